//! What a request may carry before any handler sees it: a JSON body parsed strictly (one value
//! per key, no NUL in any string) and query strings without NUL. Both are refused with 400
//! naming the problem: a duplicate key would otherwise be last-wins (two readers of one body
//! could disagree on what it asks), and a NUL reaches Postgres as an error that looks like an
//! outage (503 "db error").

use std::collections::BTreeSet;
use std::fmt;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::ApiError;

/// A JSON request body, parsed strictly.
pub(crate) struct Strict(pub Value);

impl<S: Send + Sync> FromRequest<S> for Strict {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        json_body(req, state, false)
            .await
            .map(|v| Strict(v.unwrap_or_default()))
    }
}

/// An optional JSON request body, parsed as [`Strict`]; `None` when the body is empty (a
/// job's pause, resume or cancel may give a reason or not).
pub(crate) struct MaybeStrict(pub Option<Value>);

impl<S: Send + Sync> FromRequest<S> for MaybeStrict {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        json_body(req, state, true).await.map(MaybeStrict)
    }
}

/// The request's body as one strict JSON value; `None` for an empty body when `optional`.
async fn json_body<S: Send + Sync>(
    req: Request,
    state: &S,
    optional: bool,
) -> Result<Option<Value>, ApiError> {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            let m = m.trim();
            m.eq_ignore_ascii_case("application/json")
                || (m.starts_with("application/") && m.ends_with("+json"))
        });
    let not_json = || {
        ApiError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected a JSON body (Content-Type: application/json)".into(),
        )
    };
    // A required body of another type is refused before it is read.
    if !json && !optional {
        return Err(not_json());
    }
    // The body limit (413) applies here as it does to every extractor.
    let bytes = Bytes::from_request(req, state)
        .await
        .map_err(|e| ApiError(e.status(), e.body_text()))?;
    if optional && bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if !json {
        return Err(not_json());
    }
    parse(&bytes).map(Some)
}

/// A numeric id from a route's path (`what` names it in the 400 answer).
pub(crate) fn path_id(id: &str, what: &str) -> Result<i64, ApiError> {
    id.parse().map_err(|_| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("{:?} is not a {what} id", crate::wire::cut(id)),
        )
    })
}

/// `bytes` as one JSON value, refusing duplicate keys and NUL characters.
///
/// # Errors
/// 400 naming the problem and where it is.
pub(crate) fn parse(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = de
        .deserialize_any(StrictVisitor)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
    Ok(v)
}

struct StrictVisitor;

fn no_nul<E: de::Error>(s: &str) -> Result<(), E> {
    if s.contains('\0') {
        Err(E::custom("a string holds a NUL character"))
    } else {
        Ok(())
    }
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        no_nul(v)?;
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        no_nul(&v)?;
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Seed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen = BTreeSet::new();
        while let Some(k) = map.next_key::<String>()? {
            no_nul(&k)?;
            if !seen.insert(k.clone()) {
                return Err(de::Error::custom(format!(
                    "the key {k:?} appears twice: give each field once"
                )));
            }
            let v = map.next_value_seed(Seed)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

struct Seed;

impl<'de> de::DeserializeSeed<'de> for Seed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

/// A query string may not carry NUL (`%00`), in a name or a value.
///
/// # Errors
/// 400 saying so.
pub(crate) fn check_query(query: Option<&str>) -> Result<(), ApiError> {
    if query.is_some_and(|q| q.to_ascii_lowercase().contains("%00")) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "the query string holds a NUL character (%00)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn duplicate_keys_and_nul_are_refused_anywhere() {
        assert!(parse(br#"{"a": 1, "b": {"c": [1, "x"]}}"#).is_ok());
        for bad in [
            &br#"{"ids": [1], "ids": [2]}"#[..],
            br#"{"a": {"x": 1, "x": 2}}"#,
            br#"{"reason": "a\u0000b"}"#,
            br#"{"a\u0000": 1}"#,
            br#"[{"k": "v", "k": "w"}]"#,
            br#"{"a": 1} trailing"#,
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.0, 400, "{}", String::from_utf8_lossy(bad));
        }
        let e = parse(br#"{"ids": [1], "ids": [2]}"#).unwrap_err();
        assert!(e.1.contains("\"ids\" appears twice"), "{}", e.1);
        assert!(super::check_query(Some("q=a%00b")).is_err());
        assert!(super::check_query(Some("q=ab")).is_ok());
    }
}
