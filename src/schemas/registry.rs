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
/// The largest registry answer read: a schema is kilobytes; anything past this is refused
/// rather than held in memory (a wrong or hostile URL could stream without end).
pub const MAX_ANSWER: usize = 4 * 1024 * 1024;
/// The most of a registry's error text quoted in an error (printed once, control characters
/// escaped).
const MAX_ERROR_TEXT: usize = 300;
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
    /// Without credentials: this is what errors and logs show.
    base: String,
    /// `Basic …` from the URL's `user:password@`, sent on every call and never shown.
    auth: Option<hyper::header::HeaderValue>,
    http: Client<HttpConnector, Full<Bytes>>,
}

/// `text` cut to [`MAX_ERROR_TEXT`] characters with control characters escaped: a registry's
/// text (or whatever answers at a wrong URL) is quoted, never obeyed.
fn quoted(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == MAX_ERROR_TEXT {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `url` with anything between `://` and the last `@` (credentials, however malformed) shown
/// as `…`: for messages about a URL that may carry a password.
pub(crate) fn shown_url(url: &str) -> String {
    match userinfo_span(url) {
        Some((s, at)) => format!("{}…{}", &url[..s], &url[at..]),
        None => url.to_owned(),
    }
}

/// Where a URL's credentials are: from just after `://` to the last `@` (a host and path hold
/// no `@`, and a typed password may hold a raw `/`, `?` or `#`).
fn userinfo_span(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let at = url.rfind('@').filter(|at| *at > start)?;
    Some((start, at))
}

/// The secrets a URL carries, for a process that cleans what it prints: the whole
/// `user:password`, and the password raw and percent-decoded.
pub fn url_secrets(url: &str) -> Vec<String> {
    let Some((start, at)) = userinfo_span(url) else {
        return Vec::new();
    };
    let userinfo = &url[start..at];
    let password = userinfo.split_once(':').map_or("", |(_, p)| p);
    let decoded = percent_decode(password).unwrap_or_default();
    vec![userinfo.to_owned(), password.to_owned(), decoded]
}

/// Splits `http://user:pw@host/…` into the URL without `user:pw@` and a Basic auth value.
fn split_userinfo(url: &str) -> Result<(String, Option<hyper::header::HeaderValue>), SchemaError> {
    use base64::Engine as _;
    let span = userinfo_span(url).filter(|_| url.starts_with("http://"));
    let Some((start, at)) = span else {
        return Ok((url.to_owned(), None));
    };
    let userinfo = &url[start..at];
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |s: &str| -> Result<String, SchemaError> {
        percent_decode(s).ok_or_else(|| {
            SchemaError::Config(
                "schema registry URL: its user:password part is not valid percent-encoding (not shown)"
                    .into(),
            )
        })
    };
    let token = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        decode(user)?,
        decode(pass)?
    ));
    let mut value =
        hyper::header::HeaderValue::from_str(&format!("Basic {token}")).map_err(|_| {
            SchemaError::Config("schema registry URL: bad credentials (not shown)".into())
        })?;
    value.set_sensitive(true);
    Ok((format!("http://{}", &url[at + 1..]), Some(value)))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("base", &self.base)
            .finish()
    }
}

pub(crate) use crate::config::UNRESERVED;

fn encode_subject(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

impl RegistryClient {
    /// A client for the registry at `base` (plain `http://`).
    ///
    /// # Errors
    /// [`SchemaError::Config`] for a URL that is not `http://…`.
    ///
    /// Credentials in the URL (`http://user:password@host:port/…`, percent-encoded as in any
    /// URL) are sent as HTTP Basic authentication and never shown: [`Self::url`], errors and
    /// `Debug` name the URL without them.
    pub fn new(base: &str) -> Result<Self, SchemaError> {
        let (base, auth) = split_userinfo(base.trim())?;
        let base = base.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            // The scheme alone: anything after it may hold credentials.
            let scheme: String = base.chars().take_while(|c| *c != ':').take(10).collect();
            return Err(SchemaError::Config(format!(
                "schema registry URL ({scheme}:…): only http:// is supported (put a TLS proxy in front for https)"
            )));
        }
        base.parse::<hyper::Uri>().map_err(|e| {
            SchemaError::Config(format!("schema registry URL {:?}: {e}", shown_url(&base)))
        })?;
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        Ok(Self { base, auth, http })
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
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(&uri)
            .header("accept", CONTENT_TYPE)
            .header("content-type", CONTENT_TYPE);
        if let Some(a) = &self.auth {
            req = req.header(hyper::header::AUTHORIZATION, a.clone());
        }
        let req = req
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
            // Read at most MAX_ANSWER bytes, whatever the answer's length says.
            let bytes = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        SchemaError::Unavailable(format!(
                            "{uri}: the answer is larger than {} MiB: is this a schema registry?",
                            MAX_ANSWER >> 20
                        ))
                    } else {
                        SchemaError::Unavailable(format!("{uri}: {e}"))
                    }
                })?
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
        // A registry's error is JSON with an `error_code` (40401, 40403, 42201…); anything
        // else (an HTML 404, a proxy's page) is not the registry speaking: code 0.
        let e: ErrorBody = serde_json::from_slice(&bytes)
            .ok()
            .filter(|e: &ErrorBody| e.error_code != 0)
            .unwrap_or(ErrorBody {
                error_code: 0,
                message: String::from_utf8_lossy(&bytes).into_owned(),
            });
        let message = quoted(&e.message);
        if status.is_server_error() {
            return Err(SchemaError::Unavailable(format!(
                "{uri}: HTTP {status}: {message}"
            )));
        }
        Err(SchemaError::Registry {
            status: status.as_u16(),
            code: e.error_code,
            message,
        })
    }

    pub(crate) fn parse(bytes: &[u8], id: Option<u32>) -> Result<Registered, SchemaError> {
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
            // Only the registry's own "no such subject" means new; a 404 without it (an HTML
            // page, another API's 404, a wrong base path) is a wrong URL, never "anything goes".
            Err(SchemaError::Registry {
                status: 404,
                code: SUBJECT_NOT_FOUND,
                ..
            }) => Ok(None),
            Err(SchemaError::Registry {
                status: 404,
                code,
                message,
            }) if code != VERSION_NOT_FOUND => Err(self.wrong_url(code, &message)),
            Err(SchemaError::Registry {
                status: 404,
                code: VERSION_NOT_FOUND,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl RegistryClient {
    /// A 404 that is not the registry's "no such subject": the base URL points elsewhere.
    pub(super) fn wrong_url(&self, code: i64, message: &str) -> SchemaError {
        SchemaError::Config(format!(
            "{}: HTTP 404 without the registry's \"subject not found\" (40401){}: is this the \
             base URL of a Confluent-compatible registry API (Apicurio: …/apis/ccompat/v7)?",
            self.base,
            if code == 0 {
                String::new()
            } else {
                format!(", error code {code}: {message}")
            }
        ))
    }

    /// Whether `e` is the registry saying the subject has no schema (40401, or 40402 for a
    /// subject whose versions were all deleted).
    pub(super) fn subject_missing(e: &SchemaError) -> bool {
        matches!(e, SchemaError::Registry { status: 404, code, .. }
            if *code == SUBJECT_NOT_FOUND || *code == VERSION_NOT_FOUND)
    }
}

/// Confluent's error code for a subject the registry does not hold.
pub const SUBJECT_NOT_FOUND: i64 = 40401;
/// Confluent's error code for a version the subject does not have (a subject whose versions
/// were all deleted answers so).
const VERSION_NOT_FOUND: i64 = 40402;

#[cfg(test)]
mod tests {
    #[test]
    fn url_credentials_become_basic_auth_and_are_never_shown() {
        let c = super::RegistryClient::new("http://us%3Aer:p%40ss@127.0.0.1:1/apis/ccompat/v7/")
            .unwrap();
        assert_eq!(c.url(), "http://127.0.0.1:1/apis/ccompat/v7");
        assert!(!format!("{c:?}").contains("p%40ss"));
        let a = c.auth.as_ref().unwrap();
        // base64("us:er:p@ss")
        assert_eq!(a.to_str().unwrap(), "Basic dXM6ZXI6cEBzcw==");
        let e = super::RegistryClient::new("https://u:hunter2@h:1").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        // A raw `/` or `#` in a password is still credentials, never quoted.
        for url in [
            "http://u:pa/ss@h:1/x",
            "http://u:pa#ss@h:1",
            "http://u:p@ss@h:notaport",
        ] {
            match super::RegistryClient::new(url) {
                Ok(c) => {
                    assert!(c.auth.is_some(), "{url}");
                    assert!(!c.url().contains("pa"), "{url}: {}", c.url());
                }
                Err(e) => assert!(!e.to_string().contains("ss"), "{url}: {e}"),
            }
        }
        let cfg = crate::schemas::SchemaConfig::from_topics_toml(
            "http://u:hunter2@h:1/x",
            "[[topic]]\nname = \"a.b\"\n",
        )
        .unwrap();
        assert!(!format!("{cfg:?}").contains("hunter2"));
        let plain = super::RegistryClient::new("http://h:1/x").unwrap();
        assert!(plain.auth.is_none());
    }

    #[test]
    fn quoted_error_text_is_short_and_inert() {
        let q = super::quoted(&format!("\u{1b}[2J{}", "x".repeat(10_000)));
        assert!(q.starts_with("\\u{1b}[2J"), "{q}");
        assert!(q.chars().count() <= 310);
    }

    #[test]
    fn subjects_are_escaped() {
        assert_eq!(
            super::encode_subject("orders.created-value"),
            "orders.created-value"
        );
        assert_eq!(super::encode_subject("a/b c"), "a%2Fb%20c");
    }
}
