//! The schema parsers that face input, reachable from the crate's property tests
//! (`src/proptests.rs`).

/// A registry answer's body through the client's parser.
pub(crate) fn registry_parse_for_tests(b: &[u8]) -> Result<super::Registered, super::SchemaError> {
    super::RegistryClient::parse(b, None)
}

/// `datum` through the Avro decoder of a schema with every length-prefixed and recursive kind
/// (strings, bytes, arrays, maps, unions, decimals, a nested record), and the Protobuf decoder
/// of a message with strings, repeated fields, a map and a nested message.
pub(crate) fn decode_for_tests(datum: &[u8]) {
    use std::sync::OnceLock;
    static AVRO: OnceLock<super::avro::Avro> = OnceLock::new();
    static PROTO: OnceLock<super::protobuf::Protobuf> = OnceLock::new();
    let a = AVRO.get_or_init(|| {
        super::avro::Avro::parse(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "s", "type": "string"},
                {"name": "b", "type": "bytes"},
                {"name": "a", "type": {"type": "array", "items": "long"}},
                {"name": "m", "type": {"type": "map", "values": "string"}},
                {"name": "u", "type": ["null", "string", "double"]},
                {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
                {"name": "f", "type": {"type": "fixed", "name": "F", "size": 4}},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
                {"name": "n", "type": ["null", "R"]}
            ]}"#,
        )
        .unwrap()
    });
    let _ = a.decode(datum);
    let p = PROTO.get_or_init(|| {
        super::protobuf::Protobuf::parse(
            r#"syntax = "proto3";
               message Order { string id = 1; repeated int64 lines = 2;
                               map<string, string> tags = 3; Inner inner = 4; bytes raw = 5; }
               message Inner { double x = 1; repeated Inner next = 2; }"#,
        )
        .unwrap()
    });
    let _ = p.decode(&[0], datum);
    let _ = p.decode(&[1], datum);
    if let Ok((idx, rest)) = super::frame::take_indexes(datum) {
        let _ = p.decode(&idx, rest);
    }
}
