//! The `[slurm]` section.

use super::*;

impl Check<'_> {
    pub(super) fn slurm(&mut self, raw: &RawSlurm) -> crate::slurm::Settings {
        use crate::slurm::{Runtime, Settings};
        let mut s = Settings::default();
        let name = |v: &S<String>| {
            v.as_ref()
                .map(|v| v.get_ref().trim().to_string())
                .filter(|v| !v.is_empty())
        };
        s.partition = name(&raw.partition);
        s.account = name(&raw.account);
        s.qos = name(&raw.qos);
        for (key, v) in [
            ("partition", &raw.partition),
            ("account", &raw.account),
            ("qos", &raw.qos),
        ] {
            if let Some(v) = v.as_ref().filter(|v| {
                v.get_ref()
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == ',')
            }) {
                self.fail(
                    v.span(),
                    format!("slurm `{key}` = {:?} is not a Slurm name", v.get_ref()),
                    "write the name as `sinfo`/`sacctmgr` show it, without spaces",
                );
            }
        }
        if let Some(d) = self.duration("poll", &raw.poll, Duration::from_secs(300)) {
            s.poll = d;
        }
        for (key, v, out) in [
            ("log_dir", &raw.log_dir, &mut s.log_dir),
            ("jobcomp_log", &raw.jobcomp_log, &mut s.jobcomp_log),
            ("node_samples", &raw.node_samples, &mut s.node_samples),
        ] {
            if let Some(v) = v {
                let p = PathBuf::from(v.get_ref());
                if p.is_absolute() {
                    *out = Some(p);
                } else {
                    self.fail(
                        v.span(),
                        format!("slurm `{key}` = {:?} is not an absolute path", v.get_ref()),
                        "write e.g. \"/shared/gantry-logs\"",
                    );
                }
            }
        }
        if let Some(r) = &raw.runtime {
            match r.get_ref().as_str() {
                "docker" => s.runtime = Runtime::Docker,
                "apptainer" => s.runtime = Runtime::Apptainer,
                other => self.fail(
                    r.span(),
                    format!("slurm `runtime` = {other:?} is not a choice"),
                    "write \"docker\" or \"apptainer\"",
                ),
            }
        }
        if let Some(m) = &raw.shard_memory {
            match crate::units::parse_bytes(m.get_ref()) {
                Some(b) if b >= 1 << 20 => s.shard_memory = Some(b),
                _ => self.fail(
                    m.span(),
                    format!("slurm `shard_memory` = {:?} is not a size", m.get_ref()),
                    "write the GPU memory one Slurm shard stands for, e.g. \"10GiB\"",
                ),
            }
        }
        if let Some(n) = self.count("max_nice", &raw.max_nice, 2_000_000) {
            s.max_nice = n as u32;
        }
        s
    }
}
