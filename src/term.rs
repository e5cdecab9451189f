//! Writing to the terminal: stdout that survives a closed pipe, and text from other users (names,
//! messages, job output) made unable to drive the reader's terminal.

use std::borrow::Cow;

/// `println!` that exits quietly once stdout is closed (`gantry ls | head -1`) instead of panicking.
/// SIGPIPE stays ignored: the CLI also writes to the engine's socket, and dying of SIGPIPE there
/// would hide the engine's error.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::term::write_out(format!("{}\n", format_args!($($arg)*)).as_bytes()) };
}
pub(crate) use outln;

pub fn write_out(bytes: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|_| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("gantry: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// Control characters (and bidi overrides) in `s` as visible escapes (`\u{1b}`), except those in
/// `keep`: names, messages and output come from other users and must not drive the reader's terminal.
pub fn escape<'a>(s: &'a str, keep: &str) -> Cow<'a, str> {
    let bad = |c: char| {
        (c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')) && !keep.contains(c)
    };
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if bad(c) {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// A one-line field of human output.
pub fn esc(s: &str) -> Cow<'_, str> {
    escape(s, "")
}

/// Job output made safe for a terminal: control characters other than newline and tab are escaped.
/// A UTF-8 character split between chunks is held back until its end arrives.
#[derive(Default)]
pub struct TermSafe {
    held: Vec<u8>,
}

impl TermSafe {
    pub fn feed(&mut self, chunk: &[u8]) -> String {
        self.held.extend_from_slice(chunk);
        let keep = incomplete_utf8_tail(&self.held);
        let tail = self.held.split_off(self.held.len() - keep);
        let text = escape(&String::from_utf8_lossy(&self.held), "\n\t").into_owned();
        self.held = tail;
        text
    }
}

/// How many bytes at the end of `b` start a UTF-8 character that is not complete yet.
fn incomplete_utf8_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let c = b[b.len() - back];
        if c >= 0xC0 {
            let len = if c >= 0xF0 {
                4
            } else if c >= 0xE0 {
                3
            } else {
                2
            };
            return if len > back { back } else { 0 };
        }
        if c < 0x80 {
            return 0;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_print_as_visible_escapes() {
        assert_eq!(esc("plain name-1"), "plain name-1");
        assert_eq!(
            esc("\x1b[2Jx\r\n\t\u{9b}\u{202e}"),
            "\\u{1b}[2Jx\\r\\n\\t\\u{9b}\\u{202e}"
        );
        assert_eq!(escape("a\nb\x07", "\n"), "a\nb\\u{7}");
    }

    #[test]
    fn job_output_is_escaped_across_chunk_boundaries() {
        let mut t = TermSafe::default();
        let text = "é\x1b]0;owned\x07 ok\n".as_bytes();
        let out: String = text.chunks(1).map(|c| t.feed(c)).collect();
        assert_eq!(out, "é\\u{1b}]0;owned\\u{7} ok\n");
        assert_eq!(incomplete_utf8_tail(&[b'a', 0xE2, 0x82]), 2);
        assert_eq!(incomplete_utf8_tail(&[0xE2, 0x82, 0xAC]), 0);
    }
}
