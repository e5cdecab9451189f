//! Parsing spec text (YAML/TOML) into a `JobSpec`: depth and size bounds, error positions and hints.

#[allow(unused_imports)]
use super::*;
use std::time::Duration;

/// 1-based line of the first `key:` / `key =` at any indentation.
pub(super) fn locate_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            t.strip_prefix(key)
                .map(|rest| {
                    let rest = rest.trim_start();
                    rest.starts_with(':') || rest.starts_with('=')
                })
                .unwrap_or(false)
        })
        .map(|i| i + 1)
}

pub(super) fn hint_for(message: &str) -> String {
    if message.contains("unknown field") {
        match suggest_field(message) {
            Some(f) => format!("did you mean `{f}`? (`gantry schema` lists every field)"),
            None => "remove or rename the field; `gantry schema` lists every field".into(),
        }
    } else if message.contains("missing field `image`") {
        "add `image: <docker image>` (the image must exist locally or be pullable)".into()
    } else if message.contains("missing field") {
        "add the missing field; `gantry schema` lists required fields".into()
    } else if message.contains("invalid type") {
        "check the value's type against `gantry schema`".into()
    } else {
        "check the syntax near the position shown".into()
    }
}

/// For serde's "unknown field `gpu`, expected one of `name`, `gpus`, …": the expected field nearest to
/// the unknown one, if it is a likely typo (at most 2 edits, and fewer edits than the name has letters).
pub(super) fn suggest_field(message: &str) -> Option<&str> {
    let mut quoted = message.split('`').skip(1).step_by(2);
    let unknown = quoted.next()?;
    let (_, rest) = message.split_once("expected")?;
    let limit = 2.min(unknown.chars().count().saturating_sub(1));
    rest.split('`')
        .skip(1)
        .step_by(2)
        .map(|f| (edit_distance(unknown, f), f))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f)
}

/// Levenshtein distance (insertions, deletions, substitutions), by characters.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Most jobs one `matrix` may expand to.
pub const MAX_MATRIX_JOBS: usize = 1000;
/// Most bytes of specs one submission may store (a spec times its matrix).
pub const MAX_SUBMIT_BYTES: usize = 16 << 20;
/// Most mounts per job: each is checked by a helper process, one at a time.
pub const MAX_MOUNTS: usize = 100;
/// Most jobs one `after` may list.
pub const MAX_AFTER: usize = 100;
/// Longest job name (the queue shows it to everyone).
pub const MAX_NAME_CHARS: usize = 200;

/// Parse text into a spec (syntax and field names only). A leading UTF-8 byte order mark (what
/// Notepad saves) is skipped.
pub fn parse(text: &str, format: Format) -> Result<JobSpec, SpecError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    check_nesting(text)?;
    match format {
        Format::Yaml => serde_yaml_ng::from_str::<JobSpec>(text).map_err(|e| {
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            let (line, column) = e
                .location()
                .map(|l| (Some(l.line()), Some(l.column())))
                .unwrap_or((None, None));
            SpecError {
                hint: hint_for(&msg),
                message: msg,
                line,
                column,
            }
        }),
        Format::Toml => toml::from_str::<JobSpec>(text).map_err(|e| {
            let msg = e.message().to_string();
            let (line, column) = e
                .span()
                .map(|s| line_col(text, s.start))
                .map(|(l, c)| (Some(l), Some(c)))
                .unwrap_or((None, None));
            SpecError {
                hint: hint_for(&msg),
                message: msg,
                line,
                column,
            }
        }),
    }
}

/// Durations are stored in i64 milliseconds; a year is more than any job needs and far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// A job spec nests two or three levels; the YAML parser's time grows steeply with depth (100,000 nested
/// `[` take ~23 s), so anything deeper than this is refused before parsing.
pub const MAX_NESTING: usize = 32;

/// Refuse flow collections (`[`, `{`) nested deeper than [`MAX_NESTING`], outside quotes and comments.
pub(super) fn check_nesting(text: &str) -> Result<(), SpecError> {
    let (mut depth, mut quote) = (0usize, None::<char>);
    for (line_no, line) in text.lines().enumerate() {
        let mut comment = false;
        let mut prev = ' ';
        for c in line.chars() {
            match (quote, c) {
                (_, _) if comment => {}
                (Some(q), c) if c == q && prev != '\\' => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') if prev.is_whitespace() => comment = true,
                (None, '[' | '{') => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(SpecError {
                            message: format!("the spec nests lists or maps more than {MAX_NESTING} levels deep"),
                            hint: "a job spec needs two or three levels; check the brackets".into(),
                            line: Some(line_no + 1),
                            column: None,
                        });
                    }
                }
                (None, ']' | '}') => depth = depth.saturating_sub(1),
                _ => {}
            }
            prev = c;
        }
        if quote == Some('\'') {
            quote = None; // YAML single quotes may span lines, but an unclosed one must not hide brackets forever
        }
    }
    Ok(())
}
