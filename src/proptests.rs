//! Property tests of every parser that faces input from outside the process: whatever the
//! bytes, each one answers with a value or a typed error — never a panic, never an allocation
//! sized by a number the input chose. Run with the unit tests (`cargo test --lib proptests`);
//! `PROPTEST_CASES=100000` runs a longer campaign.

use proptest::prelude::*;

fn headers() -> impl Strategy<Value = Vec<(String, Option<Vec<u8>>)>> {
    let name = prop_oneof![
        Just("x-error-kind".to_owned()),
        Just("x-consumer-group".to_owned()),
        Just("x-original-topic".to_owned()),
        Just("x-first-failed-at".to_owned()),
        Just("x-failed-at".to_owned()),
        Just("x-original-partition".to_owned()),
        Just("x-original-offset".to_owned()),
        Just("x-dlq-retries".to_owned()),
        Just("x-replay-job".to_owned()),
        Just("message_id".to_owned()),
        ".{0,40}",
    ];
    prop::collection::vec(
        (
            name,
            prop::option::of(prop::collection::vec(any::<u8>(), 0..80)),
        ),
        0..12,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512)))]

    /// Durations and instants as operators (and API callers) write them.
    #[test]
    fn instants_parse_or_refuse_and_always_format(s in ".{0,40}", n in any::<u64>(),
                                                  unit in "(s|m|h|d|w|y|ms|us|ns)") {
        for input in [s.clone(), format!("{n}{unit}"), format!("{s}{unit}")] {
            if let Ok(t) = crate::message::parse_instant(&input) {
                prop_assert!(t >= std::time::SystemTime::UNIX_EPOCH);
                let _ = crate::message::rfc3339(t);
            }
        }
    }

    /// The archive's reading of a dead letter's headers, whatever the producer wrote.
    #[test]
    #[cfg(feature = "dlq")]
    fn dead_letter_headers_parse_into_bounded_rows(h in headers(), topic in "[a-z.]{1,30}") {
        let row = crate::dlq::archive_row_for_tests(&topic, &h);
        prop_assert!(!row.original_topic.is_empty());
        prop_assert!(row.failed_at <= std::time::SystemTime::now());
        if let Some(f) = row.first_failed_at {
            prop_assert!(f <= row.failed_at);
        }
        if let Some(k) = &row.error_kind {
            prop_assert!(crate::dlq::is_known_kind(k), "{k}");
        }
        let json = crate::wire::to_json(&h);
        let _ = crate::wire::from_json(&json);
    }

    /// Selections (filters) from query strings and bodies.
    #[test]
    #[cfg(feature = "dlq")]
    fn filters_normalise_or_name_the_bad_field(topic in ".{0,20}", kind in ".{0,20}",
                                                since in ".{0,20}", until in ".{0,20}",
                                                ids in prop::collection::vec(any::<i64>(), 0..5)) {
        let f = crate::dlq::Filter {
            ids,
            topic: Some(topic),
            kind: Some(kind),
            since: Some(since),
            until: Some(until),
            ..crate::dlq::Filter::default()
        };
        if let Ok(n) = f.normalized() {
            let _ = n.to_where("d", None);
        }
    }

    /// Request bodies and query strings of the admin API, and its Host check.
    #[test]
    #[cfg(feature = "admin")]
    fn admin_input_parses_or_is_refused_with_400(b in prop::collection::vec(any::<u8>(), 0..200),
                                                 j in "[\\[\\]{}\",:0-9a-z\\\\ ]{0,60}",
                                                 host in ".{0,40}") {
        for body in [&b[..], j.as_bytes()] {
            if let Err(e) = crate::admin::parse_body_for_tests(body) {
                prop_assert_eq!(e, 400);
            }
        }
        let _ = crate::admin::host_allowed_for_tests(&host);
    }

    /// The Confluent frame and Protobuf message indexes.
    #[test]
    #[cfg(feature = "schemas")]
    fn frames_parse_or_refuse(b in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(f) = crate::schemas::frame::parse(&b) {
            let _ = crate::schemas::frame::take_indexes(f.rest);
        }
        let _ = crate::schemas::frame::take_indexes(&b);
    }

    /// Registry answers: any body is a schema or an error.
    #[test]
    #[cfg(feature = "schemas")]
    fn registry_answers_parse_or_refuse(b in prop::collection::vec(any::<u8>(), 0..200),
                                        schema in ".{0,40}", id in any::<u32>()) {
        let _ = crate::schemas::probe::registry_parse_for_tests(&b);
        let j = serde_json::json!({"id": id, "schema": schema, "schemaType": schema});
        let _ = crate::schemas::probe::registry_parse_for_tests(j.to_string().as_bytes());
    }

    /// Avro and Protobuf datums from a record's bytes: decoded or refused, whatever their
    /// lengths claim.
    #[test]
    #[cfg(feature = "schemas")]
    fn avro_and_protobuf_datums_decode_or_refuse(b in prop::collection::vec(any::<u8>(), 0..128)) {
        crate::schemas::probe::decode_for_tests(&b);
    }
}
