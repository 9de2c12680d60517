//! The Helm chart (`deploy/helm/outbox`) as a platform team checks it, offline: `helm lint
//! --strict` on every values set in its `ci/`, bad values refused naming the key, the rendered
//! manifests validated by kubeconform in strict mode against Kubernetes 1.31 and 1.37 (and the
//! Prometheus operator's and KEDA's CRDs from `tests/fixtures/crds`), every container under
//! the restricted Pod Security Standard with probes and requests, the `PrometheusRule` equal to
//! `deploy/prometheus/alerts.yml` and passing its promtool unit tests, and the helm-unittest
//! suites of `deploy/helm/outbox/tests`. The tools come from `dev/helm.sh install`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

const CHART: &str = "deploy/helm/outbox";
/// The CRD groups the cluster is told to have, so monitors, the rule and scaled objects render.
const CRD_APIS: [&str; 2] = ["monitoring.coreos.com/v1", "keda.sh/v1alpha1"];

/// Paths of the tools `dev/helm.sh` installed (once per test binary; the script holds a lock,
/// so tests of several binaries never build at the same time).
struct Tools {
    helm: String,
    unittest: String,
    kubeconform: String,
    python: String,
    schemas: String,
    crd_schemas: String,
    kube_versions: Vec<String>,
}

fn tools() -> &'static Tools {
    static T: OnceLock<Tools> = OnceLock::new();
    T.get_or_init(|| {
        let install = Command::new("bash")
            .args([&repo("dev/helm.sh"), "install"])
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .status()
            .expect("bash");
        assert!(install.success(), "dev/helm.sh install failed");
        let env = Command::new("bash")
            .args([&repo("dev/helm.sh"), "env"])
            .output()
            .unwrap();
        let env: BTreeMap<String, String> = String::from_utf8(env.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
            .collect();
        Tools {
            helm: env["HELM"].clone(),
            unittest: env["HELM_UNITTEST"].clone(),
            kubeconform: env["KUBECONFORM"].clone(),
            python: env["K8S_PYTHON"].clone(),
            schemas: env["K8S_SCHEMAS"].clone(),
            crd_schemas: env["K8S_CRD_SCHEMAS"].clone(),
            kube_versions: env["K8S_VERSIONS"]
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        }
    })
}

/// The values sets CI lints and renders: every file in the chart's `ci/`.
fn value_sets() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo(&format!("{CHART}/ci")))
        .unwrap()
        .map(|e| e.unwrap().path().to_str().unwrap().to_owned())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    v.sort();
    assert!(v.len() >= 4, "{v:?}");
    v
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(cmd: &mut Command) -> Out {
    let o = cmd.stdin(Stdio::null()).output().expect("spawn");
    Out {
        ok: o.status.success(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `helm template` of the chart with a values file and `--set`s, as Kubernetes `kube`, with
/// or without the CRDs' API groups.
fn template(values: Option<&str>, sets: &[&str], kube: &str, crds: bool) -> Out {
    let t = tools();
    let mut c = Command::new(&t.helm);
    c.args(["template", "rel", &repo(CHART), "--namespace", "payments"])
        .args(["--kube-version", kube]);
    if let Some(v) = values {
        c.args(["-f", v]);
    }
    for s in sets {
        c.args(["--set", s]);
    }
    if crds {
        for a in CRD_APIS {
            c.args(["--api-versions", a]);
        }
    }
    run(&mut c)
}

/// Runs `cmd` with `input` on its standard input.
fn run_with_stdin(cmd: &mut Command, input: &str) -> Out {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    Out {
        ok: o.status.success(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Multi-document YAML as JSON values (PyYAML in dev/helm.sh's venv).
fn yaml_docs(yaml: &str) -> Vec<Value> {
    let o = run_with_stdin(
        Command::new(&tools().python).args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ]),
        yaml,
    );
    assert!(o.ok, "{}", o.stderr);
    serde_json::from_str::<Vec<Value>>(&o.stdout).unwrap()
}

fn rendered(values: &str, kube: &str) -> Vec<Value> {
    let o = template(Some(values), &[], kube, true);
    assert!(o.ok, "{values}: {}", o.stderr);
    yaml_docs(&o.stdout)
}

fn kubeconform(yaml: &str, kube: &str) -> Out {
    let t = tools();
    run_with_stdin(
        Command::new(&t.kubeconform)
            .args(["-strict", "-summary", "-kubernetes-version", kube])
            .args([
                "-schema-location",
                &format!(
                    "{}/{{{{ .NormalizedKubernetesVersion }}}}-local-strict/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
                    t.schemas
                ),
                "-schema-location",
                &format!(
                    "{}/{{{{ .Group }}}}/{{{{ .ResourceKind }}}}_{{{{ .ResourceAPIVersion }}}}.json",
                    t.crd_schemas
                ),
            ]),
        yaml,
    )
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn name(d: &Value) -> &str {
    d["metadata"]["name"].as_str().unwrap()
}

#[test]
fn the_chart_lints_strict_with_every_values_set_and_the_defaults_ask_for_what_is_missing() {
    let t = tools();
    for v in value_sets() {
        let o = run(Command::new(&t.helm).args(["lint", "--strict", &repo(CHART), "-f", &v]));
        assert!(o.ok, "{v}:\n{}{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("0 chart(s) failed"), "{v}: {}", o.stdout);
    }
    // The defaults alone name the two values a release cannot run without.
    let o = run(Command::new(&t.helm).args(["lint", "--strict", &repo(CHART)]));
    assert!(!o.ok, "{}", o.stdout);
    let all = format!("{}{}", o.stdout, o.stderr);
    for key in ["/existingSecret/name", "/kafka/bootstrapServers"] {
        assert!(all.contains(key), "does not name {key}: {all}");
    }
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    let minimal = repo(&format!("{CHART}/ci/minimal-values.yaml"));
    let consumer =
        "autoscaling.consumers[0].deployment=billing,autoscaling.consumers[0].consumerGroup=b,\
         autoscaling.consumers[0].topic=orders.created,autoscaling.consumers[0].partitions=6";
    let cases: Vec<(Vec<String>, &str)> = vec![
        // A misspelt key is not silently ignored.
        (vec!["relay.replica=2".into()], "replica"),
        (vec!["relay.replicas=0".into()], "/relay/replicas"),
        // More relays than lanes would idle.
        (vec!["relay.replicas=65".into()], "/relay/replicas"),
        (
            vec!["relay.exactlyOnce=true".into(), "relay.replicas=5".into()],
            "relay.replicas: 5 relays would share the 4 exactly-once slots",
        ),
        // A fleet's database names become environment variables' names; `default` is the
        // release's own database; a discovery pattern is a LIKE pattern of schema names.
        (
            vec![
                "relay.tenants.enabled=true".into(),
                "relay.tenants.databases.Shard-2=SHARD2_URL".into(),
            ],
            "invalid propertyName 'Shard-2'",
        ),
        (
            vec![
                "relay.tenants.enabled=true".into(),
                "relay.tenants.databases.default=OTHER_URL".into(),
            ],
            "invalid propertyName 'default'",
        ),
        (
            vec![
                "relay.tenants.enabled=true".into(),
                "relay.tenants.discover=x';drop".into(),
            ],
            "/relay/tenants/discover",
        ),
        (
            vec![
                "relay.tenants.enabled=true".into(),
                "relay.tenants.registry=false".into(),
            ],
            "relay.tenants: a fleet needs the registry",
        ),
        (vec!["runAsUser=0".into()], "/runAsUser"),
        (vec!["image.digest=latest".into()], "/image/digest"),
        (vec!["logFormat=xml".into()], "/logFormat"),
        (vec!["kafka.bootstrapServers=kafka".into()], "/kafka/bootstrapServers"),
        // A secret belongs in the Secret, not in values.
        (
            vec!["kafka.properties.sasl\\.password=hunter2".into()],
            "invalid propertyName 'sasl.password'",
        ),
        (vec!["relay.resources.requests=null".into()], "/relay/resources"),
        (
            vec!["relay.terminationGracePeriodSeconds=35".into()],
            "relay.terminationGracePeriodSeconds: 35 must exceed relay.shutdownTimeoutSeconds (30)",
        ),
        (
            vec![
                "autoscaling.relay.enabled=true".into(),
                "autoscaling.relay.prometheusServer=http://prometheus:9090".into(),
                "autoscaling.relay.maxReplicas=65".into(),
            ],
            "/autoscaling/relay/maxReplicas",
        ),
        (
            vec![
                "relay.exactlyOnce=true".into(),
                "relay.replicas=1".into(),
                "autoscaling.relay.enabled=true".into(),
                "autoscaling.relay.prometheusServer=http://prometheus:9090".into(),
                "autoscaling.relay.maxReplicas=8".into(),
            ],
            "autoscaling.relay.maxReplicas: 8 is above the 4 exactly-once slots",
        ),
        (
            vec!["autoscaling.relay.enabled=true".into()],
            "autoscaling.relay.prometheusServer",
        ),
        (
            vec![format!("{consumer},autoscaling.consumers[0].maxReplicas=7")],
            "autoscaling.consumers[0].maxReplicas: 7 consumers of orders.created would share 6 partitions",
        ),
        (
            vec![format!("{consumer},autoscaling.consumers[0].maxReplicas=6,autoscaling.consumers[0].lagTreshold=5")],
            "lagTreshold",
        ),
        (vec!["topics=".into()], "topics: the archiver reads the dead-letter topics"),
        (vec!["networkPolicy.kafka.ports=null".into()], "/networkPolicy/kafka"),
    ];
    for (sets, key) in &cases {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let o = template(Some(&minimal), &sets, "1.31.0", true);
        assert!(!o.ok, "{sets:?} rendered:\n{}", o.stdout);
        assert!(
            o.stderr.contains(key),
            "{sets:?} does not name {key}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("panic"), "{}", o.stderr);
    }
    // And each of those sets differs from a good one only by the bad value: the base renders.
    assert!(template(Some(&minimal), &[], "1.31.0", true).ok);
}

#[test]
fn rendered_manifests_validate_strictly_against_two_kubernetes_versions_and_the_crds() {
    let t = tools();
    assert!(t.kube_versions.len() >= 2, "{:?}", t.kube_versions);
    let mut kinds = BTreeSet::new();
    for v in value_sets() {
        for kube in &t.kube_versions {
            let o = template(Some(&v), &[], kube, true);
            assert!(o.ok, "{v} on {kube}: {}", o.stderr);
            for d in yaml_docs(&o.stdout) {
                kinds.insert(d["kind"].as_str().unwrap().to_owned());
            }
            let k = kubeconform(&o.stdout, kube);
            assert!(
                k.ok && k.stdout.contains("Invalid: 0, Errors: 0, Skipped: 0"),
                "{v} on Kubernetes {kube}:\n{}{}",
                k.stdout,
                k.stderr
            );
        }
    }
    // Every kind the chart can render was validated, the CRDs' included.
    for k in [
        "Deployment",
        "Service",
        "Job",
        "ConfigMap",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ScaledObject",
    ] {
        assert!(kinds.contains(k), "no values set renders a {k}: {kinds:?}");
    }
    // The validation is not a formality: a misspelt field in a Deployment, a ScaledObject and
    // a ServiceMonitor is each refused.
    let full = repo(&format!("{CHART}/ci/full-values.yaml"));
    let good = template(Some(&full), &[], "1.31.0", true).stdout;
    for (from, to) in [
        ("revisionHistoryLimit:", "revisionHistoryLimt:"),
        ("minReplicaCount:", "minReplicaCnt:"),
        ("relabelings:", "relabelling:"),
        (
            "readOnlyRootFilesystem: true",
            "readOnlyRootFilesystem: \"yes\"",
        ),
    ] {
        assert!(good.contains(from), "{from}");
        let k = kubeconform(&good.replace(from, to), "1.31.0");
        assert!(!k.ok, "{to} passed:\n{}", k.stdout);
    }
}

/// The restricted Pod Security Standard, probes and requests, for every container of every
/// values set; and no credential as a literal value.
#[test]
fn every_container_is_restricted_non_root_read_only_with_probes_and_requests() {
    for v in value_sets() {
        let docs = rendered(&v, "1.37.0");
        let mut pods = 0;
        for d in docs
            .iter()
            .filter(|d| d["kind"] == "Deployment" || d["kind"] == "Job")
        {
            let what = format!("{v}: {} {}", d["kind"], name(d));
            let pod = &d["spec"]["template"]["spec"];
            pods += 1;
            assert_eq!(pod["automountServiceAccountToken"], false, "{what}");
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{what}"
            );
            assert_ne!(pod["securityContext"]["runAsUser"], 0, "{what}");
            assert!(
                pod["hostNetwork"].is_null() && pod["hostPID"].is_null(),
                "{what}"
            );
            let mounts_tmp = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == "tmp" && v["emptyDir"].is_object());
            assert!(
                mounts_tmp,
                "{what}: no writable /tmp beside the read-only root"
            );
            for c in pod["containers"].as_array().unwrap() {
                let what = format!("{what} container {}", c["name"]);
                let sc = &c["securityContext"];
                assert_eq!(sc["runAsNonRoot"], true, "{what}");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
                assert_eq!(sc["privileged"], false, "{what}");
                assert_eq!(
                    sc["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{what}"
                );
                assert!(sc["capabilities"]["add"].is_null(), "{what}");
                assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{what}");
                let req = &c["resources"]["requests"];
                assert!(
                    req["cpu"].is_string() && req["memory"].is_string(),
                    "{what}"
                );
                assert!(c["resources"]["limits"]["memory"].is_string(), "{what}");
                for e in c["env"].as_array().unwrap() {
                    let n = e["name"].as_str().unwrap();
                    if n == "DATABASE_URL" || n == "OUTBOX_ADMIN_TOKEN" {
                        assert!(e["value"].is_null(), "{what}: {n} as a literal");
                        assert!(e["valueFrom"]["secretKeyRef"].is_object(), "{what}: {n}");
                    }
                }
                if d["kind"] == "Deployment" {
                    // Liveness is the process's own loops, readiness its dependencies: the
                    // two endpoints item 1 of the Kubernetes issue gave every process.
                    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{what}");
                    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{what}");
                    assert_eq!(c["startupProbe"]["httpGet"]["path"], "/healthz", "{what}");
                    let port = &c["livenessProbe"]["httpGet"]["port"];
                    assert!(
                        c["ports"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|p| &p["name"] == port),
                        "{what}: probe port {port} is not a container port"
                    );
                }
            }
        }
        assert!(pods >= 2, "{v}: {pods} pod templates");
        // The relay's grace period covers its flush budget on SIGTERM.
        let relay = kind(&docs, "Deployment")
            .into_iter()
            .find(|d| name(d).ends_with("-relay"))
            .unwrap();
        let pod = &relay["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
        let args: Vec<&str> = pod["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let budget: i64 = args
            .iter()
            .find_map(|a| a.strip_prefix("--shutdown-timeout="))
            .and_then(|s| s.strip_suffix('s'))
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            grace >= budget + 10,
            "{v}: grace {grace} s, flush budget {budget} s"
        );
    }
}

/// `outbox` accepts every argument list the chart renders (a misspelt flag in a template
/// would otherwise surface as a CrashLoopBackOff after the rollout): each runs against a
/// closed port for Postgres and Kafka, and must get past argument parsing — a long-running
/// verb to its first log line, a Job to an error about the connection — never exit 2.
#[test]
fn the_binary_accepts_every_argument_list_the_chart_renders() {
    let full = repo(&format!("{CHART}/ci/full-values.yaml"));
    let eo = repo(&format!("{CHART}/ci/exactly-once-values.yaml"));
    let dir = std::env::temp_dir().join(format!("helm-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut checked = 0;
    for v in [full, eo] {
        for d in rendered(&v, "1.37.0")
            .iter()
            .filter(|d| d["kind"] == "Deployment" || d["kind"] == "Job")
        {
            let c = &d["spec"]["template"]["spec"]["containers"][0];
            let mut args: Vec<String> = c["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect();
            // Files the pod would mount, here from the repository; ports nothing else uses.
            for a in &mut args {
                *a = a.replace("/etc/outbox/topics/topics.toml", &repo("topics.toml"));
                for port in ["9187", "9188", "8080"] {
                    *a = a.replace(&format!("0.0.0.0:{port}"), "127.0.0.1:0");
                }
            }
            let log = dir.join(format!("{}.log", name(d)));
            let mut child = Command::new(outbox_testkit::outbox_bin())
                .args(&args)
                .env_clear()
                .env(
                    "DATABASE_URL",
                    "postgres://u:p@127.0.0.1:1/none?connect_timeout=1",
                )
                .env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
                .env("SCHEMA_REGISTRY_URL", "http://127.0.0.1:1/apis/ccompat/v7")
                .env("OUTBOX_ADMIN_TOKEN", "a-token-of-sixteen-characters")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let code = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status.code();
                }
                // Past parsing: the process logs (JSON, as the chart asks) before it connects.
                if std::fs::read_to_string(&log).unwrap().contains("\"level\"") {
                    child.kill().unwrap();
                    child.wait().unwrap();
                    break None;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{} neither logged nor exited",
                    name(d)
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            };
            let err = std::fs::read_to_string(&log).unwrap();
            assert_ne!(
                code,
                Some(2),
                "{}: usage error for {args:?}:\n{err}",
                name(d)
            );
            assert_ne!(
                code,
                Some(0),
                "{}: succeeded with nothing to reach:\n{err}",
                name(d)
            );
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked}");
}

#[test]
fn the_prometheus_rule_is_the_alert_file_and_passes_promtool_and_its_unit_tests() {
    let full = repo(&format!("{CHART}/ci/full-values.yaml"));
    let docs = rendered(&full, "1.37.0");
    let rules = kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    let alerts = std::fs::read_to_string(repo("deploy/prometheus/alerts.yml")).unwrap();
    let source = &yaml_docs(&alerts)[0];
    // One source: the rendered spec is the file, rule for rule, annotation for annotation.
    assert_eq!(&rules[0]["spec"], source);
    let groups = source["groups"].as_array().unwrap();
    assert!(groups.len() >= 2);
    // promtool on the rendered rules, and the existing unit tests pointed at them.
    let dir = std::env::temp_dir().join(format!("helm-rule-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rendered.yml"),
        serde_json::to_string(&rules[0]["spec"]).unwrap(),
    )
    .unwrap();
    let tests = std::fs::read_to_string(repo("deploy/prometheus/alerts_test.yml")).unwrap();
    assert!(tests.contains("  - alerts.yml\n"));
    std::fs::write(
        dir.join("alerts_test.yml"),
        tests.replace("  - alerts.yml\n", "  - rendered.yml\n"),
    )
    .unwrap();
    for args in [
        vec!["check", "rules", "rendered.yml"],
        vec!["test", "rules", "alerts_test.yml"],
    ] {
        let o = run(Command::new("promtool").args(&args).current_dir(&dir));
        assert!(o.ok, "promtool {args:?}:\n{}{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("SUCCESS"), "{}", o.stdout);
    }
    // The monitors give each target the job name the rules expect.
    let jobs: BTreeSet<String> = kind(&docs, "ServiceMonitor")
        .iter()
        .flat_map(|m| m["spec"]["endpoints"].as_array().unwrap().clone())
        .flat_map(|e| e["relabelings"].as_array().unwrap().clone())
        .filter(|r| r["targetLabel"] == "job")
        .map(|r| r["replacement"].as_str().unwrap().to_owned())
        .collect();
    for job in ["outbox-relay", "outbox-dlq-archive", "outbox-admin"] {
        assert!(jobs.contains(job), "{jobs:?}");
    }
    for r in groups.iter().flat_map(|g| g["rules"].as_array().unwrap()) {
        let expr = r["expr"].as_str().unwrap();
        if let Some(i) = expr.find("job=\"") {
            let job = expr[i + 5..].split('"').next().unwrap();
            assert!(
                jobs.contains(job),
                "{} selects job {job}: {jobs:?}",
                r["alert"]
            );
        }
    }
    // The dashboard ConfigMap is the dashboard file.
    let dash = kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| name(c).ends_with("-dashboard"))
        .unwrap();
    let file = std::fs::read_to_string(repo("deploy/grafana/outbox.json")).unwrap();
    assert_eq!(
        dash["data"]["outbox.json"].as_str().unwrap().trim_end(),
        file.trim_end()
    );
    assert_eq!(dash["metadata"]["labels"]["grafana_dashboard"], "1");
}

/// The relay's ScaledObject query, evaluated by promtool on the series two relays of this
/// release and one of another would export: the backlog once (max, not a sum over relays),
/// only this release's.
#[test]
fn the_relay_scaler_query_reads_this_releases_backlog_once() {
    let full = repo(&format!("{CHART}/ci/full-values.yaml"));
    let docs = rendered(&full, "1.37.0");
    let so = kind(&docs, "ScaledObject")
        .into_iter()
        .find(|s| name(s) == "rel-outbox-relay")
        .unwrap();
    assert_eq!(so["spec"]["minReplicaCount"], 1);
    assert_eq!(so["spec"]["maxReplicaCount"], 8);
    let trigger = &so["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "prometheus");
    assert_eq!(trigger["metricType"], "AverageValue");
    let query = trigger["metadata"]["query"].as_str().unwrap();
    let dir = std::env::temp_dir().join(format!("helm-keda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rules.yml"),
        serde_json::json!({"groups": [{"name": "keda", "rules": [
            {"record": "relay_scaler_query", "expr": query}
        ]}]})
        .to_string(),
    )
    .unwrap();
    let series = |pod: &str, inst: &str, v: &str| {
        serde_json::json!({
            "series": format!(
                "outbox_rows{{status=\"pending\",job=\"outbox-relay\",namespace=\"payments\",outbox_instance=\"{inst}\",pod=\"{pod}\"}}"
            ),
            "values": v,
        })
    };
    std::fs::write(
        dir.join("test.yml"),
        serde_json::json!({
            "rule_files": ["rules.yml"],
            "evaluation_interval": "1m",
            "tests": [{
                "interval": "1m",
                "input_series": [
                    series("rel-outbox-relay-a", "rel-outbox", "40000x5"),
                    series("rel-outbox-relay-b", "rel-outbox", "40000x5"),
                    series("other-outbox-relay-a", "other-outbox", "900000x5"),
                ],
                "promql_expr_test": [{
                    "expr": "relay_scaler_query",
                    "eval_time": "3m",
                    "exp_samples": [{"labels": "relay_scaler_query", "value": 40000}],
                }],
            }],
        })
        .to_string(),
    )
    .unwrap();
    let o = run(Command::new("promtool")
        .args(["test", "rules", "test.yml"])
        .current_dir(&dir));
    assert!(o.ok, "{query}:\n{}{}", o.stdout, o.stderr);
    // The gauge the query reads, as a running relay exports it (tests/ops/observability.rs
    // scrapes `outbox_rows{status="pending"}` from one).
    assert!(
        query.starts_with("max(outbox_rows{status=\"pending\""),
        "{query}"
    );
}

#[test]
fn helm_unittest_suites_pin_what_each_switch_renders() {
    let t = tools();
    let suites = std::fs::read_dir(repo(&format!("{CHART}/tests")))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .ends_with("_test.yaml")
        })
        .count();
    assert!(suites >= 5, "{suites} suites");
    let o = run(Command::new(&t.unittest).args(["--color=false", &repo(CHART)]));
    assert!(o.ok, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .contains(&format!("Test Suites: {suites} passed, {suites} total")),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("failed"), "{}", o.stdout);
}

/// A real API server (`dev/kube.sh`: kube-apiserver v1.37.2 and etcd, no nodes) admits every
/// values set's manifests in a server-side dry run — its own schemas with strict field
/// validation, the CRDs' structural schemas, and PodSecurity admission at `restricted` — and
/// creates a Pod from every pod template in a namespace that enforces `restricted`.
#[test]
fn a_real_api_server_admits_the_chart_under_restricted_pod_security() {
    let start = Command::new("bash")
        .args([&repo("dev/kube.sh"), "start"])
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    assert!(start.success(), "dev/kube.sh start failed");
    let env = Command::new("bash")
        .args([&repo("dev/kube.sh"), "env"])
        .output()
        .unwrap();
    let env: BTreeMap<String, String> = String::from_utf8(env.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let kubectl = |args: &[&str], stdin: Option<&str>| -> Out {
        run_with_stdin(
            Command::new(&env["KUBECTL"])
                .env("KUBECONFIG", &env["KUBECONFIG"])
                .args(args),
            stdin.unwrap_or(""),
        )
    };
    let crds = repo("tests/fixtures/crds");
    let o = kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", &crds],
        None,
    );
    assert!(o.ok, "{}", o.stderr);
    let o = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
        None,
    );
    assert!(o.ok, "{}", o.stderr);
    let ns = format!("helm-{}", outbox_testkit::hex(6));
    let namespace = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/warn": "restricted",
        }},
    });
    let o = kubectl(&["create", "-f", "-"], Some(&namespace.to_string()));
    assert!(o.ok, "{}", o.stderr);
    // What the controller manager (not running here) would make in every namespace.
    let sa = serde_json::json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": ns},
    });
    let o = kubectl(&["create", "-f", "-"], Some(&sa.to_string()));
    assert!(o.ok, "{}", o.stderr);
    let pod_of = |d: &Value| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{}-pod", name(d)), "namespace": ns},
            "spec": d["spec"]["template"]["spec"],
        })
    };
    let mut pods = 0;
    for v in value_sets() {
        let t = tools();
        let o = run(Command::new(&t.helm)
            .args([
                "template",
                "rel",
                &repo(CHART),
                "--namespace",
                &ns,
                "-f",
                &v,
            ])
            .args(["--kube-version", "1.37.0"])
            .args(["--api-versions", CRD_APIS[0], "--api-versions", CRD_APIS[1]]));
        assert!(o.ok, "{v}: {}", o.stderr);
        let docs = yaml_docs(&o.stdout);
        let a = kubectl(
            &[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-n",
                &ns,
                "-f",
                "-",
            ],
            Some(&o.stdout),
        );
        assert!(a.ok, "{v}:\n{}{}", a.stdout, a.stderr);
        assert_eq!(
            a.stdout.matches("(server dry run)").count(),
            docs.len(),
            "{v}:\n{}",
            a.stdout
        );
        assert!(!a.stderr.contains("PodSecurity"), "{v}:\n{}", a.stderr);
        for d in docs
            .iter()
            .filter(|d| d["kind"] == "Deployment" || d["kind"] == "Job")
        {
            let c = kubectl(
                &["create", "--dry-run=server", "-f", "-"],
                Some(&pod_of(d).to_string()),
            );
            assert!(c.ok, "{v} {}: {}", name(d), c.stderr);
            pods += 1;
        }
    }
    assert!(pods >= 10, "{pods}");
    // Neither check is a formality: a container that may escalate is refused in the namespace
    // that enforces `restricted`, and a misspelt field is refused by strict validation.
    let full = repo(&format!("{CHART}/ci/full-values.yaml"));
    let docs = rendered(&full, "1.37.0");
    let relay = kind(&docs, "Deployment")
        .into_iter()
        .find(|d| name(d).ends_with("-relay"))
        .unwrap();
    let mut bad = pod_of(relay);
    bad["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = true.into();
    let c = kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&bad.to_string()),
    );
    assert!(
        !c.ok && c.stderr.contains("violates PodSecurity"),
        "{}",
        c.stderr
    );
    let mut bad = relay.clone();
    bad["spec"]["revisionHistoryLimt"] = 5.into();
    let c = kubectl(
        &[
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-n",
            &ns,
            "-f",
            "-",
        ],
        Some(&bad.to_string()),
    );
    assert!(!c.ok && c.stderr.contains("unknown field"), "{}", c.stderr);
    // Nothing else uses it: the API server and etcd stop rather than idle through the suite.
    let _ = Command::new("bash")
        .args([&repo("dev/kube.sh"), "stop"])
        .status();
}
