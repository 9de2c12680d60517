//! Avro: the row's JSON encoded straight into Avro's binary encoding by walking the writer's
//! schema (and decoded back the same way), with `apache-avro` parsing the schema.
//!
//! The JSON a payload is written in is the **natural** JSON of the value, with these rules:
//!
//! | Avro type | JSON in the outbox row (and `Delivered::body` on the way back) |
//! |---|---|
//! | `null`, `boolean`, `string` | the same |
//! | `int`, `long` | an integer number (range checked) |
//! | `float`, `double` | any number |
//! | `bytes`, `fixed` | a string whose characters are code points 0–255, one byte each (Avro's JSON encoding) |
//! | `enum` | the symbol, a string |
//! | `array`, `map` | an array, an object |
//! | `record` | an object; a missing field takes its default; a field the schema lacks is refused |
//! | union | the value itself, taking the first branch it fits (`null` for null), or Avro's JSON form `{"<branch>": value}` naming the branch (a primitive name or a named type's full name); read back as the value itself |
//! | `decimal` | a number or a decimal string (`"12.30"`), at most `scale` fraction digits; read back as a string with exactly `scale` digits |
//! | `uuid` | a UUID string |
//! | `date`, `time-millis`, `time-micros` | an integer (days, ms or µs) |
//! | `timestamp-*`, `local-timestamp-*` | an integer, or an RFC 3339 string; read back as the integer |
//! | `duration` | an object `{"months", "days", "millis"}` |

use std::collections::HashMap;

use apache_avro::schema::{DecimalSchema, Name, RecordSchema, Schema};
use serde_json::{Map, Value};

use super::binary::{block, get_long, len, minimal, put_bytes, put_long, rescale, take, unscale};
use super::SchemaError;

/// A parsed Avro schema with its named types indexed for `Ref`s.
#[derive(Debug)]
pub(crate) struct Avro {
    schema: Schema,
    names: HashMap<String, Schema>,
}

impl Avro {
    /// Parses an Avro schema (`.avsc` JSON).
    pub(crate) fn parse(text: &str) -> Result<Self, SchemaError> {
        let schema = Schema::parse_str(text)
            .map_err(|e| SchemaError::Schema(format!("avro schema: {e}")))?;
        let mut names = HashMap::new();
        collect(&schema, &mut names);
        Ok(Self { schema, names })
    }

    /// The full name of the top-level named type (record naming), if it has one.
    pub(crate) fn record_name(&self) -> Option<String> {
        match &self.schema {
            Schema::Record(r) => Some(r.name.fullname(None)),
            Schema::Enum(e) => Some(e.name.fullname(None)),
            Schema::Fixed(f) => Some(f.name.fullname(None)),
            _ => None,
        }
    }

    /// Encodes `json` (natural JSON, see the module docs) into `out`.
    pub(crate) fn encode(&self, json: &Value, out: &mut Vec<u8>) -> Result<(), SchemaError> {
        self.enc(&self.schema, json, out, &mut Vec::new())
    }

    /// Decodes one datum written with this schema.
    pub(crate) fn decode(&self, mut input: &[u8]) -> Result<Value, SchemaError> {
        let v = self.dec(&self.schema, &mut input)?;
        if !input.is_empty() {
            return Err(SchemaError::Invalid(format!(
                "{} byte(s) left after the avro datum",
                input.len()
            )));
        }
        Ok(v)
    }

    fn named(&self, name: &Name) -> Result<&Schema, SchemaError> {
        self.names.get(&name.fullname(None)).ok_or_else(|| {
            SchemaError::Schema(format!("unknown avro type {}", name.fullname(None)))
        })
    }

    fn enc(
        &self,
        schema: &Schema,
        v: &Value,
        out: &mut Vec<u8>,
        path: &mut Vec<String>,
    ) -> Result<(), SchemaError> {
        let bad = |path: &[String], want: &str| {
            SchemaError::Invalid(format!("{}: expected {want}, found {}", at(path), kind(v)))
        };
        match schema {
            Schema::Null => v.is_null().then_some(()).ok_or_else(|| bad(path, "null")),
            Schema::Boolean => {
                let b = v.as_bool().ok_or_else(|| bad(path, "a boolean"))?;
                out.push(u8::from(b));
                Ok(())
            }
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let n = v
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| bad(path, "an integer within int's range"))?;
                put_long(out, i64::from(n));
                Ok(())
            }
            Schema::Long | Schema::TimeMicros => {
                let n = v.as_i64().ok_or_else(|| bad(path, "an integer"))?;
                put_long(out, n);
                Ok(())
            }
            Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                let n = match v {
                    Value::String(s) => {
                        let t = humantime::parse_rfc3339_weak(s).map_err(|e| {
                            SchemaError::Invalid(format!(
                                "{}: {s:?} is not RFC 3339: {e}",
                                at(path)
                            ))
                        })?;
                        let d = t
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_err(|_| bad(path, "a time after 1970"))?;
                        match schema {
                            Schema::TimestampMillis | Schema::LocalTimestampMillis => {
                                d.as_millis() as i64
                            }
                            Schema::TimestampMicros | Schema::LocalTimestampMicros => {
                                d.as_micros() as i64
                            }
                            _ => d.as_nanos() as i64,
                        }
                    }
                    _ => v
                        .as_i64()
                        .ok_or_else(|| bad(path, "an integer or an RFC 3339 string"))?,
                };
                put_long(out, n);
                Ok(())
            }
            Schema::Float => {
                let f = v.as_f64().ok_or_else(|| bad(path, "a number"))?;
                out.extend_from_slice(&(f as f32).to_le_bytes());
                Ok(())
            }
            Schema::Double => {
                let f = v.as_f64().ok_or_else(|| bad(path, "a number"))?;
                out.extend_from_slice(&f.to_le_bytes());
                Ok(())
            }
            Schema::String | Schema::Uuid => {
                let s = v.as_str().ok_or_else(|| bad(path, "a string"))?;
                if matches!(schema, Schema::Uuid) && uuid::Uuid::parse_str(s).is_err() {
                    return Err(bad(path, "a UUID string"));
                }
                put_bytes(out, s.as_bytes());
                Ok(())
            }
            Schema::Bytes => {
                let b = code_points(v).ok_or_else(|| bad(path, "a string of code points 0-255"))?;
                put_bytes(out, &b);
                Ok(())
            }
            Schema::Fixed(f) => {
                let b = code_points(v).ok_or_else(|| bad(path, "a string of code points 0-255"))?;
                if b.len() != f.size {
                    return Err(bad(path, &format!("{} bytes", f.size)));
                }
                out.extend_from_slice(&b);
                Ok(())
            }
            Schema::Decimal(d) => self.enc_decimal(d, v, out, path),
            Schema::BigDecimal => Err(SchemaError::Schema(
                "big-decimal is not supported; use decimal with a scale".into(),
            )),
            Schema::Duration => {
                let o = v
                    .as_object()
                    .ok_or_else(|| bad(path, "an object {months, days, millis}"))?;
                for k in ["months", "days", "millis"] {
                    let n = o
                        .get(k)
                        .and_then(Value::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| bad(path, "an object {months, days, millis} of u32"))?;
                    out.extend_from_slice(&n.to_le_bytes());
                }
                Ok(())
            }
            Schema::Enum(e) => {
                let s = v.as_str().ok_or_else(|| bad(path, "an enum symbol"))?;
                let i = e.symbols.iter().position(|x| x == s).ok_or_else(|| {
                    SchemaError::Invalid(format!(
                        "{}: {s:?} is not one of {:?}",
                        at(path),
                        e.symbols
                    ))
                })?;
                put_long(out, i as i64);
                Ok(())
            }
            Schema::Array(a) => {
                let items = v.as_array().ok_or_else(|| bad(path, "an array"))?;
                if !items.is_empty() {
                    put_long(out, items.len() as i64);
                    for (i, item) in items.iter().enumerate() {
                        path.push(i.to_string());
                        self.enc(&a.items, item, out, path)?;
                        path.pop();
                    }
                }
                put_long(out, 0);
                Ok(())
            }
            Schema::Map(m) => {
                let o = v.as_object().ok_or_else(|| bad(path, "an object (map)"))?;
                if !o.is_empty() {
                    put_long(out, o.len() as i64);
                    for (k, item) in o {
                        put_bytes(out, k.as_bytes());
                        path.push(k.clone());
                        self.enc(&m.types, item, out, path)?;
                        path.pop();
                    }
                }
                put_long(out, 0);
                Ok(())
            }
            Schema::Record(r) => self.enc_record(r, v, out, path),
            Schema::Union(u) => {
                let branches = u.variants();
                // Avro's JSON form names the branch: {"long": 5}, {"com.acme.Money": {...}}.
                if let Some(o) = v.as_object().filter(|o| o.len() == 1) {
                    let (name, inner) = o.iter().next().expect("one entry");
                    if let Some(i) = branches.iter().position(|b| branch_name(b) == *name) {
                        put_long(out, i as i64);
                        return self.enc(&branches[i], inner, out, path);
                    }
                }
                for (i, b) in branches.iter().enumerate() {
                    let mut trial = Vec::new();
                    if self.enc(b, v, &mut trial, path).is_ok() {
                        put_long(out, i as i64);
                        out.extend_from_slice(&trial);
                        return Ok(());
                    }
                }
                Err(SchemaError::Invalid(format!(
                    "{}: {} fits no branch of the union [{}]",
                    at(path),
                    kind(v),
                    branches
                        .iter()
                        .map(branch_name)
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            Schema::Ref { name } => self.enc(self.named(name)?, v, out, path),
        }
    }

    fn enc_record(
        &self,
        r: &RecordSchema,
        v: &Value,
        out: &mut Vec<u8>,
        path: &mut Vec<String>,
    ) -> Result<(), SchemaError> {
        let o = v.as_object().ok_or_else(|| {
            SchemaError::Invalid(format!(
                "{}: expected an object ({}), found {}",
                at(path),
                r.name.fullname(None),
                kind(v)
            ))
        })?;
        if let Some(extra) = o.keys().find(|k| !r.lookup.contains_key(*k)) {
            return Err(SchemaError::Invalid(format!(
                "{}: field {extra:?} is not in {}",
                at(path),
                r.name.fullname(None)
            )));
        }
        for f in &r.fields {
            path.push(f.name.clone());
            match (o.get(&f.name), &f.default) {
                (Some(x), _) => self.enc(&f.schema, x, out, path)?,
                (None, Some(d)) => self.enc_default(&f.schema, d, out, path)?,
                (None, None) => {
                    return Err(SchemaError::Invalid(format!(
                        "{}: required field missing",
                        at(path)
                    )))
                }
            }
            path.pop();
        }
        Ok(())
    }

    /// A field's default: for a union, a value of its first branch (the Avro rule).
    fn enc_default(
        &self,
        schema: &Schema,
        d: &Value,
        out: &mut Vec<u8>,
        path: &mut Vec<String>,
    ) -> Result<(), SchemaError> {
        match schema {
            Schema::Union(u) if !u.variants().is_empty() => {
                put_long(out, 0);
                self.enc(&u.variants()[0], d, out, path)
            }
            _ => self.enc(schema, d, out, path),
        }
    }

    fn enc_decimal(
        &self,
        d: &DecimalSchema,
        v: &Value,
        out: &mut Vec<u8>,
        path: &[String],
    ) -> Result<(), SchemaError> {
        let text = match v {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            _ => {
                return Err(SchemaError::Invalid(format!(
                    "{}: expected a decimal number or string, found {}",
                    at(path),
                    kind(v)
                )))
            }
        };
        let unscaled = unscale(&text, d.scale).ok_or_else(|| {
            SchemaError::Invalid(format!(
                "{}: {text:?} is not a decimal with at most {} fraction digit(s) and {} digit(s)",
                at(path),
                d.scale,
                d.precision
            ))
        })?;
        if unscaled.unsigned_abs().to_string().len() > d.precision {
            return Err(SchemaError::Invalid(format!(
                "{}: {text} has more than {} digit(s)",
                at(path),
                d.precision
            )));
        }
        let full = unscaled.to_be_bytes();
        match &*d.inner {
            Schema::Fixed(f) => {
                // Sign-extended to the fixed size.
                let fill = if unscaled < 0 { 0xff } else { 0 };
                if f.size >= 16 {
                    out.extend(std::iter::repeat_n(fill, f.size - 16));
                    out.extend_from_slice(&full);
                } else {
                    let min = minimal(&full);
                    if min.len() > f.size {
                        return Err(SchemaError::Invalid(format!(
                            "{}: {text} does not fit fixed({})",
                            at(path),
                            f.size
                        )));
                    }
                    out.extend(std::iter::repeat_n(fill, f.size - min.len()));
                    out.extend_from_slice(min);
                }
            }
            _ => put_bytes(out, minimal(&full)),
        }
        Ok(())
    }

    fn dec(&self, schema: &Schema, input: &mut &[u8]) -> Result<Value, SchemaError> {
        Ok(match schema {
            Schema::Null => Value::Null,
            Schema::Boolean => Value::Bool(take(input, 1)?[0] != 0),
            Schema::Int
            | Schema::Long
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => Value::from(get_long(input)?),
            Schema::Float => {
                let b = take(input, 4)?;
                number(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            Schema::Double => {
                let b = take(input, 8)?;
                number(f64::from_le_bytes(b.try_into().expect("8 bytes")))
            }
            Schema::String | Schema::Uuid => {
                let n = len(input)?;
                let b = take(input, n)?;
                Value::String(
                    std::str::from_utf8(b)
                        .map_err(|_| SchemaError::Invalid("an avro string is not UTF-8".into()))?
                        .to_owned(),
                )
            }
            Schema::Bytes => {
                let n = len(input)?;
                Value::String(take(input, n)?.iter().map(|b| char::from(*b)).collect())
            }
            Schema::Fixed(f) => Value::String(
                take(input, f.size)?
                    .iter()
                    .map(|b| char::from(*b))
                    .collect(),
            ),
            Schema::Decimal(d) => {
                let raw = match &*d.inner {
                    Schema::Fixed(f) => take(input, f.size)?,
                    _ => {
                        let n = len(input)?;
                        take(input, n)?
                    }
                };
                Value::String(rescale(raw, d.scale)?)
            }
            Schema::BigDecimal => {
                return Err(SchemaError::Schema("big-decimal is not supported".into()))
            }
            Schema::Duration => {
                let b = take(input, 12)?;
                let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                serde_json::json!({"months": u(0), "days": u(4), "millis": u(8)})
            }
            Schema::Enum(e) => {
                let i = get_long(input)?;
                Value::String(
                    usize::try_from(i)
                        .ok()
                        .and_then(|i| e.symbols.get(i))
                        .ok_or_else(|| SchemaError::Invalid(format!("enum index {i}")))?
                        .clone(),
                )
            }
            Schema::Array(a) => {
                let mut items = Vec::new();
                block(input, |input| {
                    items.push(self.dec(&a.items, input)?);
                    Ok(())
                })?;
                Value::Array(items)
            }
            Schema::Map(m) => {
                let mut o = Map::new();
                block(input, |input| {
                    let n = len(input)?;
                    let k = std::str::from_utf8(take(input, n)?)
                        .map_err(|_| SchemaError::Invalid("an avro map key is not UTF-8".into()))?
                        .to_owned();
                    o.insert(k, self.dec(&m.types, input)?);
                    Ok(())
                })?;
                Value::Object(o)
            }
            Schema::Record(r) => {
                let mut o = Map::new();
                for f in &r.fields {
                    o.insert(f.name.clone(), self.dec(&f.schema, input)?);
                }
                Value::Object(o)
            }
            Schema::Union(u) => {
                let i = get_long(input)?;
                let b = usize::try_from(i)
                    .ok()
                    .and_then(|i| u.variants().get(i))
                    .ok_or_else(|| SchemaError::Invalid(format!("union branch {i}")))?;
                self.dec(b, input)?
            }
            Schema::Ref { name } => self.dec(self.named(name)?, input)?,
        })
    }
}

fn collect(schema: &Schema, names: &mut HashMap<String, Schema>) {
    match schema {
        Schema::Record(r) => {
            names.insert(r.name.fullname(None), schema.clone());
            for f in &r.fields {
                collect(&f.schema, names);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.fullname(None), schema.clone());
        }
        Schema::Fixed(f) => {
            names.insert(f.name.fullname(None), schema.clone());
        }
        Schema::Decimal(d) => collect(&d.inner, names),
        Schema::Array(a) => collect(&a.items, names),
        Schema::Map(m) => collect(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect(v, names)),
        _ => {}
    }
}

/// The name a union branch goes by in Avro's JSON form.
fn branch_name(s: &Schema) -> String {
    match s {
        Schema::Null => "null".into(),
        Schema::Boolean => "boolean".into(),
        Schema::Int | Schema::Date | Schema::TimeMillis => "int".into(),
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long".into(),
        Schema::Float => "float".into(),
        Schema::Double => "double".into(),
        Schema::Bytes | Schema::BigDecimal => "bytes".into(),
        Schema::String | Schema::Uuid => "string".into(),
        Schema::Array(_) => "array".into(),
        Schema::Map(_) => "map".into(),
        Schema::Record(r) => r.name.fullname(None),
        Schema::Enum(e) => e.name.fullname(None),
        Schema::Fixed(f) => f.name.fullname(None),
        Schema::Decimal(d) => branch_name(&d.inner),
        Schema::Duration => "fixed".into(),
        Schema::Ref { name } => name.fullname(None),
        Schema::Union(_) => "union".into(),
    }
}

fn at(path: &[String]) -> String {
    if path.is_empty() {
        "the payload".into()
    } else {
        format!("field {}", path.join("."))
    }
}

fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn number(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn code_points(v: &Value) -> Option<Vec<u8>> {
    v.as_str()?
        .chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ORDER: &str = r#"{
      "type": "record", "name": "OrderCreated", "namespace": "com.acme",
      "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "total_cents", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": null},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "attrs", "type": {"type": "map", "values": "int"}, "default": {}},
        {"name": "raw", "type": "bytes", "default": ""},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 0},
        {"name": "prev", "type": ["null", "Status"], "default": null}
      ]}"#;

    #[test]
    fn natural_json_round_trips() {
        let a = Avro::parse(ORDER).unwrap();
        assert_eq!(a.record_name().as_deref(), Some("com.acme.OrderCreated"));
        let v = json!({"order_id": "A-1", "total_cents": 1500, "note": "hi", "status": "PAID",
                       "amount": "15.5", "tags": ["x", "y"], "attrs": {"k": 3},
                       "raw": "\u{0}\u{ff}", "at": "2026-12-02T06:00:00Z", "prev": "NEW"});
        let mut out = Vec::new();
        a.encode(&v, &mut out).unwrap();
        let back = a.decode(&out).unwrap();
        assert_eq!(back["order_id"], "A-1");
        assert_eq!(back["total_cents"], 1500);
        assert_eq!(back["note"], "hi");
        assert_eq!(back["amount"], "15.50");
        assert_eq!(back["tags"], json!(["x", "y"]));
        assert_eq!(back["attrs"], json!({"k": 3}));
        assert_eq!(back["raw"], "\u{0}\u{ff}");
        assert_eq!(back["at"], 1_796_191_200_000_i64);
        assert_eq!(back["prev"], "NEW");
    }

    #[test]
    fn defaults_and_avro_json_union_form() {
        let a = Avro::parse(ORDER).unwrap();
        let v = json!({"order_id": "A-2", "total_cents": -3, "status": "NEW", "amount": -0.05,
                       "note": {"string": "wrapped"}});
        let mut out = Vec::new();
        a.encode(&v, &mut out).unwrap();
        let back = a.decode(&out).unwrap();
        assert_eq!(back["note"], "wrapped");
        assert_eq!(back["amount"], "-0.05");
        assert_eq!(back["tags"], json!([]));
        assert_eq!(back["prev"], Value::Null);
    }

    #[test]
    fn broken_contracts_name_the_field() {
        let a = Avro::parse(ORDER).unwrap();
        let cases = [
            (
                json!({"order_id": "A", "status": "NEW", "amount": 1}),
                "total_cents: required field missing",
            ),
            (
                json!({"order_id": "A", "total_cents": "x", "status": "NEW", "amount": 1}),
                "total_cents: expected an integer",
            ),
            (
                json!({"order_id": "A", "total_cents": 1, "status": "LOST", "amount": 1}),
                "\"LOST\" is not one of",
            ),
            (
                json!({"order_id": "A", "total_cents": 1, "status": "NEW", "amount": "1.234"}),
                "at most 2 fraction",
            ),
            (
                json!({"order_id": "A", "total_cents": 1, "status": "NEW", "amount": 1, "extra": 1}),
                "\"extra\" is not in com.acme.OrderCreated",
            ),
            (
                json!({"order_id": "A", "total_cents": 1, "status": "NEW", "amount": 1, "note": 5}),
                "fits no branch",
            ),
        ];
        for (v, want) in cases {
            let e = a.encode(&v, &mut Vec::new()).unwrap_err().to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}
