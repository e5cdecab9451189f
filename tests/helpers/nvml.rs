//! Engines on the real NVML backend without a GPU: the fake `libnvidia-ml.so.1` of `tests/fake-nvml`
//! (built here once with make) reads its GPUs and their processes from a JSON file per test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::{bin, Engine, IMAGE};

/// The fake library, built once per test run into the target dir the tests were built in.
pub fn fake_nvml_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        // target/debug/gantry -> target
        let target = Path::new(bin())
            .parent()
            .and_then(Path::parent)
            .expect("the gantry binary lives in <target>/<profile>/");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml");
        let out = Command::new("make")
            .arg("-C")
            .arg(&dir)
            .arg(format!("TARGET_DIR={}", target.display()))
            .output()
            .expect("run make (build-essential)");
        assert!(
            out.status.success(),
            "make -C tests/fake-nvml failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("fake-nvml/libnvidia-ml.so.1")
    })
}

/// One test's GPUs, as the fake NVML reports them: `{"gpus": [...]}` in the format of
/// `tests/fake-nvml/fake_nvml.c`. Rewritten atomically, so the library never reads half a file.
///
/// An engine on NVML takes the machine-wide lock (`gantry-engine`), as on a real machine: one fake
/// machine at a time, so tests on the fake library run one after another (the guard is held until
/// the `FakeGpus` drops, after the test's engine, which is declared later).
pub struct FakeGpus {
    dir: tempfile::TempDir,
    _one_machine: std::sync::MutexGuard<'static, ()>,
}

impl FakeGpus {
    /// Empty until [`FakeGpus::set`]: the UUIDs come from [`FakeGpus::uuid`].
    pub fn new() -> FakeGpus {
        let guard = this_machines_gpus();
        let f = FakeGpus {
            dir: tempfile::Builder::new().prefix("gantry-fake-nvml-").tempdir().unwrap(),
            _one_machine: guard,
        };
        f.set(json!([]));
        f
    }
    /// A UUID for GPU `i` of this test only: engines treat GPUs that other engines' containers hold
    /// (by UUID) as busy, and tests run side by side.
    pub fn uuid(&self, i: u32) -> String {
        let tag: String = self
            .dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        format!("GPU-fake-{tag}-{i}")
    }
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("gpus.json")
    }
    pub fn set(&self, gpus: Value) {
        self.set_config(json!({ "gpus": gpus }));
    }
    /// The whole file: `gpus` and, e.g., `topology`.
    pub fn set_config(&self, config: Value) {
        let tmp = self.dir.path().join("gpus.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        std::fs::rename(&tmp, self.path()).unwrap();
    }
}

/// A fake GPU: `uuid`, `name`, memory in GiB, and processes `(pid, GiB)`.
pub fn fake_gpu(uuid: &str, name: &str, total_gib: u64, used_gib: u64, processes: &[(u32, u64)]) -> Value {
    json!({
        "uuid": uuid, "name": name, "memory_total": total_gib << 30, "memory_used": used_gib << 30,
        "utilization": 0, "temperature": 40, "power_mw": 70000,
        "processes": processes.iter().map(|(pid, gib)| json!({"pid": pid, "used_memory": gib << 30})).collect::<Vec<_>>(),
    })
}

/// GPU containers need dockerd's built-in "nvidia" device driver, which dockerd registers only if an
/// `nvidia-container-runtime-hook` was on its PATH when it started (a fake one in CI).
/// The machine's (fake) GPUs, for one test at a time: engines on the fake NVML library, and anything
/// that runs containers naming GPUs by index or `--gpus all` (the Slurm tests' jobs), which every such
/// engine rightly counts as GPUs in use outside it.
pub fn this_machines_gpus() -> std::sync::MutexGuard<'static, ()> {
    static MACHINE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MACHINE.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn require_gpu_docker() {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    let r = OK.get_or_init(|| {
        super::ensure_image();
        // By a UUID no GPU has: `--gpus all` would hold every GPU of the fake machine meanwhile.
        let out = Command::new("docker")
            .args(["run", "--rm", "--gpus", "device=GPU-gantry-test-probe", IMAGE, "true"])
            .output()
            .expect("run docker");
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "dockerd cannot start GPU containers ({}). Without a GPU, install the fake hook and restart dockerd: \
             tests/fake-nvml/install-hook.sh (scripts/docker-up.sh runs it before it starts dockerd)",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

impl Engine {
    /// An engine on the fake NVML library, through the engine's normal NVML path (`GANTRY_NVML_LIB`).
    pub fn start_nvml(gpus: &FakeGpus, extra: &[&str]) -> Engine {
        let mut e = Engine::stopped(extra);
        if let Some(i) = e.args.iter().position(|a| a == "--gpus") {
            e.args.drain(i..i + 2);
        }
        e.env
            .push(("GANTRY_NVML_LIB".into(), fake_nvml_lib().display().to_string()));
        e.env
            .push(("GANTRY_FAKE_NVML_CONFIG".into(), gpus.path().display().to_string()));
        e.restart();
        e
    }
}
