//! A job's log file: Gantry's own lines, and the job's output copied in by its backend through one
//! capped path ([`CappedLog`]), so a capped log says so whichever backend ran the job.
//!
//! The job's output is cut into lines by [`Lines`], in one pass and bounded memory: a line is what
//! was written up to `\n`, and its text is its last non-empty `\r` segment (a progress bar's final
//! state, a CRLF line without its `\r`); a segment longer than [`LINE_MAX`] keeps its first
//! [`LINE_MAX`] bytes and gets a note saying how much was left out.
//!
//! The file holds one record per line:
//! - `<timestamp> <text>\n`: a line of the job's output (Docker's timestamp, where to resume after
//!   a restart; Slurm's output has none),
//! - `[gantry …] …\n`: Gantry's own,
//! - `\r<text>\n`: the current state of a line that has not ended yet (a progress bar), written at
//!   most every [`PROGRESS_EVERY`] while the job runs. A reader shows it only while nothing follows
//!   it ([`strip_stamps`]): the line's next state, or the line itself, replaces it.
//!
//! - `\r\r<what>\n`: a backend's bookkeeping (where its copy of the output got to), never shown.
//!
//! A line's text never holds `\r`, so a record starting with `\r` is always a progress state (or,
//! with two, bookkeeping: a state never starts with `\r` either).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

pub(crate) use crate::defaults::{LINE_MAX, PROGRESS_EVERY, PROGRESS_MAX, PROGRESS_SLOW};

/// Gantry's own lines in a job log start with `[gantry`, never with a digit, so they are never taken
/// for Docker's timestamped output when finding where to resume.
pub(crate) fn append_log(path: &Path, line: &str) {
    let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
    {
        let _ = writeln!(f, "[gantry {ts}] {line}");
    }
}

/// Is this line of a job log Gantry's own (not the job's output)?
pub(crate) fn is_gantrys(line: &[u8]) -> bool {
    line.starts_with(b"[gantry ") || line.starts_with(b"[gantry]")
}

/// Is this record of a job log a progress state (see the module docs)?
pub(crate) fn is_progress(line: &[u8]) -> bool {
    line.first() == Some(&b'\r')
}

/// A job's output as users read it. The engine stores each line with Docker's timestamp in front (where
/// to resume after a restart); that prefix is dropped. Gantry's own `[gantry …]` lines are kept whole.
/// A progress state shows only when nothing follows it in `data` (it is the current state of the
/// last line), as a line of its own.
pub fn strip_stamps(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut progress: Option<&[u8]> = None;
    for line in data.split_inclusive(|c| *c == b'\n') {
        if line.starts_with(b"\r\r") {
            continue; // a backend's own bookkeeping (`CappedLog::mark`)
        }
        if is_progress(line) {
            progress = Some(&line[1..]);
            continue;
        }
        progress = None;
        out.extend_from_slice(&line[stamp_len(line)..]);
    }
    if let Some(p) = progress {
        out.extend_from_slice(p);
    }
    out
}

/// [`strip_stamps`] for a reader following the log chunk by chunk on a terminal (`logs -f`): the
/// current progress state ends in `\r` instead of `\n`, so the next state, or the line itself, is
/// drawn over it.
pub fn strip_stamps_live(data: &[u8]) -> Vec<u8> {
    let mut out = strip_stamps(data);
    if data
        .split_inclusive(|c| *c == b'\n')
        .next_back()
        .is_some_and(is_progress)
        && out.last() == Some(&b'\n')
    {
        *out.last_mut().unwrap() = b'\r';
    }
    out
}

/// [`strip_stamps`] for a log read chunk by chunk (the API streams logs in bounded memory): fed
/// the file in any chunking, then [`LogReader::finish`]ed, it gives what `strip_stamps` gives for
/// the whole file. It holds at most one record not ended yet (cut at [`RECORD_MAX`]) and the last
/// progress state.
#[derive(Debug, Default)]
pub struct LogReader {
    /// The record not ended yet (no `\n` seen).
    partial: Vec<u8>,
    /// The last progress state (with its `\n`), shown only if nothing follows it.
    progress: Option<Vec<u8>>,
}

/// A record longer than this (Gantry never writes one: lines are cut at [`LINE_MAX`]) is passed on
/// in pieces, so a reader's memory stays bounded whatever the file holds.
pub const RECORD_MAX: usize = 4 * LINE_MAX;

impl LogReader {
    /// What `data` adds to the output: every record it ends.
    pub fn feed(&mut self, mut data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        while let Some(nl) = data.iter().position(|c| *c == b'\n') {
            if self.partial.is_empty() {
                self.record(&data[..=nl], &mut out);
            } else {
                let mut rec = std::mem::take(&mut self.partial);
                rec.extend_from_slice(&data[..=nl]);
                self.record(&rec, &mut out);
                rec.clear();
                self.partial = rec;
            }
            data = &data[nl + 1..];
        }
        self.partial.extend_from_slice(data);
        if self.partial.len() > RECORD_MAX {
            let rec = std::mem::take(&mut self.partial);
            self.record(&rec, &mut out);
        }
        out
    }

    fn record(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if line.starts_with(b"\r\r") {
            return; // a backend's own bookkeeping
        }
        if is_progress(line) {
            let p = self.progress.get_or_insert_with(Vec::new);
            p.clear();
            p.extend_from_slice(&line[1..line.len().min(RECORD_MAX)]);
            return;
        }
        self.progress = None;
        out.extend_from_slice(&line[stamp_len(line)..]);
    }

    /// Caught up with a log still being written (`logs -f`, the app): the current progress state,
    /// once, ending in `\r` instead of `\n`, so its next state, or the line itself, is drawn over it
    /// (a progress bar redraws, as on the job's own terminal, instead of a new line per update).
    pub fn caught_up(&mut self) -> Vec<u8> {
        let mut p = self.progress.take().unwrap_or_default();
        if p.last() == Some(&b'\n') {
            *p.last_mut().unwrap() = b'\r';
        }
        p
    }

    /// The end of the file: the record without a newline, and the progress state nothing followed.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = vec![];
        let rec = std::mem::take(&mut self.partial);
        if !rec.is_empty() {
            self.record(&rec, &mut out);
        }
        out.extend(self.progress.take().unwrap_or_default());
        out
    }
}

/// Length of a leading `2026-01-02T03:04:05.123456789Z ` (0 if the line has none).
pub(crate) fn stamp_len(line: &[u8]) -> usize {
    if !line.first().is_some_and(u8::is_ascii_digit) {
        return 0;
    }
    let Some(sp) = line.iter().take(40).position(|c| *c == b' ') else {
        return 0;
    };
    match std::str::from_utf8(&line[..sp]).ok().map(humantime::parse_rfc3339) {
        Some(Ok(_)) => sp + 1,
        _ => 0,
    }
}

/// One stream's output cut into lines (see the module docs): linear in what it is fed, never more
/// than two segments of [`LINE_MAX`] in memory.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    /// The segment being written (after the last `\r`), and how many of its bytes were left out.
    cur: Vec<u8>,
    cur_cut: u64,
    /// The last non-empty segment before it.
    prev: Vec<u8>,
    prev_cut: u64,
    /// Bytes fed since the last line ended.
    raw: u64,
}

impl Lines {
    /// Feed output; `done(text, cut)` gets each line that ends in it (`cut`: bytes left out).
    pub fn feed(
        &mut self,
        mut data: &[u8],
        mut done: impl FnMut(&[u8], u64) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.raw = match data.iter().rposition(|c| *c == b'\n') {
            Some(p) => (data.len() - p - 1) as u64,
            None => self.raw + data.len() as u64,
        };
        while !data.is_empty() {
            let at = data.iter().position(|c| *c == b'\r' || *c == b'\n');
            let text = &data[..at.unwrap_or(data.len())];
            let room = LINE_MAX.saturating_sub(self.cur.len()).min(text.len());
            self.cur.extend_from_slice(&text[..room]);
            self.cur_cut += (text.len() - room) as u64;
            let Some(at) = at else { break };
            if data[at] == b'\r' {
                if !self.cur.is_empty() {
                    std::mem::swap(&mut self.cur, &mut self.prev);
                    self.prev_cut = self.cur_cut;
                    self.cur.clear();
                    self.cur_cut = 0;
                }
            } else {
                let (text, cut) = self.state();
                done(text, cut)?;
                self.clear();
            }
            data = &data[at + 1..];
        }
        Ok(())
    }

    /// The current state of the line not ended yet: its last non-empty segment (empty if none).
    pub fn state(&self) -> (&[u8], u64) {
        if self.cur.is_empty() {
            (&self.prev, self.prev_cut)
        } else {
            (&self.cur, self.cur_cut)
        }
    }

    /// Nothing written since the last line ended (or only `\r`s).
    pub fn is_empty(&self) -> bool {
        self.cur.is_empty() && self.prev.is_empty()
    }

    /// Bytes fed since the last line ended: where to read again to rebuild the line not ended yet.
    pub fn pending(&self) -> u64 {
        self.raw
    }

    pub fn clear(&mut self) {
        self.cur.clear();
        self.prev.clear();
        self.cur_cut = 0;
        self.prev_cut = 0;
        self.raw = 0;
    }
}

/// A job's log open for its output, capped at `cap` bytes (the lab's `log_cap`): the line that would
/// take it past the cap is replaced by `[gantry] log truncated: …`, written once; nothing after it.
pub(crate) struct CappedLog {
    f: std::fs::File,
    written: u64,
    cap: u64,
    truncated: bool,
    /// Bytes of progress states written, for their slower pace past 1/16 of the cap.
    progress_bytes: u64,
    buf: Vec<u8>,
}

impl CappedLog {
    /// Append to `path` (created 0600).
    pub fn open(path: &Path, cap: u64) -> std::io::Result<CappedLog> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        CappedLog::new(f, cap)
    }

    /// Write on to `f`, already where output goes next.
    pub fn new(f: std::fs::File, cap: u64) -> std::io::Result<CappedLog> {
        let written = f.metadata()?.len();
        Ok(CappedLog {
            f,
            written,
            cap,
            truncated: written >= cap,
            progress_bytes: 0,
            buf: vec![],
        })
    }

    /// One record, with its newline.
    pub fn put(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.truncated {
            return Ok(());
        }
        if self.written + line.len() as u64 > self.cap {
            self.f.write_all(
                format!("[gantry] log truncated: the job wrote more than {} bytes\n", self.cap).as_bytes(),
            )?;
            self.truncated = true;
            return Ok(());
        }
        self.written += line.len() as u64;
        self.f.write_all(line)
    }

    /// One line of the job's output (`stamp`: what goes in front, Docker's timestamp and a space);
    /// a line cut at [`LINE_MAX`] is followed by a note saying so.
    pub fn line(&mut self, stamp: &[u8], text: &[u8], cut: u64) -> std::io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.extend_from_slice(stamp);
        buf.extend_from_slice(text);
        buf.push(b'\n');
        let wrote = self.put(&buf);
        self.buf = buf;
        wrote?;
        if cut > 0 {
            let kept = crate::units::format_bytes(LINE_MAX as u64);
            self.put(format!("[gantry] the line above was cut at {kept}: {cut} more bytes of it (without a newline) are left out\n").as_bytes())?;
        }
        Ok(())
    }

    /// The current state of a line not ended yet (its first [`PROGRESS_MAX`] bytes).
    pub fn progress(&mut self, text: &[u8]) -> std::io::Result<()> {
        let text = &text[..text.len().min(PROGRESS_MAX)];
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.push(b'\r');
        buf.extend_from_slice(text);
        buf.push(b'\n');
        let wrote = self.put(&buf);
        self.progress_bytes += buf.len() as u64;
        self.buf = buf;
        wrote
    }

    /// A backend's bookkeeping (one line of text), never shown to readers.
    pub fn mark(&mut self, what: &str) -> std::io::Result<()> {
        self.put(format!("\r\r{what}\n").as_bytes())
    }

    /// How long after a progress state the next may be written.
    pub fn progress_every(&self) -> Duration {
        if self.progress_bytes > self.cap / 16 {
            PROGRESS_SLOW
        } else {
            PROGRESS_EVERY
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_replaced_by_one_note() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.log");
        let mut l = CappedLog::open(&p, 10).unwrap();
        for line in ["12345\n", "678\n", "9abc\n", "d\n"] {
            l.put(line.as_bytes()).unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "12345\n678\n[gantry] log truncated: the job wrote more than 10 bytes\n"
        );
        assert!(
            is_gantrys(b"[gantry] log truncated")
                && is_gantrys(b"[gantry 2026-01-01T00:00:00Z] x")
                && !is_gantrys(b"2026 out")
        );
    }

    fn lines_of(chunks: &[&[u8]]) -> (Vec<(String, u64)>, String) {
        let mut l = Lines::default();
        let mut out = vec![];
        for c in chunks {
            l.feed(c, |t, cut| {
                out.push((String::from_utf8_lossy(t).into_owned(), cut));
                Ok(())
            })
            .unwrap();
        }
        (out, String::from_utf8_lossy(l.state().0).into_owned())
    }

    /// A line is its last non-empty `\r` segment, whatever the chunking: the same lines for every
    /// split of the same output.
    #[test]
    fn a_line_is_its_last_carriage_return_segment_in_every_chunking() {
        let out = b"epoch 1\n\r  0%|     | 0/3\r 33%|#    | 1/3\r100%|#####| 3/3\r\nwin\r\n\r\n\rabc\rx\n50%\rnow";
        let want: Vec<(String, u64)> = ["epoch 1", "100%|#####| 3/3", "win", "", "x"]
            .iter()
            .map(|s| (s.to_string(), 0))
            .collect();
        for size in 1..=out.len() {
            let chunks: Vec<&[u8]> = out.chunks(size).collect();
            let (lines, state) = lines_of(&chunks);
            assert_eq!(lines, want, "chunks of {size}");
            assert_eq!(
                state, "now",
                "the line not ended yet: its current state, chunks of {size}"
            );
        }
        assert_eq!(
            lines_of(&[b"a\rb\r"]).1,
            "b",
            "after a `\\r` the last state stays until the next one"
        );
    }

    /// Issue 18, item 5: a log streamed chunk by chunk reads as the whole file does, in every
    /// chunking, holding at most one record.
    #[test]
    fn a_log_read_in_chunks_reads_as_the_whole_file() {
        let log: &[u8] = b"2026-01-01T00:00:00.000000001Z start\n\r 10%\n\r\rmark 1\n\r 20%\n2026-01-01T00:00:01.000000001Z 100%\n[gantry 2026] note\n\r 5%\n\r\rmark 2\n\r 7%\n";
        for tail in [&b""[..], b"2026-01-01T00:00:02.000000001Z no newline yet"] {
            let whole = [log, tail].concat();
            let want = strip_stamps(&whole);
            for size in 1..=whole.len() {
                let mut r = LogReader::default();
                let mut got: Vec<u8> = whole.chunks(size).flat_map(|c| r.feed(c)).collect();
                got.extend(r.finish());
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&want),
                    "chunks of {size}"
                );
            }
        }
        // Following: the current state once when caught up, never held back past the next line.
        let mut r = LogReader::default();
        assert_eq!(r.feed(b"a\n\r 1%\n"), b"a\n");
        // Issue 28: it ends in `\r`, so the next state or the line is drawn over it.
        assert_eq!(r.caught_up(), b" 1%\r");
        assert_eq!(r.caught_up(), b"");
        assert_eq!(
            r.feed(b"\r 2%\nb\n"),
            b"b\n",
            "a state followed by its line is not shown"
        );
        // A record far longer than Gantry writes is passed on in pieces, not held.
        let mut r = LogReader::default();
        let out = r.feed(&vec![b'x'; RECORD_MAX + 10]);
        assert_eq!((out.len(), r.partial.len()), (RECORD_MAX + 10, 0));
    }

    #[test]
    fn a_long_line_keeps_its_first_64_kib_and_counts_the_rest() {
        let mut l = Lines::default();
        let mut got = vec![];
        let block = vec![b'x'; 16 << 10];
        for _ in 0..10 {
            l.feed(&block, |_, _| unreachable!()).unwrap();
        }
        assert_eq!(l.state().0.len(), LINE_MAX);
        assert_eq!(l.pending(), 160 << 10);
        l.feed(b"tail\nnext\n", |t, cut| {
            got.push((t.len(), cut));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![(LINE_MAX, (160 << 10) + 4 - LINE_MAX as u64), (4, 0)]);
        assert_eq!(l.pending(), 0);
        l.feed(b"a\rbc", |_, _| Ok(())).unwrap();
        assert_eq!(l.pending(), 4);
    }

    #[test]
    fn records_read_as_the_output_with_the_current_progress_state_last() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.log");
        let mut l = CappedLog::open(&p, 1 << 20).unwrap();
        l.line(b"2026-01-01T00:00:00.000000001Z ", b"start", 0).unwrap();
        l.progress(b" 10%").unwrap();
        l.progress(b" 20%").unwrap();
        let running = std::fs::read(&p).unwrap();
        assert_eq!(
            String::from_utf8(strip_stamps(&running)).unwrap(),
            "start\n 20%\n",
            "while it runs: the bar's current state"
        );
        l.mark("bookkeeping 123").unwrap();
        assert_eq!(
            String::from_utf8(strip_stamps(&std::fs::read(&p).unwrap())).unwrap(),
            "start\n 20%\n",
            "bookkeeping is never shown"
        );
        l.line(b"2026-01-01T00:00:01.000000001Z ", b"100%", 0).unwrap();
        l.line(b"", &vec![b'y'; LINE_MAX], 7).unwrap();
        let all = std::fs::read(&p).unwrap();
        let shown = String::from_utf8(strip_stamps(&all)).unwrap();
        assert!(shown.starts_with("start\n100%\nyyy"), "{}", &shown[..40]);
        assert!(
            shown.ends_with(
                "\n[gantry] the line above was cut at 64.0 KiB: 7 more bytes of it (without a newline) are left out\n"
            ),
            "{}",
            &shown[shown.len() - 120..]
        );
        // A reader following the file chunk by chunk sees each state once, then the line.
        let (a, b) = running.split_at(running.iter().position(|c| *c == b'\r').unwrap());
        assert_eq!(strip_stamps(a), b"start\n");
        assert_eq!(strip_stamps(b), b" 20%\n");
        assert_eq!(
            strip_stamps_live(b),
            b" 20%\r",
            "followed on a terminal, the next state is drawn over it"
        );
        assert_eq!(strip_stamps_live(a), b"start\n");
        assert_eq!(l.progress_every(), PROGRESS_EVERY);
        let mut tiny = CappedLog::open(&d.path().join("t.log"), 16 * 64).unwrap();
        for _ in 0..20 {
            tiny.progress(b"bar").unwrap();
        }
        assert_eq!(
            tiny.progress_every(),
            PROGRESS_SLOW,
            "past 1/16 of the cap, progress slows down"
        );
    }
}
