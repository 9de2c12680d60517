//! The Docker users' stack, validated without a Docker engine: `docker compose up -d` must not
//! abort on a variable `.env` lacks, and the alerts must have somewhere to go.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

/// The `NAME=` lines of an env file.
fn defined(env_file: &str) -> BTreeSet<String> {
    std::fs::read_to_string(env_file)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()))
        .collect()
}

/// Every `${NAME…}` compose.yml interpolates.
fn referenced() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo("compose.yml")).unwrap();
    text.split("${")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

fn compose_config(env_file: &str) -> std::process::Output {
    Command::new("docker-compose")
        .args([
            "--env-file",
            env_file,
            "-f",
            &repo("compose.yml"),
            "config",
            "-q",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // Only the env file speaks: a variable exported in the test's environment must not
        // hide one the file lacks.
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("docker-compose (dev/up.sh installs it)")
}

#[test]
fn compose_validates_with_the_env_file_and_the_env_file_names_every_variable() {
    let env = repo(".env");
    let missing: Vec<String> = referenced().difference(&defined(&env)).cloned().collect();
    assert!(
        missing.is_empty(),
        "compose.yml uses, .env lacks: {missing:?}"
    );
    let o = compose_config(&env);
    assert!(
        o.status.success(),
        "docker-compose config: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Without one of them, compose refuses to start and says which (what `up -d` did before).
    let dir = std::env::temp_dir().join(format!("outbox-compose-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let partial = dir.join("env");
    let text: String = std::fs::read_to_string(&env)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("OUTBOX_ADMIN_TOKEN="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&partial, text).unwrap();
    let o = compose_config(partial.to_str().unwrap());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("OUTBOX_ADMIN_TOKEN"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_stack_has_an_alertmanager_with_a_receiver_and_prometheus_sends_to_it() {
    let compose = std::fs::read_to_string(repo("compose.yml")).unwrap();
    assert!(
        compose.contains("\n  alertmanager:\n"),
        "no alertmanager service"
    );
    let prom = std::fs::read_to_string(repo("deploy/prometheus/prometheus.yml")).unwrap();
    assert!(
        prom.contains("alerting:") && prom.contains("alertmanager:9093"),
        "prometheus sends alerts nowhere:\n{prom}"
    );
    let am = repo("deploy/alertmanager/alertmanager.yml");
    assert!(Path::new(&am).exists());
    let o = Command::new("amtool")
        .args(["check-config", &am])
        .output()
        .expect("amtool (dev/up.sh installs it)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("1 receivers"), "{out}");
}

/// Each target Prometheus scrapes by service name is served under that name: the listeners
/// refuse a `Host` they were not told (DNS rebinding), so the service's command must name it
/// (`--metrics-allowed-host` for a sidecar's `/metrics`, `--allowed-host` for the admin server).
#[test]
fn every_scrape_target_is_allowed_by_the_command_it_scrapes() {
    let compose = std::fs::read_to_string(repo("compose.yml")).unwrap();
    let prometheus = std::fs::read_to_string(repo("deploy/prometheus/prometheus.yml")).unwrap();
    let mut checked = 0;
    for target in prometheus.split("targets: [\"").skip(1) {
        let target = target.split('"').next().unwrap();
        let (name, _port) = target.split_once(':').unwrap();
        if name == "alertmanager" {
            continue;
        }
        // The service's lines: after `  name:`, up to the next line indented by two spaces.
        let block: Vec<&str> = compose
            .lines()
            .skip_while(|l| *l != format!("  {name}:"))
            .skip(1)
            .take_while(|l| l.starts_with("   ") || l.trim().is_empty())
            .collect();
        let entry = block
            .iter()
            .find(|l| l.trim_start().starts_with("entrypoint:"))
            .unwrap_or_else(|| panic!("service {name} has no entrypoint"));
        assert!(
            entry.contains(&format!("--metrics-allowed-host {name}"))
                || entry.contains(&format!("--allowed-host {name}")),
            "Prometheus scrapes {target}, but {name}'s command does not allow that name: {entry}"
        );
        checked += 1;
    }
    assert!(checked >= 3, "scrape targets checked: {checked}");
}
