//! Schema files in a directory, for `outbox schemas register DIR` and `outbox schemas check
//! DIR`: each file is one subject, named by the file's stem, its format by its extension
//! (`orders.created-value.avsc`, `payments.captured-value.proto`, `orders.noted-value.json`).

use std::path::{Path, PathBuf};

use super::{Compiled, Format, RegistryClient, SchemaError};

/// One schema file.
#[derive(Debug, Clone)]
pub struct SchemaFile {
    /// The file.
    pub path: PathBuf,
    /// The subject (the file's stem).
    pub subject: String,
    /// The format (the extension).
    pub format: Format,
    /// The schema text.
    pub text: String,
}

/// What happened to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileVerdict {
    /// Registered (or already there) with this id.
    Registered(u32),
    /// Compatible with the subject's latest version under the registry's rule.
    Compatible,
    /// The subject does not exist yet: the schema would become version 1.
    New,
    /// The registry's rule refuses it (or its message).
    Incompatible(String),
    /// The file does not compile, or the registry cannot take it.
    Invalid(String),
}

impl FileVerdict {
    /// True for the verdicts a CI check fails on.
    pub fn fails(&self) -> bool {
        matches!(self, Self::Incompatible(_) | Self::Invalid(_))
    }
}

/// Reads every `.avsc`, `.proto` and `.json` file of `dir` (not recursive), sorted by name;
/// each one is compiled locally first, so a syntax error is found without the registry.
///
/// # Errors
/// [`SchemaError::Config`] when the directory cannot be read or holds no schema file.
pub fn read_dir(dir: &Path) -> Result<Vec<(SchemaFile, Option<SchemaError>)>, SchemaError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| SchemaError::Config(format!("cannot read {}: {e}", dir.display())))?;
    let mut out = Vec::new();
    for e in entries {
        let path = e
            .map_err(|e| SchemaError::Config(format!("cannot read {}: {e}", dir.display())))?
            .path();
        let (Some(stem), Some(format)) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension()
                .and_then(|s| s.to_str())
                .and_then(Format::of_extension),
        ) else {
            continue;
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| SchemaError::Config(format!("cannot read {}: {e}", path.display())))?;
        let local = Compiled::new(0, format, &text).err();
        out.push((
            SchemaFile {
                subject: stem.to_owned(),
                path,
                format,
                text,
            },
            local,
        ));
    }
    if out.is_empty() {
        return Err(SchemaError::Config(format!(
            "{}: no .avsc, .proto or .json schema file",
            dir.display()
        )));
    }
    out.sort_by(|a, b| a.0.path.cmp(&b.0.path));
    Ok(out)
}

/// Checks (`register == false`) or registers each file of `dir`.
///
/// # Errors
/// [`SchemaError::Config`] as [`read_dir`]; [`SchemaError::Unavailable`] when the registry
/// cannot be reached (a CI check must not pass on silence).
pub async fn run(
    client: &RegistryClient,
    dir: &Path,
    register: bool,
) -> Result<Vec<(SchemaFile, FileVerdict)>, SchemaError> {
    let mut out = Vec::new();
    for (file, local) in read_dir(dir)? {
        if let Some(e) = local {
            out.push((file, FileVerdict::Invalid(e.to_string())));
            continue;
        }
        let verdict = if register {
            match client
                .register(&file.subject, file.format, &file.text)
                .await
            {
                Ok(id) => FileVerdict::Registered(id),
                Err(SchemaError::Registry {
                    status: 409,
                    message,
                    ..
                }) => FileVerdict::Incompatible(message),
                Err(e @ SchemaError::Registry { .. }) => FileVerdict::Invalid(e.to_string()),
                Err(e) => return Err(e),
            }
        } else if match client.latest(&file.subject).await {
            // Only the registry's own "no such subject" (or "no version") means new; any
            // other 404 — an HTML page, a wrong base path, another API — is a wrong URL and
            // fails the check instead of passing it on silence.
            Err(e) if RegistryClient::subject_missing(&e) => true,
            Err(SchemaError::Registry {
                status: 404,
                code,
                message,
            }) => return Err(client.wrong_url(code, &message)),
            _ => false,
        } {
            // Asked first: some registries answer "compatible" for a subject they lack.
            FileVerdict::New
        } else {
            match client
                .compatible(&file.subject, file.format, &file.text)
                .await
            {
                Ok(Some(true)) => FileVerdict::Compatible,
                Ok(Some(false)) => FileVerdict::Incompatible(
                    "the registry's compatibility rule refuses it as the next version".into(),
                ),
                Ok(None) => FileVerdict::New,
                Err(e @ SchemaError::Registry { .. }) => FileVerdict::Invalid(e.to_string()),
                Err(e) => return Err(e),
            }
        };
        out.push((file, verdict));
    }
    Ok(out)
}
