//! The public API as a user's `use` lines meet it: every path to every public item, from
//! rustdoc's JSON (`cargo rustdoc --output-format json`, with the `sqlx` and `schemas`
//! features), compared with the listing committed in `docs/public-api.txt`. A change to the
//! API shows as a diff of that file, which the change must carry: rerun with
//! `OUTBOX_BLESS_API=1` to rewrite it. Each item is reachable by one path (deprecated aliases
//! of renamed items aside), and the crate root re-exports no more than it does today.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Re-exports at the crate root: what a service uses (its configuration, enqueue, the relay,
/// migrations, cleanup); the rest lives in its module, defaults as associated constants of
/// the types they configure.
const ROOT_REEXPORTS_AT_MOST: usize = 30;

fn rustdoc_json() -> Value {
    let root = env!("CARGO_MANIFEST_DIR");
    // JSON output is unstable: rustdoc alone is told it may use it, through a wrapper. With
    // RUSTC_BOOTSTRAP in cargo's own environment the build scripts that watch it (proc-macro2's)
    // would rerun, and every crate above them would be rebuilt here and again by the next build
    // without it: 45 s here and 81 s for the doc tests after it, in one clean-clone run.
    let wrapper = std::env::temp_dir().join(format!("outbox-rustdoc-json-{}", std::process::id()));
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nRUSTC_BOOTSTRAP=1 exec rustdoc \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .env("RUSTDOC", &wrapper)
        .args([
            "rustdoc",
            "--lib",
            "-p",
            "outbox",
            "--features",
            "sqlx,schemas",
            "--",
        ])
        .args(["-Z", "unstable-options", "--output-format", "json"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&wrapper);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| format!("{root}/target"));
    serde_json::from_slice(&std::fs::read(Path::new(&target).join("doc/outbox.json")).unwrap())
        .unwrap()
}

/// One way to name a public item.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Named {
    path: String,
    kind: String,
    reexport: bool,
    deprecated: bool,
}

/// Every public path, by the item it names (the item's id, or the source of an external
/// re-export).
fn paths(doc: &Value) -> BTreeMap<String, Vec<Named>> {
    fn kind(it: &Value) -> String {
        it["inner"]
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .unwrap_or_default()
    }
    fn walk(
        doc: &Value,
        module: &Value,
        path: &[String],
        deprecated: bool,
        seen: &mut BTreeSet<String>,
        out: &mut BTreeMap<String, Vec<Named>>,
    ) {
        let index = &doc["index"];
        for child in module["inner"]["module"]["items"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let c = &index[child.to_string()];
            if c["visibility"] != "public" {
                continue;
            }
            let dep = deprecated || !c["deprecation"].is_null();
            let at = |name: &str| [path, &[name.to_owned()]].concat();
            match kind(c).as_str() {
                "use" => {
                    let u = &c["inner"]["use"];
                    let target = u["id"].to_string();
                    let t = &index[&target];
                    if u["is_glob"] == true {
                        if kind(t) == "module"
                            && seen.insert(format!("{target}@{}", path.join("::")))
                        {
                            walk(doc, t, path, dep, seen, out);
                        }
                        continue;
                    }
                    let name = u["name"].as_str().unwrap_or_default();
                    if kind(t) == "module" {
                        if seen.insert(format!("{target}@{name}")) {
                            walk(doc, t, &at(name), dep, seen, out);
                        }
                        continue;
                    }
                    let key = if t.is_null() {
                        format!("extern {}", u["source"])
                    } else {
                        target
                    };
                    out.entry(key).or_default().push(Named {
                        path: at(name).join("::"),
                        kind: if t.is_null() {
                            "extern".into()
                        } else {
                            kind(t)
                        },
                        reexport: true,
                        deprecated: dep,
                    });
                }
                "module" => walk(doc, c, &at(c["name"].as_str().unwrap()), dep, seen, out),
                k => out.entry(child.to_string()).or_default().push(Named {
                    path: at(c["name"].as_str().unwrap_or_default()).join("::"),
                    kind: k.to_owned(),
                    reexport: false,
                    deprecated: dep,
                }),
            }
        }
    }
    let root = &doc["index"][doc["root"].to_string()];
    let mut out = BTreeMap::new();
    walk(
        doc,
        root,
        &["outbox".to_owned()],
        false,
        &mut BTreeSet::new(),
        &mut out,
    );
    out
}

#[test]
fn the_public_api_is_the_listed_one_and_each_item_has_one_path() {
    let doc = rustdoc_json();
    let by_item = paths(&doc);
    let mut lines: Vec<String> = by_item
        .values()
        .flatten()
        .map(|n| {
            format!(
                "{} {}{}",
                n.path,
                n.kind,
                if n.deprecated { " (deprecated)" } else { "" }
            )
        })
        .collect();
    lines.sort();
    assert!(
        lines.iter().any(|l| l == "outbox::Message struct"),
        "the walk sees the root: {lines:?}"
    );
    let listing = format!(
        "# Every public path of the `outbox` crate (features sqlx, schemas), written by\n\
         # tests/ops/api.rs: OUTBOX_BLESS_API=1 cargo test --test ops api:: rewrites it.\n{}\n",
        lines.join("\n")
    );
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/public-api.txt");
    if std::env::var_os("OUTBOX_BLESS_API").is_some() {
        std::fs::write(&file, &listing).unwrap();
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    if committed != listing {
        let old: BTreeSet<&str> = committed.lines().collect();
        let new: BTreeSet<&str> = listing.lines().collect();
        let gone: Vec<&&str> = old.difference(&new).collect();
        let added: Vec<&&str> = new.difference(&old).collect();
        panic!(
            "the public API changed; if that is meant, rewrite docs/public-api.txt with \
             OUTBOX_BLESS_API=1 and commit it.\nremoved: {gone:#?}\nadded: {added:#?}"
        );
    }
    // One path per item: a second, non-deprecated path is a re-export to remove.
    let twice: Vec<String> = by_item
        .values()
        .filter(|ns| ns.iter().filter(|n| !n.deprecated).count() > 1)
        .map(|ns| {
            ns.iter()
                .map(|n| n.path.clone())
                .collect::<Vec<_>>()
                .join(" = ")
        })
        .collect();
    assert!(
        twice.is_empty(),
        "items reachable by two paths:\n{}",
        twice.join("\n")
    );
    let root = by_item
        .values()
        .flatten()
        .filter(|n| n.reexport && !n.deprecated && n.path.matches("::").count() == 1)
        .count();
    assert!(
        root <= ROOT_REEXPORTS_AT_MOST,
        "the crate root re-exports {root} items (at most {ROOT_REEXPORTS_AT_MOST})"
    );
}
