//! Schemas: per-topic payload formats in the Confluent wire format through a schema registry
//! that speaks Confluent's API (Apicurio Registry serves it at `/apis/ccompat/v7`).
//!
//! Payloads stay JSON in the outbox table. For a topic declared with a format:
//! - [`Enqueuer::with_schemas`](crate::Enqueuer::with_schemas) checks the payload against the
//!   subject's latest schema **inside the producing transaction**, before anything is written:
//!   a broken contract is an [`EnqueueError::Schema`](crate::EnqueueError::Schema) and the
//!   business transaction can roll back;
//! - the relay encodes the row's JSON into the format and frames it (magic byte, schema id,
//!   Protobuf message indexes; [`frame`]);
//! - the consumer decodes a framed record before dispatch: `Delivered::body` is the JSON view,
//!   `Delivered::payload` the raw bytes, `Delivered::schema_id` the id.
//!
//! ```toml
//! # topics.toml
//! [[topic]]
//! name = "orders.created"
//! format = "avro"            # json (default) | json-schema | avro | protobuf
//! subject = "topic"          # <topic>-value (default) | "record": the record's full name |
//!                            # "topic-record": <topic>-<record>
//! record = "com.acme.OrderCreated"   # with subject = "record" / "topic-record"
//! ```
//!
//! Schemas by subject are cached and refreshed every [`SchemaConfig::refresh`] (a stale
//! schema is kept while the registry is unreachable); schemas by id are immutable and cached
//! for good. How each format maps JSON: [`avro`](self#avro), Protobuf's JSON mapping, JSON
//! Schema as is — see docs/SCHEMAS.md.
//!
//! # Avro
//! The JSON rules for Avro (unions, bytes, decimals, logical types) are in the table of the
//! `avro` module: a union value is given plainly or as `{"<branch>": value}`, bytes as a
//! string of code points 0–255, a decimal as a number or a decimal string.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

mod avro;
mod binary;
pub mod files;
pub mod frame;
mod json_schema;
#[cfg(test)]
pub(crate) mod probe;
mod protobuf;
mod registry;

pub use registry::{url_secrets, Registered, RegistryClient};

/// How often a subject's latest schema is fetched again (a new version takes effect within
/// this bound).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);

/// Why a schema operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The registry could not be reached, timed out or answered 5xx: nothing is wrong with
    /// the message; try again later.
    #[error("schema registry unavailable: {0}")]
    Unavailable(String),
    /// The registry refused the request (no such subject or id, an invalid or incompatible
    /// schema), with its error code.
    #[error("schema registry: HTTP {status}, error {code}: {message}")]
    Registry {
        /// HTTP status.
        status: u16,
        /// The registry's `error_code` (40401 no subject, 40403 no id, 409 incompatible, 42201 invalid).
        code: i64,
        /// The registry's message.
        message: String,
    },
    /// The payload breaks the schema (says where and how).
    #[error("payload does not match the schema: {0}")]
    Invalid(String),
    /// The schema itself cannot be used (does not compile, unsupported type).
    #[error("unusable schema: {0}")]
    Schema(String),
    /// A payload is not in the Confluent wire format.
    #[error("not a Confluent-framed payload: {0}")]
    Frame(String),
    /// Bad configuration (topics file, registry URL).
    #[error("schema configuration: {0}")]
    Config(String),
}

impl SchemaError {
    /// True when the registry is unreachable: the message is not at fault and nothing should
    /// be spent on it (the relay leaves the row pending, the consumer holds the record).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// A topic's payload format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Plain JSON, unframed (the default).
    Json,
    /// JSON validated by a JSON Schema, framed.
    JsonSchema,
    /// Avro binary, framed.
    Avro,
    /// Protobuf, framed with message indexes.
    Protobuf,
}

impl Format {
    /// The registry's `schemaType` (`None` for Avro, the registry's default).
    pub fn schema_type(self) -> Option<&'static str> {
        match self {
            Self::Avro | Self::Json => None,
            Self::JsonSchema => Some("JSON"),
            Self::Protobuf => Some("PROTOBUF"),
        }
    }

    fn of_schema_type(t: Option<&str>) -> Result<Self, SchemaError> {
        match t.map(str::to_ascii_uppercase).as_deref() {
            None | Some("AVRO") => Ok(Self::Avro),
            Some("JSON") => Ok(Self::JsonSchema),
            Some("PROTOBUF") => Ok(Self::Protobuf),
            Some(o) => Err(SchemaError::Schema(format!(
                "schemaType {o} is not supported"
            ))),
        }
    }

    /// The format a schema file's extension names: `.avsc`, `.proto`, `.json`.
    pub fn of_extension(ext: &str) -> Option<Self> {
        match ext {
            "avsc" => Some(Self::Avro),
            "proto" => Some(Self::Protobuf),
            "json" => Some(Self::JsonSchema),
            _ => None,
        }
    }
}

/// How a topic's subject is named (Confluent's subject name strategies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectNaming {
    /// `<topic>-value` (the default).
    Topic,
    /// The record's full name.
    Record(String),
    /// `<topic>-<record full name>`.
    TopicRecord(String),
}

/// A topic's format and subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSchema {
    /// The payload format.
    pub format: Format,
    /// The subject naming.
    pub naming: SubjectNaming,
}

impl TopicSchema {
    /// The registry subject of `topic`'s values.
    pub fn subject(&self, topic: &str) -> String {
        match &self.naming {
            SubjectNaming::Topic => format!("{topic}-value"),
            SubjectNaming::Record(r) => r.clone(),
            SubjectNaming::TopicRecord(r) => format!("{topic}-{r}"),
        }
    }
}

/// The schema settings: where the registry is, and each topic's format.
#[derive(Clone)]
pub struct SchemaConfig {
    /// The registry's base URL, e.g. `http://127.0.0.1:18081/apis/ccompat/v7`.
    pub registry_url: String,
    /// Topics with a format other than plain JSON.
    pub topics: BTreeMap<String, TopicSchema>,
    /// How often a subject's latest schema is fetched again.
    pub refresh: Duration,
}

#[derive(Deserialize)]
struct FileTopic {
    name: String,
    format: Option<Format>,
    subject: Option<String>,
    record: Option<String>,
}

#[derive(Deserialize, Default)]
struct FileDefaults {
    format: Option<Format>,
    subject: Option<String>,
}

#[derive(Deserialize)]
struct TopicsFile {
    #[serde(default)]
    defaults: FileDefaults,
    #[serde(default, rename = "topic")]
    topics: Vec<FileTopic>,
}

impl std::fmt::Debug for SchemaConfig {
    // The URL may carry credentials (`http://user:password@…`): shown without them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaConfig")
            .field("registry_url", &registry::shown_url(&self.registry_url))
            .field("topics", &self.topics)
            .field("refresh", &self.refresh)
            .finish()
    }
}

impl SchemaConfig {
    /// Formats from a topics file's text (`format`, `subject`, `record` of each `[[topic]]`,
    /// `format` and `subject` in `[defaults]`); other keys are `topics apply`'s.
    ///
    /// # Errors
    /// [`SchemaError::Config`] for malformed TOML, an unknown format or naming, or a record
    /// naming without `record`.
    pub fn from_topics_toml(registry_url: &str, text: &str) -> Result<Self, SchemaError> {
        let file: TopicsFile =
            toml::from_str(text).map_err(|e| SchemaError::Config(format!("topics file: {e}")))?;
        let mut topics = BTreeMap::new();
        for t in file.topics {
            let format = t.format.or(file.defaults.format).unwrap_or(Format::Json);
            if format == Format::Json {
                continue;
            }
            let naming = match (
                t.subject.as_deref().or(file.defaults.subject.as_deref()),
                t.record,
            ) {
                (None | Some("topic"), _) => SubjectNaming::Topic,
                (Some("record"), Some(r)) => SubjectNaming::Record(r),
                (Some("topic-record"), Some(r)) => SubjectNaming::TopicRecord(r),
                (Some(s @ ("record" | "topic-record")), None) => {
                    return Err(SchemaError::Config(format!(
                        "topic {}: subject = {s:?} needs record = \"<full record name>\"",
                        t.name
                    )))
                }
                (Some(s), _) => {
                    return Err(SchemaError::Config(format!(
                        "topic {}: subject {s:?} is not topic, record or topic-record",
                        t.name
                    )))
                }
            };
            topics.insert(t.name, TopicSchema { format, naming });
        }
        Ok(Self {
            registry_url: registry_url.to_owned(),
            topics,
            refresh: DEFAULT_REFRESH,
        })
    }

    /// As [`SchemaConfig::from_topics_toml`], reading the file.
    ///
    /// # Errors
    /// [`SchemaError::Config`] when the file cannot be read, or as `from_topics_toml`.
    pub fn from_topics_file(
        registry_url: &str,
        path: impl AsRef<std::path::Path>,
    ) -> Result<Self, SchemaError> {
        let p = path.as_ref();
        let text = std::fs::read_to_string(p)
            .map_err(|e| SchemaError::Config(format!("cannot read {}: {e}", p.display())))?;
        Self::from_topics_toml(registry_url, &text)
    }
}

/// A schema compiled for encoding and decoding.
#[derive(Debug)]
pub struct Compiled {
    /// The registry's id.
    pub id: u32,
    /// The format.
    pub format: Format,
    codec: Codec,
}

#[derive(Debug)]
enum Codec {
    Avro(avro::Avro),
    Protobuf(protobuf::Protobuf),
    JsonSchema(json_schema::JsonSchema),
}

impl Compiled {
    /// Compiles a schema's text.
    ///
    /// # Errors
    /// [`SchemaError::Schema`] when it does not compile.
    pub fn new(id: u32, format: Format, text: &str) -> Result<Self, SchemaError> {
        let codec = match format {
            Format::Avro => Codec::Avro(avro::Avro::parse(text)?),
            Format::Protobuf => Codec::Protobuf(protobuf::Protobuf::parse(text)?),
            Format::JsonSchema => Codec::JsonSchema(json_schema::JsonSchema::parse(text)?),
            Format::Json => return Err(SchemaError::Schema("plain json has no schema".into())),
        };
        Ok(Self { id, format, codec })
    }

    /// The full name of the schema's record (Avro's top-level named type, Protobuf's first
    /// message, JSON Schema's `title`), for record subject naming.
    pub fn record_name(&self) -> Option<String> {
        match &self.codec {
            Codec::Avro(a) => a.record_name(),
            Codec::Protobuf(p) => p.record_name(),
            Codec::JsonSchema(j) => j.record_name(),
        }
    }

    /// Checks `json` against the schema without keeping the encoding.
    ///
    /// # Errors
    /// [`SchemaError::Invalid`] naming where and how it breaks the schema.
    pub fn validate(&self, json: &serde_json::Value) -> Result<(), SchemaError> {
        match &self.codec {
            Codec::JsonSchema(j) => j.validate(json),
            _ => self.encode(json).map(drop),
        }
    }

    /// `json` encoded and framed (magic byte, id, message indexes for Protobuf).
    ///
    /// # Errors
    /// [`SchemaError::Invalid`] when `json` breaks the schema.
    pub fn encode(&self, json: &serde_json::Value) -> Result<Vec<u8>, SchemaError> {
        let mut out = frame::header(self.id, 256);
        match &self.codec {
            Codec::Avro(a) => a.encode(json, &mut out)?,
            Codec::Protobuf(p) => {
                let mut datum = Vec::with_capacity(256);
                let ix = p.encode(json, &mut datum)?;
                frame::put_indexes(&mut out, ix);
                out.extend_from_slice(&datum);
            }
            Codec::JsonSchema(j) => {
                j.validate(json)?;
                serde_json::to_writer(&mut out, json)
                    .map_err(|e| SchemaError::Invalid(e.to_string()))?;
            }
        }
        Ok(out)
    }

    /// [`Compiled::encode`] from the stored JSON text (the relay's path: Protobuf reads the
    /// text directly).
    ///
    /// # Errors
    /// [`SchemaError::Invalid`] when the text is not JSON or breaks the schema.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u8>, SchemaError> {
        if let Codec::Protobuf(p) = &self.codec {
            let mut out = frame::header(self.id, text.len());
            let mut datum = Vec::with_capacity(text.len());
            let ix = p.encode_text(text, &mut datum)?;
            frame::put_indexes(&mut out, ix);
            out.extend_from_slice(&datum);
            return Ok(out);
        }
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| SchemaError::Invalid(format!("stored payload is not JSON: {e}")))?;
        self.encode(&json)
    }

    /// The JSON view of a framed payload's datum (`rest`: what follows the 5-byte header).
    ///
    /// # Errors
    /// [`SchemaError::Invalid`] / [`SchemaError::Frame`] when the bytes do not decode.
    pub fn decode(&self, rest: &[u8]) -> Result<serde_json::Value, SchemaError> {
        match &self.codec {
            Codec::Avro(a) => a.decode(rest),
            Codec::Protobuf(p) => {
                let (ix, datum) = frame::take_indexes(rest)?;
                p.decode(&ix, datum)
            }
            Codec::JsonSchema(j) => {
                let v = serde_json::from_slice(rest)
                    .map_err(|e| SchemaError::Invalid(format!("body is not JSON: {e}")))?;
                j.validate(&v)?;
                Ok(v)
            }
        }
    }
}

/// A framed payload decoded.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The JSON view.
    pub json: serde_json::Value,
    /// The schema id the payload names.
    pub schema_id: u32,
}

struct Latest {
    compiled: Arc<Compiled>,
    fetched: Instant,
}

struct Inner {
    config: SchemaConfig,
    client: RegistryClient,
    by_subject: Mutex<HashMap<String, Latest>>,
    by_id: Mutex<HashMap<u32, Arc<Compiled>>>,
}

/// The registry client with its caches and the topics' formats; cheap to clone, shared by
/// the enqueuer, the relay and the consumer of one process.
#[derive(Clone)]
pub struct Schemas {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Schemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schemas")
            .field("registry", &self.inner.client.url())
            .field("topics", &self.inner.config.topics)
            .finish()
    }
}

impl Schemas {
    /// Schemas for `config` (nothing is fetched until a topic needs it).
    ///
    /// # Errors
    /// [`SchemaError::Config`] for a bad registry URL.
    pub fn new(config: SchemaConfig) -> Result<Self, SchemaError> {
        let client = RegistryClient::new(&config.registry_url)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                client,
                by_subject: Mutex::default(),
                by_id: Mutex::default(),
            }),
        })
    }

    /// The registry client.
    pub fn client(&self) -> &RegistryClient {
        &self.inner.client
    }

    /// `topic`'s format and subject, when it has a schema.
    pub fn topic(&self, topic: &str) -> Option<&TopicSchema> {
        self.inner.config.topics.get(topic)
    }

    /// The schema `topic`'s payloads must follow now (`None`: plain JSON): the subject's
    /// latest version, cached for [`SchemaConfig::refresh`]; while the registry is
    /// unreachable a stale one is used, and without one the error says it is unavailable.
    ///
    /// # Errors
    /// [`SchemaError::Unavailable`], [`SchemaError::Registry`] (no such subject),
    /// [`SchemaError::Schema`] (the registered schema does not compile or is of another
    /// format than the topic declares).
    pub async fn for_topic(&self, topic: &str) -> Result<Option<Arc<Compiled>>, SchemaError> {
        let Some(ts) = self.topic(topic) else {
            return Ok(None);
        };
        let subject = ts.subject(topic);
        let stale = {
            let cache = self.inner.by_subject.lock().expect("schema cache");
            match cache.get(&subject) {
                Some(l) if l.fetched.elapsed() < self.inner.config.refresh => {
                    return Ok(Some(l.compiled.clone()))
                }
                Some(l) => Some(l.compiled.clone()),
                None => None,
            }
        };
        let fetched = async {
            let r = self.inner.client.latest(&subject).await?;
            if r.format != ts.format {
                return Err(SchemaError::Schema(format!(
                    "subject {subject} holds a {:?} schema, topic {topic} is declared {:?}",
                    r.format, ts.format
                )));
            }
            let c = self.compiled(r.id, r.format, &r.schema)?;
            // Record naming: the subject's schema must be the record the topic names.
            if let SubjectNaming::Record(want) | SubjectNaming::TopicRecord(want) = &ts.naming {
                if c.record_name().as_deref() != Some(want.as_str()) {
                    return Err(SchemaError::Schema(format!(
                        "subject {subject} holds record {}, topic {topic} declares record {want}",
                        c.record_name().unwrap_or_else(|| "(none)".into())
                    )));
                }
            }
            Ok(c)
        }
        .await;
        match (fetched, stale) {
            (Ok(c), _) => {
                self.inner.by_subject.lock().expect("schema cache").insert(
                    subject,
                    Latest {
                        compiled: c.clone(),
                        fetched: Instant::now(),
                    },
                );
                Ok(Some(c))
            }
            (Err(e), Some(old)) if e.is_unavailable() => {
                tracing::debug!(error = %e, %subject, "registry unreachable: using the cached schema");
                Ok(Some(old))
            }
            (Err(e), _) => Err(e),
        }
    }

    fn compiled(&self, id: u32, format: Format, text: &str) -> Result<Arc<Compiled>, SchemaError> {
        if let Some(c) = self.inner.by_id.lock().expect("schema cache").get(&id) {
            return Ok(c.clone());
        }
        let c = Arc::new(Compiled::new(id, format, text)?);
        self.inner
            .by_id
            .lock()
            .expect("schema cache")
            .insert(id, c.clone());
        Ok(c)
    }

    /// The schema with global id `id` (cached for good: ids are immutable).
    ///
    /// # Errors
    /// [`SchemaError::Unavailable`], [`SchemaError::Registry`] (no such id),
    /// [`SchemaError::Schema`].
    pub async fn by_id(&self, id: u32) -> Result<Arc<Compiled>, SchemaError> {
        if let Some(c) = self.inner.by_id.lock().expect("schema cache").get(&id) {
            return Ok(c.clone());
        }
        let r = self.inner.client.by_id(id).await?;
        self.compiled(id, r.format, &r.schema)
    }

    /// Checks a payload for `topic` against its schema (nothing for plain-JSON topics).
    ///
    /// # Errors
    /// As [`Schemas::for_topic`], and [`SchemaError::Invalid`] for a broken contract.
    pub async fn validate(&self, topic: &str, json: &serde_json::Value) -> Result<(), SchemaError> {
        match self.for_topic(topic).await? {
            Some(c) => c.validate(json),
            None => Ok(()),
        }
    }

    /// Decodes a framed payload through the schema it names.
    ///
    /// # Errors
    /// [`SchemaError::Frame`], [`SchemaError::Unavailable`], [`SchemaError::Registry`] (an id
    /// the registry does not know), [`SchemaError::Invalid`].
    pub async fn decode(&self, payload: &[u8]) -> Result<Decoded, SchemaError> {
        let f = frame::parse(payload)?;
        let c = self.by_id(f.schema_id).await?;
        Ok(Decoded {
            json: c.decode(f.rest)?,
            schema_id: f.schema_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_subjects_from_a_topics_file() {
        let c = SchemaConfig::from_topics_toml(
            "http://127.0.0.1:1/apis/ccompat/v7",
            r#"
            [defaults]
            partitions = 6
            [[topic]]
            name = "orders.created"
            format = "avro"
            [[topic]]
            name = "orders.paid"
            format = "protobuf"
            subject = "record"
            record = "acme.Paid"
            [[topic]]
            name = "orders.noted"
            format = "json-schema"
            subject = "topic-record"
            record = "Noted"
            [[topic]]
            name = "orders.plain"
            "#,
        )
        .unwrap();
        assert_eq!(c.topics.len(), 3);
        assert_eq!(
            c.topics["orders.created"].subject("orders.created"),
            "orders.created-value"
        );
        assert_eq!(c.topics["orders.paid"].subject("orders.paid"), "acme.Paid");
        assert_eq!(
            c.topics["orders.noted"].subject("orders.noted"),
            "orders.noted-Noted"
        );
        assert_eq!(c.topics["orders.noted"].format, Format::JsonSchema);
        for bad in [
            "[[topic]]\nname = \"a.b\"\nformat = \"xml\"",
            "[[topic]]\nname = \"a.b\"\nformat = \"avro\"\nsubject = \"record\"",
            "[[topic]]\nname = \"a.b\"\nformat = \"avro\"\nsubject = \"weird\"",
        ] {
            assert!(
                matches!(
                    SchemaConfig::from_topics_toml("http://x", bad),
                    Err(SchemaError::Config(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            RegistryClient::new("https://x"),
            Err(SchemaError::Config(_))
        ));
    }

    #[test]
    fn compiled_schemas_frame_what_they_encode() {
        let c = Compiled::new(
            7,
            Format::Avro,
            r#"{"type":"record","name":"R","fields":[{"name":"n","type":"long"}]}"#,
        )
        .unwrap();
        let bytes = c.encode(&serde_json::json!({"n": 42})).unwrap();
        assert_eq!(bytes, [0, 0, 0, 0, 7, 84]);
        let f = frame::parse(&bytes).unwrap();
        assert_eq!(c.decode(f.rest).unwrap(), serde_json::json!({"n": 42}));
        let j = Compiled::new(
            8,
            Format::JsonSchema,
            r#"{"type":"object","required":["n"]}"#,
        )
        .unwrap();
        assert_eq!(
            j.encode(&serde_json::json!({"n": 1})).unwrap(),
            b"\0\0\0\0\x08{\"n\":1}"
        );
        assert!(matches!(
            j.encode(&serde_json::json!({})),
            Err(SchemaError::Invalid(_))
        ));
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// Per-message encode and decode cost of the relay_drain payload (run by hand:
    /// `cargo test --release --lib --features schemas schemas::cost -- --ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, run by hand"]
    fn encode_and_decode_cost() {
        let text = r#"{"order_number": "A-123456", "customer": "customer-321", "total_cents": 45678, "currency": "EUR", "note": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#;
        let avro = Compiled::new(1, Format::Avro, r#"{"type": "record", "name": "OrderCreated", "namespace": "bench",
            "fields": [{"name": "order_number", "type": "string"}, {"name": "customer", "type": "string"},
                       {"name": "total_cents", "type": "long"}, {"name": "currency", "type": "string"},
                       {"name": "note", "type": "string"}]}"#).unwrap();
        let proto = Compiled::new(2, Format::Protobuf, "syntax = \"proto3\"; package bench;
            message OrderCreated { string order_number = 1; string customer = 2; int64 total_cents = 3;
                                   string currency = 4; string note = 5; }").unwrap();
        let n = 200_000;
        for (name, c) in [("avro", &avro), ("protobuf", &proto)] {
            let t = std::time::Instant::now();
            let mut bytes = Vec::new();
            for _ in 0..n {
                bytes = std::hint::black_box(c.encode_text(text).unwrap());
            }
            let enc = t.elapsed().as_nanos() as f64 / n as f64;
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::hint::black_box(c.decode(&bytes[5..]).unwrap());
            }
            let dec = t.elapsed().as_nanos() as f64 / n as f64;
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::hint::black_box(serde_json::from_str::<serde_json::Value>(text).unwrap());
            }
            let parse = t.elapsed().as_nanos() as f64 / n as f64;
            println!("{name}: encode {enc:.0} ns, decode {dec:.0} ns, json parse alone {parse:.0} ns, {} bytes", bytes.len());
        }
    }
}
