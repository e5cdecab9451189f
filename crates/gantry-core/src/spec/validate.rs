//! Checking a parsed spec into a `ValidJob`: limits, GPU choice (`GpuFilter`), names and ranges.

#[allow(unused_imports)]
use super::*;
use serde::{Deserialize, Serialize};
use std::time::Duration;

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
        return err(
            "`image` is empty".into(),
            "set `image` to a Docker image name, e.g. `pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime`",
            "image",
        );
    }
    if spec.image.chars().any(|c| c.is_whitespace()) {
        return err(
            format!("`image` {:?} contains whitespace", spec.image),
            "an image name has no spaces: `repo/name:tag`",
            "image",
        );
    }
    if spec.gpus < 0 {
        return err(
            format!("`gpus` is {}, it must be 0 or more", spec.gpus),
            "use `gpus: 0` for a CPU-only job, or the number of GPUs to reserve",
            "gpus",
        );
    }
    if spec.gpus > 64 {
        return err(
            format!("`gpus` is {}, more than any workstation has", spec.gpus),
            "ask for the number of GPUs the job really uses",
            "gpus",
        );
    }
    if spec.retries < 0 || spec.retries > 100 {
        return err(
            format!("`retries` is {}, it must be between 0 and 100", spec.retries),
            "use e.g. `retries: 2`",
            "retries",
        );
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
                    return err(
                        "`gpu_memory` is set but `gpus` is 0".into(),
                        "remove `gpu_memory`, or ask for at least one GPU",
                        "gpu_memory",
                    );
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
            Ok(d) if d > MAX_DURATION => {
                return err(
                    format!("`timeout` {s:?} is longer than a year"),
                    "use at most `365d`, or leave `timeout` out for no limit",
                    "timeout",
                )
            }
            _ => {
                return err(
                    format!("`timeout` {s:?} is not a duration"),
                    "write e.g. `24h`, `90m` or `1h 30m`",
                    "timeout",
                )
            }
        },
    };
    if let Some(Command::Exec(v)) = &spec.command {
        if v.is_empty() {
            return err(
                "`command` is an empty list".into(),
                "give the program and its arguments, e.g. [\"python\", \"train.py\"]",
                "command",
            );
        }
    }
    if let Some(w) = &spec.workdir {
        if !w.starts_with('/') {
            return err(
                format!("`workdir` {w:?} is not an absolute path"),
                "use an absolute path inside the container, e.g. `/workspace`",
                "workdir",
            );
        }
    }
    if let Some(t) = &spec.tensorboard {
        if t.trim().is_empty() || t.contains('\0') || t.split('/').any(|c| c == "..") {
            return err(
                format!("`tensorboard` {t:?} is not a folder path"),
                "give the folder your SummaryWriter writes to, e.g. `runs` (relative to `workdir`) or `/data/runs`",
                "tensorboard",
            );
        }
        if !t.starts_with('/') && spec.workdir.is_none() {
            return err(
                format!("`tensorboard` {t:?} is relative, but the job sets no `workdir`"),
                "set `workdir`, or give an absolute path inside the container under one of the job's mounts",
                "tensorboard",
            );
        }
    }
    for k in spec.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return err(
                format!("environment variable name {k:?} is invalid"),
                "names are letters, digits and `_`",
                "env",
            );
        }
        // The NVIDIA container runtime reads these from the container's environment (capabilities,
        // NVSwitch and IMEX channels, MIG configuration): the GPUs a job gets are Gantry's to set.
        if k.to_ascii_uppercase().starts_with("NVIDIA_") {
            return err(
                format!("`env` sets {k}, which the NVIDIA container runtime would act on"),
                "remove it: Gantry gives the job its GPUs (`gpus`, `gpu_memory`, `gpu_type`) and sets NVIDIA_VISIBLE_DEVICES itself",
                "env",
            );
        }
    }
    if spec.mounts.len() > MAX_MOUNTS {
        return err(
            format!("the job has {} `mounts`; the limit is {MAX_MOUNTS}", spec.mounts.len()),
            "mount a few parent folders instead of many single paths",
            "mounts",
        );
    }
    if spec.after.len() > MAX_AFTER {
        return err(
            format!("`after` lists {} jobs; the limit is {MAX_AFTER}", spec.after.len()),
            "wait for a few jobs that end last, or chain the jobs",
            "after",
        );
    }
    let mut mounts = Vec::new();
    for m in &spec.mounts {
        mounts.push(parse_mount(m, origin).map_err(|e| (e, "mounts"))?);
    }
    if spec.is_host_image() {
        // Those folders are the machine's own, mounted read-only: nothing goes inside them.
        let system = |p: &str| {
            HOST_SYSTEM_FOLDERS
                .iter()
                .any(|d| p == *d || p.starts_with(&format!("{d}/")))
        };
        if let Some(m) = mounts.iter().find(|m| system(m.container.trim_end_matches('/'))) {
            return err(
                format!("the mount at {} is inside this machine's system folders, which a job without an image sees read-only as they are", m.container),
                "mount it elsewhere, e.g. under /mnt or your home",
                "mounts",
            );
        }
    }
    let name = spec
        .name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .or_else(|| {
            origin
                .file_name
                .as_ref()
                .map(|f| f.rsplit_once('.').map(|(a, _)| a).unwrap_or(f).to_string())
        })
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "job".into());
    if name.chars().count() > MAX_NAME_CHARS {
        return err(
            format!("`name` is longer than {MAX_NAME_CHARS} characters"),
            "use a short name",
            "name",
        );
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
            Ok(d) if d > MAX_DURATION => {
                return err(
                    format!("`expected_runtime` {s:?} is longer than a year"),
                    "use at most `365d`",
                    "expected_runtime",
                )
            }
            _ => {
                return err(
                    format!("`expected_runtime` {s:?} is not a duration"),
                    "write e.g. `2h` or `45m`",
                    "expected_runtime",
                )
            }
        },
    };
    if let Some(b) = &spec.begin {
        // The form only: the moment is fixed when the job is queued (`+2h` from then).
        if let Err(m) = crate::units::parse_when(b, 0, 0, "`begin`") {
            return err(m, "or leave `begin` out to start as soon as GPUs are free", "begin");
        }
    }
    if spec.matrix.values().any(|v| v.is_empty()) {
        return err(
            "a `matrix` entry has no values".into(),
            "give each matrix key a list of values, e.g. `lr: [0.1, 0.01]`",
            "matrix",
        );
    }
    // Checked: 64 keys of 2 values overflow a plain product.
    let combos = spec
        .matrix
        .values()
        .try_fold(1usize, |n, v| n.checked_mul(v.len()).filter(|n| *n <= MAX_MATRIX_JOBS));
    let Some(combos) = combos else {
        let shown = spec
            .matrix
            .values()
            .map(|v| v.len().to_string())
            .collect::<Vec<_>>()
            .join(" x ");
        return err(
            format!("`matrix` expands to more than {MAX_MATRIX_JOBS} jobs ({shown}); the limit is {MAX_MATRIX_JOBS}"),
            "split the sweep into several files",
            "matrix",
        );
    };
    // Each expanded job stores the whole spec: one request may not fill the engine's disk.
    let stored = serde_json::to_vec(&spec)
        .map(|v| v.len())
        .unwrap_or(usize::MAX)
        .saturating_mul(combos);
    if stored > MAX_SUBMIT_BYTES {
        return err(
            format!(
                "the `matrix` makes {combos} jobs of this spec, {} in all; the limit is {}",
                format_bytes(stored as u64),
                format_bytes(MAX_SUBMIT_BYTES as u64)
            ),
            "keep large data out of the spec (put it in a mounted file), or split the sweep",
            "matrix",
        );
    }
    for k in spec.matrix.keys() {
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return err(
                format!("matrix key {k:?} must be letters, digits and `_`"),
                "rename the key, e.g. `lr`",
                "matrix",
            );
        }
    }
    if let Some(IdOrName::Id(i)) = spec.after.iter().find(|a| matches!(a, IdOrName::Id(i) if *i <= 0)) {
        return err(
            format!("`after` refers to job {i}"),
            "job ids are positive numbers; names are strings",
            "after",
        );
    }
    if spec.ports.len() > MAX_PORTS {
        return err(
            format!("the job serves {} `ports`; the limit is {MAX_PORTS}", spec.ports.len()),
            "list the ports you will open with `gantry open`",
            "ports",
        );
    }
    for (i, p) in spec.ports.iter().enumerate() {
        if *p == 0 {
            return err(
                "`ports` lists port 0".into(),
                "list the port your server listens on inside the container, e.g. `ports: [8888]`",
                "ports",
            );
        }
        if spec.ports[..i].contains(p) {
            return err(format!("`ports` lists port {p} twice"), "list each port once", "ports");
        }
    }
    if spec.interactive {
        if !spec.matrix.is_empty() {
            return err(
                "an `interactive` session has a `matrix`".into(),
                "a session is one terminal: remove `matrix`, or make it a batch job (`interactive: false`)",
                "matrix",
            );
        }
        if spec.retries != 0 {
            return err(
                "an `interactive` session has `retries`".into(),
                "a session is never run again on its own: remove `retries`",
                "retries",
            );
        }
    }
    if let Some(c) = &spec.checkpoint {
        if let Some(sig) = &c.signal {
            if signal_name(sig).is_none() {
                return err(
                    format!("`checkpoint.signal` {sig:?} is not a checkpoint signal"),
                    &format!("use one of {}", CHECKPOINT_SIGNALS.join(", ")),
                    "checkpoint",
                );
            }
        }
        if let Some(g) = &c.grace {
            match humantime::parse_duration(g.trim()) {
                Ok(d) if d > Duration::ZERO && d <= MAX_CHECKPOINT_GRACE => {}
                Ok(d) if d > MAX_CHECKPOINT_GRACE => {
                    return err(
                        format!("`checkpoint.grace` {g:?} is longer than an hour"),
                        "a preemption holds the GPUs it frees for the grace: use at most `1h`",
                        "checkpoint",
                    )
                }
                _ => {
                    return err(
                        format!("`checkpoint.grace` {g:?} is not a duration"),
                        "write e.g. `5m` or `90s`",
                        "checkpoint",
                    )
                }
            }
        }
    }
    let limits = validate_limits(&spec)?;
    Ok(ValidJob {
        name,
        gpus: spec.gpus as u32,
        gpu_memory,
        timeout,
        retries: spec.retries as u32,
        mounts,
        expected_runtime,
        limits,
        spec,
        matrix_part: None,
        begin_ms: None,
    })
}

/// `cpus`, `memory`, `shm_size`, `ulimits` and `pids_limit`.
pub(super) fn validate_limits(spec: &JobSpec) -> Result<Limits, (SpecError, &'static str)> {
    let err = |m: String, h: &str, k: &'static str| Err((SpecError::new(m, h), k));
    let cpus_milli = match spec.cpus {
        None => None,
        Some(c) if c.is_finite() && (0.01..=1024.0).contains(&c) => Some((c * 1000.0).round() as u64),
        Some(c) => {
            return err(
                format!("`cpus` is {c}; it must be from 0.01 to 1024"),
                "write the number of CPUs the job uses, e.g. `cpus: 8` or `cpus: 0.5`",
                "cpus",
            )
        }
    };
    let size = |v: &Option<String>,
                key: &'static str,
                min: u64,
                hint: &str|
     -> Result<Option<u64>, (SpecError, &'static str)> {
        match v.as_deref().map(|s| (s, parse_bytes(s))) {
            None => Ok(None),
            Some((_, Some(b))) if b >= min => Ok(Some(b)),
            Some((s, _)) => Err((
                SpecError::new(
                    format!("`{key}` {s:?} is not a size of at least {}", format_bytes(min)),
                    hint,
                ),
                key,
            )),
        }
    };
    let memory = size(
        &spec.memory,
        "memory",
        MIN_MEMORY,
        "write the RAM the job may use, e.g. `memory: 64GiB`, or leave it out for the lab's default",
    )?;
    let shm_size = size(
        &spec.shm_size,
        "shm_size",
        1 << 20,
        "write e.g. `shm_size: 16GiB`, or leave it out for half the job's memory",
    )?;
    if let (Some(shm), Some(mem)) = (shm_size, memory) {
        if shm > mem {
            return err(
                format!(
                    "`shm_size` ({}) is larger than `memory` ({}): /dev/shm counts against the job's memory",
                    format_bytes(shm),
                    format_bytes(mem)
                ),
                "lower `shm_size` or raise `memory`",
                "shm_size",
            );
        }
    }
    let limit = |v: Option<&String>, key: &'static str| -> Result<Option<i64>, (SpecError, &'static str)> {
        match v.map(|s| (s, parse_limit(s))) {
            None => Ok(None),
            Some((_, Some(n))) => Ok(Some(n)),
            Some((s, None)) => Err((
                SpecError::new(
                    format!("ulimit `{key}` {s:?} is not `unlimited` or a size"),
                    "write e.g. `memlock: unlimited` or `stack: 64MiB`",
                ),
                "ulimits",
            )),
        }
    };
    let u = spec.ulimits.as_ref();
    let pids_limit = match spec.pids_limit {
        Some(n) if !super::PIDS_LIMIT_RANGE.contains(&n) => {
            let (lo, hi) = (super::PIDS_LIMIT_RANGE.start(), super::PIDS_LIMIT_RANGE.end());
            return err(format!("`pids_limit` is {n}; it must be from {lo} to {hi}"), "write the most processes and threads the job runs at once, e.g. `pids_limit: 512`, or leave it out for the lab's limit", "pids_limit");
        }
        n => n,
    };
    Ok(Limits {
        cpus_milli,
        memory,
        shm_size,
        memlock: limit(u.and_then(|u| u.memlock.as_ref()), "memlock")?,
        stack: limit(u.and_then(|u| u.stack.as_ref()), "stack")?,
        pids_limit,
    })
}

/// Longest `gpu_type` (GPU names are short).
pub const MAX_GPU_TYPE_CHARS: usize = 100;

/// `gpu_type` and `min_gpu_memory`: only for GPU jobs, a non-empty printable name, a size.
pub(super) fn check_gpu_choice(spec: &JobSpec) -> Result<(), (SpecError, &'static str)> {
    let err = |m: String, h: &str, k: &'static str| Err((SpecError::new(m, h), k));
    if let Some(t) = &spec.gpu_type {
        if t.trim().is_empty() {
            return err(
                "`gpu_type` is empty".into(),
                "write part of a GPU name from `gantry gpus`, e.g. `H100`, or leave it out",
                "gpu_type",
            );
        }
        if t.chars().count() > MAX_GPU_TYPE_CHARS || t.chars().any(unprintable) {
            return err(
                format!("`gpu_type` {t:?} is not a GPU name"),
                "write part of a GPU name from `gantry gpus`, e.g. `H100`",
                "gpu_type",
            );
        }
        if spec.gpus == 0 {
            return err(
                "`gpu_type` is set but `gpus` is 0".into(),
                "remove `gpu_type`, or ask for at least one GPU",
                "gpu_type",
            );
        }
    }
    if let Some(m) = &spec.min_gpu_memory {
        if !matches!(parse_bytes(m), Some(b) if b > 0) {
            return err(
                format!("`min_gpu_memory` {m:?} is not a memory size"),
                "write a size such as `40GiB`, or leave it out",
                "min_gpu_memory",
            );
        }
        if spec.gpus == 0 {
            return err(
                "`min_gpu_memory` is set but `gpus` is 0".into(),
                "remove `min_gpu_memory`, or ask for at least one GPU",
                "min_gpu_memory",
            );
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
        self.gpu_type
            .as_ref()
            .is_none_or(|t| name.to_lowercase().contains(&t.trim().to_lowercase()))
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
pub(super) fn article(word: &str) -> &'static str {
    let mut c = word.chars();
    let (first, second) = (c.next().unwrap_or('x').to_ascii_uppercase(), c.next().unwrap_or(' '));
    let spelled = second.is_ascii_digit() || word.chars().all(|c| !c.is_ascii_lowercase());
    let vowel = if spelled {
        "AEFHILMNORSX".contains(first)
    } else {
        "AEIOU".contains(first)
    };
    if vowel {
        "an"
    } else {
        "a"
    }
}

/// The filter of a stored job's `gpu_type` and `min_gpu_memory`.
pub fn gpu_filter(gpu_type: Option<&str>, min_gpu_memory: Option<&str>) -> GpuFilter {
    GpuFilter {
        gpu_type: gpu_type.map(|t| t.trim().to_string()),
        min_memory: min_gpu_memory.and_then(parse_bytes),
    }
}

/// Characters a name may not show: controls, and the marks that reorder text on screen.
pub(super) fn unprintable(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}
