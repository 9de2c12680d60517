//! Avro's binary encoding primitives (zig-zag varints, length-prefixed bytes, array and map
//! blocks) and decimals as two's complement integers, for `avro.rs`.

use super::SchemaError;

pub(super) fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

pub(super) fn get_long(input: &mut &[u8]) -> Result<i64, SchemaError> {
    let mut z: u64 = 0;
    for shift in (0..70).step_by(7) {
        let b = take(input, 1)?[0];
        if shift == 63 && b > 1 {
            break;
        }
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    Err(SchemaError::Invalid("an avro varint is too long".into()))
}

pub(super) fn len(input: &mut &[u8]) -> Result<usize, SchemaError> {
    let n = get_long(input)?;
    usize::try_from(n)
        .ok()
        .filter(|n| *n <= input.len())
        .ok_or_else(|| {
            SchemaError::Invalid(format!(
                "an avro length of {n} with {} byte(s) left",
                input.len()
            ))
        })
}

pub(super) fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], SchemaError> {
    if input.len() < n {
        return Err(SchemaError::Invalid("the avro datum is cut short".into()));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

/// Array and map blocks: counts (a negative count is followed by the block's size in bytes),
/// ending with 0.
pub(super) fn block(
    input: &mut &[u8],
    mut item: impl FnMut(&mut &[u8]) -> Result<(), SchemaError>,
) -> Result<(), SchemaError> {
    loop {
        let mut n = get_long(input)?;
        if n == 0 {
            return Ok(());
        }
        if n < 0 {
            n = -n;
            get_long(input)?;
        }
        if n as usize > input.len().max(1) * 8 + 1_000_000 {
            return Err(SchemaError::Invalid(format!("an avro block of {n} items")));
        }
        for _ in 0..n {
            item(input)?;
        }
    }
}

/// `"12.3"` at scale 2 → 1230; `None` for malformed text or lost digits.
pub(super) fn unscale(text: &str, scale: usize) -> Option<i128> {
    let t = text.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if t.contains(['e', 'E']) {
        return None;
    }
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let frac = frac.trim_end_matches('0');
    if frac.len() > scale || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}{}", "0".repeat(scale - frac.len()));
    let v: i128 = if digits.trim_start_matches('0').is_empty() {
        0
    } else {
        digits.trim_start_matches('0').parse().ok()?
    };
    Some(if neg { -v } else { v })
}

/// Two's complement big-endian bytes (any length) at `scale` → `"12.30"`.
pub(super) fn rescale(raw: &[u8], scale: usize) -> Result<String, SchemaError> {
    if raw.len() > 16 && raw[..raw.len() - 16].iter().any(|b| *b != 0 && *b != 0xff) {
        return Err(SchemaError::Invalid("a decimal wider than 128 bits".into()));
    }
    let neg = raw.first().is_some_and(|b| b & 0x80 != 0);
    let mut buf = [if neg { 0xff } else { 0 }; 16];
    let tail = &raw[raw.len().saturating_sub(16)..];
    buf[16 - tail.len()..].copy_from_slice(tail);
    let v = i128::from_be_bytes(buf);
    let digits = v.unsigned_abs().to_string();
    let digits = format!(
        "{}{digits}",
        "0".repeat((scale + 1).saturating_sub(digits.len()))
    );
    let (int, frac) = digits.split_at(digits.len() - scale);
    let sign = if v < 0 { "-" } else { "" };
    Ok(if scale == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    })
}

/// The shortest two's complement form of a 16-byte big-endian integer.
pub(super) fn minimal(full: &[u8; 16]) -> &[u8] {
    let mut i = 0;
    while i < 15 {
        let (b, next) = (full[i], full[i + 1]);
        if (b == 0 && next & 0x80 == 0) || (b == 0xff && next & 0x80 != 0) {
            i += 1;
        } else {
            break;
        }
    }
    &full[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_and_varints() {
        assert_eq!(unscale("12.3", 2), Some(1230));
        assert_eq!(unscale("-0.05", 2), Some(-5));
        assert_eq!(unscale("7", 0), Some(7));
        assert_eq!(unscale("1.239", 2), None);
        assert_eq!(unscale("abc", 2), None);
        assert_eq!(rescale(&[0x04, 0xce], 2).unwrap(), "12.30");
        assert_eq!(rescale(&[0xfb], 2).unwrap(), "-0.05");
        assert_eq!(minimal(&(-5i128).to_be_bytes()), &[0xfb]);
        assert_eq!(minimal(&(128i128).to_be_bytes()), &[0x00, 0x80]);
        for n in [0i64, 1, -1, 63, -64, 64, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            put_long(&mut out, n);
            assert_eq!(get_long(&mut &out[..]).unwrap(), n);
        }
    }
}
