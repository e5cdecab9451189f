//! The `[containers]` section and the top-level `gpus` key.

use super::*;

impl Check<'_> {
    pub(super) fn containers(&mut self, raw: &RawContainers) -> crate::resources::Containers {
        use crate::resources::Amount;
        let mut c = crate::resources::Containers::default();
        let sizes = "write a size such as \"8GiB\"";
        if let Some(v) = &raw.shm_size {
            match (v.get_ref().as_str(), crate::units::parse_bytes(v.get_ref())) {
                ("auto", _) => {}
                (_, Some(b)) if b >= 1 << 20 => c.shm_size = Some(b),
                (s, _) => self.fail(
                    v.span(),
                    format!("`shm_size` = {s:?} is not \"auto\" or a size of at least 1 MiB"),
                    format!("{sizes}, or \"auto\" (half the job's memory limit)"),
                ),
            }
        }
        for (key, v, out) in [
            ("memlock", &raw.memlock, &mut c.memlock),
            ("stack", &raw.stack, &mut c.stack),
        ] {
            if let Some(v) = v {
                match crate::units::parse_limit(v.get_ref()) {
                    Some(n) => *out = n,
                    None => self.fail(
                        v.span(),
                        format!("`{key}` = {:?} is not \"unlimited\" or a size", v.get_ref()),
                        "write e.g. \"unlimited\" or \"64MiB\"",
                    ),
                }
            }
        }
        if let Some(b) = &raw.allow_ipc_host {
            c.allow_ipc_host = *b.get_ref();
        }
        if let Some(b) = &raw.host_image {
            c.host_image = *b.get_ref();
        }
        if let Some(h) = &raw.home {
            match h.get_ref().as_str() {
                "tmpfs" => c.home = crate::spec::Home::Tmpfs,
                "mount" => c.home = crate::spec::Home::Mount,
                other => self.fail(h.span(), format!("`home` = {other:?} is not a choice"), "write \"tmpfs\" (an empty folder per job) or \"mount\" (the user's home, read-write, checked as them)"),
            }
        }
        let cpus_hint = "write a number of CPUs (e.g. 8 or 0.5), \"auto\" (an equal share) or \"none\" (no limit)";
        let mut cpus = |key: &str, v: &S<toml::Value>, none_ok: bool| -> Option<Amount> {
            let v = v.as_ref()?;
            let n = match v.get_ref() {
                toml::Value::String(s) if s == "auto" && none_ok => return Some(Amount::Auto),
                toml::Value::String(s) if s == "none" && none_ok => return Some(Amount::Unlimited),
                toml::Value::Integer(i) => Some(*i as f64),
                toml::Value::Float(f) => Some(*f),
                _ => None,
            };
            match n {
                Some(n) if n.is_finite() && (if none_ok { 0.01 } else { 0.0 }..=1024.0).contains(&n) => {
                    Some(Amount::Is((n * 1000.0).round() as u64))
                }
                _ => {
                    self.fail(
                        v.span(),
                        format!(
                            "`{key}` = {} is not a number of CPUs from {} to 1024",
                            v.get_ref(),
                            if none_ok { "0.01" } else { "0" }
                        ),
                        if none_ok { cpus_hint } else { "write e.g. 1" },
                    );
                    None
                }
            }
        };
        c.cpus_per_gpu = cpus("cpus_per_gpu", &raw.cpus_per_gpu, true).unwrap_or(c.cpus_per_gpu);
        c.cpu_only_cpus = cpus("cpu_only_cpus", &raw.cpu_only_cpus, true).unwrap_or(c.cpu_only_cpus);
        if let Some(Amount::Is(n)) = cpus("reserve_cpus", &raw.reserve_cpus, false) {
            c.reserve_cpus_milli = n;
        }
        let mut memory = |key: &str, v: &S<String>, none_ok: bool| -> Option<Amount> {
            let v = v.as_ref()?;
            match (v.get_ref().as_str(), crate::units::parse_bytes(v.get_ref())) {
                ("auto", _) if none_ok => Some(Amount::Auto),
                ("none", _) if none_ok => Some(Amount::Unlimited),
                (_, Some(b)) if b >= crate::spec::MIN_MEMORY || (!none_ok) => Some(Amount::Is(b)),
                (s, _) => {
                    self.fail(
                        v.span(),
                        format!(
                            "`{key}` = {s:?} is not a size{}",
                            if none_ok {
                                " of at least 6 MiB, \"auto\" or \"none\""
                            } else {
                                ""
                            }
                        ),
                        "write e.g. \"64GiB\"",
                    );
                    None
                }
            }
        };
        c.memory_per_gpu = memory("memory_per_gpu", &raw.memory_per_gpu, true).unwrap_or(c.memory_per_gpu);
        c.cpu_only_memory = memory("cpu_only_memory", &raw.cpu_only_memory, true).unwrap_or(c.cpu_only_memory);
        if let Some(Amount::Is(b)) = memory("reserve_memory", &raw.reserve_memory, false) {
            c.reserve_memory = b;
        }
        if let Some(v) = &raw.cpu_only_shares {
            match *v.get_ref() {
                n @ 1..=1024 => c.cpu_only_shares = n as u32,
                n => self.fail(
                    v.span(),
                    format!("`cpu_only_shares` = {n} is not a number of shares from 1 to 1024"),
                    "write e.g. 1 (CPU-only jobs together hold one share, as many as one GPU's) or 2",
                ),
            }
        }
        if let Some(v) = &raw.pids_limit {
            let (lo, hi) = (
                crate::spec::PIDS_LIMIT_RANGE.start(),
                crate::spec::PIDS_LIMIT_RANGE.end(),
            );
            match *v.get_ref() {
                n if crate::spec::PIDS_LIMIT_RANGE.contains(&n) => c.pids_limit = n,
                n => self.fail(
                    v.span(),
                    format!("`pids_limit` = {n} is not a number of processes from {lo} to {hi}"),
                    "write e.g. 4096 (processes and threads per job; a spec may ask for fewer)",
                ),
            }
        }
        c
    }

    pub(super) fn gpus(&mut self, v: &Spanned<toml::Value>) -> Option<GpuChoice> {
        let hint = "write gpus = \"all\", or a list of GPU indexes or UUIDs, e.g. [0, 1, 2, 3, 4, 5, 6]";
        let (line, column) = crate::units::line_col(self.text, v.span().start);
        let list = match v.get_ref() {
            toml::Value::String(s) if s == "all" => return None,
            toml::Value::Array(a) if !a.is_empty() => a,
            other => {
                self.fail(
                    v.span(),
                    format!("`gpus` = {other} is not \"all\" or a list of GPUs"),
                    hint,
                );
                return None;
            }
        };
        let mut gpus = vec![];
        for item in list {
            let g = match item {
                toml::Value::Integer(i) if (0..=1024).contains(i) => GpuRef::Index(*i as u32),
                toml::Value::String(s) if s.starts_with("GPU-") || s.starts_with("MIG-") => GpuRef::Uuid(s.clone()),
                other => {
                    self.fail(
                        v.span(),
                        format!("`gpus` lists {other}, which is neither a GPU index nor a GPU UUID"),
                        hint,
                    );
                    return None;
                }
            };
            if gpus.contains(&g) {
                self.fail(v.span(), format!("`gpus` lists GPU {g} twice"), "list each GPU once");
                return None;
            }
            gpus.push(g);
        }
        Some(GpuChoice {
            gpus,
            file: self.file.to_path_buf(),
            line,
            column,
        })
    }
}
