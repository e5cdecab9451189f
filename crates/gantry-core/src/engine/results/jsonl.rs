//! The `GANTRY_METRICS` file: one JSON object per line, `{"step": 100, "loss": 0.23, "val/acc": 0.91}`.
//! Every key but `step` whose value is a number is a metric (NaN and infinities as Python's `json`
//! writes them, bare `NaN`/`Infinity`/`-Infinity`, or as strings); other values are ignored. A line
//! that is not a JSON object is garbage: counted, skipped, never fatal. Pure: the reader feeds it
//! bytes and keeps where it got to.

use crate::defaults::RESULTS_LINE_MAX;
use crate::protocol::results::parse_non_finite;
use crate::store::Logged;

/// What one pass over the unread part of the file gave.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    pub points: Vec<Logged>,
    pub garbage: u64,
    /// The first garbage line's number (1-based, in the file).
    pub first_garbage: Option<u64>,
    /// Bytes consumed (whole lines; all of `buf` at the end or in a too-long line).
    pub consumed: usize,
    /// Lines consumed.
    pub lines: u64,
    /// Still inside a line longer than [`RESULTS_LINE_MAX`] (counted once as garbage).
    pub skipping: bool,
}

/// Parse the complete lines of `buf` (the file from its unread part on); with `last`, the trailing
/// line without `\n` too (the attempt ended). `skipping`: the previous pass stopped inside a too-long
/// line. `line_no`: lines consumed before `buf`. `at`: the time given to the points.
pub fn parse(buf: &[u8], last: bool, mut skipping: bool, line_no: u64, at: i64) -> Parsed {
    let mut p = Parsed::default();
    let mut pos = 0;
    while pos < buf.len() {
        let rest = &buf[pos..];
        let Some(nl) = rest.iter().position(|&c| c == b'\n') else {
            if skipping || rest.len() >= RESULTS_LINE_MAX {
                // Inside (or starting) a line too long to be metrics: drop what is here.
                if !skipping {
                    p.garbage += 1;
                    p.first_garbage.get_or_insert(line_no + p.lines + 1);
                }
                p.consumed = buf.len();
                p.skipping = !last;
                return p;
            }
            if last {
                one_line(rest, line_no + p.lines + 1, at, &mut p);
                p.lines += 1;
                p.consumed = buf.len();
            }
            return p;
        };
        let line = &rest[..nl];
        if skipping {
            skipping = false;
        } else if line.len() > RESULTS_LINE_MAX {
            p.garbage += 1;
            p.first_garbage.get_or_insert(line_no + p.lines + 1);
        } else {
            one_line(line, line_no + p.lines + 1, at, &mut p);
        }
        p.lines += 1;
        pos += nl + 1;
        p.consumed = pos;
    }
    p
}

fn one_line(line: &[u8], n: u64, at: i64, p: &mut Parsed) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|c| c.is_ascii_whitespace()) {
        return;
    }
    let obj = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line)
        .ok()
        .or_else(|| {
            let fixed = quote_bare_non_finite(line)?;
            serde_json::from_slice(&fixed).ok()
        });
    let Some(obj) = obj else {
        p.garbage += 1;
        p.first_garbage.get_or_insert(n);
        return;
    };
    let step = obj
        .get("step")
        .and_then(number)
        .filter(|s| s.is_finite())
        .map(|s| s as i64);
    for (k, v) in &obj {
        if k == "step" {
            continue;
        }
        if let Some(value) = number(v) {
            p.points.push(Logged {
                name: k.clone(),
                step,
                at,
                value,
            });
        }
    }
}

fn number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => parse_non_finite(s),
        _ => None,
    }
}

/// `{"loss": NaN}` (Python's `json.dumps` of a NaN) as `{"loss": "NaN"}`; `None` when there is
/// nothing to quote.
fn quote_bare_non_finite(line: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(line.len() + 8);
    let (mut in_str, mut escaped, mut changed) = (false, false, false);
    let mut i = 0;
    while i < line.len() {
        let c = line[i];
        if in_str {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
            out.push(c);
            i += 1;
            continue;
        }
        let token = [&b"-Infinity"[..], b"Infinity", b"NaN"]
            .into_iter()
            .find(|t| line[i..].starts_with(t));
        match token {
            Some(t) => {
                out.push(b'"');
                out.extend_from_slice(t);
                out.push(b'"');
                i += t.len();
                changed = true;
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_points_and_garbage_is_counted() {
        let text = b"{\"step\": 100, \"loss\": 0.23, \"val/acc\": 0.91}\nnot json\n{\"loss\": NaN, \"x\": -Infinity, \"note\": \"NaN here\"}\n\x00\xff\xfe\n\n{\"loss\": 0.1}";
        let p = parse(text, false, false, 0, 7);
        assert_eq!((p.garbage, p.first_garbage, p.lines), (2, Some(2), 5));
        assert_eq!(p.consumed, text.len() - "{\"loss\": 0.1}".len());
        let names: Vec<(&str, Option<i64>)> = p.points.iter().map(|l| (l.name.as_str(), l.step)).collect();
        assert_eq!(
            names,
            [("loss", Some(100)), ("val/acc", Some(100)), ("loss", None), ("x", None)]
        );
        assert!(p.points[2].value.is_nan());
        assert_eq!(p.points[3].value, f64::NEG_INFINITY);
        // The attempt ended: the last line without its newline counts.
        let p = parse(&text[p.consumed..], true, false, 5, 7);
        assert_eq!((p.points.len(), p.points[0].value, p.lines), (1, 0.1, 1));
    }

    #[test]
    fn a_line_too_long_is_one_garbage_line_however_it_is_cut() {
        let mut text = vec![b'x'; RESULTS_LINE_MAX + 10];
        let p = parse(&text, false, false, 0, 0);
        assert_eq!((p.garbage, p.skipping, p.consumed), (1, true, text.len()));
        text.extend_from_slice(b"yyy\n{\"a\": 1}\n");
        let p2 = parse(b"yyy\n{\"a\": 1}\n", false, true, 0, 0);
        assert_eq!((p2.garbage, p2.points.len(), p2.skipping), (0, 1, false));
        let whole = parse(&text, false, false, 0, 0);
        assert_eq!((whole.garbage, whole.points.len()), (1, 1));
    }
}
