//! The Confluent wire format: magic byte `0`, the schema id as 4 bytes big-endian, for
//! Protobuf the message indexes (which message of the schema file), then the encoded datum.
//!
//! Message indexes are a count and that many indexes, each a zig-zag varint; the common
//! case, the first message of the file (`[0]`), is written as the single byte `0`.

use super::SchemaError;

/// The first byte of every framed payload. A JSON text never starts with it.
pub const MAGIC: u8 = 0;

/// A framed payload taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The registry's schema id.
    pub schema_id: u32,
    /// The rest of the payload after the id (for Protobuf, still with the message indexes).
    pub rest: &'a [u8],
}

/// True when `payload` starts like a framed payload (magic byte and room for an id).
pub fn is_framed(payload: &[u8]) -> bool {
    payload.len() >= 5 && payload[0] == MAGIC
}

/// Splits a framed payload into its schema id and the rest.
///
/// # Errors
/// [`SchemaError::Frame`] when the payload is shorter than a frame or the magic byte differs.
pub fn parse(payload: &[u8]) -> Result<Frame<'_>, SchemaError> {
    if payload.len() < 5 {
        return Err(SchemaError::Frame(format!(
            "{} byte(s): shorter than the 5-byte Confluent header",
            payload.len()
        )));
    }
    if payload[0] != MAGIC {
        return Err(SchemaError::Frame(format!(
            "magic byte is {}, not 0",
            payload[0]
        )));
    }
    let schema_id = u32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]);
    Ok(Frame {
        schema_id,
        rest: &payload[5..],
    })
}

/// The 5-byte header for `schema_id`, with room for `datum` bytes more.
pub fn header(schema_id: u32, datum: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + 4 + datum);
    out.push(MAGIC);
    out.extend_from_slice(&schema_id.to_be_bytes());
    out
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    // zig-zag, then base-128 little-endian groups
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn get_varint(input: &[u8], at: &mut usize) -> Result<i64, SchemaError> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *input
            .get(*at)
            .ok_or_else(|| SchemaError::Frame("message indexes cut short".into()))?;
        *at += 1;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    Err(SchemaError::Frame("message index varint too long".into()))
}

/// Appends Protobuf message indexes: `[0]` as the single byte `0`.
pub fn put_indexes(out: &mut Vec<u8>, indexes: &[i32]) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    put_varint(out, indexes.len() as i64);
    for i in indexes {
        put_varint(out, i64::from(*i));
    }
}

/// Reads Protobuf message indexes from the start of `rest`; returns them and the datum.
///
/// # Errors
/// [`SchemaError::Frame`] for a cut or implausible list.
pub fn take_indexes(rest: &[u8]) -> Result<(Vec<i32>, &[u8]), SchemaError> {
    let mut at = 0;
    let n = get_varint(rest, &mut at)?;
    if n == 0 {
        return Ok((vec![0], &rest[at..]));
    }
    if !(1..=64).contains(&n) {
        return Err(SchemaError::Frame(format!("{n} message indexes")));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let i = get_varint(rest, &mut at)?;
        out.push(
            i32::try_from(i)
                .ok()
                .filter(|i| *i >= 0)
                .ok_or_else(|| SchemaError::Frame(format!("message index {i}")))?,
        );
    }
    Ok((out, &rest[at..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_parse_agree() {
        let mut p = header(258, 3);
        p.extend_from_slice(b"abc");
        assert_eq!(p[..5], [0, 0, 0, 1, 2]);
        let f = parse(&p).unwrap();
        assert_eq!(f.schema_id, 258);
        assert_eq!(f.rest, b"abc");
        assert!(is_framed(&p));
        assert!(!is_framed(b"{\"a\":1}"));
        assert!(matches!(
            parse(b"\x01\0\0\0\x01"),
            Err(SchemaError::Frame(_))
        ));
        assert!(matches!(parse(b"\0\0"), Err(SchemaError::Frame(_))));
    }

    #[test]
    fn message_indexes_as_confluent_writes_them() {
        let mut out = Vec::new();
        put_indexes(&mut out, &[0]);
        assert_eq!(out, [0]);
        let mut out = Vec::new();
        put_indexes(&mut out, &[1, 0]);
        // count 2 → zig-zag 4; 1 → 2; 0 → 0
        assert_eq!(out, [4, 2, 0]);
        out.extend_from_slice(b"datum");
        let (ix, rest) = take_indexes(&out).unwrap();
        assert_eq!(ix, [1, 0]);
        assert_eq!(rest, b"datum");
        let (ix, rest) = take_indexes(&[0, 9]).unwrap();
        assert_eq!((ix, rest), (vec![0], &[9u8][..]));
        assert!(take_indexes(&[4, 2]).is_err());
        let mut big = Vec::new();
        put_indexes(&mut big, &[300]);
        assert_eq!(take_indexes(&big).unwrap().0, [300]);
    }
}
