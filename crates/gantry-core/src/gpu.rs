//! GPU inventory: one trait, two backends. NVML on machines with an NVIDIA driver; a simulated
//! backend everywhere else (clearly reported as such through `BackendKind`).

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("NVIDIA driver library not usable: {0}")]
    Nvml(String),
    #[error("invalid simulated GPU spec {0:?}: write e.g. `sim:4x24GiB` or `sim:2xA100-40GiB+2xH100-80GiB`")]
    BadSimSpec(String),
}

// Samples are wire types, defined in `protocol::gpu` (which imports nothing of the crate).
pub use crate::protocol::gpu::{BackendKind, GpuLink, GpuProcess, GpuSample, Link, MigParent};

/// Command lines are shown in one table row: cut long ones.
pub const COMMAND_MAX: usize = 200;

/// What Gantry runs on a GPU, so the simulated backend can show plausible load.
#[derive(Debug, Clone, Default)]
pub struct SimLoad {
    pub index: u32,
    pub exclusive: bool,
    pub shared_declared: u64,
    pub shared_jobs: u32,
    /// The containers of Gantry's jobs on it, each with its declared memory (`None`: the whole GPU).
    /// They are reported as the GPU's processes, as NVML reports a real job's, so their memory is
    /// known to be Gantry's (not used outside Gantry).
    pub containers: Vec<(String, Option<u64>)>,
}

pub trait GpuBackend: Send {
    fn kind(&self) -> BackendKind;
    /// One reading of every GPU, in index order.
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError>;
    /// Tell the backend what Gantry runs (only the simulated backend uses it).
    fn set_load(&mut self, _load: &[SimLoad]) {}
    /// The NUMA node of each GPU (by index) that the machine says it is attached to; simulated GPUs
    /// have none.
    fn numa_nodes(&mut self) -> Vec<(u32, u32)> {
        vec![]
    }
}

/// The NUMA node of a PCI device from sysfs, by NVML's bus id (`00000000:3B:00.0`); `None` where the
/// machine does not say (`-1`, one node).
pub fn numa_node_of(bus_id: &str) -> Option<u32> {
    let id = bus_id.trim().to_ascii_lowercase();
    // NVML pads the PCI domain to 8 digits, sysfs to 4.
    let id = if id.len() == 16 && id.starts_with("0000") {
        id[4..].to_string()
    } else {
        id
    };
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/bus/pci/devices/{id}/numa_node"))
        .ok()?
        .trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// Simulated GPUs: `sim:4x24GiB`, or a mixed machine `sim:2xA100-40GiB+2xH100-80GiB`.
pub struct SimulatedBackend {
    /// (UUID, name, memory) per GPU.
    gpus: Vec<(String, String, u64)>,
    load: Vec<SimLoad>,
    tick: u64,
}

impl SimulatedBackend {
    pub fn new(count: u32, memory: u64) -> Self {
        Self::on_machine(&[(count, None, memory)], 0)
    }
    /// Simulated GPUs of one (simulated) machine: engines given the same `machine` see the same UUIDs,
    /// as engines on one real machine see the same GPUs.
    fn on_machine(groups: &[(u32, Option<String>, u64)], machine: u16) -> Self {
        let gpus = groups
            .iter()
            .flat_map(|(n, ty, mem)| {
                (0..*n).map(move |_| (format!("Simulated {}", ty.as_deref().unwrap_or("GPU")), *mem))
            })
            .enumerate()
            .map(|(i, (name, mem))| (format!("GPU-5160a7ed-{machine:04x}-4000-8000-{i:012x}"), name, mem))
            .collect();
        SimulatedBackend {
            gpus,
            load: vec![],
            tick: 0,
        }
    }
    /// (GPU count, memory of the first GPU).
    pub fn shape(&self) -> (u32, u64) {
        (self.gpus.len() as u32, self.gpus.first().map(|g| g.2).unwrap_or(0))
    }
    /// Parse `sim:4x24GiB` (or `4x24GiB`); groups of named cards joined by `+`
    /// (`sim:2xA100-40GiB+2xH100-80GiB`, named "Simulated A100"); `…@name` simulates another
    /// machine's GPUs (tests run many engines side by side, each on its own simulated machine).
    pub fn from_spec(s: &str) -> Result<Self, GpuError> {
        let bad = || GpuError::BadSimSpec(s.into());
        let body = s.strip_prefix("sim:").unwrap_or(s);
        let (body, machine) = match body.split_once('@') {
            Some((b, name)) => (
                b,
                name.bytes()
                    .fold(0u16, |h, c| h.wrapping_mul(31).wrapping_add(c as u16))
                    .max(1),
            ),
            None => (body, 0),
        };
        let mut groups = vec![];
        for g in body.split('+') {
            let (n, rest) = g.split_once(['x', 'X']).ok_or_else(bad)?;
            let n: u32 = n.trim().parse().map_err(|_| bad())?;
            let (ty, mem) = match rest.rsplit_once('-') {
                Some((ty, mem)) => (Some(ty.trim().to_string()), mem),
                None => (None, rest),
            };
            if ty
                .as_ref()
                .is_some_and(|t| t.is_empty() || !t.chars().all(|c| c.is_ascii_alphanumeric() || " ._".contains(c)))
            {
                return Err(bad());
            }
            let mem = crate::units::parse_bytes(mem).filter(|m| *m > 0).ok_or_else(bad)?;
            if n == 0 {
                return Err(bad());
            }
            groups.push((n, ty, mem));
        }
        if groups.iter().map(|g| g.0 as u64).sum::<u64>() > 64 {
            return Err(bad());
        }
        Ok(Self::on_machine(&groups, machine))
    }
}

impl GpuBackend for SimulatedBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Simulated
    }
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError> {
        self.tick += 1;
        Ok(self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, (uuid, name, total))| {
                let l = self
                    .load
                    .iter()
                    .find(|l| l.index == i as u32)
                    .cloned()
                    .unwrap_or_default();
                // Deterministic wobble so charts look alive without randomness.
                let wobble = ((self.tick * 7 + i as u64 * 13) % 11) as u32;
                let util = if l.exclusive {
                    88 + wobble
                } else if l.shared_jobs > 0 {
                    (35 * l.shared_jobs + wobble).min(100)
                } else {
                    0
                };
                // A job with a whole GPU uses most of it; a shared one what it declared.
                let processes: Vec<GpuProcess> = l
                    .containers
                    .iter()
                    .map(|(cid, declared)| GpuProcess {
                        pid: 0,
                        used_memory: Some(declared.unwrap_or(total * 7 / 10)),
                        container_id: Some(cid.clone()),
                        uid: None,
                        command: None,
                    })
                    .collect();
                let used = processes.iter().filter_map(|p| p.used_memory).sum::<u64>().min(*total);
                GpuSample {
                    index: i as u32,
                    uuid: uuid.clone(),
                    name: name.clone(),
                    memory_total: *total,
                    memory_used: used,
                    utilization: util.min(100),
                    temperature_c: Some(35 + util / 2),
                    power_w: Some(60.0 + util as f64 * 2.5),
                    processes,
                    mig_parent: None,
                    links: vec![],
                }
            })
            .collect())
    }
    fn set_load(&mut self, load: &[SimLoad]) {
        self.load = load.to_vec();
    }
}

/// Names the NVML library to load instead of the driver's `libnvidia-ml.so.1` (e.g. the fake NVML of
/// `tests/fake-nvml`). `gantry gpus` and `gantry status` then name the library, so a test double is
/// never mistaken for the driver.
pub const NVML_LIB_ENV: &str = "GANTRY_NVML_LIB";

/// Real GPUs through NVML. One handle for the process lifetime.
pub struct NvmlBackend {
    nvml: nvml_wrapper::Nvml,
    /// Links between GPUs by UUID pair: the topology does not change while the machine runs, and
    /// asking costs two NVML calls per pair.
    links: std::collections::HashMap<(String, String), Option<Link>>,
}

impl NvmlBackend {
    /// Load the driver's NVML, or the library at `lib`.
    pub fn new(lib: Option<&std::path::Path>) -> Result<Self, GpuError> {
        let nvml = match lib {
            Some(p) => nvml_wrapper::Nvml::builder().lib_path(p.as_os_str()).init(),
            None => nvml_wrapper::Nvml::init(),
        }
        .map_err(|e| GpuError::Nvml(init_error(lib.is_none(), &e)))?;
        let n = nvml.device_count().map_err(|e| GpuError::Nvml(e.to_string()))?;
        if n == 0 {
            return Err(GpuError::Nvml("the driver reports no GPUs".into()));
        }
        Ok(NvmlBackend {
            nvml,
            links: Default::default(),
        })
    }
}

/// Why NVML did not start, in words: a machine without NVIDIA's driver is the common case, and
/// libloading's "cannot open shared object file" means nothing to a researcher.
fn init_error(drivers_library: bool, e: &nvml_wrapper::error::NvmlError) -> String {
    let raw = e.to_string();
    match e {
        nvml_wrapper::error::NvmlError::LibloadingError(_) if drivers_library && raw.contains("No such file") => {
            "no NVIDIA driver found (libnvidia-ml.so.1 missing)".into()
        }
        _ => raw,
    }
}

/// One NVML device (a GPU or a MIG instance) as a sample.
fn read_device(
    d: &nvml_wrapper::Device,
    index: u32,
    name: String,
    mig_parent: Option<MigParent>,
) -> Result<GpuSample, GpuError> {
    use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let e = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
    let mem = d.memory_info().map_err(e)?;
    let processes = d
        .running_compute_processes()
        .unwrap_or_default()
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            used_memory: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
            container_id: container_of_pid(p.pid),
            uid: uid_of_pid(p.pid),
            command: command_of_pid(p.pid),
        })
        .collect();
    Ok(GpuSample {
        index,
        uuid: d.uuid().map_err(e)?,
        name,
        memory_total: mem.total,
        memory_used: mem.used,
        // MIG instances report no utilization, temperature or power of their own.
        utilization: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
        temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
        power_w: d.power_usage().ok().map(|mw| mw as f64 / 1000.0),
        processes,
        mig_parent,
        links: vec![],
    })
}

/// The MIG instances of a GPU in MIG mode (`None`: MIG is off or unsupported, the GPU itself is
/// the device jobs get).
fn mig_instances<'n>(d: &nvml_wrapper::Device<'n>) -> Option<Vec<nvml_wrapper::Device<'n>>> {
    let mode = d.mig_mode().ok()?;
    if mode.current != 1 {
        return None; // NVML_DEVICE_MIG_ENABLE
    }
    let max = d.mig_device_count().unwrap_or(0);
    // Slots without an instance answer "not found".
    Some((0..max).filter_map(|k| d.mig_device_by_index(k).ok()).collect())
}

/// How NVML says two GPUs connect: NVLink when peer-to-peer over NVLink works, else their closest
/// common PCIe ancestor. `None`: the driver does not say.
fn link_between(a: &nvml_wrapper::Device, b: nvml_wrapper::Device) -> Option<Link> {
    use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
    if matches!(a.p2p_status(&b, P2pCapabilitiesIndex::NvLink), Ok(P2pStatus::Ok)) {
        return Some(Link::Nvlink);
    }
    Some(match a.topology_common_ancestor(b).ok()? {
        TopologyLevel::Internal => Link::SameBoard,
        TopologyLevel::Single => Link::PcieSwitch,
        TopologyLevel::Multiple => Link::PcieSwitches,
        TopologyLevel::HostBridge => Link::HostBridge,
        TopologyLevel::Node => Link::NumaNode,
        TopologyLevel::System => Link::System,
    })
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nvml
    }
    /// From each physical GPU's PCI bus id; MIG instances are on their GPU's node.
    fn numa_nodes(&mut self) -> Vec<(u32, u32)> {
        let node_of = |i: u32| {
            self.nvml
                .device_by_index(i)
                .ok()?
                .pci_info()
                .ok()
                .and_then(|p| numa_node_of(&p.bus_id))
        };
        let physical: Vec<(u32, Option<u32>)> = (0..self.nvml.device_count().unwrap_or(0))
            .map(|i| (i, node_of(i)))
            .collect();
        let Ok(samples) = self.sample() else { return vec![] };
        samples
            .iter()
            .filter_map(|g| {
                let i = g.mig_parent.as_ref().map_or(g.index, |p| p.index);
                let node = physical.iter().find(|p| p.0 == i)?.1?;
                Some((g.index, node))
            })
            .collect()
    }
    /// Physical GPUs keep their NVML index; a GPU in MIG mode is replaced by its MIG instances,
    /// numbered after the physical GPUs (so `gpus = [0, 1]` in the lab config and `--gpus device=1`
    /// still mean what `nvidia-smi` shows).
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError> {
        let e = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
        let nvml = &self.nvml;
        let n = nvml.device_count().map_err(e)?;
        let mut out = Vec::with_capacity(n as usize);
        let mut next_mig = n;
        let mut whole: Vec<u32> = vec![];
        for i in 0..n {
            let d = nvml.device_by_index(i).map_err(e)?;
            let name = d.name().unwrap_or_else(|_| "NVIDIA GPU".into());
            match mig_instances(&d) {
                Some(migs) => {
                    let parent = MigParent {
                        index: i,
                        uuid: d.uuid().map_err(e)?,
                        name,
                    };
                    for (k, m) in migs.iter().enumerate() {
                        let name = m.name().unwrap_or_else(|_| format!("{} MIG {k}", parent.name));
                        out.push(read_device(m, next_mig, name, Some(parent.clone()))?);
                        next_mig += 1;
                    }
                }
                None => {
                    out.push(read_device(&d, i, name, None)?);
                    whole.push(i);
                }
            }
        }
        // Topology between whole GPUs (MIG instances share their parent's links, and jobs do not
        // span them).
        let cache = &mut self.links;
        for (x, &i) in whole.iter().enumerate() {
            for &j in &whole[x + 1..] {
                let ui = out
                    .iter()
                    .find(|g| g.index == i)
                    .map(|g| g.uuid.clone())
                    .unwrap_or_default();
                let uj = out
                    .iter()
                    .find(|g| g.index == j)
                    .map(|g| g.uuid.clone())
                    .unwrap_or_default();
                let link = *cache.entry((ui, uj)).or_insert_with(|| {
                    let (a, b) = (nvml.device_by_index(i), nvml.device_by_index(j));
                    a.ok().zip(b.ok()).and_then(|(a, b)| link_between(&a, b))
                });
                if let Some(link) = link {
                    for (g, peer) in [(i, j), (j, i)] {
                        if let Some(s) = out.iter_mut().find(|s| s.index == g) {
                            s.links.push(GpuLink { peer, link });
                        }
                    }
                }
            }
        }
        out.sort_by_key(|g| g.index);
        Ok(out)
    }
}

/// Map a host PID to its Docker container id through /proc/PID/cgroup.
pub fn container_of_pid(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    container_id_from_cgroup(&text)
}

/// The owner of a host PID.
pub fn uid_of_pid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// A host PID's command line, arguments joined by spaces (kernel threads and zombies have none).
pub fn command_of_pid(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let line = args.join(" ");
    (!line.is_empty()).then(|| line.chars().take(COMMAND_MAX).collect())
}

/// Find a 64-hex container id in cgroup text (cgroup v1 `/docker/<id>`, v2 `docker-<id>.scope`).
pub fn container_id_from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        let path = line.rsplit(':').next().unwrap_or("");
        for part in path.split('/').rev() {
            let part = part.trim_start_matches("docker-").trim_end_matches(".scope");
            if part.len() == 64 && part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Some(part.to_string());
            }
        }
    }
    None
}

/// The backend [`open`] chose.
pub struct Opened {
    pub backend: Box<dyn GpuBackend>,
    /// Why NVML is not used, when it is not.
    pub note: Option<String>,
    /// The NVML library loaded instead of the driver's, from [`NVML_LIB_ENV`].
    pub library: Option<String>,
}

/// Open the backend: `sim:NxMEM` forces simulated GPUs; otherwise NVML when it loads, else a
/// simulated default (with the reason NVML was not used). A library named by [`NVML_LIB_ENV`] must
/// load: the admin asked for it, so falling back to simulated GPUs would hide the mistake.
pub fn open(forced: Option<&str>) -> Result<Opened, GpuError> {
    if let Some(s) = forced {
        return Ok(Opened {
            backend: Box::new(SimulatedBackend::from_spec(s)?),
            note: None,
            library: None,
        });
    }
    if let Some(lib) = std::env::var_os(NVML_LIB_ENV).filter(|l| !l.is_empty()) {
        let path = std::path::PathBuf::from(lib);
        let b = NvmlBackend::new(Some(&path)).map_err(|e| {
            GpuError::Nvml(format!(
                "{e} (loading {} named by {NVML_LIB_ENV}; unset it to use the driver's library)",
                path.display()
            ))
        })?;
        return Ok(Opened {
            backend: Box::new(b),
            note: None,
            library: Some(path.display().to_string()),
        });
    }
    match NvmlBackend::new(None) {
        Ok(b) => Ok(Opened {
            backend: Box::new(b),
            note: None,
            library: None,
        }),
        Err(e) => {
            let why = match e {
                GpuError::Nvml(why) => why,
                e => e.to_string(),
            };
            Ok(Opened {
                backend: Box::new(SimulatedBackend::new(2, 24 << 30)),
                note: Some(why),
                library: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_spec() {
        let mut b = SimulatedBackend::from_spec("sim:4x24GiB").unwrap();
        let s = b.sample().unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[3].memory_total, 24 << 30);
        assert_ne!(s[0].uuid, s[1].uuid);
        assert!(SimulatedBackend::from_spec("sim:0x1GiB").is_err());
        assert!(SimulatedBackend::from_spec("sim:four").is_err());
        let uuids = |spec: &str| {
            SimulatedBackend::from_spec(spec)
                .unwrap()
                .sample()
                .unwrap()
                .into_iter()
                .map(|g| g.uuid)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            uuids("sim:2x1GiB@lab"),
            uuids("sim:2x1GiB@lab"),
            "one machine, the same GPUs"
        );
        assert_ne!(uuids("sim:2x1GiB@lab"), uuids("sim:2x1GiB@other"));
        assert_eq!(uuids("sim:2x1GiB"), uuids("2x1GiB"));
    }

    #[test]
    fn sim_spec_mixed_cards() {
        let s = SimulatedBackend::from_spec("sim:2xA100-40GiB+1xH100-80GiB@lab")
            .unwrap()
            .sample()
            .unwrap();
        let got: Vec<(u32, &str, u64)> = s.iter().map(|g| (g.index, g.name.as_str(), g.memory_total)).collect();
        assert_eq!(
            got,
            vec![
                (0, "Simulated A100", 40 << 30),
                (1, "Simulated A100", 40 << 30),
                (2, "Simulated H100", 80 << 30)
            ]
        );
        assert_eq!(
            SimulatedBackend::from_spec("sim:2x24GiB").unwrap().sample().unwrap()[1].name,
            "Simulated GPU"
        );
        // The first GPUs keep the UUIDs of the plain spec.
        assert_eq!(
            s[0].uuid,
            SimulatedBackend::from_spec("sim:1x1GiB@lab").unwrap().sample().unwrap()[0].uuid
        );
        for bad in [
            "sim:2xA100-40GiB+",
            "sim:2x-40GiB",
            "sim:2xA100-",
            "sim:40x1GiB+30x1GiB",
            "sim:1xA$-1GiB",
        ] {
            assert!(SimulatedBackend::from_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sim_reflects_load() {
        let mut b = SimulatedBackend::new(2, 24 << 30);
        b.set_load(&[SimLoad {
            index: 1,
            exclusive: true,
            ..Default::default()
        }]);
        let s = b.sample().unwrap();
        assert_eq!(s[0].utilization, 0);
        assert!(s[1].utilization >= 88);
        // Gantry's jobs are the GPU's processes, in their containers, with their memory.
        let c = |n: char| n.to_string().repeat(64);
        b.set_load(&[
            SimLoad {
                index: 0,
                shared_jobs: 2,
                shared_declared: 16 << 30,
                containers: vec![(c('a'), Some(8 << 30)), (c('b'), Some(8 << 30))],
                ..Default::default()
            },
            SimLoad {
                index: 1,
                exclusive: true,
                containers: vec![(c('c'), None)],
                ..Default::default()
            },
        ]);
        let s = b.sample().unwrap();
        assert_eq!(s[0].memory_used, 16 << 30);
        let procs: Vec<(Option<&str>, Option<u64>)> = s[0]
            .processes
            .iter()
            .map(|p| (p.container_id.as_deref(), p.used_memory))
            .collect();
        assert_eq!(
            procs,
            vec![
                (Some(c('a').as_str()), Some(8 << 30)),
                (Some(c('b').as_str()), Some(8 << 30))
            ]
        );
        assert_eq!(
            (s[1].memory_used, s[1].processes[0].used_memory),
            ((24u64 << 30) * 7 / 10, Some((24u64 << 30) * 7 / 10))
        );
    }

    #[test]
    fn numa_nodes_of_devices_that_are_not_there_are_unknown() {
        assert_eq!(numa_node_of("00000000:FF:1F.7"), None);
        assert_eq!(numa_node_of("../../../etc/passwd"), None);
        assert!(
            SimulatedBackend::new(2, 1 << 30).numa_nodes().is_empty(),
            "simulated GPUs have no NUMA node"
        );
        // A device this machine has (the host bridge), as NVML would name it.
        if std::path::Path::new("/sys/bus/pci/devices/0000:00:00.0/numa_node").exists() {
            let raw: i64 = std::fs::read_to_string("/sys/bus/pci/devices/0000:00:00.0/numa_node")
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert_eq!(numa_node_of("00000000:00:00.0"), u32::try_from(raw).ok());
        }
    }

    #[test]
    fn cgroup_parsing() {
        let id = "a".repeat(64);
        assert_eq!(
            container_id_from_cgroup(&format!("0::/system.slice/docker-{id}.scope\n")),
            Some(id.clone())
        );
        assert_eq!(container_id_from_cgroup(&format!("12:memory:/docker/{id}\n")), Some(id));
        assert_eq!(container_id_from_cgroup("0::/user.slice/session-1.scope\n"), None);
    }

    #[test]
    fn nvml_absent_falls_back_to_simulated_with_reason() {
        // These machines have no NVIDIA driver; a GPU host would load NVML instead.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return;
        }
        if std::env::var_os(NVML_LIB_ENV).is_some() {
            return;
        }
        let o = open(None).unwrap();
        assert_eq!(o.backend.kind(), BackendKind::Simulated);
        assert_eq!(
            o.note.as_deref(),
            Some("no NVIDIA driver found (libnvidia-ml.so.1 missing)")
        );
    }
}
