//! The registry client: the few calls of Confluent's Schema Registry API the library needs
//! (Apicurio Registry serves them at `/apis/ccompat/v7`), over plain HTTP/1.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::{Format, SchemaError};

/// How long one registry call may take before the registry counts as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// A schema as the registry returns it.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The registry's global id.
    pub id: u32,
    /// The subject's version (0 when fetched by id).
    pub version: i32,
    /// The format (`schemaType`; absent means Avro).
    pub format: Format,
    /// The schema text.
    pub schema: String,
}

#[derive(Deserialize)]
struct SchemaBody {
    #[serde(default)]
    id: Option<u32>,
    #[serde(default)]
    version: Option<i32>,
    #[serde(default, rename = "schemaType")]
    schema_type: Option<String>,
    schema: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

/// A registry at one base URL (`http://host:port/apis/ccompat/v7` for Apicurio).
#[derive(Clone)]
pub struct RegistryClient {
    base: String,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("base", &self.base)
            .finish()
    }
}

fn encode_subject(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl RegistryClient {
    /// A client for the registry at `base` (plain `http://`).
    ///
    /// # Errors
    /// [`SchemaError::Config`] for a URL that is not `http://…`.
    pub fn new(base: &str) -> Result<Self, SchemaError> {
        let base = base.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            return Err(SchemaError::Config(format!(
                "schema registry URL {base:?}: only http:// is supported (put a TLS proxy in front for https)"
            )));
        }
        base.parse::<hyper::Uri>()
            .map_err(|e| SchemaError::Config(format!("schema registry URL {base:?}: {e}")))?;
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        Ok(Self { base, http })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Bytes, SchemaError> {
        let uri = format!("{}{path}", self.base);
        let req = hyper::Request::builder()
            .method(method)
            .uri(&uri)
            .header("accept", CONTENT_TYPE)
            .header("content-type", CONTENT_TYPE)
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .map_err(|e| SchemaError::Config(format!("{uri}: {e}")))?;
        let call = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| SchemaError::Unavailable(format!("{uri}: {e}")))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| SchemaError::Unavailable(format!("{uri}: {e}")))?
                .to_bytes();
            Ok::<_, SchemaError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| {
                SchemaError::Unavailable(format!("{uri}: no answer in {CALL_TIMEOUT:?}"))
            })??;
        if status.is_success() {
            return Ok(bytes);
        }
        let e: ErrorBody = serde_json::from_slice(&bytes).unwrap_or(ErrorBody {
            error_code: i64::from(status.as_u16()),
            message: String::from_utf8_lossy(&bytes).chars().take(300).collect(),
        });
        if status.is_server_error() {
            return Err(SchemaError::Unavailable(format!(
                "{uri}: HTTP {status}: {}",
                e.message
            )));
        }
        Err(SchemaError::Registry {
            status: status.as_u16(),
            code: e.error_code,
            message: e.message,
        })
    }

    fn parse(bytes: &[u8], id: Option<u32>) -> Result<Registered, SchemaError> {
        let b: SchemaBody = serde_json::from_slice(bytes).map_err(|e| {
            SchemaError::Unavailable(format!("registry answer is not a schema: {e}"))
        })?;
        Ok(Registered {
            id: b
                .id
                .or(id)
                .ok_or_else(|| SchemaError::Unavailable("registry answer without an id".into()))?,
            version: b.version.unwrap_or(0),
            format: Format::of_schema_type(b.schema_type.as_deref())?,
            schema: b.schema,
        })
    }

    /// The latest version of `subject`.
    ///
    /// # Errors
    /// [`SchemaError::Registry`] (40401: no such subject), [`SchemaError::Unavailable`].
    pub async fn latest(&self, subject: &str) -> Result<Registered, SchemaError> {
        let b = self
            .call(
                hyper::Method::GET,
                &format!("/subjects/{}/versions/latest", encode_subject(subject)),
                None,
            )
            .await?;
        Self::parse(&b, None)
    }

    /// The schema with global id `id`.
    ///
    /// # Errors
    /// [`SchemaError::Registry`] (40403: no such id), [`SchemaError::Unavailable`].
    pub async fn by_id(&self, id: u32) -> Result<Registered, SchemaError> {
        let b = self
            .call(hyper::Method::GET, &format!("/schemas/ids/{id}"), None)
            .await?;
        Self::parse(&b, Some(id))
    }

    fn body(format: Format, schema: &str) -> serde_json::Value {
        let mut b = serde_json::json!({ "schema": schema });
        if let Some(t) = format.schema_type() {
            b["schemaType"] = t.into();
        }
        b
    }

    /// Registers `schema` under `subject` (the same schema again returns its id); the
    /// registry refuses one its compatibility rule forbids (409).
    ///
    /// # Errors
    /// [`SchemaError::Registry`] (409 incompatible, 422 invalid), [`SchemaError::Unavailable`].
    pub async fn register(
        &self,
        subject: &str,
        format: Format,
        schema: &str,
    ) -> Result<u32, SchemaError> {
        #[derive(Deserialize)]
        struct Id {
            id: u32,
        }
        let b = self
            .call(
                hyper::Method::POST,
                &format!("/subjects/{}/versions", encode_subject(subject)),
                Some(Self::body(format, schema)),
            )
            .await?;
        serde_json::from_slice::<Id>(&b)
            .map(|i| i.id)
            .map_err(|e| SchemaError::Unavailable(format!("registry answer without an id: {e}")))
    }

    /// Whether `schema` may become the next version of `subject` under the registry's
    /// compatibility rule; `None` when the subject does not exist yet (anything goes).
    ///
    /// # Errors
    /// [`SchemaError::Registry`] (422 invalid schema), [`SchemaError::Unavailable`].
    pub async fn compatible(
        &self,
        subject: &str,
        format: Format,
        schema: &str,
    ) -> Result<Option<bool>, SchemaError> {
        #[derive(Deserialize)]
        struct Compat {
            is_compatible: bool,
        }
        let r = self
            .call(
                hyper::Method::POST,
                &format!(
                    "/compatibility/subjects/{}/versions/latest",
                    encode_subject(subject)
                ),
                Some(Self::body(format, schema)),
            )
            .await;
        match r {
            Ok(b) => serde_json::from_slice::<Compat>(&b)
                .map(|c| Some(c.is_compatible))
                .map_err(|e| SchemaError::Unavailable(format!("registry answer: {e}"))),
            Err(SchemaError::Registry { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn subjects_are_escaped() {
        assert_eq!(
            super::encode_subject("orders.created-value"),
            "orders.created-value"
        );
        assert_eq!(super::encode_subject("a/b c"), "a%2Fb%20c");
    }
}
