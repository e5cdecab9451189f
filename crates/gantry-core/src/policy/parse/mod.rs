//! Reading the lab config file: TOML with positions, every key checked (`Check`), problems reported
//! all at once with line and column, then turned into a [`super::Policy`] and [`super::LabConfig`].
//!
//! This file owns the shared plumbing: loading and checking the text, [`Problem`] and [`PolicyError`],
//! and `Check`'s value readers; `raw` holds the file's serde shape, `build` the top-level keys and
//! the small sections, and the larger sections each have a file.

#[allow(unused_imports)]
use super::*;
use crate::defaults as config;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

mod build;
mod containers;
mod notify;
mod raw;
mod sessions;
mod slurm;

use raw::*;

impl LabConfig {
    /// Read and check `file`. A missing file means the defaults when `missing_ok` (the system
    /// engine's `/etc/gantry/config.toml`), and is an error otherwise (`--config FILE`).
    pub fn load(file: &Path, missing_ok: bool) -> Result<LabConfig, PolicyError> {
        use std::io::Read;
        let opened = std::fs::File::open(file);
        let text = match opened {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && missing_ok => return Ok(LabConfig::default()),
            Err(e) => {
                return Err(PolicyError::file(
                    file,
                    format!("cannot read it: {e}"),
                    "check the path and that the engine's user may read it",
                ))
            }
            Ok(f) => {
                let mut s = String::new();
                f.take(MAX_CONFIG_BYTES + 1)
                    .read_to_string(&mut s)
                    .map_err(|e| PolicyError::file(file, format!("cannot read it: {e}"), "save it as UTF-8 text"))?;
                if s.len() as u64 > MAX_CONFIG_BYTES {
                    return Err(PolicyError::file(
                        file,
                        "it is larger than 1 MiB".into(),
                        "a lab config is a page of settings; check that this is the right file",
                    ));
                }
                s
            }
        };
        Self::parse(&text, file)
    }

    /// Check the text of a lab config (`file` names it in errors).
    pub fn parse(text: &str, file: &Path) -> Result<LabConfig, PolicyError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map(|s| crate::units::line_col(text, s.start))
                .unwrap_or((0, 0));
            let msg = e.message().trim().to_string();
            let hint = if msg.contains("unknown field") {
                "remove or rename the key; the packaged /etc/gantry/config.toml documents every key"
            } else {
                "fix the value's type or syntax; the packaged /etc/gantry/config.toml shows each key with an example"
            };
            PolicyError::at(file, line, column, msg, hint.into())
        })?;
        let mut c = Check {
            text,
            file,
            problems: vec![],
        };
        let lab = c.build(raw);
        if c.problems.is_empty() {
            Ok(LabConfig {
                file: Some(file.to_path_buf()),
                ..lab
            })
        } else {
            Err(PolicyError { problems: c.problems })
        }
    }

    /// The names of settings that differ from `old` and only apply after a restart.
    pub fn restart_only_changes(&self, old: &LabConfig) -> Vec<&'static str> {
        let mut out = vec![];
        if self.gpus.as_ref().map(|g| &g.gpus) != old.gpus.as_ref().map(|g| &g.gpus) {
            out.push("gpus");
        }
        if self.simulate != old.simulate {
            out.push("simulate");
        }
        if self.inbox_group != old.inbox_group {
            out.push("inbox.group");
        }
        if self.inbox_path != old.inbox_path {
            out.push("inbox.path");
        }
        if self.templates_dir != old.templates_dir {
            out.push("inbox.templates");
        }
        if self.backend != old.backend {
            out.push("backend");
        }
        if self.slurm != old.slurm {
            out.push("slurm");
        }
        if self.notify != old.notify {
            out.push("notify");
        }
        if self.metrics != old.metrics {
            out.push("metrics");
        }
        out
    }
}

/// One problem in a lab config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    pub file: PathBuf,
    /// 1-based; 0 when the problem is with the file as a whole.
    pub line: usize,
    pub column: usize,
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}; {}", self.file.display(), self.message, self.hint)
        } else {
            write!(
                f,
                "{}:{}:{}: {}; {}",
                self.file.display(),
                self.line,
                self.column,
                self.message,
                self.hint
            )
        }
    }
}

/// Every problem found in a lab config (one line each).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct PolicyError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.problems.iter().map(|p| p.to_string()).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl PolicyError {
    pub(super) fn at(file: &Path, line: usize, column: usize, message: String, hint: String) -> PolicyError {
        PolicyError {
            problems: vec![Problem {
                file: file.to_path_buf(),
                line,
                column,
                message,
                hint,
            }],
        }
    }
    pub(super) fn file(file: &Path, message: String, hint: &str) -> PolicyError {
        Self::at(file, 0, 0, message, hint.into())
    }
}

type S<T> = Option<Spanned<T>>;

/// Collects every problem (not just the first), each at its value's line and column.
struct Check<'a> {
    text: &'a str,
    file: &'a Path,
    problems: Vec<Problem>,
}

impl Check<'_> {
    fn fail(&mut self, span: Range<usize>, message: String, hint: impl Into<String>) {
        let (line, column) = crate::units::line_col(self.text, span.start);
        self.problems.push(Problem {
            file: self.file.to_path_buf(),
            line,
            column,
            message,
            hint: hint.into(),
        });
    }

    fn duration(&mut self, key: &str, v: &S<String>, max: Duration) -> Option<Duration> {
        let v = v.as_ref()?;
        match humantime::parse_duration(v.get_ref().trim()) {
            Ok(d) if d > Duration::ZERO && d <= max => Some(d),
            Ok(d) if d > max => {
                self.fail(
                    v.span(),
                    format!("`{key}` = {:?} is longer than {}", v.get_ref(), human(max)),
                    format!("use at most \"{}\"", human(max)),
                );
                None
            }
            _ => {
                self.fail(
                    v.span(),
                    format!("`{key}` = {:?} is not a duration", v.get_ref()),
                    "write e.g. \"10s\", \"30m\", \"24h\" or \"7d\"",
                );
                None
            }
        }
    }

    fn range(&mut self, key: &str, v: &S<Vec<i64>>) -> Option<(i32, i32)> {
        let v = v.as_ref()?;
        let hint = "write [lowest, highest], e.g. [-10, 10]";
        match v.get_ref().as_slice() {
            [lo, hi] if i32::try_from(*lo).is_err() || i32::try_from(*hi).is_err() => {
                self.fail(
                    v.span(),
                    format!("`{key}` = [{lo}, {hi}] is outside what a priority can hold"),
                    format!("use values from {} to {}", i32::MIN, i32::MAX),
                );
                None
            }
            [lo, hi] if lo > hi => {
                self.fail(
                    v.span(),
                    format!("`{key}` = [{lo}, {hi}]: the lowest value is above the highest"),
                    format!("swap them: [{hi}, {lo}]"),
                );
                None
            }
            [lo, hi] => Some((*lo as i32, *hi as i32)),
            other => {
                self.fail(v.span(), format!("`{key}` has {} values, not 2", other.len()), hint);
                None
            }
        }
    }

    fn count(&mut self, key: &str, v: &S<i64>, max: i64) -> Option<i64> {
        let v = v.as_ref()?;
        let n = *v.get_ref();
        if n < 1 || n > max {
            self.fail(
                v.span(),
                format!("`{key}` = {n} is out of range"),
                format!("use a number from 1 to {max}, or leave `{key}` out"),
            );
            return None;
        }
        Some(n)
    }
}
