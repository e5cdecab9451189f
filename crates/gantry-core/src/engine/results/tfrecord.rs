//! TensorBoard event files: TFRecord framing (length, masked CRC32C of the length, data, masked
//! CRC32C of the data) around `Event` protobufs, decoded by hand for the few fields scalars use:
//! `Event { wall_time = 1 (double), step = 2 (int64), summary = 5 }`, `Summary { value = 1 }`,
//! `Summary.Value { tag = 1, simple_value = 2 (float), tensor = 8 }` and a scalar `TensorProto`
//! (`dtype = 1`, `tensor_content = 4`, `float_val = 5`, `double_val = 6`, `int_val = 7`,
//! `int64_val = 10`, `half_val = 13`). Pure: the reader feeds it bytes and keeps where it got to.

use crate::store::Logged;

/// CRC32C (Castagnoli), reflected, as TFRecord uses it.
fn crc32c(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            }
            *e = c;
        }
        t
    });
    !data
        .iter()
        .fold(!0u32, |c, &b| t[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8))
}

/// TFRecord's masked CRC.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// What one pass over the unread part of an event file gave.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    pub points: Vec<Logged>,
    /// Records whose CRCs did not match or that did not decode (skipped).
    pub bad: u64,
    /// Bytes consumed: whole records only (a record being written is read next time).
    pub consumed: usize,
    /// The framing is broken (a length whose CRC does not match): nothing after it can be trusted.
    pub broken: bool,
}

/// Most bytes one record may have (a scalar event is ~100 bytes; images and histograms are larger,
/// and skipped whole).
const RECORD_MAX: u64 = 64 << 20;

/// Parse the whole records in `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    let mut p = Parsed::default();
    let mut pos = 0usize;
    while buf.len() - pos >= 12 {
        let head = &buf[pos..pos + 12];
        let len = u64::from_le_bytes(head[..8].try_into().unwrap());
        let len_crc = u32::from_le_bytes(head[8..12].try_into().unwrap());
        if masked_crc(&head[..8]) != len_crc || len > RECORD_MAX {
            p.bad += 1;
            p.broken = true;
            return p;
        }
        let end = pos + 12 + len as usize + 4;
        if buf.len() < end {
            break;
        }
        let data = &buf[pos + 12..end - 4];
        let crc = u32::from_le_bytes(buf[end - 4..end].try_into().unwrap());
        if masked_crc(data) != crc || event(data, &mut p.points).is_none() {
            p.bad += 1;
        }
        pos = end;
        p.consumed = pos;
    }
    p
}

/// One protobuf field: its number and value.
enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of one message, in order; `None` when it does not decode.
fn fields(b: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = vec![];
    let mut pos = 0;
    while pos < b.len() {
        let key = varint(b, &mut pos)?;
        let f = match key & 7 {
            0 => Field::Varint(varint(b, &mut pos)?),
            1 => {
                let v = u64::from_le_bytes(b.get(pos..pos + 8)?.try_into().ok()?);
                pos += 8;
                Field::Fixed64(v)
            }
            2 => {
                let n = varint(b, &mut pos)? as usize;
                let v = b.get(pos..pos.checked_add(n)?)?;
                pos += n;
                Field::Bytes(v)
            }
            5 => {
                let v = u32::from_le_bytes(b.get(pos..pos + 4)?.try_into().ok()?);
                pos += 4;
                Field::Fixed32(v)
            }
            _ => return None,
        };
        out.push((key >> 3, f));
    }
    Some(out)
}

fn event(data: &[u8], out: &mut Vec<Logged>) -> Option<()> {
    let (mut wall, mut step, mut summary) = (0f64, 0i64, None);
    for (n, f) in fields(data)? {
        match (n, f) {
            (1, Field::Fixed64(v)) => wall = f64::from_bits(v),
            (2, Field::Varint(v)) => step = v as i64,
            (5, Field::Bytes(b)) => summary = Some(b),
            _ => {}
        }
    }
    let at = if wall.is_finite() { (wall * 1000.0) as i64 } else { 0 };
    for (n, f) in fields(summary.unwrap_or_default())? {
        if let (1, Field::Bytes(v)) = (n, f) {
            let (mut tag, mut value) = (None, None);
            for (n, f) in fields(v)? {
                match (n, f) {
                    (1, Field::Bytes(t)) => tag = std::str::from_utf8(t).ok(),
                    (2, Field::Fixed32(x)) => value = Some(f32::from_bits(x) as f64),
                    (8, Field::Bytes(t)) => value = value.or_else(|| scalar_tensor(t)),
                    _ => {}
                }
            }
            if let (Some(tag), Some(value)) = (tag, value) {
                out.push(Logged {
                    name: tag.to_string(),
                    step: Some(step),
                    at,
                    value,
                });
            }
        }
    }
    Some(())
}

/// The value of a tensor with one element (a scalar), by its dtype.
fn scalar_tensor(t: &[u8]) -> Option<f64> {
    let (mut dtype, mut content, mut dims) = (0u64, None, 0usize);
    let mut vals: Vec<f64> = vec![];
    let packed_or_one = |f: Field, width: usize, conv: &dyn Fn(&[u8]) -> f64, vals: &mut Vec<f64>| match f {
        Field::Bytes(b) => vals.extend(b.chunks_exact(width).map(conv)),
        Field::Fixed32(x) => vals.push(conv(&x.to_le_bytes())),
        Field::Fixed64(x) => vals.push(conv(&x.to_le_bytes())),
        Field::Varint(_) => {}
    };
    for (n, f) in fields(t)? {
        match (n, f) {
            (1, Field::Varint(d)) => dtype = d,
            (2, Field::Bytes(shape)) => {
                dims = fields(shape)?
                    .iter()
                    .filter(|(n, f)| *n == 2 && matches!(f, Field::Bytes(_)))
                    .count()
            }
            (4, Field::Bytes(c)) => content = Some(c),
            (5, f) => packed_or_one(f, 4, &|b| f32::from_le_bytes(b.try_into().unwrap()) as f64, &mut vals),
            (6, f) => packed_or_one(f, 8, &|b| f64::from_le_bytes(b.try_into().unwrap()), &mut vals),
            (7 | 10 | 13, Field::Varint(v)) => vals.push(match (n, dtype) {
                (13, _) => half(v as u16),
                (10, _) => v as i64 as f64,
                _ => v as i32 as f64,
            }),
            (7 | 10 | 13, Field::Bytes(b)) => {
                let mut pos = 0;
                while pos < b.len() {
                    let v = varint(b, &mut pos)?;
                    vals.push(match n {
                        13 => half(v as u16),
                        10 => v as i64 as f64,
                        _ => v as i32 as f64,
                    });
                }
            }
            _ => {}
        }
    }
    if dims > 0 && vals.len() != 1 {
        return None;
    }
    if let Some(c) = content {
        return match (dtype, c.len()) {
            (1, 4) => Some(f32::from_le_bytes(c.try_into().ok()?) as f64),
            (2, 8) => Some(f64::from_le_bytes(c.try_into().ok()?)),
            (3, 4) => Some(i32::from_le_bytes(c.try_into().ok()?) as f64),
            (9, 8) => Some(i64::from_le_bytes(c.try_into().ok()?) as f64),
            (19, 2) => Some(half(u16::from_le_bytes(c.try_into().ok()?))),
            _ => None,
        };
    }
    (vals.len() == 1).then(|| vals[0])
}

/// An IEEE half-precision float.
fn half(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f64;
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Test and benchmark helpers: event records as a writer makes them.
#[cfg(test)]
pub mod write {
    use super::masked_crc;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn bytes_field(n: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(n << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    /// One framed record.
    pub fn record(data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&masked_crc(&out.clone()).to_le_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(&masked_crc(data).to_le_bytes());
        out
    }

    /// An `Event` with one `simple_value` (or, with `tensor`, a scalar float tensor).
    pub fn scalar(tag: &str, step: i64, wall: f64, value: f32, tensor: bool) -> Vec<u8> {
        let mut v = vec![];
        bytes_field(1, tag.as_bytes(), &mut v);
        if tensor {
            let mut t = vec![];
            varint(1 << 3, &mut t);
            varint(1, &mut t); // DT_FLOAT
            bytes_field(2, &[], &mut t); // shape: no dims
            t.push(5 << 3 | 5);
            t.extend_from_slice(&value.to_le_bytes());
            bytes_field(8, &t, &mut v);
        } else {
            v.push(2 << 3 | 5);
            v.extend_from_slice(&value.to_le_bytes());
        }
        let mut summary = vec![];
        bytes_field(1, &v, &mut summary);
        let mut e = vec![9u8];
        e.extend_from_slice(&wall.to_le_bytes());
        varint(2 << 3, &mut e);
        varint(step as u64, &mut e);
        bytes_field(5, &summary, &mut e);
        record(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnolis() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn scalars_are_read_from_simple_values_and_tensors_and_partial_records_wait() {
        let mut file = write::record(b"\x09\0\0\0\0\0\0\xf0\x3f\x1a\x0dbrain.Event:2"); // file_version
        file.extend(write::scalar("loss", 10, 1700000000.5, 0.25, false));
        file.extend(write::scalar("acc", 10, 1700000000.5, 0.75, true));
        file.extend(write::scalar("loss", 20, 1700000001.0, f32::NAN, false));
        let whole = file.len();
        let next = write::scalar("loss", 30, 1700000002.0, 0.125, false);
        file.extend(&next[..10]);
        let p = parse(&file);
        assert_eq!((p.bad, p.consumed, p.broken), (0, whole, false));
        let got: Vec<(&str, i64, i64)> = p
            .points
            .iter()
            .map(|l| (l.name.as_str(), l.step.unwrap(), l.at))
            .collect();
        assert_eq!(
            got,
            [
                ("loss", 10, 1700000000500),
                ("acc", 10, 1700000000500),
                ("loss", 20, 1700000001000)
            ]
        );
        assert_eq!((p.points[0].value, p.points[1].value), (0.25, 0.75));
        assert!(p.points[2].value.is_nan());
    }

    #[test]
    fn a_corrupt_record_is_counted_and_garbage_framing_stops_reading() {
        let mut rec = write::scalar("loss", 1, 1.0, 1.0, false);
        let n = rec.len();
        rec[n - 6] ^= 0xff; // data changed: its CRC no longer matches
        rec.extend(write::scalar("loss", 2, 2.0, 2.0, false));
        let p = parse(&rec);
        assert_eq!((p.bad, p.points.len(), p.broken), (1, 1, false));
        let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let p = parse(&junk);
        assert_eq!((p.bad, p.points.len(), p.broken, p.consumed), (1, 0, true, 0));
    }
}
