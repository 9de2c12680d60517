//! `outbox schemas`: schema files as code. `check DIR` asks the registry whether each file
//! may become its subject's next version (exit 1 when one may not: a CI gate);
//! `register DIR` registers them.

use std::io::Write;

use clap::{Args as ClapArgs, Subcommand};
use outbox::schemas::files::FileVerdict;

use crate::args::UsageError;

/// Schema files (one subject each, named by the file: `orders.created-value.avsc`).
#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    action: SchemasAction,
}

#[derive(Subcommand)]
enum SchemasAction {
    /// Check each schema file against its subject under the registry's compatibility rule;
    /// exit 1 when any is incompatible or invalid.
    Check(DirArgs),
    /// Register each schema file as its subject's next version (a schema already there keeps
    /// its id); exit 1 when the registry refuses any.
    Register(DirArgs),
}

#[derive(ClapArgs)]
struct DirArgs {
    /// The directory of `.avsc`, `.proto` and `.json` (JSON Schema) files.
    dir: std::path::PathBuf,
    /// The registry's Confluent-compatible API, e.g. http://127.0.0.1:18081/apis/ccompat/v7.
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    schema_registry_url: String,
}

/// One or more files the registry refused.
#[derive(Debug, thiserror::Error)]
#[error("{0} schema file(s) refused")]
struct Refused(usize);

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let (a, register) = match args.action {
        SchemasAction::Check(a) => (a, false),
        SchemasAction::Register(a) => (a, true),
    };
    crate::redact::register_url(&a.schema_registry_url);
    let client = outbox::schemas::RegistryClient::new(&a.schema_registry_url)
        .map_err(|e| UsageError(e.to_string()))?;
    let results = outbox::schemas::files::run(&client, &a.dir, register)
        .await
        .map_err(|e| match e {
            outbox::schemas::SchemaError::Config(c) => anyhow::Error::new(UsageError(c)),
            e => anyhow::Error::new(e),
        })?;
    let mut refused = 0;
    for (f, v) in &results {
        let name = f
            .path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let line = match v {
            FileVerdict::Registered(id) => {
                format!("registered   {} (id {id}) from {name}", f.subject)
            }
            FileVerdict::Compatible => format!("compatible   {} from {name}", f.subject),
            FileVerdict::New => format!("new subject  {} from {name}", f.subject),
            FileVerdict::Incompatible(why) => {
                format!("INCOMPATIBLE {} from {name}: {why}", f.subject)
            }
            FileVerdict::Invalid(why) => format!("INVALID      {} from {name}: {why}", f.subject),
        };
        writeln!(out, "{line}")?;
        refused += usize::from(v.fails());
    }
    if refused > 0 {
        return Err(Refused(refused).into());
    }
    Ok(())
}
