//! CPU, RAM and container settings for deep learning: the machine's capacity for jobs (read once at
//! start), each job's CPU and RAM (its spec's, else the lab's per-GPU share), and the container
//! settings the executor applies (shm, ulimits, IPC, HOME).

use crate::defaults as config;
use crate::scheduler::CpuRam;
use crate::spec::{format_bytes, Home, Ipc, SpecError, ValidJob};

/// A CPU or RAM default in the lab config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// An equal share: the CPUs and RAM for jobs split into one share per GPU plus one for CPU-only
    /// jobs, so a machine full of GPU jobs still runs a CPU-only job.
    Auto,
    /// No limit, and not counted by the scheduler.
    Unlimited,
    /// CPU thousandths or bytes.
    Is(u64),
}

impl Amount {
    pub fn show(&self, cpu: bool) -> String {
        match self {
            Amount::Auto => "auto".into(),
            Amount::Unlimited => "none".into(),
            Amount::Is(v) if cpu => crate::units::format_cpus(*v),
            Amount::Is(v) => format_bytes(*v),
        }
    }
}

/// `[containers]` in the lab config (see packaging/config.toml).
#[derive(Debug, Clone, PartialEq)]
pub struct Containers {
    /// `None`: half the job's memory limit ([`config::SHM_WITHOUT_MEMORY_LIMIT`] without one).
    pub shm_size: Option<u64>,
    /// Bytes; -1 unlimited.
    pub memlock: i64,
    pub stack: i64,
    pub allow_ipc_host: bool,
    pub home: Home,
    pub cpus_per_gpu: Amount,
    pub memory_per_gpu: Amount,
    pub cpu_only_cpus: Amount,
    pub cpu_only_memory: Amount,
    /// CPU-only jobs together hold at most this many equal shares ([`Containers::cpu_only_limit`]).
    pub cpu_only_shares: u32,
    pub reserve_cpus_milli: u64,
    pub reserve_memory: u64,
    /// Processes and threads per job; a spec may ask for fewer, never more.
    pub pids_limit: i64,
    /// Jobs without an image (`image: host`) run in this machine's own system folders.
    pub host_image: bool,
}

impl Default for Containers {
    fn default() -> Self {
        Containers {
            shm_size: None,
            memlock: -1,
            stack: config::STACK_LIMIT,
            allow_ipc_host: false,
            home: Home::Tmpfs,
            cpus_per_gpu: Amount::Auto,
            memory_per_gpu: Amount::Auto,
            cpu_only_cpus: Amount::Auto,
            cpu_only_memory: Amount::Auto,
            cpu_only_shares: config::CPU_ONLY_SHARES,
            reserve_cpus_milli: config::RESERVE_CPUS_MILLI,
            reserve_memory: config::RESERVE_MEMORY,
            pids_limit: config::PIDS_LIMIT,
            host_image: true,
        }
    }
}

impl Containers {
    /// Each setting as `key = value`, for the reload log.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let lim = |v: i64| {
            if v < 0 {
                "unlimited".to_string()
            } else {
                format_bytes(v as u64)
            }
        };
        vec![
            (
                "containers.shm_size",
                self.shm_size.map(format_bytes).unwrap_or_else(|| "auto".into()),
            ),
            ("containers.memlock", lim(self.memlock)),
            ("containers.stack", lim(self.stack)),
            ("containers.allow_ipc_host", self.allow_ipc_host.to_string()),
            ("containers.home", format!("{:?}", self.home).to_lowercase()),
            ("containers.cpus_per_gpu", self.cpus_per_gpu.show(true)),
            ("containers.memory_per_gpu", self.memory_per_gpu.show(false)),
            ("containers.cpu_only_cpus", self.cpu_only_cpus.show(true)),
            ("containers.cpu_only_memory", self.cpu_only_memory.show(false)),
            ("containers.cpu_only_shares", self.cpu_only_shares.to_string()),
            (
                "containers.reserve_cpus",
                crate::units::format_cpus(self.reserve_cpus_milli),
            ),
            ("containers.reserve_memory", format_bytes(self.reserve_memory)),
            ("containers.pids_limit", self.pids_limit.to_string()),
            ("containers.host_image", self.host_image.to_string()),
        ]
    }

    /// The CPU and RAM a job is limited to and counted for: what its spec says (`cpus_milli`,
    /// `memory`), else the lab's default for its `gpus`. `cap` is the machine's capacity for jobs,
    /// `gpu_count` the number of GPUs Gantry schedules.
    pub fn needs(
        &self,
        gpus: u32,
        cpus_milli: Option<u64>,
        memory: Option<u64>,
        cap: CpuRam,
        gpu_count: usize,
    ) -> CpuRam {
        self.needs_sharing(gpus, cpus_milli, memory, cap, gpu_count, None)
    }

    /// [`Containers::needs`] for a job that may share its GPUs: with `gpu_memory` declared on GPUs of
    /// `gpu_total` bytes (`part`: `(gpu_memory, gpu_total)`), its default CPU/RAM is that part of each
    /// GPU's share (issue 28 item 6: three 8 GiB jobs on a 24 GiB GPU hold one share together, not
    /// three). `gpu_total` is the largest GPU's, so the jobs packed on any one GPU never hold more
    /// than its share. What the spec sets is kept as it is.
    pub fn needs_sharing(
        &self,
        gpus: u32,
        cpus_milli: Option<u64>,
        memory: Option<u64>,
        cap: CpuRam,
        gpu_count: usize,
        part: Option<(u64, u64)>,
    ) -> CpuRam {
        let part = part.filter(|(m, total)| gpus > 0 && *total > 0 && m < total);
        let scale = |v: u64, floor: u64| match part {
            Some((m, total)) => ((v as u128 * m as u128 / total as u128) as u64).max(floor),
            None => v,
        };
        let shares = gpu_count as u64 + 1;
        let pick = |explicit: Option<u64>, per_gpu: Amount, cpu_only: Amount, total: u64, floor: u64| -> u64 {
            if let Some(v) = explicit {
                return v;
            }
            let (amount, times) = if gpus == 0 {
                (cpu_only, 1)
            } else {
                (per_gpu, gpus as u64)
            };
            match amount {
                Amount::Unlimited => 0,
                Amount::Is(v) => scale(v, floor).saturating_mul(times),
                Amount::Auto => scale((total / shares).max(floor), floor).saturating_mul(times),
            }
        };
        CpuRam {
            cpus_milli: pick(cpus_milli, self.cpus_per_gpu, self.cpu_only_cpus, cap.cpus_milli, 10),
            memory: pick(
                memory,
                self.memory_per_gpu,
                self.cpu_only_memory,
                cap.memory,
                crate::spec::MIN_MEMORY,
            ),
        }
    }

    /// What CPU-only jobs together may hold (issue 33): `cpu_only_shares` of the machine's equal shares
    /// (the capacity split one per GPU plus one), or of one default CPU-only job's CPU/RAM where the lab
    /// set that larger. A measure CPU-only jobs are not counted in (`none`) is not bounded (`u64::MAX`).
    pub fn cpu_only_limit(&self, cap: CpuRam, gpu_count: usize) -> CpuRam {
        let one = self.needs(0, None, None, cap, gpu_count);
        let shares = gpu_count as u64 + 1;
        let n = self.cpu_only_shares.max(1) as u64;
        let limit = |one: u64, total: u64| {
            if one == 0 {
                u64::MAX
            } else {
                // `n` shares of `total` (not n × a rounded share: all shares are the whole of it).
                ((total as u128 * n as u128 / shares as u128) as u64).max(one.saturating_mul(n))
            }
        };
        CpuRam {
            cpus_milli: limit(one.cpus_milli, cap.cpus_milli),
            memory: limit(one.memory, cap.memory),
        }
    }

    /// The most CPU and RAM a job with `gpus` GPUs may hold (issue 18 item 10): the capacity for jobs
    /// less one per-GPU share for every other GPU, so that however it is asked for, the other GPUs
    /// can still each run a job with its default share. There is no exception for an idle machine: a
    /// job's limits hold for its whole run, and a machine idle at its start rarely stays so. A
    /// measure the lab does not count (`none`) has no ceiling.
    pub fn ceiling(&self, gpus: u32, cap: CpuRam, gpu_count: usize) -> CpuRam {
        let share = self.needs(1, None, None, cap, gpu_count);
        let own = self.needs(gpus, None, None, cap, gpu_count);
        let others = (gpu_count as u64).saturating_sub(gpus as u64);
        let one = |share: u64, own: u64, total: u64| {
            if share == 0 {
                u64::MAX
            } else {
                total.saturating_sub(others * share).max(own)
            }
        };
        CpuRam {
            cpus_milli: one(share.cpus_milli, own.cpus_milli, cap.cpus_milli),
            memory: one(share.memory, own.memory, cap.memory),
        }
    }

    /// Refuse CPU or RAM above [`Containers::ceiling`], saying what the job may have and why.
    pub fn check_share(
        &self,
        job: &ValidJob,
        cap: CpuRam,
        gpu_count: usize,
        set_in: &dyn Fn(&str) -> String,
    ) -> Result<(), SpecError> {
        let ceil = self.ceiling(job.gpus, cap, gpu_count);
        let share = self.needs(1, None, None, cap, gpu_count);
        let others = gpu_count.saturating_sub(job.gpus as usize);
        let who = if job.gpus == 0 {
            "a CPU-only job".to_string()
        } else {
            format!("a {}-GPU job", job.gpus)
        };
        let gpus_left = format!("the other {others} GPU{}", if others == 1 { "" } else { "s" });
        if let Some(c) = job.limits.cpus_milli.filter(|c| *c > ceil.cpus_milli) {
            use crate::units::cpus_count;
            return Err(SpecError::new(
                format!(
                    "the job asks for {}; {who} may hold at most {} here, so that {gpus_left} keep their share ({} each) of the {} for jobs{}",
                    cpus_count(c), cpus_count(ceil.cpus_milli), cpus_count(share.cpus_milli), cpus_count(cap.cpus_milli), set_in("containers.cpus_per_gpu")
                ),
                format!("ask for at most `cpus: {}`, or for more GPUs", crate::units::format_cpus(ceil.cpus_milli)),
            ));
        }
        if let Some(m) = job.limits.memory.filter(|m| *m > ceil.memory) {
            return Err(SpecError::new(
                format!(
                    "the job asks for {} of memory; {who} may hold at most {} here, so that {gpus_left} keep their share ({} each) of the {} for jobs{}",
                    format_bytes(m), format_bytes(ceil.memory), format_bytes(share.memory), format_bytes(cap.memory), set_in("containers.memory_per_gpu")
                ),
                format!("ask for at most `memory: {}`, or for more GPUs", format_bytes(ceil.memory)),
            ));
        }
        Ok(())
    }

    /// Refuse a `pids_limit` above the lab's (at submit; a job queued before the lab lowered its limit
    /// gets the lab's).
    pub fn check_pids(&self, job: &ValidJob, set_in: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
        match job.limits.pids_limit {
            Some(n) if n > self.pids_limit => Err(SpecError::new(
                format!(
                    "`pids_limit` is {n}; this machine allows at most {} processes per job{}",
                    self.pids_limit,
                    set_in("containers.pids_limit")
                ),
                format!(
                    "ask for at most {}, or leave `pids_limit` out to get that",
                    self.pids_limit
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Refuse what the lab does not allow: `ipc: host` and `home: mount`.
    pub fn check(&self, job: &ValidJob, set_in: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
        if job.spec.is_host_image() && !self.host_image {
            return Err(SpecError::new(
                format!(
                    "jobs without an image (`image: host`, this machine's own folders) are turned off here{}",
                    set_in("containers.host_image")
                ),
                "name a Docker image in `image` (`gantry run --image IMG`)",
            ));
        }
        if job.spec.ipc == Some(Ipc::Host) && !self.allow_ipc_host {
            return Err(SpecError::new(
                format!("`ipc: host` is not allowed on this machine: it would let the job reach other jobs' and the host's shared memory{}", set_in("containers.allow_ipc_host")),
                "remove `ipc` (PyTorch works with the default private IPC and the job's large /dev/shm), or ask an admin to set `allow_ipc_host = true`",
            ));
        }
        if job.spec.home == Some(Home::Mount) && self.home != Home::Mount {
            return Err(SpecError::new(
                format!("`home: mount` is not enabled on this machine{}", set_in("containers.home")),
                "remove `home` (the job gets an empty, writable $HOME), mount the folders it needs under `mounts`, or ask an admin to set `home = \"mount\"`",
            ));
        }
        Ok(())
    }
}

/// The machine's CPUs and RAM, read once when the engine starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    pub total: CpuRam,
    /// The most locked memory a container may get here (`None`: unlimited is allowed). Raising
    /// RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE, which some hosts (a dockerd inside a container) lack;
    /// asking for more there would fail every job at start.
    pub memlock_max: Option<i64>,
}

impl Machine {
    pub fn read() -> Machine {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| mem_total(&m))
            .unwrap_or(0);
        Machine {
            total: CpuRam {
                cpus_milli: cpus * 1000,
                memory,
            },
            memlock_max: memlock_max(),
        }
    }

    /// What jobs may use: the machine less the lab's reserve for the OS, Docker and the engine, but at
    /// least half the machine (a reserve larger than a small machine must not leave nothing).
    pub fn for_jobs(&self, c: &Containers) -> CpuRam {
        let t = self.total;
        CpuRam {
            cpus_milli: t.cpus_milli.saturating_sub(c.reserve_cpus_milli).max(t.cpus_milli / 2),
            memory: t.memory.saturating_sub(c.reserve_memory).max(t.memory / 2),
        }
    }
}

/// The CPUs jobs may be pinned to, and the machine's NUMA nodes, read once when the engine starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// The engine's own CPUs (`Cpus_allowed_list`): what its containers may be pinned to.
    pub cpus: Vec<u32>,
    /// Each NUMA node's CPUs (`/sys/devices/system/node/node<N>/cpulist`).
    pub nodes: Vec<(u32, Vec<u32>)>,
}

impl Topology {
    pub fn read() -> Topology {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(parse_cpu_list)
            .unwrap_or_default();
        let mut nodes = vec![];
        if let Ok(rd) = std::fs::read_dir("/sys/devices/system/node") {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(n) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                let list = std::fs::read_to_string(e.path().join("cpulist")).unwrap_or_default();
                nodes.push((n, parse_cpu_list(&list)));
            }
        }
        nodes.sort();
        Topology { cpus, nodes }
    }

    /// The CPUs of these NUMA nodes.
    pub fn cpus_of(&self, nodes: &[u32]) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|(n, _)| nodes.contains(n))
            .flat_map(|(_, c)| c.iter().copied())
            .collect()
    }
}

/// `0-3,8,10-11` (Linux's cpulist, Docker's cpuset) -> the CPUs; what does not parse is left out.
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = vec![];
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
            if a <= b && b - a < 65_536 {
                out.extend(a..=b);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// CPUs as a cpulist, ranges joined: `[0, 1, 2, 3, 8]` -> `0-3,8`.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts: Vec<String> = vec![];
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// `n` CPUs of `pool` none of which is `taken`, those in `near` first (the job's GPUs' NUMA node),
/// lowest first; `None` when fewer than `n` are free. Pure: the engine decides under one lock, so two
/// jobs are never pinned to the same CPU.
pub fn pick_cpus(n: usize, pool: &[u32], taken: &std::collections::BTreeSet<u32>, near: &[u32]) -> Option<Vec<u32>> {
    let mut free: Vec<u32> = pool.iter().copied().filter(|c| !taken.contains(c)).collect();
    free.sort_by_key(|c| (!near.contains(c), *c));
    free.dedup();
    if n == 0 || free.len() < n {
        return None;
    }
    let mut got: Vec<u32> = free[..n].to_vec();
    got.sort_unstable();
    Some(got)
}

/// `MemTotal:       24567890 kB` -> bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `Some(hard limit)` when this (root) process may not raise RLIMIT_MEMLOCK to unlimited, which means
/// the container runtime on this host may not either. A non-root engine cannot tell: it assumes it may.
fn memlock_max() -> Option<i64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).ok()?;
    if hard == RLIM_INFINITY || setrlimit(Resource::RLIMIT_MEMLOCK, soft, RLIM_INFINITY).is_ok() {
        return None;
    }
    Some(hard as i64)
}

/// What the executor applies to a job's container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSettings {
    /// Billionths of a CPU (Docker's NanoCpus); `None`: no limit.
    pub nano_cpus: Option<i64>,
    /// Bytes (swap is set to the same, so none is added); `None`: no limit.
    pub memory: Option<i64>,
    pub shm_size: Option<i64>,
    /// -1 unlimited.
    pub memlock: Option<i64>,
    pub stack: Option<i64>,
    pub ipc_host: bool,
    /// `$HOME` in the container.
    pub home: Option<String>,
    /// Mount an empty tmpfs owned by the job's user at `home` (else the owner's home is one of the
    /// job's checked mounts, or a spec mount is already there).
    pub home_tmpfs: bool,
    /// Processes and threads at once (Docker's PidsLimit); `None`: Docker's own (none).
    pub pids_limit: Option<i64>,
    /// The CPUs the job is pinned to (Docker's cpuset, `0-3,8`), when its share is whole CPUs.
    pub cpuset: Option<String>,
    /// Threads a framework should use (`OMP_NUM_THREADS`, `MKL_NUM_THREADS` unless the spec sets them).
    pub threads: Option<u32>,
    /// Docker keeps the container's own log in [`config::DOCKER_LOG_FILES`] json-file files of this
    /// many bytes each; `None`: the Docker daemon's own log settings.
    pub log_file_size: Option<u64>,
    /// The owner's name (`USER`, `LOGNAME`).
    pub user: Option<String>,
    /// Bytes the container's writable layer may hold (`--storage-opt size`), where Docker's
    /// storage driver can bound it; `None`: unbounded.
    pub layer_size: Option<u64>,
}

/// Where a job's HOME goes when its owner's home cannot be used as the path (no passwd entry, `/`).
pub const FALLBACK_HOME: &str = "/gantry/home";

impl Containers {
    /// The container settings of `job`, whose CPU and RAM are `needs` (from [`Containers::needs`]).
    /// `owner_home` is the owner's home folder; with `home: mount`, the caller adds it to the mounts
    /// that are checked as the owner (see [`Containers::home_mount`]).
    pub fn settings(
        &self,
        job: &ValidJob,
        needs: CpuRam,
        machine: &Machine,
        owner_home: Option<&str>,
    ) -> ContainerSettings {
        let memory = (needs.memory > 0).then_some(needs.memory);
        let shm = job
            .limits
            .shm_size
            .or(self.shm_size)
            .unwrap_or_else(|| memory.map(|m| m / 2).unwrap_or(config::SHM_WITHOUT_MEMORY_LIMIT));
        let memlock = job.limits.memlock.unwrap_or(self.memlock);
        let memlock = match machine.memlock_max {
            Some(max) if memlock < 0 || memlock > max => max,
            _ => memlock,
        };
        let home = home_path(owner_home);
        // A spec mount at the home path is the job's HOME as it is.
        let taken = job.mounts.iter().any(|m| m.container.trim_end_matches('/') == home);
        ContainerSettings {
            nano_cpus: (needs.cpus_milli > 0).then(|| needs.cpus_milli as i64 * 1_000_000),
            memory: memory.map(|m| m as i64),
            shm_size: Some(shm as i64),
            memlock: Some(memlock),
            stack: Some(job.limits.stack.unwrap_or(self.stack)),
            ipc_host: job.spec.ipc == Some(Ipc::Host),
            home_tmpfs: !taken && self.home_mode(job) == Home::Tmpfs,
            home: Some(home),
            pids_limit: Some(
                job.limits
                    .pids_limit
                    .map_or(self.pids_limit, |n| n.min(self.pids_limit)),
            ),
            threads: (needs.cpus_milli > 0).then(|| needs.cpus_milli.div_ceil(1000).max(1) as u32),
            cpuset: None,
            log_file_size: None,
            user: None,
            layer_size: None,
        }
    }

    /// A job in this machine's own folders (`image: host`) has the owner's home, as on the machine.
    fn home_mode(&self, job: &ValidJob) -> Home {
        job.spec.home.unwrap_or(if job.spec.is_host_image() {
            Home::Mount
        } else {
            self.home
        })
    }

    /// The owner's home as a read-write mount, when the job's HOME is their home folder.
    pub fn home_mount(&self, job: &ValidJob, owner_home: Option<&str>) -> Option<crate::spec::Mount> {
        let home = home_path(owner_home);
        let taken = job.mounts.iter().any(|m| m.container.trim_end_matches('/') == home);
        (self.home_mode(job) == Home::Mount && !taken && home != FALLBACK_HOME).then(|| crate::spec::Mount {
            host: home.clone(),
            container: home,
            read_only: false,
        })
    }
}

fn home_path(owner_home: Option<&str>) -> String {
    match owner_home.map(|h| h.trim_end_matches('/')) {
        Some(h) if h.starts_with('/') && h.len() > 1 && !h.contains(':') => h.to_string(),
        _ => FALLBACK_HOME.into(),
    }
}
#[cfg(test)]
mod tests;
