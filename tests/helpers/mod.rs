//! Test helpers: start real engines in temp dirs and drive them through the real CLI.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use serde_json::Value;

mod faults;
mod nvml;
mod users;
#[allow(unused_imports)]
pub use faults::*;
#[allow(unused_imports)]
pub use nvml::*;
#[allow(unused_imports)]
pub use users::*;

pub const IMAGE: &str = "gantry-test/busybox:1";
const WAIT: Duration = Duration::from_secs(90);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gantry")
}

/// Build the tiny test image from the host's static busybox if it is missing.
pub fn ensure_image() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let have = Command::new("docker")
            .args(["image", "inspect", IMAGE])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if have.map(|s| s.success()).unwrap_or(false) {
            return;
        }
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -e; r=$(mktemp -d); mkdir -p $r/bin $r/tmp; cp /bin/busybox $r/bin/busybox; \
                 for c in sh echo env sleep cat id grep true false ls; do ln -s busybox $r/bin/$c; done; \
                 tar -C $r -c . | docker import - {IMAGE} >/dev/null; rm -rf $r"
            ))
            .status()
            .expect("run sh");
        assert!(
            status.success(),
            "could not build {IMAGE}: is Docker running and busybox-static installed?"
        );
    });
}

pub fn gantry_in(state: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .output()
        .expect("run gantry")
}

/// A lab config in which CPU-only jobs get no CPU/RAM share (see [`Engine::start_unbounded_cpu_only`]).
pub const UNBOUNDED_CPU_ONLY: &str = "[containers]\ncpu_only_cpus = \"none\"\ncpu_only_memory = \"none\"\n";

pub struct Engine {
    _dir: tempfile::TempDir,
    pub state: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    pub engine_id: String,
    /// Extra environment for the daemon (e.g. `DOCKER_HOST`).
    pub env: Vec<(String, String)>,
}

impl Engine {
    /// Start `gantry daemon` with 2 simulated 24 GiB GPUs unless `extra` says otherwise.
    pub fn start(extra: &[&str]) -> Engine {
        let mut e = Engine::stopped(extra);
        e.restart();
        e
    }

    /// Like [`Engine::start`], with a lab config file of this text (written beside the state).
    pub fn start_with_lab(lab: &str, extra: &[&str]) -> Engine {
        let mut e = Engine::stopped(extra);
        let path = e._dir.path().join("lab-config.toml");
        std::fs::write(&path, lab).unwrap();
        e.args.extend(["--config".into(), path.display().to_string()]);
        e.restart();
        e
    }

    /// Like [`Engine::start`], where CPU-only jobs get no CPU/RAM share (`"none"`: unlimited and not
    /// counted), for tests that run several at once: by default they hold one share together and a
    /// free GPU's share is never theirs, so with default limits they run one at a time.
    pub fn start_unbounded_cpu_only(extra: &[&str]) -> Engine {
        Engine::start_with_lab(UNBOUNDED_CPU_ONLY, extra)
    }

    /// Like [`Engine::start`], with simulated GPUs as a user writes them (`sim:1x24GiB`, no `@machine`).
    pub fn start_unnamed(extra: &[&str]) -> Engine {
        let mut e = Engine::stopped(extra);
        for a in e.args.iter_mut().filter(|a| a.starts_with("sim:")) {
            if let Some((spec, _)) = a.split_once('@') {
                *a = spec.to_string();
            }
        }
        e.restart();
        e
    }

    /// Like [`Engine::start`], but not started yet: set `state` or `env`, then call `restart`.
    pub fn stopped(extra: &[&str]) -> Engine {
        ensure_image();
        let dir = tempfile::Builder::new().prefix("gantry-test-").tempdir().unwrap();
        // Other test users (setpriv) must reach the socket inside.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let state = dir.path().join("state");
        let mut args: Vec<String> = vec![
            "daemon".into(),
            "--stop-grace".into(),
            "2s".into(),
            "--retry-backoff".into(),
            "1s".into(),
        ];
        if !extra.contains(&"--gpus") {
            args.extend(["--gpus".into(), "sim:2x24GiB".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        // Engines now treat each other's GPU containers as busy (one machine): give each test engine its
        // own simulated machine unless the test names one (`sim:2x24GiB@shared`).
        let machine = dir.path().file_name().unwrap().to_string_lossy().into_owned();
        for a in args.iter_mut().filter(|a| a.starts_with("sim:") && !a.contains('@')) {
            a.push_str(&format!("@{machine}"));
        }
        Engine {
            _dir: dir,
            state,
            args,
            child: None,
            engine_id: String::new(),
            env: vec![],
        }
    }

    /// `gantry daemon --system` with its `/var/lib/gantry` and `/run/gantry` under the temp dir.
    pub fn system() -> Engine {
        Engine::system_with(&[])
    }

    /// [`Engine::system`] with more daemon arguments (e.g. `--gpus sim:2x24GiB@shared`).
    pub fn system_with(extra: &[&str]) -> Engine {
        let mut e = Engine::stopped(&[&["--system"], extra].concat());
        let root = e._dir.path().to_path_buf();
        e.state = root.join("var/lib/gantry");
        e.env.push(("GANTRY_SYSTEM_ROOT".into(), root.display().to_string()));
        e.restart();
        e
    }

    /// The system engine's `/` (see [`Engine::system`]): its `etc/gantry/templates` holds lab templates.
    pub fn system_root(&self) -> &Path {
        self._dir.path()
    }

    /// The system engine's socket (see [`Engine::system`]).
    pub fn system_socket(&self) -> PathBuf {
        self._dir.path().join("run/gantry/gantry.sock")
    }

    pub fn restart(&mut self) {
        // A second daemon beside a live one fails on the engine lock, and the test would go on
        // against the first: a restart that tests nothing. Stop it first.
        if let Some(c) = self.child.as_mut() {
            assert!(
                c.try_wait().unwrap().is_some(),
                "restart() while the engine still runs: kill9() it (or signal it and let it exit) first"
            );
        }
        let system = self.args.iter().any(|a| a == "--system");
        if !system {
            std::fs::create_dir_all(&self.state).unwrap();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.daemon_log_path())
            .unwrap();
        let child = Command::new(bin())
            .args(if system {
                vec![]
            } else {
                vec!["--state-dir".into(), self.state.clone()]
            })
            .args(&self.args)
            .envs(self.env.iter().cloned())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start gantry daemon");
        self.child = Some(child);
        let t = Instant::now();
        loop {
            let out = match system {
                true => Command::new(bin())
                    .args(["status", "--json"])
                    .env("GANTRY_SYSTEM_SOCKET", self.system_socket())
                    .env_remove("GANTRY_STATE_DIR")
                    .output()
                    .unwrap(),
                false => gantry_in(&self.state, &["status", "--json"]),
            };
            if out.status.success() && self.inbox().join("accepted").exists() {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                self.engine_id = v["engine_id"].as_str().unwrap().to_string();
                // Let the drop-folder watcher finish its start-up scan.
                std::thread::sleep(Duration::from_millis(200));
                return;
            }
            assert!(t.elapsed() < WAIT, "engine did not come up: {}", self.daemon_log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Outside the state dir, so a full state disk does not swallow the engine's own log.
    fn daemon_log_path(&self) -> PathBuf {
        self._dir.path().join("daemon.log")
    }

    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.daemon_log_path()).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap(); // SIGKILL
            c.wait().unwrap();
        }
    }

    /// The drop folder: `--inbox` when given, else `STATE/inbox`.
    pub fn inbox(&self) -> PathBuf {
        self.args
            .iter()
            .position(|a| a == "--inbox")
            .map(|i| PathBuf::from(&self.args[i + 1]))
            .unwrap_or_else(|| self.state.join("inbox"))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("engine running").id()
    }

    pub fn gantry(&self, args: &[&str]) -> Output {
        match self.args.iter().any(|a| a == "--system") {
            true => Command::new(bin())
                .env("GANTRY_SYSTEM_SOCKET", self.system_socket())
                .env_remove("GANTRY_STATE_DIR")
                .args(args)
                .output()
                .expect("run gantry"),
            false => gantry_in(&self.state, args),
        }
    }

    /// Run the CLI as another user (uid = gid).
    pub fn gantry_as(&self, uid: u32, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
            ])
            .arg(bin())
            .arg("--state-dir")
            .arg(&self.state)
            .args(args)
            .output()
            .expect("run setpriv")
    }

    /// Run the CLI as a real user (their uid, gid and supplementary groups).
    pub fn gantry_user(&self, u: &User, args: &[&str]) -> Output {
        u.command(bin())
            .arg("--state-dir")
            .arg(&self.state)
            .args(args)
            .current_dir("/")
            .output()
            .expect("run setpriv")
    }

    /// `gantry --json ARGS` as a user; panics unless it succeeds.
    pub fn json_as(&self, u: &User, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.gantry_user(u, &a);
        assert!(
            out.status.success(),
            "gantry {args:?} as {} failed: {}\n{}",
            u.name,
            String::from_utf8_lossy(&out.stderr),
            self.daemon_log()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.gantry(&a);
        assert!(
            out.status.success(),
            "gantry {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.daemon_log()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn write_spec(&self, name: &str, text: &str) -> PathBuf {
        let p = self._dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        p
    }

    pub fn submit_yaml(&self, name: &str, text: &str) -> i64 {
        let f = self.write_spec(&format!("{name}.yaml"), text);
        let v = self.json(&["submit", f.to_str().unwrap()]);
        v[0]["job_id"].as_i64().unwrap_or_else(|| panic!("submit failed: {v}"))
    }

    /// Drop a file the way users do: write elsewhere, then rename into the inbox.
    pub fn drop_file(&self, name: &str, text: &str) {
        self.drop_bytes(name, text.as_bytes())
    }

    pub fn drop_bytes(&self, name: &str, body: &[u8]) {
        let tmp = self._dir.path().join(format!("staging-{}", name.replace('/', "_")));
        std::fs::write(&tmp, body).unwrap();
        std::fs::rename(&tmp, self.inbox().join(name)).unwrap();
    }

    pub fn wait_until(&self, what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(
                t.elapsed() < WAIT,
                "timed out waiting for {what}\n{}",
                self.daemon_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn show(&self, id: i64) -> Value {
        self.json(&["show", &id.to_string()])
    }

    pub fn wait_state(&self, id: i64, state: &str) -> Value {
        let mut last = Value::Null;
        self.wait_until(&format!("job {id} to be {state}"), || {
            last = self.show(id);
            last["job"]["state"] == state
        });
        last
    }

    pub fn wait_final(&self, id: i64) -> Value {
        let mut last = Value::Null;
        self.wait_until(&format!("job {id} to end"), || {
            last = self.show(id);
            ["succeeded", "failed", "cancelled", "timed_out"].contains(&last["job"]["state"].as_str().unwrap_or(""))
                && last["attempts"]
                    .as_array()
                    .map(|a| a.iter().all(|a| !a["ended_at"].is_null()))
                    .unwrap_or(true)
        });
        last
    }

    pub fn logs(&self, id: i64) -> String {
        String::from_utf8_lossy(&self.gantry(&["logs", &id.to_string()]).stdout).into_owned()
    }

    /// Wait for a file in `inbox/<sub>` whose name ends with `suffix`; returns its name.
    pub fn wait_for_file(&self, sub: &str, suffix: &str) -> String {
        let dir = self.inbox().join(sub);
        let mut found = String::new();
        self.wait_until(&format!("a file *{suffix} in {}", dir.display()), || {
            found = std::fs::read_dir(&dir)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .find(|n| n.ends_with(suffix))
                        .unwrap_or_default()
                })
                .unwrap_or_default();
            !found.is_empty()
        });
        found
    }

    pub fn wait_for_rejection(&self, name: &str) -> String {
        self.wait_for_file("rejected", &format!("{name}.error.txt"));
        std::fs::read_to_string(self.inbox().join("rejected").join(format!("{name}.error.txt"))).unwrap()
    }

    pub fn our_containers(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=dev.gantry.engine={}", self.engine_id),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
        let ids = self.our_containers();
        if !ids.is_empty() {
            let _ = Command::new("docker").args(["rm", "-f"]).args(&ids).output();
        }
        // Pinned mounts a stopped engine left (a job still ran): unmount them before the temp dir is
        // deleted, or its removal would reach into the users' mounted folders.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "grep -o ' {0}/mnt/[^ ]*' /proc/self/mountinfo | xargs -r -n1 umount -l",
                self.state.display()
            ))
            .output();
    }
}
