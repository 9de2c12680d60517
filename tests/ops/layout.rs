//! The crate's shape, checked: the top-level modules and the children of every module form
//! one-way graphs, the module map names every file, a service built with
//! `default-features = false` links no Kafka, HTTP or CLI crates, each feature builds alone, and
//! the migration runner records what refinery (which earlier releases ran) records.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use outbox_testkit::*;

/// The top-level module a source file belongs to (`src/relay/lanes.rs` → `relay`).
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `crate::name` references in code (comments and doc comments excluded), by top module.
fn module_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let tops: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(&src, f))
        .filter(|m| m != "lib")
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = top_module(&src, f);
        if from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for line in text.lines() {
            let code = line.split("//").next().unwrap();
            let mut rest = code;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                // `crate::{a, b}` groups: every name in the braces.
                let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                    let inner = group.split('}').next().unwrap_or("");
                    inner
                        .split(',')
                        .map(|s| s.trim().split("::").next().unwrap().trim().to_owned())
                        .collect()
                } else {
                    vec![name]
                };
                for n in names {
                    if tops.contains(&n) && n != from {
                        edges.entry(from.clone()).or_default().insert(n);
                    }
                }
            }
        }
    }
    edges
}

/// A cycle through `start`, if any (depth-first).
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_owned());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_top_level_modules_form_a_one_way_graph() {
    let edges = module_edges();
    assert!(
        edges.get("relay").is_some_and(|e| e.contains("sql")),
        "the scan sees edges: {edges:?}"
    );
    if let Some(c) = cycle(&edges) {
        panic!("module cycle: {}\nall edges: {edges:#?}", c.join(" -> "));
    }
    // The wire format is below both its writers and its readers.
    for part in ["consumer", "dlq"] {
        assert!(edges[part].contains("wire"), "{part} uses the wire format");
    }
    for low in [
        "wire", "message", "schema", "sql", "topic", "enqueue", "migrate", "config",
    ] {
        for heavy in ["relay", "consumer", "dlq", "admin", "kafka", "topics"] {
            assert!(
                !edges.get(low).is_some_and(|e| e.contains(heavy)),
                "core module {low} depends on {heavy}"
            );
        }
    }
    assert!(
        !edges.get("dlq").is_some_and(|e| e.contains("consumer")),
        "the DLQ tools do not depend on the consumer"
    );
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut edges = module_edges();
    edges
        .entry("wire".into())
        .or_default()
        .insert("consumer".into());
    let c = cycle(&edges).expect("a planted cycle is found");
    assert!(c.contains(&"wire".to_owned()), "{c:?}");
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// The library's normal dependency tree (what links into a service), one crate a line, with `features` (e.g.
/// `--no-default-features`) or the defaults.
fn cargo_tree(features: Option<&str>) -> String {
    cargo_tree_of("outbox", features)
}

/// [`cargo_tree`] of another package of the workspace.
fn cargo_tree_of(package: &str, features: Option<&str>) -> String {
    let mut args = vec!["tree", "--locked", "--offline", "-p", package];
    args.extend(features);
    // Proc-macros (prost's derive pulls anyhow in) run at build time and link nothing into
    // a service: left out.
    args.extend(["-e", "normal,no-proc-macro", "--prefix", "none"]);
    let o = cargo().args(&args).output().expect("cargo tree");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_service_without_default_features_links_no_kafka_http_or_cli_crate() {
    let tree = cargo_tree(Some("--no-default-features"));
    let crates: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains("tokio-postgres"), "{crates:?}");
    for heavy in [
        "rdkafka",
        "rdkafka-sys",
        "axum",
        "hyper",
        "clap",
        "indicatif",
        "tracing-subscriber",
        "metrics-exporter-prometheus",
        "openssl",
        "refinery",
        "url",
        "regex",
        "opentelemetry",
        "opentelemetry_sdk",
        "opentelemetry-otlp",
        "reqwest",
    ] {
        assert!(!crates.contains(heavy), "{heavy} in the lean tree:\n{tree}");
    }
    // The defaults still bring every part (today's users keep compiling).
    let full = cargo_tree(None);
    assert!(
        full.contains("rdkafka ") && full.contains("axum "),
        "{full}"
    );
}

/// The test kit's normal dependency tree with `features` of its own.
fn testkit_tree(features: &str) -> BTreeSet<String> {
    let o = cargo()
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            "outbox-testkit",
            "--no-default-features",
            "--features",
            features,
            "-e",
            "normal,no-proc-macro",
            "--prefix",
            "none",
        ])
        .output()
        .expect("cargo tree");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_test_kit_takes_only_the_features_the_service_uses() {
    // A service on the relay and the consumer pays for no admin server, exporter, TLS, schema
    // registry or sqlx in its test build; one on sqlx gets sqlx.
    let lean = testkit_tree("relay,consumer");
    assert!(
        lean.contains("outbox") && lean.contains("rdkafka"),
        "{lean:?}"
    );
    for heavy in [
        "axum",
        "hyper",
        "metrics-exporter-prometheus",
        "openssl",
        "sqlx",
        "apache-avro",
        "prost",
    ] {
        assert!(
            !lean.contains(heavy),
            "{heavy} in the kit's tree for relay,consumer"
        );
    }
    assert!(testkit_tree("sqlx").contains("sqlx"));
    if std::env::var_os("OUTBOX_SKIP_FEATURE_BUILDS").is_some() {
        return;
    }
    for features in ["", "relay", "consumer", "dlq", "sqlx"] {
        let o = cargo()
            .args([
                "check",
                "--locked",
                "--offline",
                "--message-format",
                "short",
                "-p",
                "outbox-testkit",
                "--no-default-features",
                "--features",
                features,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "kit features [{features}]:\n{err}");
        assert!(
            !err.contains(": warning"),
            "kit features [{features}]:\n{err}"
        );
    }
}

#[test]
fn otel_is_the_api_alone_and_the_exporter_lives_in_outbox_otlp() {
    // The defaults carry no OpenTelemetry at all; `otel` adds the API and nothing else: no
    // SDK, no exporter, no HTTP client. The SDK and OTLP come with `outbox-otlp`.
    let full = cargo_tree(None);
    assert!(!full.contains("opentelemetry"), "{full}");
    let traced = cargo_tree(Some("--features=otel"));
    let crates: BTreeSet<&str> = traced
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains("opentelemetry"), "{traced}");
    for not_here in [
        "opentelemetry_sdk",
        "opentelemetry-otlp",
        "opentelemetry-proto",
        "reqwest",
    ] {
        assert!(
            !crates.contains(not_here),
            "{not_here} with --features otel:\n{traced}"
        );
    }
    let exporter = cargo_tree_of("outbox-otlp", None);
    assert!(
        exporter.contains("opentelemetry_sdk ") && exporter.contains("opentelemetry-otlp "),
        "{exporter}"
    );
    assert!(
        !exporter.contains("rdkafka "),
        "outbox-otlp takes the library without its defaults"
    );
}

#[test]
fn the_library_never_depends_on_what_only_the_binary_needs() {
    let tree = cargo_tree(Some("--all-features"));
    for bin_only in ["clap ", "indicatif ", "tracing-subscriber ", "anyhow "] {
        assert!(!tree.contains(bin_only), "{bin_only}in the library's tree");
    }
}

#[test]
fn checksums_are_refinerys() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
    for name in outbox::embedded_migrations() {
        let sql = std::fs::read_to_string(format!("{dir}/{name}.sql")).unwrap();
        let theirs = refinery::Migration::unapplied(&name, &sql).unwrap();
        assert_eq!(
            outbox::testing::migration_checksum(&name, &sql),
            Some(theirs.checksum()),
            "{name}"
        );
    }
}

mod embedded {
    refinery::embed_migrations!("migrations");
}

#[tokio::test]
async fn a_schema_migrated_by_refinery_is_up_to_date_and_ours_satisfies_refinery() {
    // Earlier releases ran refinery: their databases must look migrated to this runner.
    let schema = format!("r_{}", hex(10));
    let db = outbox::DbConfig::new(&database_url(), &schema).unwrap();
    let (mut c, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c.batch_execute(&format!(
        "CREATE SCHEMA \"{schema}\"; SET search_path TO \"{schema}\""
    ))
    .await
    .unwrap();
    embedded::migrations::runner()
        .set_grouped(false)
        .run_async(&mut c)
        .await
        .unwrap();
    let report = outbox::migrate(&db).await.unwrap();
    assert!(report.applied.is_empty(), "{:?}", report.applied);

    // And the other way round: refinery finds nothing to do in a schema this runner migrated.
    let fresh = fresh_db().await;
    c.batch_execute(&format!("SET search_path TO {}", fresh.schema.quoted()))
        .await
        .unwrap();
    let theirs = embedded::migrations::runner()
        .set_grouped(false)
        .run_async(&mut c)
        .await
        .unwrap();
    assert!(theirs.applied_migrations().is_empty());

    // A changed migration is refused, not re-run.
    c.execute(
        "UPDATE refinery_schema_history SET checksum = '1' WHERE version = 1",
        &[],
    )
    .await
    .unwrap();
    let e = outbox::migrate(&fresh).await.unwrap_err();
    assert!(matches!(e, outbox::MigrateError::History(_)), "{e}");
}

#[test]
fn each_feature_builds_alone() {
    if std::env::var_os("OUTBOX_SKIP_FEATURE_BUILDS").is_some() {
        return;
    }
    // `cargo check` per feature: a part that reaches into one it does not declare fails here,
    // and so does a warning that only that set of parts shows (dead code and unused imports
    // excepted: lib.rs allows them in partial builds, where shared helpers go unused).
    // The shared target directory keeps this cheap: the dependencies' build scripts (librdkafka)
    // ran already for the test build.
    for features in [
        "",
        "tls",
        "kafka",
        "relay",
        "consumer",
        "dlq",
        "prometheus",
        "admin",
        "schemas",
        "schemas,consumer",
        "sqlx",
        "sqlx,consumer",
        "otel",
        "otel,relay",
        "otel,consumer",
        "otel,dlq",
    ] {
        let o = cargo()
            .args([
                "check",
                "--locked",
                "--offline",
                "--message-format",
                "short",
                "-p",
                "outbox",
                "--lib",
                "--no-default-features",
                "--features",
                features,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let warnings: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("src/") && l.contains(": warning"))
            .collect();
        assert!(o.status.success(), "features [{features}]:\n{err}");
        assert!(
            warnings.is_empty(),
            "features [{features}]:\n{}",
            warnings.join("\n")
        );
    }
    // The exporter's crate alone (it takes the library without its defaults).
    let o = cargo()
        .args([
            "check",
            "--locked",
            "--offline",
            "--message-format",
            "short",
            "-p",
            "outbox-otlp",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !err.contains(": warning"),
        "outbox-otlp:\n{err}"
    );
}

fn src_files() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut cli = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/outbox-cli/src"),
        &mut cli,
    );
    files.extend(cli);
    files
        .into_iter()
        .map(|f| {
            let rel = f
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap()
                .display()
                .to_string();
            (rel, std::fs::read_to_string(&f).unwrap())
        })
        .collect()
}

#[test]
fn every_statement_lives_in_the_sql_store() {
    // Outside src/sql/ only the migration runner's own history statements and the admin
    // server's `SELECT 1` probe may spell SQL; doc examples (`///`, `//!`) do not count.
    let verbs = [
        "\"SELECT ",
        "\"INSERT ",
        "\"UPDATE ",
        "\"DELETE ",
        "\"WITH ",
    ];
    let mut strays = Vec::new();
    for (path, text) in src_files() {
        if path.starts_with("src/sql/") || path == "src/migrate.rs" {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let after_format = code.replace("format!(", "");
            if verbs.iter().any(|v| after_format.contains(v)) && !code.contains("\"SELECT 1\"") {
                strays.push(format!("{path}:{}: {}", n + 1, code));
            }
        }
    }
    assert!(
        strays.is_empty(),
        "SQL outside src/sql/:\n{}",
        strays.join("\n")
    );
}

#[test]
fn doc_comments_stand_on_their_own() {
    // A reader of docs.rs has no seeds and no design card: rules are stated, not cited.
    let mut cites = Vec::new();
    for (path, text) in src_files() {
        for (n, line) in text.lines().enumerate() {
            let l = line.trim_start();
            if (l.starts_with("///") || l.starts_with("//!"))
                && (l.contains("seed 0") || l.contains("DESIGN §") || l.contains("DESIGN.md §"))
            {
                cites.push(format!("{path}:{}: {l}", n + 1));
            }
        }
    }
    assert!(cites.is_empty(), "{}", cites.join("\n"));
}

/// Within one directory of `src/` (a module with children), which child refers to which: a
/// child file's `super::sibling` and `crate::<path>::sibling`, a child directory's
/// `super::super::sibling` and `crate::<path>::sibling` (comments excluded). The parent
/// (`mod.rs`, or `lib.rs` for `src/`) is not a child.
fn child_edges(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let path: Vec<String> = dir
        .strip_prefix(&src)
        .unwrap()
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let crate_path = std::iter::once("crate".to_owned())
        .chain(path)
        .collect::<Vec<_>>()
        .join("::");
    let mut children: BTreeMap<String, Vec<(std::path::PathBuf, usize)>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            let mut fs = Vec::new();
            rust_files(&p, &mut fs);
            let depth_of = |f: &Path| f.strip_prefix(&p).unwrap().components().count();
            children
                .entry(name)
                .or_default()
                .extend(fs.iter().map(|f| (f.clone(), depth_of(f))));
        } else if name.ends_with(".rs") && name != "mod.rs" && name != "lib.rs" {
            children
                .entry(name.trim_end_matches(".rs").to_owned())
                .or_default()
                .push((p, 0));
        }
    }
    let names: BTreeSet<String> = children.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (child, files) in &children {
        let out = edges.entry(child.clone()).or_default();
        for (f, depth) in files {
            // From a file `depth` levels inside a child directory, `super::` repeated this
            // often reaches `dir` (a file `x/mod.rs` is one level in, like `x.rs`).
            let is_mod = f.file_name().is_some_and(|n| n == "mod.rs");
            let ups = if *depth == 0 {
                1
            } else {
                depth - usize::from(is_mod) + 1
            };
            let up = vec!["super"; ups].join("::");
            let text = std::fs::read_to_string(f).unwrap();
            for line in text.lines() {
                let code = line.split("//").next().unwrap();
                for prefix in [format!("{up}::"), format!("{crate_path}::")] {
                    let mut rest = code;
                    while let Some(i) = rest.find(&prefix) {
                        // `super::super::x` also contains `super::x`: only the exact depth.
                        let before = &rest[..i];
                        rest = &rest[i + prefix.len()..];
                        if prefix.starts_with("super") && before.ends_with("super::") {
                            continue;
                        }
                        let group = rest
                            .strip_prefix('{')
                            .map(|r| r.split('}').next().unwrap_or(""));
                        let named: Vec<String> = match group {
                            Some(g) => g
                                .split(',')
                                .map(|n| n.trim().split("::").next().unwrap_or("").to_owned())
                                .collect(),
                            None => vec![rest
                                .chars()
                                .take_while(|c| c.is_alphanumeric() || *c == '_')
                                .collect()],
                        };
                        for n in named {
                            if n != *child && names.contains(&n) {
                                out.insert(n);
                            }
                        }
                    }
                }
            }
        }
    }
    edges
}

/// Every directory of `src/` that holds modules.
fn module_dirs() -> Vec<std::path::PathBuf> {
    fn walk(d: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.push(p.clone());
                walk(&p, out);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&src, &mut out);
    out
}

#[test]
fn inside_every_module_the_children_form_a_one_way_graph() {
    // The top level is checked above; here every directory: shared data lives in leaf
    // modules, so no two siblings need each other.
    let dirs = module_dirs();
    assert!(dirs.iter().any(|d| d.ends_with("consumer")), "{dirs:?}");
    let consumer = child_edges(
        &dirs
            .iter()
            .find(|d| d.ends_with("consumer"))
            .unwrap()
            .clone(),
    );
    assert!(
        consumer
            .get("process")
            .is_some_and(|e| e.contains("envelope")),
        "the scan sees edges: {consumer:?}"
    );
    let mut cycles = Vec::new();
    for d in &dirs {
        let edges = child_edges(d);
        if let Some(c) = cycle(&edges) {
            cycles.push(format!("{}: {}", d.display(), c.join(" -> ")));
        }
    }
    assert!(
        cycles.is_empty(),
        "cycles inside modules:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_directory_check_finds_a_planted_cycle() {
    // Planted in the edges of a real directory: `envelope` (a leaf) pointing back at `process`.
    let d = module_dirs()
        .into_iter()
        .find(|d| d.ends_with("consumer"))
        .unwrap();
    let mut edges = child_edges(&d);
    edges
        .entry("envelope".into())
        .or_default()
        .insert("process".into());
    assert!(cycle(&edges).is_some());
}

#[test]
fn no_two_public_types_share_a_name() {
    // Two public structs, enums or traits of one name (the old `Status` twice) make a user's
    // `use` ambiguous; re-exports of one item are fine, as they are `pub use` lines.
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, text) in src_files() {
        // `moved.rs` holds the deprecated aliases of renamed items: each is the item itself
        // under its published name, not a second type.
        if path.starts_with("crates/") || path.ends_with("/moved.rs") {
            continue;
        }
        for line in text.lines() {
            for kind in ["pub struct ", "pub enum ", "pub trait ", "pub type "] {
                if let Some(rest) = line.trim_start().strip_prefix(kind) {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    seen.entry(name).or_default().push(path.clone());
                }
            }
        }
    }
    let dup: Vec<String> = seen
        .into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(k, v)| format!("{k}: {}", v.join(", ")))
        .collect();
    assert!(dup.is_empty(), "{}", dup.join("\n"));
}

#[test]
fn the_module_map_in_lib_rs_names_every_source_file() {
    // The `//! # Layout` map is how a reader finds code: a file it does not name is a file
    // nobody finds. Top-level modules are named as `module`; files inside one by file name.
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let map: String = lib
        .lines()
        .skip_while(|l| !l.starts_with("//! # Layout"))
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!map.is_empty(), "src/lib.rs has no `//! # Layout` section");
    let mut missing = Vec::new();
    for (rel, _) in src_files()
        .into_iter()
        .filter(|(p, _)| p.starts_with("/src/") || p.starts_with("src/"))
    {
        let rel = rel
            .trim_start_matches('/')
            .trim_start_matches("src/")
            .to_owned();
        let parts: Vec<&str> = rel.split('/').collect();
        let named = match parts.as_slice() {
            ["lib.rs"] => true,
            [file] => map.contains(&format!("`{}`", file.trim_end_matches(".rs"))),
            [dir, "mod.rs"] => map.contains(&format!("`{dir}`")),
            [.., file] => map.contains(*file),
            [] => true,
        };
        if !named {
            missing.push(rel);
        }
    }
    assert!(
        missing.is_empty(),
        "files the lib.rs layout map does not name:\n{}",
        missing.join("\n")
    );
}
