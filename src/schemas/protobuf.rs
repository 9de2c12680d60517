//! Protobuf: `.proto` text from the registry compiled in process (protox, so no `protoc` on
//! anyone's machine), messages built from the row's JSON through Protobuf's JSON mapping
//! (`prost-reflect`: field names as written or in lowerCamelCase, unknown fields refused) and
//! read back as JSON with the `.proto` field names, every field present, 64-bit integers as
//! numbers.
//!
//! A schema registered by Confluent's own serializers (a base64 `FileDescriptorProto`, as
//! Apicurio keeps it) is read too. The relay encodes the file's first message (indexes
//! `[0]`); the consumer follows the indexes a record names.

use std::collections::HashMap;

use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, FileDescriptor, MessageDescriptor,
    SerializeOptions,
};

use super::SchemaError;

const ROOT: &str = "__registered.proto";
const STRICT: DeserializeOptions = DeserializeOptions::new().deny_unknown_fields(true);

struct Source(HashMap<String, String>);

impl protox::file::FileResolver for Source {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.0.get(name) {
            Some(src) => protox::file::File::from_source(name, src),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// A compiled Protobuf schema file.
#[derive(Debug)]
pub(crate) struct Protobuf {
    file: FileDescriptor,
    /// The message the relay encodes: the file's first (`[0]`).
    first: Option<MessageDescriptor>,
}

impl Protobuf {
    /// Compiles `.proto` text (or reads a base64 `FileDescriptorProto`).
    pub(crate) fn parse(text: &str) -> Result<Self, SchemaError> {
        if !text.contains("message") && !text.contains("syntax") {
            if let Some(p) = Self::from_descriptor(text) {
                return p;
            }
        }
        let mut chain = protox::file::ChainFileResolver::new();
        chain.add(Source(HashMap::from([(ROOT.to_owned(), text.to_owned())])));
        chain.add(protox::file::GoogleFileResolver::new());
        let mut c = protox::Compiler::with_file_resolver(chain);
        c.include_imports(true);
        c.open_file(ROOT)
            .map_err(|e| SchemaError::Schema(format!("protobuf schema: {e}")))?;
        let file = c
            .descriptor_pool()
            .get_file_by_name(ROOT)
            .ok_or_else(|| SchemaError::Schema("protobuf schema: compiled to nothing".into()))?;
        Ok(Self::of(file))
    }

    fn from_descriptor(text: &str) -> Option<Result<Self, SchemaError>> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()?;
        let proto =
            prost_reflect::prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()?;
        let name = proto.name().to_owned();
        let mut pool = DescriptorPool::new();
        // Well-known imports (google/protobuf/*.proto) come from protox's copies.
        for dep in &proto.dependency {
            let mut c =
                protox::Compiler::with_file_resolver(protox::file::GoogleFileResolver::new());
            c.include_imports(true);
            if c.open_file(dep).is_err() {
                return Some(Err(SchemaError::Schema(format!(
                    "protobuf schema imports {dep}, which is not a well-known type (schema references are not supported)"
                ))));
            }
            if let Err(e) = pool.add_file_descriptor_set(c.file_descriptor_set()) {
                return Some(Err(SchemaError::Schema(format!("protobuf schema: {e}"))));
            }
        }
        Some(
            pool.add_file_descriptor_proto(proto)
                .map_err(|e| SchemaError::Schema(format!("protobuf schema: {e}")))
                .and_then(|()| {
                    pool.get_file_by_name(&name).ok_or_else(|| {
                        SchemaError::Schema("protobuf schema: descriptor without a file".into())
                    })
                })
                .map(Self::of),
        )
    }

    fn of(file: FileDescriptor) -> Self {
        let first = file.messages().next();
        Self { first, file }
    }

    /// The full name of the file's first message (record naming).
    pub(crate) fn record_name(&self) -> Option<String> {
        self.file
            .messages()
            .next()
            .map(|m| m.full_name().to_owned())
    }

    /// The message at Confluent message indexes `path` (`[0]`: the first of the file; map
    /// entries are not counted).
    fn message_at(&self, path: &[i32]) -> Result<MessageDescriptor, SchemaError> {
        let missing =
            || SchemaError::Invalid(format!("no message at indexes {path:?} in the schema"));
        let (first, rest) = path.split_first().ok_or_else(missing)?;
        let mut m = self
            .file
            .messages()
            .nth(usize::try_from(*first).map_err(|_| missing())?)
            .ok_or_else(missing)?;
        for i in rest {
            let i = usize::try_from(*i).map_err(|_| missing())?;
            let next = m
                .child_messages()
                .filter(|c| !c.is_map_entry())
                .nth(i)
                .ok_or_else(missing)?;
            m = next;
        }
        Ok(m)
    }

    /// Encodes `json` as the file's first message; the message indexes used.
    pub(crate) fn encode(
        &self,
        json: &serde_json::Value,
        out: &mut Vec<u8>,
    ) -> Result<&'static [i32], SchemaError> {
        let desc = self.first()?;
        let msg =
            DynamicMessage::deserialize_with_options(desc.clone(), json, &STRICT).map_err(|e| {
                SchemaError::Invalid(format!("{}: {}{e}", desc.full_name(), culprit(desc, json)))
            })?;
        msg.encode(out)
            .map_err(|e| SchemaError::Invalid(format!("{}: {e}", desc.full_name())))?;
        Ok(&[0])
    }

    /// [`Protobuf::encode`] straight from JSON text (no intermediate `Value`: the relay's path).
    pub(crate) fn encode_text(
        &self,
        text: &str,
        out: &mut Vec<u8>,
    ) -> Result<&'static [i32], SchemaError> {
        let desc = self.first()?;
        let mut de = serde_json::Deserializer::from_str(text);
        match DynamicMessage::deserialize_with_options(desc.clone(), &mut de, &STRICT) {
            Ok(msg) => {
                msg.encode(out)
                    .map_err(|e| SchemaError::Invalid(format!("{}: {e}", desc.full_name())))?;
                Ok(&[0])
            }
            // The slow path only to name the field.
            Err(_) => {
                let json: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| SchemaError::Invalid(format!("not JSON: {e}")))?;
                self.encode(&json, out)
            }
        }
    }

    fn first(&self) -> Result<&MessageDescriptor, SchemaError> {
        self.first
            .as_ref()
            .ok_or_else(|| SchemaError::Schema("protobuf schema without a message".into()))
    }

    /// Decodes the message at `indexes` into its JSON view.
    pub(crate) fn decode(
        &self,
        indexes: &[i32],
        datum: &[u8],
    ) -> Result<serde_json::Value, SchemaError> {
        let desc = self.message_at(indexes)?;
        let msg = DynamicMessage::decode(desc.clone(), datum)
            .map_err(|e| SchemaError::Invalid(format!("{}: {e}", desc.full_name())))?;
        msg.serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new()
                .use_proto_field_name(true)
                .skip_default_fields(false)
                .stringify_64_bit_integers(false),
        )
        .map_err(|e| SchemaError::Invalid(format!("{}: {e}", desc.full_name())))
    }
}

/// `"field <name>: "` for the first top-level field that does not map on its own (the JSON
/// mapping's errors do not say where they are).
fn culprit(desc: &MessageDescriptor, json: &serde_json::Value) -> String {
    let Some(o) = json.as_object() else {
        return String::new();
    };
    for (k, v) in o {
        let one = serde_json::Value::Object([(k.clone(), v.clone())].into_iter().collect());
        let alone = DynamicMessage::deserialize_with_options(desc.clone(), &one, &STRICT);
        if alone.is_err() {
            return format!("field {k}: ");
        }
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ORDERS: &str = r#"
        syntax = "proto3";
        package acme.orders;
        import "google/protobuf/timestamp.proto";
        message OrderCreated {
          string order_id = 1;
          int64 total_cents = 2;
          repeated Line lines = 3;
          map<string, string> attrs = 4;
          google.protobuf.Timestamp at = 5;
          message Line { string sku = 1; int32 qty = 2; }
        }
        message OrderCancelled { string order_id = 1; }
    "#;

    #[test]
    fn json_round_trips_through_the_first_message() {
        let p = Protobuf::parse(ORDERS).unwrap();
        assert_eq!(p.record_name().as_deref(), Some("acme.orders.OrderCreated"));
        let v = json!({"order_id": "A-1", "totalCents": 1500, "lines": [{"sku": "x", "qty": 2}],
                       "attrs": {"k": "v"}, "at": "2026-12-02T06:00:00Z"});
        let mut out = Vec::new();
        assert_eq!(p.encode(&v, &mut out).unwrap(), &[0]);
        let back = p.decode(&[0], &out).unwrap();
        assert_eq!(back["order_id"], "A-1");
        assert_eq!(back["total_cents"], 1500);
        assert_eq!(back["lines"][0]["qty"], 2);
        assert_eq!(back["attrs"]["k"], "v");
        assert_eq!(back["at"], "2026-12-02T06:00:00Z");
        // Nested and second messages by their indexes.
        let line =
            DynamicMessage::deserialize(p.message_at(&[0, 0]).unwrap(), &json!({"sku": "z"}))
                .unwrap();
        assert_eq!(
            p.decode(&[0, 0], &line.encode_to_vec()).unwrap()["sku"],
            "z"
        );
        assert!(p.message_at(&[1]).is_ok());
        assert!(p.message_at(&[2]).is_err());
    }

    #[test]
    fn a_broken_contract_is_refused() {
        let p = Protobuf::parse(ORDERS).unwrap();
        for v in [
            json!({"order_id": 5}),
            json!({"nope": 1}),
            json!({"total_cents": "abc"}),
        ] {
            assert!(
                matches!(p.encode(&v, &mut Vec::new()), Err(SchemaError::Invalid(_))),
                "{v}"
            );
        }
        assert!(matches!(
            Protobuf::parse("message {"),
            Err(SchemaError::Schema(_))
        ));
    }
}
