//! A job's log file: Gantry's own lines, and the job's output copied in by its backend through one
//! capped path ([`CappedLog`]), so a capped log says so whichever backend ran the job.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Gantry's own lines in a job log start with `[gantry`, never with a digit, so they are never taken
/// for Docker's timestamped output when finding where to resume.
pub(crate) fn append_log(path: &Path, line: &str) {
    let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path) {
        let _ = writeln!(f, "[gantry {ts}] {line}");
    }
}

/// Is this line of a job log Gantry's own (not the job's output)?
pub(crate) fn is_gantrys(line: &[u8]) -> bool {
    line.starts_with(b"[gantry ") || line.starts_with(b"[gantry]")
}

/// A job's output as users read it. The engine stores each line with Docker's timestamp in front (where
/// to resume after a restart); that prefix is dropped. Gantry's own `[gantry …]` lines are kept whole.
pub fn strip_stamps(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    for line in data.split_inclusive(|c| *c == b'\n') {
        out.extend_from_slice(&line[stamp_len(line)..]);
    }
    out
}

/// Length of a leading `2026-01-02T03:04:05.123456789Z ` (0 if the line has none).
fn stamp_len(line: &[u8]) -> usize {
    if !line.first().is_some_and(u8::is_ascii_digit) {
        return 0;
    }
    let Some(sp) = line.iter().take(40).position(|c| *c == b' ') else { return 0 };
    match std::str::from_utf8(&line[..sp]).ok().map(humantime::parse_rfc3339) {
        Some(Ok(_)) => sp + 1,
        _ => 0,
    }
}

/// A job's log open for its output, capped at `cap` bytes (the lab's `log_cap`): the line that would
/// take it past the cap is replaced by `[gantry] log truncated: …`, written once; nothing after it.
pub(crate) struct CappedLog {
    f: std::fs::File,
    written: u64,
    cap: u64,
    truncated: bool,
}

impl CappedLog {
    /// Append to `path` (created 0600).
    pub fn open(path: &Path, cap: u64) -> std::io::Result<CappedLog> {
        let f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        CappedLog::new(f, cap)
    }

    /// Write on to `f`, already where output goes next.
    pub fn new(f: std::fs::File, cap: u64) -> std::io::Result<CappedLog> {
        let written = f.metadata()?.len();
        Ok(CappedLog { f, written, cap, truncated: written >= cap })
    }

    /// One line of the job's output, with its newline.
    pub fn put(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.truncated {
            return Ok(());
        }
        if self.written + line.len() as u64 > self.cap {
            self.f.write_all(format!("[gantry] log truncated: the job wrote more than {} bytes\n", self.cap).as_bytes())?;
            self.truncated = true;
            return Ok(());
        }
        self.written += line.len() as u64;
        self.f.write_all(line)
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
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "12345\n678\n[gantry] log truncated: the job wrote more than 10 bytes\n");
        assert!(is_gantrys(b"[gantry] log truncated") && is_gantrys(b"[gantry 2026-01-01T00:00:00Z] x") && !is_gantrys(b"2026 out"));
    }
}
