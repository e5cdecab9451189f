//! The job spec: one job per file, YAML or TOML, strictly checked.
//!
//! Parsing never panics and every error says where (line/column when known) and how to fix it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
pub use crate::units::{format_bytes, line_col, parse_bytes, parse_limit};
use serde::{Deserialize, Serialize};

/// Largest spec file Gantry reads (drop folder and CLI alike).
pub const MAX_SPEC_BYTES: u64 = 1024 * 1024;

/// The command a job runs: either a list (exec form) or a string run by `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Command {
    /// A single string, run with `/bin/sh -c`.
    Shell(String),
    /// Program and arguments, run as is.
    Exec(Vec<String>),
}

impl Command {
    /// The argv handed to Docker.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            Command::Exec(v) => v.clone(),
        }
    }
    pub fn map(&self, f: impl Fn(&str) -> String) -> Command {
        match self {
            Command::Shell(s) => Command::Shell(f(s)),
            Command::Exec(v) => Command::Exec(v.iter().map(|s| f(s)).collect()),
        }
    }
    fn mentions(&self, needle: &str) -> bool {
        match self {
            Command::Shell(s) => s.contains(needle),
            Command::Exec(v) => v.iter().any(|s| s.contains(needle)),
        }
    }
}

/// A job as written by a researcher. Unknown fields are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Gantry job spec")]
pub struct JobSpec {
    /// Short name shown in the queue and history. Defaults to the file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Docker image, e.g. `paddlepaddle/paddle:2.6.1-gpu-cuda12.0-cudnn8.9-trt8.6`.
    pub image: String,
    /// Command: a list (exec form) or a string run with `/bin/sh -c`. Defaults to the image's CMD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Command>,
    /// Working directory inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Bind mounts, `host:container` or `host:container:ro`. Host paths are absolute or relative to the spec file;
    /// each must exist and be readable (for read-write mounts, writable) by the submitter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    /// Number of GPUs (0 allowed). Default 1.
    #[serde(default = "default_gpus")]
    #[schemars(range(min = 0, max = 64))]
    pub gpus: i64,
    /// GPU memory needed on each GPU, e.g. `20GiB`. When set, the job may share a GPU with others whose
    /// declared memory fits; when absent, the job gets whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub gpu_memory: Option<String>,
    /// Only GPUs whose name contains this (any case), e.g. `H100` matches "NVIDIA H100 80GB HBM3".
    /// `gantry gpus` lists the names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Only GPUs with at least this much memory in all, e.g. `40GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub min_gpu_memory: Option<String>,
    /// Higher runs first. Default 0.
    #[serde(default)]
    pub priority: i32,
    /// Wall-clock limit, e.g. `24h`, `90m`. The job is stopped (SIGTERM, then SIGKILL) when it passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// How often to retry after a failure (not after cancel). Default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub retries: i64,
    /// How long the job is expected to run (`2h`). Lets the scheduler backfill and estimate start times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_runtime: Option<String>,
    /// Start only after these jobs succeeded: job ids, or names of your earlier jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<IdOrName>,
    /// Job array: one job per combination of values, e.g. `{lr: [0.1, 0.01], bs: [32, 64]}` makes 4
    /// jobs. Each sees `{lr}` replaced in its command and `LR=0.1` in its environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub matrix: BTreeMap<String, Vec<Scalar>>,
    // Container settings for deep learning; each defaults to the lab config's `[containers]`.
    /// CPUs the job may use, e.g. `8` or `0.5`. Default: the lab's share per GPU (`cpus_per_gpu`), or
    /// `cpu_only_cpus` for a CPU-only job. The scheduler starts the job only when this many are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1024))]
    pub cpus: Option<f64>,
    /// RAM limit, e.g. `64GiB` (swap is not added on top). Default: the lab's share per GPU
    /// (`memory_per_gpu`), or `cpu_only_memory` for a CPU-only job. Counted by the scheduler like CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub memory: Option<String>,
    /// Size of `/dev/shm` (PyTorch DataLoader workers pass batches through it), e.g. `16GiB`.
    /// Default: half the job's memory limit (8 GiB without one); Docker's own is 64 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub shm_size: Option<String>,
    /// `private` (default) or `host`: share the host's IPC namespace (only where the lab config allows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<Ipc>,
    /// Where `$HOME` points: `tmpfs` (an empty, writable folder for this job) or `mount` (your home
    /// folder, read-write; only where the lab config enables it). Default: the lab's `home`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<Home>,
    /// Resource limits. Default: `memlock: unlimited`, `stack: 64MiB` (NVIDIA's advice for PyTorch/NCCL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ulimits: Option<Ulimits>,
}

/// `ipc` in a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Ipc {
    Private,
    Host,
}

/// `home` in a spec and in the lab config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Home {
    Tmpfs,
    Mount,
}

/// `ulimits` in a spec: each `unlimited` or a size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ulimits {
    /// Locked memory (RDMA and pinned-memory transfers need it), e.g. `unlimited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memlock: Option<String>,
    /// Stack size of each thread, e.g. `64MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
}

/// The container settings a spec asked for, parsed (`None`: the lab's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPUs in thousandths.
    pub cpus_milli: Option<u64>,
    pub memory: Option<u64>,
    pub shm_size: Option<u64>,
    /// Bytes; -1 is unlimited (Docker's and the kernel's convention).
    pub memlock: Option<i64>,
    pub stack: Option<i64>,
}

/// Docker refuses a memory limit below 6 MiB.
pub const MIN_MEMORY: u64 = 6 << 20;

/// A job reference in `after`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum IdOrName {
    Id(i64),
    Name(String),
}

/// A matrix value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Str(s) => write!(f, "{s}"),
        }
    }
}

fn default_gpus() -> i64 {
    1
}

/// A spec that passed every check, with sizes and durations parsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidJob {
    pub name: String,
    pub spec: JobSpec,
    pub gpus: u32,
    /// Declared memory per GPU in bytes; `None` means whole GPUs.
    pub gpu_memory: Option<u64>,
    pub timeout: Option<Duration>,
    pub retries: u32,
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub expected_runtime: Option<Duration>,
    /// CPU, RAM, shm and ulimits the spec set (the engine fills in the lab's defaults).
    #[serde(default)]
    pub limits: Limits,
    /// Set on each job a `matrix` expanded into: its place among its siblings (the Slurm backend
    /// submits them together as one job array).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix_part: Option<MatrixPart>,
}

/// One job of a `matrix` expansion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatrixPart {
    /// Unique per expansion.
    pub group: String,
    pub index: u32,
    pub count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub host: String,
    pub container: String,
    pub read_only: bool,
}

/// Which syntax a spec is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
}

impl Format {
    /// From a file name; `None` when the extension is not one Gantry reads.
    pub fn from_name(name: &str) -> Option<Format> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            Some(Format::Yaml)
        } else if lower.ends_with(".toml") {
            Some(Format::Toml)
        } else {
            None
        }
    }
}

/// A spec problem: what, where, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct SpecError {
    pub message: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub hint: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column {c}: ")?,
            (Some(l), None) => write!(f, "line {l}: ")?,
            _ => {}
        }
        write!(f, "{}", self.message)?;
        if !self.hint.is_empty() {
            write!(f, "\n  fix: {}", self.hint)?;
        }
        Ok(())
    }
}

impl SpecError {
    pub fn new(message: impl Into<String>, hint: impl Into<String>) -> Self {
        SpecError { message: message.into(), line: None, column: None, hint: hint.into() }
    }
    fn at_key(mut self, text: &str, key: &str) -> Self {
        if let Some(line) = locate_key(text, key) {
            self.line = Some(line);
        }
        self
    }
}

/// 1-based line of the first `key:` / `key =` at any indentation.
fn locate_key(text: &str, key: &str) -> Option<usize> {
    text.lines().position(|l| {
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


fn hint_for(message: &str) -> String {
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
fn suggest_field(message: &str) -> Option<&str> {
    let mut quoted = message.split('`').skip(1).step_by(2);
    let unknown = quoted.next()?;
    let (_, rest) = message.split_once("expected")?;
    let limit = 2.min(unknown.chars().count().saturating_sub(1));
    rest.split('`').skip(1).step_by(2).map(|f| (edit_distance(unknown, f), f)).filter(|(d, _)| *d <= limit).min_by_key(|(d, _)| *d).map(|(_, f)| f)
}

/// Levenshtein distance (insertions, deletions, substitutions), by characters.
fn edit_distance(a: &str, b: &str) -> usize {
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
            let (line, column) = e.location().map(|l| (Some(l.line()), Some(l.column()))).unwrap_or((None, None));
            SpecError { hint: hint_for(&msg), message: msg, line, column }
        }),
        Format::Toml => toml::from_str::<JobSpec>(text).map_err(|e| {
            let msg = e.message().to_string();
            let (line, column) =
                e.span().map(|s| line_col(text, s.start)).map(|(l, c)| (Some(l), Some(c))).unwrap_or((None, None));
            SpecError { hint: hint_for(&msg), message: msg, line, column }
        }),
    }
}

/// Durations are stored in i64 milliseconds; a year is more than any job needs and far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// A job spec nests two or three levels; the YAML parser's time grows steeply with depth (100,000 nested
/// `[` take ~23 s), so anything deeper than this is refused before parsing.
pub const MAX_NESTING: usize = 32;

/// Refuse flow collections (`[`, `{`) nested deeper than [`MAX_NESTING`], outside quotes and comments.
fn check_nesting(text: &str) -> Result<(), SpecError> {
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



/// Where the spec came from: used for defaults (name) and resolving relative mount paths.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// File name, for the default job name.
    pub file_name: Option<String>,
    /// Directory relative host paths are resolved against. `None`: relative paths are errors.
    pub base_dir: Option<std::path::PathBuf>,
}

/// Full check: parse, then validate values. `text` is used to point at the offending line.
pub fn validate_text(text: &str, format: Format, origin: &Origin) -> Result<ValidJob, SpecError> {
    let spec = parse(text, format)?;
    validate(spec, origin).map_err(|(e, key)| e.at_key(text, key))
}

/// Value checks. On error, returns the field name so callers can point at its line.
pub fn validate(spec: JobSpec, origin: &Origin) -> Result<ValidJob, (SpecError, &'static str)> {
    let err = |m: String, h: &str, k: &'static str| Err((SpecError::new(m, h), k));
    if spec.image.trim().is_empty() {
        return err("`image` is empty".into(), "set `image` to a Docker image name, e.g. `pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime`", "image");
    }
    if spec.image.chars().any(|c| c.is_whitespace()) {
        return err(format!("`image` {:?} contains whitespace", spec.image), "an image name has no spaces: `repo/name:tag`", "image");
    }
    if spec.gpus < 0 {
        return err(format!("`gpus` is {}, it must be 0 or more", spec.gpus), "use `gpus: 0` for a CPU-only job, or the number of GPUs to reserve", "gpus");
    }
    if spec.gpus > 64 {
        return err(format!("`gpus` is {}, more than any workstation has", spec.gpus), "ask for the number of GPUs the job really uses", "gpus");
    }
    if spec.retries < 0 || spec.retries > 100 {
        return err(format!("`retries` is {}, it must be between 0 and 100", spec.retries), "use e.g. `retries: 2`", "retries");
    }
    let gpu_memory = match &spec.gpu_memory {
        None => None,
        Some(s) => match parse_bytes(s) {
            Some(0) | None => {
                return err(
                    format!("`gpu_memory` {s:?} is not a memory size"),
                    "write a size per GPU such as `20GiB` or `512MiB`, or leave it out to get whole GPUs",
                    "gpu_memory",
                )
            }
            Some(b) => {
                if spec.gpus == 0 {
                    return err("`gpu_memory` is set but `gpus` is 0".into(), "remove `gpu_memory`, or ask for at least one GPU", "gpu_memory");
                }
                Some(b)
            }
        },
    };
    check_gpu_choice(&spec)?;
    let timeout = match &spec.timeout {
        None => None,
        Some(s) => match humantime::parse_duration(s.trim()) {
            Ok(d) if d > Duration::ZERO && d <= MAX_DURATION => Some(d),
            Ok(d) if d > MAX_DURATION => return err(format!("`timeout` {s:?} is longer than a year"), "use at most `365d`, or leave `timeout` out for no limit", "timeout"),
            _ => return err(format!("`timeout` {s:?} is not a duration"), "write e.g. `24h`, `90m` or `1h 30m`", "timeout"),
        },
    };
    if let Some(Command::Exec(v)) = &spec.command {
        if v.is_empty() {
            return err("`command` is an empty list".into(), "give the program and its arguments, e.g. [\"python\", \"train.py\"]", "command");
        }
    }
    if let Some(w) = &spec.workdir {
        if !w.starts_with('/') {
            return err(format!("`workdir` {w:?} is not an absolute path"), "use an absolute path inside the container, e.g. `/workspace`", "workdir");
        }
    }
    for k in spec.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return err(format!("environment variable name {k:?} is invalid"), "names are letters, digits and `_`", "env");
        }
    }
    if spec.mounts.len() > MAX_MOUNTS {
        return err(format!("the job has {} `mounts`; the limit is {MAX_MOUNTS}", spec.mounts.len()), "mount a few parent folders instead of many single paths", "mounts");
    }
    if spec.after.len() > MAX_AFTER {
        return err(format!("`after` lists {} jobs; the limit is {MAX_AFTER}", spec.after.len()), "wait for a few jobs that end last, or chain the jobs", "after");
    }
    let mut mounts = Vec::new();
    for m in &spec.mounts {
        mounts.push(parse_mount(m, origin).map_err(|e| (e, "mounts"))?);
    }
    let name = spec
        .name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .or_else(|| origin.file_name.as_ref().map(|f| f.rsplit_once('.').map(|(a, _)| a).unwrap_or(f).to_string()))
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "job".into());
    if name.chars().count() > MAX_NAME_CHARS {
        return err(format!("`name` is longer than {MAX_NAME_CHARS} characters"), "use a short name", "name");
    }
    // Names reach everyone's terminal and the engine's log: no escapes, line breaks or bidi overrides.
    if name.chars().any(unprintable) {
        return err(
            format!("the job name {name:?} contains control characters"),
            "use letters, digits, spaces and punctuation (rename the file if the name comes from it)",
            "name",
        );
    }
    let expected_runtime = match &spec.expected_runtime {
        None => None,
        Some(s) => match humantime::parse_duration(s.trim()) {
            Ok(d) if d > Duration::ZERO && d <= MAX_DURATION => Some(d),
            Ok(d) if d > MAX_DURATION => return err(format!("`expected_runtime` {s:?} is longer than a year"), "use at most `365d`", "expected_runtime"),
            _ => return err(format!("`expected_runtime` {s:?} is not a duration"), "write e.g. `2h` or `45m`", "expected_runtime"),
        },
    };
    if spec.matrix.values().any(|v| v.is_empty()) {
        return err("a `matrix` entry has no values".into(), "give each matrix key a list of values, e.g. `lr: [0.1, 0.01]`", "matrix");
    }
    // Checked: 64 keys of 2 values overflow a plain product.
    let combos = spec.matrix.values().try_fold(1usize, |n, v| n.checked_mul(v.len()).filter(|n| *n <= MAX_MATRIX_JOBS));
    let Some(combos) = combos else {
        let shown = spec.matrix.values().map(|v| v.len().to_string()).collect::<Vec<_>>().join(" x ");
        return err(format!("`matrix` expands to more than {MAX_MATRIX_JOBS} jobs ({shown}); the limit is {MAX_MATRIX_JOBS}"), "split the sweep into several files", "matrix");
    };
    // Each expanded job stores the whole spec: one request may not fill the engine's disk.
    let stored = serde_json::to_vec(&spec).map(|v| v.len()).unwrap_or(usize::MAX).saturating_mul(combos);
    if stored > MAX_SUBMIT_BYTES {
        return err(
            format!("the `matrix` makes {combos} jobs of this spec, {} in all; the limit is {}", format_bytes(stored as u64), format_bytes(MAX_SUBMIT_BYTES as u64)),
            "keep large data out of the spec (put it in a mounted file), or split the sweep",
            "matrix",
        );
    }
    for k in spec.matrix.keys() {
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return err(format!("matrix key {k:?} must be letters, digits and `_`"), "rename the key, e.g. `lr`", "matrix");
        }
    }
    if let Some(IdOrName::Id(i)) = spec.after.iter().find(|a| matches!(a, IdOrName::Id(i) if *i <= 0)) {
        return err(format!("`after` refers to job {i}"), "job ids are positive numbers; names are strings", "after");
    }
    let limits = validate_limits(&spec)?;
    Ok(ValidJob { name, gpus: spec.gpus as u32, gpu_memory, timeout, retries: spec.retries as u32, mounts, expected_runtime, limits, spec, matrix_part: None })
}

/// `cpus`, `memory`, `shm_size` and `ulimits`.
fn validate_limits(spec: &JobSpec) -> Result<Limits, (SpecError, &'static str)> {
    let err = |m: String, h: &str, k: &'static str| Err((SpecError::new(m, h), k));
    let cpus_milli = match spec.cpus {
        None => None,
        Some(c) if c.is_finite() && (0.01..=1024.0).contains(&c) => Some((c * 1000.0).round() as u64),
        Some(c) => return err(format!("`cpus` is {c}; it must be from 0.01 to 1024"), "write the number of CPUs the job uses, e.g. `cpus: 8` or `cpus: 0.5`", "cpus"),
    };
    let size = |v: &Option<String>, key: &'static str, min: u64, hint: &str| -> Result<Option<u64>, (SpecError, &'static str)> {
        match v.as_deref().map(|s| (s, parse_bytes(s))) {
            None => Ok(None),
            Some((_, Some(b))) if b >= min => Ok(Some(b)),
            Some((s, _)) => Err((SpecError::new(format!("`{key}` {s:?} is not a size of at least {}", format_bytes(min)), hint), key)),
        }
    };
    let memory = size(&spec.memory, "memory", MIN_MEMORY, "write the RAM the job may use, e.g. `memory: 64GiB`, or leave it out for the lab's default")?;
    let shm_size = size(&spec.shm_size, "shm_size", 1 << 20, "write e.g. `shm_size: 16GiB`, or leave it out for half the job's memory")?;
    if let (Some(shm), Some(mem)) = (shm_size, memory) {
        if shm > mem {
            return err(
                format!("`shm_size` ({}) is larger than `memory` ({}): /dev/shm counts against the job's memory", format_bytes(shm), format_bytes(mem)),
                "lower `shm_size` or raise `memory`",
                "shm_size",
            );
        }
    }
    let limit = |v: Option<&String>, key: &'static str| -> Result<Option<i64>, (SpecError, &'static str)> {
        match v.map(|s| (s, parse_limit(s))) {
            None => Ok(None),
            Some((_, Some(n))) => Ok(Some(n)),
            Some((s, None)) => Err((SpecError::new(format!("ulimit `{key}` {s:?} is not `unlimited` or a size"), "write e.g. `memlock: unlimited` or `stack: 64MiB`"), "ulimits")),
        }
    };
    let u = spec.ulimits.as_ref();
    Ok(Limits { cpus_milli, memory, shm_size, memlock: limit(u.and_then(|u| u.memlock.as_ref()), "memlock")?, stack: limit(u.and_then(|u| u.stack.as_ref()), "stack")? })
}


/// Longest `gpu_type` (GPU names are short).
pub const MAX_GPU_TYPE_CHARS: usize = 100;

/// `gpu_type` and `min_gpu_memory`: only for GPU jobs, a non-empty printable name, a size.
fn check_gpu_choice(spec: &JobSpec) -> Result<(), (SpecError, &'static str)> {
    let err = |m: String, h: &str, k: &'static str| Err((SpecError::new(m, h), k));
    if let Some(t) = &spec.gpu_type {
        if t.trim().is_empty() {
            return err("`gpu_type` is empty".into(), "write part of a GPU name from `gantry gpus`, e.g. `H100`, or leave it out", "gpu_type");
        }
        if t.chars().count() > MAX_GPU_TYPE_CHARS || t.chars().any(unprintable) {
            return err(format!("`gpu_type` {t:?} is not a GPU name"), "write part of a GPU name from `gantry gpus`, e.g. `H100`", "gpu_type");
        }
        if spec.gpus == 0 {
            return err("`gpu_type` is set but `gpus` is 0".into(), "remove `gpu_type`, or ask for at least one GPU", "gpu_type");
        }
    }
    if let Some(m) = &spec.min_gpu_memory {
        if !matches!(parse_bytes(m), Some(b) if b > 0) {
            return err(format!("`min_gpu_memory` {m:?} is not a memory size"), "write a size such as `40GiB`, or leave it out", "min_gpu_memory");
        }
        if spec.gpus == 0 {
            return err("`min_gpu_memory` is set but `gpus` is 0".into(), "remove `min_gpu_memory`, or ask for at least one GPU", "min_gpu_memory");
        }
    }
    Ok(())
}

impl ValidJob {
    /// Which GPUs the job accepts (fields checked by [`validate`]).
    pub fn gpu_filter(&self) -> GpuFilter {
        gpu_filter(self.spec.gpu_type.as_deref(), self.spec.min_gpu_memory.as_deref())
    }
}

/// Which GPUs a job accepts (`gpu_type`, `min_gpu_memory`). The default accepts every GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFilter {
    /// Case-insensitive part of the GPU's name: `H100` matches "NVIDIA H100 80GB HBM3".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Least memory the GPU has in all (not: has free).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_memory: Option<u64>,
}

impl GpuFilter {
    pub fn is_any(&self) -> bool {
        self.gpu_type.is_none() && self.min_memory.is_none()
    }

    /// May the job use a GPU of this name and total memory?
    pub fn eligible(&self, name: &str, memory_total: u64) -> bool {
        self.gpu_type.as_ref().is_none_or(|t| name.to_lowercase().contains(&t.trim().to_lowercase()))
            && self.min_memory.is_none_or(|m| memory_total >= m)
    }

    /// "an H100 with ≥ 40.0 GiB", "2 GPUs with ≥ 60.0 GiB", "2 A100s".
    pub fn describe(&self, n: u32) -> String {
        let what = match (&self.gpu_type, n) {
            (Some(t), 1) => format!("{} {t}", article(t)),
            (Some(t), _) => format!("{n} {t}s"),
            (None, 1) => "a GPU".into(),
            (None, _) => format!("{n} GPUs"),
        };
        match self.min_memory {
            Some(m) => format!("{what} with ≥ {}", format_bytes(m)),
            None => what,
        }
    }
}

/// "an H100", "an A100", "a Tesla": model numbers are read letter by letter.
fn article(word: &str) -> &'static str {
    let mut c = word.chars();
    let (first, second) = (c.next().unwrap_or('x').to_ascii_uppercase(), c.next().unwrap_or(' '));
    let spelled = second.is_ascii_digit() || word.chars().all(|c| !c.is_ascii_lowercase());
    let vowel = if spelled { "AEFHILMNORSX".contains(first) } else { "AEIOU".contains(first) };
    if vowel { "an" } else { "a" }
}

/// The filter of a stored job's `gpu_type` and `min_gpu_memory`.
pub fn gpu_filter(gpu_type: Option<&str>, min_gpu_memory: Option<&str>) -> GpuFilter {
    GpuFilter { gpu_type: gpu_type.map(|t| t.trim().to_string()), min_memory: min_gpu_memory.and_then(parse_bytes) }
}

/// Characters a name may not show: controls, and the marks that reorder text on screen.
fn unprintable(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Expand a job array (`matrix`) into one job per combination; a job without `matrix` is returned as is.
pub fn expand(job: &ValidJob) -> Vec<ValidJob> {
    if job.spec.matrix.is_empty() {
        // A job run again is on its own, whatever matrix it once came from.
        return vec![ValidJob { matrix_part: None, ..job.clone() }];
    }
    let mut combos: Vec<Vec<(String, String)>> = vec![vec![]];
    for (k, vals) in &job.spec.matrix {
        combos = combos.into_iter().flat_map(|c| vals.iter().map(move |v| { let mut c = c.clone(); c.push((k.clone(), v.to_string())); c })).collect();
    }
    let group = {
        use std::hash::{Hash, Hasher};
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (std::time::SystemTime::now(), std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed), &job.name).hash(&mut h);
        format!("{:016x}", h.finish())
    };
    let count = combos.len() as u32;
    combos
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            let mut j = job.clone();
            j.matrix_part = Some(MatrixPart { group: group.clone(), index: index as u32, count });
            j.spec.matrix.clear();
            let subst = |s: &str| c.iter().fold(s.to_string(), |acc, (k, v)| acc.replace(&format!("{{{k}}}"), v));
            j.spec.command = job.spec.command.as_ref().map(|cmd| cmd.map(subst));
            for (k, v) in &c {
                j.spec.env.insert(k.to_ascii_uppercase(), v.clone());
            }
            let shown = |v: &str| v.chars().map(|ch| if unprintable(ch) { ch.escape_unicode().to_string() } else { ch.to_string() }).collect::<String>();
            j.name = format!("{}[{}]", job.name, c.iter().map(|(k, v)| format!("{k}={}", shown(v))).collect::<Vec<_>>().join(","));
            // A long matrix value stays in the command and environment, not in everyone's queue.
            if j.name.chars().count() > MAX_NAME_CHARS {
                j.name = j.name.chars().take(MAX_NAME_CHARS - 2).chain("…]".chars()).collect();
            }
            j.spec.name = Some(j.name.clone());
            j
        })
        .collect()
}

/// Host paths refused on sight (with what lies under them). This is only a cheap first filter: the
/// authority is [`crate::access::check_mounts`], which resolves each path as the submitter and refuses
/// whatever contains or lies inside the container engine's sockets or Gantry's state.
const FORBIDDEN_MOUNTS: &[&str] =
    &["/var/run/docker.sock", "/run/docker.sock", "/run/containerd", "/var/run/containerd", "/run/docker", "/var/run/docker"];

fn parse_mount(m: &str, origin: &Origin) -> Result<Mount, SpecError> {
    let parts: Vec<&str> = m.split(':').collect();
    let (host, container, read_only) = match parts.as_slice() {
        [h, c] => (*h, *c, false),
        [h, c, "ro"] => (*h, *c, true),
        [h, c, "rw"] => (*h, *c, false),
        _ => {
            return Err(SpecError::new(
                format!("mount {m:?} is not `host:container` or `host:container:ro`"),
                "write e.g. `/data/imagenet:/data:ro`",
            ))
        }
    };
    if host.is_empty() || container.is_empty() || host.contains('\0') {
        return Err(SpecError::new(format!("mount {m:?} has an empty path"), "write e.g. `/data/imagenet:/data:ro`"));
    }
    if !container.starts_with('/') {
        return Err(SpecError::new(format!("mount {m:?}: container path {container:?} is not absolute"), "container paths start with `/`"));
    }
    let host_path = if host.starts_with('/') {
        std::path::PathBuf::from(host)
    } else {
        match &origin.base_dir {
            Some(b) => b.join(host),
            None => {
                return Err(SpecError::new(
                    format!("mount {m:?}: host path {host:?} is relative"),
                    // No base folder: the spec came from another computer (`--host`, the app's remote mode).
                    "use an absolute host path on the workstation: relative paths are local-only, and the spec was sent from another computer",
                ))
            }
        }
    };
    let host_norm = normalize(&host_path);
    if host_norm == "/" {
        return Err(SpecError::new(
            format!("mount {m:?} would hand the job the whole host file system"),
            "mount only the directories the job needs, e.g. `/data/imagenet:/data:ro`",
        ));
    }
    if FORBIDDEN_MOUNTS.iter().any(|f| std::path::Path::new(&host_norm).starts_with(f)) || host_norm.ends_with("gantry.sock") {
        return Err(SpecError::new(
            format!("mount {m:?} would hand the job control of the container engine"),
            "remove this mount: jobs may not mount the Docker, containerd or Gantry sockets",
        ));
    }
    Ok(Mount { host: host_norm, container: container.to_string(), read_only })
}

/// Lexically resolve `.` and `..` (no filesystem access, no symlink following).
pub(crate) fn normalize(p: &std::path::Path) -> String {
    use std::path::Component;
    let mut out: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(s) => out.push(s.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    format!("/{}", out.join("/"))
}

/// Template folders: a `gantry.toml`/`gantry.yaml` whose command refers to `{config}`.
pub const TEMPLATE_NAMES: &[&str] = &["gantry.toml", "gantry.yaml", "gantry.yml"];
/// Where a template job sees its config file.
pub const TEMPLATE_CONFIG_DIR: &str = "/gantry/config";

/// Check a template: it must be a valid spec whose command uses `{config}`.
pub fn parse_template(text: &str, format: Format) -> Result<JobSpec, SpecError> {
    let spec = parse(text, format)?;
    match &spec.command {
        Some(c) if c.mentions("{config}") => Ok(spec),
        _ => Err(SpecError::new(
            "the template's `command` does not mention `{config}`",
            "write e.g. `command = \"python tools/train.py -c {config}\"`",
        )
        .at_key(text, "command")),
    }
}

/// Instantiate a template for one dropped config file at `host_path` (its final, accepted location).
pub fn instantiate_template(template: &JobSpec, template_dir_name: &str, host_path: &str, file_name: &str) -> JobSpec {
    let inside = format!("{TEMPLATE_CONFIG_DIR}/{file_name}");
    let mut spec = template.clone();
    spec.command = template.command.as_ref().map(|c| c.map(|s| s.replace("{config}", &inside)));
    spec.mounts.push(format!("{host_path}:{inside}:ro"));
    let stem = file_name.rsplit_once('.').map(|(a, _)| a).unwrap_or(file_name);
    spec.name = Some(format!("{}:{stem}", template.name.clone().unwrap_or_else(|| template_dir_name.to_string())));
    spec
}

/// JSON Schema of the spec, for editors.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(JobSpec)).expect("schema serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_yaml(t: &str) -> ValidJob {
        validate_text(t, Format::Yaml, &Origin { file_name: Some("x.yaml".into()), base_dir: Some("/home/a".into()) }).unwrap()
    }
    fn err_yaml(t: &str) -> SpecError {
        validate_text(t, Format::Yaml, &Origin::default()).unwrap_err()
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let j = ok_yaml("\u{feff}image: busybox\ncommand: [echo, hi]\n");
        assert_eq!(j.spec.image, "busybox");
        let t = parse("\u{feff}image = \"busybox\"\n", Format::Toml).unwrap();
        assert_eq!(t.image, "busybox");
        let e = parse_template("\u{feff}image = \"busybox\"\n", Format::Toml).unwrap_err();
        assert!(e.message.contains("{config}"), "{e}");
    }

    #[test]
    fn full_yaml_spec_parses() {
        let j = ok_yaml(
            "name: resnet\nimage: paddle:2.6\ncommand: [python, train.py]\nworkdir: /w\nenv: {A: '1'}\n\
             mounts: ['/data:/data:ro', 'out:/out']\ngpus: 2\ngpu_memory: 20GiB\npriority: 5\ntimeout: 24h\nretries: 2\n",
        );
        assert_eq!(j.name, "resnet");
        assert_eq!(j.gpus, 2);
        assert_eq!(j.gpu_memory, Some(20 << 30));
        assert_eq!(j.timeout, Some(Duration::from_secs(86400)));
        assert_eq!(j.retries, 2);
        assert_eq!(j.mounts[0], Mount { host: "/data".into(), container: "/data".into(), read_only: true });
        assert_eq!(j.mounts[1].host, "/home/a/out");
        // Relative paths are resolved against the spec's folder, `..` included; `access` then checks them as the user.
        assert_eq!(ok_yaml("image: a\nmounts: ['../../../../etc:/etc2']\n").mounts[0].host, "/etc");
        // Only whole components match the deny-list.
        assert_eq!(ok_yaml("image: a\nmounts: ['/run/dockerd-data:/d']\n").mounts[0].host, "/run/dockerd-data");
        assert_eq!(j.spec.command.unwrap().argv(), vec!["python", "train.py"]);
    }

    #[test]
    fn gpu_type_and_min_gpu_memory_make_a_filter() {
        let j = ok_yaml("image: a\ngpus: 2\ngpu_type: ' h100 '\nmin_gpu_memory: 40GiB\n");
        let f = j.gpu_filter();
        assert_eq!((f.gpu_type.as_deref(), f.min_memory), (Some("h100"), Some(40 << 30)));
        assert!(f.eligible("NVIDIA H100 80GB HBM3", 80 << 30));
        assert!(!f.eligible("NVIDIA H100 PCIe", 32 << 30), "too little memory");
        assert!(!f.eligible("NVIDIA A100-SXM4-80GB", 80 << 30), "another card");
        assert!(ok_yaml("image: a\n").gpu_filter().is_any());
    }

    #[test]
    fn toml_spec_and_defaults() {
        let j = validate_text("image = \"busybox\"\ncommand = \"echo hi\"\n", Format::Toml, &Origin { file_name: Some("exp1.toml".into()), base_dir: None }).unwrap();
        assert_eq!(j.name, "exp1");
        assert_eq!(j.gpus, 1);
        assert_eq!(j.gpu_memory, None);
        assert_eq!(j.spec.command.unwrap().argv(), vec!["/bin/sh", "-c", "echo hi"]);
    }

    #[test]
    fn unknown_field_points_at_line() {
        let e = err_yaml("image: a\ngpu: 2\n");
        assert!(e.message.contains("unknown field `gpu`"), "{e}");
        assert_eq!(e.line, Some(2));
        assert!(e.hint.contains("gantry schema"));
    }

    #[test]
    fn unknown_field_suggests_the_nearest_known_one() {
        let e = err_yaml("image: a\ngpu: 2\n");
        assert!(e.hint.starts_with("did you mean `gpus`?"), "{e}");
        assert!(e.to_string().contains("did you mean `gpus`?"), "{e}");
        let e = validate_text("image = \"a\"\ntimout = \"1h\"\n", Format::Toml, &Origin::default()).unwrap_err();
        assert!(e.hint.starts_with("did you mean `timeout`?"), "{e}");
        // Nothing close: no guess.
        let e = err_yaml("image: a\nbanana: 2\n");
        assert!(!e.hint.contains("did you mean"), "{e}");
        assert_eq!(edit_distance("gpu", "gpus"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(suggest_field("unknown field `x`, expected `a` or `b`"), None);
    }

    #[test]
    fn toml_unknown_field_has_line() {
        let e = validate_text("image = \"a\"\n\nbogus = 1\n", Format::Toml, &Origin::default()).unwrap_err();
        assert!(e.message.contains("unknown field"), "{e}");
        assert_eq!(e.line, Some(3));
    }

    #[test]
    fn bad_yaml_syntax_has_position() {
        let e = err_yaml("image: a\ncommand: [unclosed\n");
        assert!(e.line.is_some(), "{e:?}");
    }

    #[test]
    fn value_errors_are_clear() {
        let cases = [
            ("image: a\ngpus: -1\n", "must be 0 or more", Some(2)),
            ("gpus: 1\n", "missing field `image`", Some(1)),
            ("image: ''\n", "`image` is empty", Some(1)),
            ("image: a\ngpu_memory: lots\n", "not a memory size", Some(2)),
            ("image: a\ntimeout: forever\n", "not a duration", Some(2)),
            ("image: a\nmounts: ['/var/run/docker.sock:/d']\n", "container engine", Some(2)),
            ("image: a\nmounts: ['/a/../var/run/docker.sock:/d']\n", "container engine", Some(2)),
            ("image: a\nmounts: ['/run/containerd/containerd.sock:/d']\n", "container engine", Some(2)),
            ("image: a\nmounts: ['/var/run/docker:/d']\n", "container engine", Some(2)),
            ("image: a\nmounts: ['/:/host']\n", "whole host file system", Some(2)),
            ("image: a\nmounts: ['/data/..:/host:ro']\n", "whole host file system", Some(2)),
            ("image: a\nmounts: ['rel:/d']\n", "relative", Some(2)),
            ("image: a\nmounts: ['/a:b']\n", "not absolute", Some(2)),
            ("image: a\ngpus: 0\ngpu_memory: 1GiB\n", "`gpus` is 0", Some(3)),
            ("image: a\ncommand: []\n", "empty list", Some(2)),
            ("image: a\nworkdir: w\n", "not an absolute path", Some(2)),
            ("image: a\nretries: -3\n", "between 0 and 100", Some(2)),
            ("image: a\ngpu_type: ' '\n", "`gpu_type` is empty", Some(2)),
            ("image: a\ngpus: 0\ngpu_type: H100\n", "`gpus` is 0", Some(3)),
            ("image: a\ngpu_type: \"H\\e100\"\n", "not a GPU name", Some(2)),
            ("image: a\nmin_gpu_memory: big\n", "not a memory size", Some(2)),
            ("image: a\ngpus: 0\nmin_gpu_memory: 40GiB\n", "`gpus` is 0", Some(3)),
        ];
        for (text, want, line) in cases {
            let e = err_yaml(text);
            assert!(e.message.contains(want), "{text:?}: {e}");
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(!e.hint.is_empty());
        }
    }

    #[test]
    fn deep_nesting_huge_durations_and_empty_names_are_handled() {
        let deep = format!("image: a\nenv: {{X: {}1{}}}\n", "[".repeat(100_000), "]".repeat(100_000));
        let e = err_yaml(&deep);
        assert!(e.message.contains("more than 32 levels"), "{e}");
        assert!(ok_yaml("image: a\ncommand: \"echo '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\"\n").spec.image == "a", "brackets in strings are text");
        assert!(err_yaml("image: a\ntimeout: 300000000years\n").message.contains("longer than a year"));
        assert!(err_yaml("image: a\nexpected_runtime: 400d\n").message.contains("longer than a year"));
        let j = validate_text("image: a\n", Format::Yaml, &Origin { file_name: Some(".yaml".into()), base_dir: None }).unwrap();
        assert_eq!(j.name, "job");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("20GiB"), Some(20 << 30));
        assert_eq!(parse_bytes("512 MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("100"), Some(100));
        assert_eq!(parse_bytes("GiB"), None);
        assert_eq!(parse_bytes("5XB"), None);
        assert_eq!(format_bytes(24 << 30), "24.0 GiB");
    }

    #[test]
    fn template_substitutes_config() {
        let t = parse_template("image = \"paddle\"\ncommand = \"python tools/train.py -c {config}\"\ngpus = 1\n", Format::Toml).unwrap();
        let s = instantiate_template(&t, "paddle-train", "/home/a/Gantry/inbox/paddle-train/accepted/7-exp.yaml", "exp.yaml");
        assert_eq!(s.name.as_deref(), Some("paddle-train:exp"));
        assert_eq!(s.command.unwrap().argv()[2], "python tools/train.py -c /gantry/config/exp.yaml");
        assert_eq!(s.mounts, vec!["/home/a/Gantry/inbox/paddle-train/accepted/7-exp.yaml:/gantry/config/exp.yaml:ro"]);
        assert!(parse_template("image = \"p\"\ncommand = \"python x.py\"\n", Format::Toml).unwrap_err().message.contains("{config}"));
    }

    #[test]
    fn matrix_expands_into_one_job_per_combination() {
        let j = ok_yaml("name: sweep\nimage: a\ncommand: python train.py --lr {lr} --bs {bs}\nmatrix: {lr: [0.1, 0.01], bs: [32, 64]}\nafter: [12, prep]\nexpected_runtime: 2h\n");
        assert_eq!(j.expected_runtime, Some(Duration::from_secs(7200)));
        assert_eq!(j.spec.after, vec![IdOrName::Id(12), IdOrName::Name("prep".into())]);
        let jobs = expand(&j);
        assert_eq!(jobs.len(), 4);
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["sweep[bs=32,lr=0.1]", "sweep[bs=32,lr=0.01]", "sweep[bs=64,lr=0.1]", "sweep[bs=64,lr=0.01]"]);
        assert_eq!(jobs[1].spec.command.as_ref().unwrap().argv()[2], "python train.py --lr 0.01 --bs 32");
        assert_eq!(jobs[1].spec.env.get("LR").map(String::as_str), Some("0.01"));
        assert!(jobs.iter().all(|j| j.spec.matrix.is_empty()));
        assert_eq!(expand(&ok_yaml("image: a\n")).len(), 1);
        assert!(err_yaml("image: a\nmatrix: {lr: []}\n").message.contains("no values"));
        assert!(err_yaml("image: a\nexpected_runtime: soon\n").message.contains("not a duration"));
    }

    #[test]
    fn sizes_users_could_abuse_are_bounded() {
        let keys: Vec<String> = (0..64).map(|i| format!("k{i}: [0, 1]")).collect();
        let e = err_yaml(&format!("image: a\nmatrix: {{{}}}\n", keys.join(", ")));
        assert!(e.message.contains("more than 1000 jobs"), "{e}");
        let vals: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
        let e = err_yaml(&format!("image: a\nenv: {{B: {}}}\nmatrix: {{i: [{}]}}\n", "x".repeat(20_000), vals.join(",")));
        assert!(e.message.contains("1000 jobs of this spec") && e.message.contains("the limit is 16.0 MiB"), "{e}");
        assert_eq!(e.line, Some(3));
        let mounts: Vec<String> = (0..101).map(|i| format!("'/d:/m{i}'")).collect();
        assert!(err_yaml(&format!("image: a\nmounts: [{}]\n", mounts.join(","))).message.contains("the limit is 100"));
        let after: Vec<String> = (1..=101).map(|i| i.to_string()).collect();
        assert!(err_yaml(&format!("image: a\nafter: [{}]\n", after.join(","))).message.contains("the limit is 100"));
        let j = ok_yaml(&format!("name: s\nimage: a\nmatrix: {{v: ['{}', b]}}\n", "é".repeat(500)));
        let names: Vec<String> = expand(&j).into_iter().map(|j| j.name).collect();
        assert_eq!(names[0].chars().count(), 200);
        assert!(names[0].starts_with("s[v=éé") && names[0].ends_with("…]"), "{}", names[0]);
        assert_eq!(names[1], "s[v=b]");
        for bad in [r#""a\e[2Jb""#, r#""line\nbreak""#, r#""abc\u202Egpj.exe""#] {
            let e = err_yaml(&format!("image: a\nname: {bad}\n"));
            assert!(e.message.contains("control characters"), "{e}");
            assert_eq!(e.line, Some(2));
        }
        let j = ok_yaml("name: s\nimage: a\nmatrix: {v: [\"\\e[2J\"]}\n");
        assert_eq!(expand(&j)[0].name, "s[v=\\u{1b}[2J]");
        assert_eq!(expand(&j)[0].spec.env["V"], "\u{1b}[2J", "the value itself is the job's business");
    }

    #[test]
    fn schema_lists_fields() {
        let s = json_schema();
        let props = s["properties"].as_object().unwrap();
        for f in ["name", "image", "command", "workdir", "env", "mounts", "gpus", "gpu_memory", "gpu_type", "min_gpu_memory", "priority", "timeout", "retries", "expected_runtime", "after", "matrix"] {
            assert!(props.contains_key(f), "{f}");
        }
        assert_eq!(s["additionalProperties"], serde_json::json!(false));
    }

    #[test]
    fn container_settings_parse_and_are_checked() {
        let j = ok_yaml("image: a\ncpus: 0.5\nmemory: 64GiB\nshm_size: 16GiB\nipc: host\nhome: mount\nulimits: {memlock: unlimited, stack: 64MiB}\n");
        assert_eq!(j.limits, Limits { cpus_milli: Some(500), memory: Some(64 << 30), shm_size: Some(16 << 30), memlock: Some(-1), stack: Some(64 << 20) });
        assert_eq!((j.spec.ipc, j.spec.home), (Some(Ipc::Host), Some(Home::Mount)));
        let t = validate_text("image = \"a\"\ncpus = 8\n[ulimits]\nstack = \"8MiB\"\n", Format::Toml, &Origin::default()).unwrap();
        assert_eq!((t.limits.cpus_milli, t.limits.stack, t.limits.memory), (Some(8000), Some(8 << 20), None));
        assert_eq!(ok_yaml("image: a\n").limits, Limits::default());
        let cases = [
            ("image: a\ncpus: 0\n", "`cpus` is 0; it must be from 0.01 to 1024", 2),
            ("image: a\ncpus: 5000\n", "from 0.01 to 1024", 2),
            ("image: a\nmemory: lots\n", "`memory` \"lots\" is not a size of at least 6.0 MiB", 2),
            ("image: a\nmemory: 1KiB\n", "at least 6.0 MiB", 2),
            ("image: a\nshm_size: 0\n", "`shm_size` \"0\" is not a size", 2),
            ("image: a\nmemory: 1GiB\nshm_size: 2GiB\n", "`shm_size` (2.0 GiB) is larger than `memory` (1.0 GiB)", 3),
            ("image: a\nipc: shareable\n", "unknown variant `shareable`, expected `private` or `host`", 2),
            ("image: a\nhome: nfs\n", "unknown variant `nfs`", 2),
            ("image: a\nulimits:\n  stack: big\n", "ulimit `stack` \"big\" is not `unlimited` or a size", 2),
            ("image: a\nulimits: {nofile: 10}\n", "unknown field `nofile`", 2),
        ];
        for (text, want, line) in cases {
            let e = err_yaml(text);
            assert!(e.message.contains(want), "{text:?}: {e}");
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            assert!(!e.hint.is_empty());
        }
        let s = json_schema();
        for f in ["cpus", "memory", "shm_size", "ipc", "home", "ulimits"] {
            assert!(s["properties"].as_object().unwrap().contains_key(f), "{f} missing from the schema");
        }
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains("\"host\"") && text.contains("\"tmpfs\"") && text.contains("memlock"), "{text}");
    }
}
