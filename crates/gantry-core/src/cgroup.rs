//! A container's CPU time and memory, read from its cgroup (issue 30 item 3: each run's efficiency).
//!
//! Docker puts each container in a cgroup named after its id. Where depends on the cgroup version
//! and Docker's cgroup driver:
//! - v1, `cgroupfs` driver (Docker 20.10 on Debian 12 without systemd, as on the CI machines):
//!   `/sys/fs/cgroup/cpuacct/docker/<id>/cpuacct.usage` (ns) and
//!   `/sys/fs/cgroup/memory/docker/<id>/memory.max_usage_in_bytes`;
//! - v1, `systemd` driver: the same files under `.../system.slice/docker-<id>.scope/`;
//! - v2 (unified): `/sys/fs/cgroup/system.slice/docker-<id>.scope/` (systemd) or
//!   `/sys/fs/cgroup/docker/<id>/` (cgroupfs), with `cpu.stat` (`usage_usec`) and `memory.peak`
//!   (Linux 5.19+; older kernels only have `memory.current`, so the peak is the largest sample).
//!
//! runc deletes the cgroup as soon as the container's last process exits, before Docker reports the
//! exit: an attempt's figures are those of its last sample (the engine samples every second), and its
//! CPU efficiency is taken over the time up to that sample, not its whole wall time.

use std::path::{Path, PathBuf};

/// What one read of a container's cgroup says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUse {
    /// CPU time of all its processes since it started (ns).
    pub cpu_ns: Option<u64>,
    /// The most memory it has held (bytes): the kernel's own peak where it keeps one, else now.
    pub memory_peak: Option<u64>,
}

/// The cgroup file system's root (`/sys/fs/cgroup`); tests read a folder laid out like it.
pub const ROOT: &str = "/sys/fs/cgroup";

/// Read container `id`'s cgroup under `root`; `None` when it has none there (it has exited, it runs
/// under another cgroup parent, or this is not Linux).
pub fn read_container(root: &Path, id: &str) -> Option<CgroupUse> {
    if !id.chars().all(|c| c.is_ascii_alphanumeric()) || id.is_empty() {
        return None;
    }
    let names = [format!("docker/{id}"), format!("system.slice/docker-{id}.scope")];
    // v2: one folder has every controller's files.
    for n in &names {
        let d = root.join(n);
        if let Some(cpu) = read_text(&d.join("cpu.stat")) {
            let usec = cpu
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok());
            let peak = read_u64(&d.join("memory.peak")).or_else(|| read_u64(&d.join("memory.current")));
            return Some(CgroupUse {
                cpu_ns: usec.map(|u| u.saturating_mul(1000)),
                memory_peak: peak,
            });
        }
    }
    // v1: one hierarchy per controller (cpuacct may be mounted together with cpu).
    let mut found: Option<CgroupUse> = None;
    for n in &names {
        let cpu = ["cpuacct", "cpu,cpuacct", "cpuacct,cpu"]
            .iter()
            .find_map(|c| read_u64(&root.join(c).join(n).join("cpuacct.usage")));
        let mem = read_u64(&root.join("memory").join(n).join("memory.max_usage_in_bytes"));
        if cpu.is_some() || mem.is_some() {
            found = Some(CgroupUse {
                cpu_ns: cpu,
                memory_peak: mem,
            });
            break;
        }
    }
    found
}

fn read_text(p: &PathBuf) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn each_cgroup_layout_docker_uses_is_read() {
        let id = "f225c98b030f";
        // (layout, files, wanted)
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let cases: Vec<(&str, Vec<(String, &str)>, Option<CgroupUse>)> = vec![
            (
                "v1 cgroupfs",
                vec![
                    (format!("cpuacct/docker/{id}/cpuacct.usage"), "1374067346\n"),
                    (format!("memory/docker/{id}/memory.max_usage_in_bytes"), "4079616\n"),
                ],
                Some(CgroupUse {
                    cpu_ns: Some(1_374_067_346),
                    memory_peak: Some(4_079_616),
                }),
            ),
            (
                "v1 systemd, cpu and cpuacct mounted together",
                vec![
                    (
                        format!("cpu,cpuacct/system.slice/docker-{id}.scope/cpuacct.usage"),
                        "5\n",
                    ),
                    (
                        format!("memory/system.slice/docker-{id}.scope/memory.max_usage_in_bytes"),
                        "7\n",
                    ),
                ],
                Some(CgroupUse {
                    cpu_ns: Some(5),
                    memory_peak: Some(7),
                }),
            ),
            (
                "v2 systemd with memory.peak",
                vec![
                    (
                        format!("system.slice/docker-{id}.scope/cpu.stat"),
                        "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n",
                    ),
                    (format!("system.slice/docker-{id}.scope/memory.peak"), "9000\n"),
                    (format!("system.slice/docker-{id}.scope/memory.current"), "100\n"),
                ],
                Some(CgroupUse {
                    cpu_ns: Some(2_500_000),
                    memory_peak: Some(9000),
                }),
            ),
            (
                "v2 cgroupfs on an older kernel: memory.current only",
                vec![
                    (format!("docker/{id}/cpu.stat"), "usage_usec 1\n"),
                    (format!("docker/{id}/memory.current"), "100\n"),
                ],
                Some(CgroupUse {
                    cpu_ns: Some(1000),
                    memory_peak: Some(100),
                }),
            ),
            ("gone (the container exited)", vec![], None),
        ];
        for (name, files, want) in cases {
            let root = tempfile::tempdir().unwrap();
            for (rel, text) in &files {
                write(root.path(), rel, text);
            }
            assert_eq!(read_container(root.path(), id), want, "{name}");
        }
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "docker/x/cpu.stat", "usage_usec 1\n");
        assert_eq!(read_container(root.path(), "../x"), None, "an id is never a path");
    }
}
