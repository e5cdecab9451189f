//! The installed package, as a lab gets it: `dpkg -i gantry_*.deb`, the engine started by the systemd
//! unit's own ExecStart line (CI has no systemd), and real users who set nothing up. Run by
//! `scripts/test-installed.sh` after installing the package (not part of `cargo test`: it needs root's
//! /usr, /etc and /run).
//!
//! The tests share the one system engine, so each holds [`machine`] for its whole run.

#[allow(dead_code)]
mod helpers;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use helpers::{add_to_group, ensure_image, user, User, IMAGE};
use serde_json::Value;

const GANTRY: &str = "/usr/bin/gantry";
const UNIT: &str = "/lib/systemd/system/gantry.service";
const CONFIG: &str = "/etc/gantry/config.toml";
const SOCKET: &str = "/run/gantry/gantry.sock";
const WAIT: Duration = Duration::from_secs(90);

/// The machine's engine, started as systemd would: the unit's ExecStart line, as root, no env.
struct Service {
    child: Option<Child>,
}

impl Service {
    fn exec_start() -> Vec<String> {
        let unit = std::fs::read_to_string(UNIT).expect("the package installs the systemd unit");
        let line = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart in the unit");
        line.split_whitespace().map(String::from).collect()
    }

    fn start(&mut self) {
        assert!(self.child.is_none());
        let argv = Service::exec_start();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path())
            .unwrap();
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("run the unit's ExecStart");
        self.child = Some(child);
        let t = Instant::now();
        while !Command::new(GANTRY)
            .arg("status")
            .env_clear()
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
        {
            assert!(t.elapsed() < WAIT, "the service did not come up:\n{}", service_log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What systemd does on stop and before an upgrade (KillMode=process): SIGTERM to the engine only.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            c.wait().unwrap();
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().expect("service running").id() as i32
    }
}

fn log_path() -> PathBuf {
    PathBuf::from(std::env::var("GANTRY_SERVICE_LOG").unwrap_or_else(|_| "/tmp/gantry-installed-service.log".into()))
}

fn service_log() -> String {
    std::fs::read_to_string(log_path()).unwrap_or_default()
}

static MACHINE: Mutex<Option<Service>> = Mutex::new(None);

/// The users, and the service running. Users join the `gantry` group (the packaged config's inbox
/// group) before the engine first starts, the way an admin sets up a lab.
fn machine() -> (MutexGuard<'static, Option<Service>>, User, User) {
    let mut g = MACHINE.lock().unwrap_or_else(|p| p.into_inner());
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    if g.is_none() {
        ensure_image();
        add_to_group(&alice, "gantry");
        let mut s = Service { child: None };
        s.start();
        *g = Some(s);
    }
    (g, alice, bob)
}

/// `gantry ARGS` as a user with nothing set up: only HOME, USER and PATH, as a login shell has.
fn as_user(u: &User, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            format!("--reuid={}", u.uid),
            format!("--regid={}", u.gid),
            "--init-groups".into(),
        ])
        .arg(GANTRY)
        .args(args)
        .env_clear()
        .env("HOME", &u.home)
        .env("USER", &u.name)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir("/")
        .output()
        .expect("run setpriv")
}

fn json_as(u: &User, args: &[&str]) -> Value {
    let mut a = vec!["--json"];
    a.extend(args);
    let out = as_user(u, &a);
    assert!(
        out.status.success(),
        "gantry {args:?} as {}: {}\n{}",
        u.name,
        String::from_utf8_lossy(&out.stderr),
        service_log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < WAIT, "timed out waiting for {what}\n{}", service_log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_final(u: &User, id: i64) -> Value {
    let mut last = Value::Null;
    wait_until(&format!("job {id} to end"), || {
        last = json_as(u, &["show", &id.to_string()]);
        ["succeeded", "failed", "cancelled", "timed_out"].contains(&last["job"]["state"].as_str().unwrap_or(""))
    });
    last
}

fn run_as(u: &User, extra: &[&str], command: &[&str]) -> i64 {
    let mut args = vec!["run", "--image", IMAGE];
    args.extend(extra);
    args.push("--");
    args.extend(command);
    json_as(u, &args)["job_id"].as_i64().expect("job id")
}

/// What the job printed (without Gantry's own `[gantry …]` lines).
fn output_as(u: &User, id: i64) -> String {
    let all = String::from_utf8_lossy(&as_user(u, &["logs", &id.to_string()]).stdout).into_owned();
    all.lines()
        .filter(|l| !l.starts_with("[gantry"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Each user's drop folder, as the packaged config places it.
fn inbox_of(u: &User) -> PathBuf {
    u.home.join("Gantry/inbox")
}

/// Write `name` with `text` into `dir` as user `u` (write elsewhere, then rename in, as editors do).
fn drop_as(u: &User, dir: &Path, name: &str, text: &str) {
    let tmp = format!("{}/.{name}.part", u.home.display());
    let out = u
        .command("sh")
        .arg("-c")
        .arg(r#"printf %s "$1" > "$2" && mv "$2" "$3""#)
        .arg("sh")
        .arg(text)
        .arg(&tmp)
        .arg(dir.join(name))
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "drop as {}: {}",
        u.name,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_user_with_no_setup_reaches_the_system_engine_and_runs_as_herself() {
    let (_m, alice, _) = machine();
    let status = json_as(&alice, &["status"]);
    assert_eq!(status["found_by"], "system", "{status}");
    assert_eq!(status["socket"], SOCKET, "{status}");
    let id = run_as(&alice, &["--gpus", "1"], &["id", "-u"]);
    let j = wait_final(&alice, id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    assert_eq!(
        output_as(&alice, id).trim(),
        alice.uid.to_string(),
        "the job runs as its submitter"
    );
}

#[test]
fn a_drop_into_your_own_inbox_runs_as_you_and_a_file_moved_in_by_someone_else_does_not() {
    let (_m, alice, bob) = machine();
    let inbox = inbox_of(&alice);
    wait_until("the engine to create alice's drop folder", || {
        inbox.join("accepted").is_dir()
    });
    let meta = std::fs::metadata(&inbox).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        alice.uid,
        "alice owns her inbox"
    );

    let name = format!("mine-{}.yaml", std::process::id());
    drop_as(
        &alice,
        &inbox,
        &name,
        &format!("image: {IMAGE}\ncommand: id -u\ngpus: 0\n"),
    );
    let mut accepted = String::new();
    wait_until("alice's file to be accepted", || {
        accepted = std::fs::read_dir(inbox.join("accepted"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.ends_with(&name))
            .unwrap_or_default();
        !accepted.is_empty()
    });
    let accepted_meta = std::fs::metadata(inbox.join("accepted").join(&accepted)).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&accepted_meta),
        alice.uid,
        "accepted files stay alice's"
    );
    let id: i64 = accepted.split('-').next().unwrap().parse().unwrap();
    let j = wait_final(&alice, id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    assert_eq!(output_as(&alice, id).trim(), alice.uid.to_string());

    // Bob's file lands in alice's inbox (a careless alice opened it to everyone; root does the move
    // here, her home being private). It must not run as alice, nor as bob, who did not submit it.
    let sneaky = format!("sneaky-{}.yaml", std::process::id());
    drop_as(
        &bob,
        &bob.home,
        &sneaky,
        &format!("image: {IMAGE}\ncommand: id -u\ngpus: 0\n"),
    );
    std::fs::rename(bob.home.join(&sneaky), inbox.join(&sneaky)).unwrap();
    // Not alice's to move: the file stays where bob put it, with the reason next to it.
    let error = inbox.join(format!("{sneaky}.error.txt"));
    wait_until("bob's file to be refused", || error.exists());
    let why = std::fs::read_to_string(&error).unwrap();
    assert!(
        why.contains("gantry-bob") || why.contains("owner"),
        "the error says whose file it is: {why}"
    );
    let queue = json_as(&alice, &["ls"]);
    let history = json_as(&alice, &["history"]);
    for row in queue.as_array().unwrap().iter().chain(history.as_array().unwrap()) {
        assert!(!row.to_string().contains("sneaky"), "bob's file became a job: {row}");
    }
    let _ = std::fs::remove_file(inbox.join(&sneaky));
    let _ = std::fs::remove_file(&error);
}

/// GPU UUIDs in each running container's NVIDIA_VISIBLE_DEVICES, by container, for these engines'
/// containers (other tests on the machine may run their own).
fn gpu_holders(engines: &[String]) -> HashMap<String, Vec<String>> {
    let mut listed = String::new();
    for e in engines {
        let ids = Command::new("docker")
            .args(["ps", "-q", "--filter", &format!("label=dev.gantry.engine={e}")])
            .output()
            .unwrap();
        listed.push_str(&String::from_utf8_lossy(&ids.stdout));
    }
    let mut out = HashMap::new();
    for id in listed.split_whitespace() {
        let env = Command::new("docker")
            .args(["inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}", id])
            .output()
            .unwrap();
        let uuids: Vec<String> = String::from_utf8_lossy(&env.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .flat_map(|v| v.split(',').map(String::from))
            .filter(|u| u.starts_with("GPU-"))
            .collect();
        out.insert(id.to_string(), uuids);
    }
    out
}

/// The installed engine's id (its containers carry it as a label; it survives restarts and upgrades).
fn service_engine(u: &User) -> String {
    json_as(u, &["status"])["engine_id"]
        .as_str()
        .expect("engine id")
        .to_string()
}

#[test]
fn with_a_second_engine_forced_up_no_gpu_is_ever_held_by_two_jobs() {
    let (_m, alice, _) = machine();
    // Someone's own engine on the same machine, as an app that started before the service was
    // installed would run it: like the service, it finds no NVIDIA driver and falls back to the
    // machine's simulated GPUs (the same ones; an explicit unnamed `--gpus sim:…` would be that
    // engine's own simulated machine, with its own UUIDs).
    let gpus = json_as(&alice, &["gpus"]);
    let n = gpus["gpus"].as_array().unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let mut other = Command::new(GANTRY)
        .args(["--state-dir", dir.path().to_str().unwrap(), "daemon"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let other_cli = |args: &[&str]| {
        Command::new(GANTRY)
            .args(["--state-dir", dir.path().to_str().unwrap(), "--json"])
            .args(args)
            .output()
            .unwrap()
    };
    wait_until("the second engine", || other_cli(&["status"]).status.success());
    let other_id = serde_json::from_slice::<Value>(&other_cli(&["status"]).stdout).unwrap()["engine_id"]
        .as_str()
        .unwrap()
        .to_string();
    let engines = [service_engine(&alice), other_id];
    let other_uuids: HashSet<String> = serde_json::from_slice::<Value>(&other_cli(&["gpus"]).stdout).unwrap()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect();
    let ours: HashSet<String> = gpus["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ours, other_uuids,
        "both engines see the same GPUs, as on one real machine"
    );

    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, format!("image: {IMAGE}\ncommand: sleep 2\ngpus: 1\n")).unwrap();
    let mut ids = Vec::new();
    for _ in 0..n + 1 {
        ids.push(run_as(&alice, &["--gpus", "1"], &["sleep", "2"]));
        assert!(other_cli(&["submit", spec.to_str().unwrap()]).status.success());
    }
    let t = Instant::now();
    let mut seen = 0;
    loop {
        let holders = gpu_holders(&engines);
        let mut by_gpu: HashMap<&str, Vec<&str>> = HashMap::new();
        for (c, uuids) in &holders {
            for u in uuids {
                by_gpu.entry(u).or_default().push(c);
            }
        }
        for (gpu, cs) in &by_gpu {
            assert!(cs.len() == 1, "GPU {gpu} held by two exclusive jobs at once: {cs:?}");
        }
        seen = seen.max(holders.len());
        let ours_done = ids
            .iter()
            .all(|id| json_as(&alice, &["show", &id.to_string()])["job"]["finished_at"].is_i64());
        let theirs: Value = serde_json::from_slice(&other_cli(&["ls"]).stdout).unwrap();
        if ours_done && theirs.as_array().unwrap().is_empty() {
            break;
        }
        assert!(t.elapsed() < WAIT * 2, "jobs did not finish\n{}", service_log());
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(seen >= 1, "some job ran");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(other.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    other.wait().unwrap();
}

/// Replace the lab config and reload the service (what `systemctl reload gantry` does).
fn set_config(service: &Service, text: &str) {
    std::fs::write(CONFIG, text).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(service.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

/// Puts the packaged config back (and reloads) however the test ends.
struct RestoreConfig(String, i32);

impl Drop for RestoreConfig {
    fn drop(&mut self) {
        std::fs::write(CONFIG, &self.0).unwrap();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.1), nix::sys::signal::Signal::SIGHUP);
    }
}

#[test]
fn lab_policy_limits_give_clear_errors_and_usage_matches_history() {
    let (m, alice, bob) = machine();
    let service = m.as_ref().unwrap();
    let old = std::fs::read_to_string(CONFIG).unwrap();
    let _restore = RestoreConfig(old.clone(), service.pid());
    let policy = format!("{old}\n").replace("[limits]\n", "[limits]\npriority = [-3, 3]\n");
    assert_ne!(policy, old, "the packaged config has a [limits] table");
    set_config(service, &policy);
    let mut refused = String::new();
    wait_until("the reloaded policy to refuse priority 5", || {
        let out = as_user(
            &bob,
            &["run", "--image", IMAGE, "--gpus", "0", "--priority", "5", "--", "true"],
        );
        refused = String::from_utf8_lossy(&out.stderr).into_owned();
        !out.status.success()
    });
    assert!(
        refused.contains("-3") && refused.contains('3'),
        "the error names the allowed range: {refused}"
    );
    let check = Command::new(GANTRY).args(["config", "check"]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));

    // A broken file is reported with its line and column, and the running policy stays.
    let broken = policy.replace("priority = [-3, 3]", "priority = [-3, 3]\nbogus = 1");
    std::fs::write(CONFIG, &broken).unwrap();
    let line = broken.lines().position(|l| l == "bogus = 1").unwrap() + 1;
    let check = Command::new(GANTRY).args(["config", "check"]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        !check.status.success() && text.contains(&format!("{CONFIG}:{line}:1")),
        "config check names the file, line and column: {text}"
    );
    set_config(service, &broken);
    let still = as_user(
        &bob,
        &["run", "--image", IMAGE, "--gpus", "0", "--priority", "5", "--", "true"],
    );
    assert!(!still.status.success(), "a broken file keeps the running policy");
    set_config(service, &old);

    // Usage: the numbers fair share acts on add up to the history's.
    let id = run_as(&bob, &["--gpus", "1"], &["sleep", "1"]);
    wait_final(&bob, id);
    let usage = json_as(&bob, &["usage", "--since", "1d"]);
    let history = json_as(&bob, &["history", "--since", "1d", "--limit", "10000"]);
    let rows = usage
        .as_array()
        .or_else(|| usage["users"].as_array())
        .expect("usage rows")
        .clone();
    let bob_row = rows
        .iter()
        .find(|r| r["user"] == bob.name)
        .unwrap_or_else(|| panic!("bob in usage: {usage}"));
    let bobs: Vec<&Value> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["owner"] == bob.name)
        .collect();
    assert_eq!(
        bob_row["jobs_finished"].as_u64().unwrap(),
        bobs.len() as u64,
        "usage counts bob's finished jobs: {usage}"
    );
    let hours: f64 = bobs
        .iter()
        .map(|r| {
            r["gpus"].as_array().unwrap().len() as f64
                * (r["finished_at"].as_i64().unwrap() - r["started_at"].as_i64().unwrap()) as f64
                / 3.6e6
        })
        .sum();
    assert!(
        (bob_row["gpu_hours"].as_f64().unwrap() - hours).abs() < 1e-6,
        "GPU-hours {hours} from history vs {usage}"
    );
    let _ = alice;
}

fn dpkg_install(deb: &str) {
    let out = Command::new("dpkg")
        .args(["-i", deb])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dpkg -i {deb}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn upgrading_the_package_while_a_job_runs_keeps_the_job_and_the_lab_config() {
    let (mut m, alice, _) = machine();
    let next = std::env::var("GANTRY_UPGRADE_DEB")
        .expect("scripts/test-installed.sh names the newer package in GANTRY_UPGRADE_DEB");
    let mut config = std::fs::read_to_string(CONFIG).unwrap();
    config.push_str("\n# edited by the lab's admin\n");
    std::fs::write(CONFIG, &config).unwrap();

    // The job runs until the test says so (a file in a folder of alice's), so a slow upgrade cannot
    // outlast it.
    let gate = alice.private_dir("upgrade");
    let mount = format!("{}:/gate", gate.display());
    let id = run_as(
        &alice,
        &["--gpus", "1", "--mount", &mount],
        &[
            "sh",
            "-c",
            "echo before; while [ ! -e /gate/go ]; do sleep 0.2; done; echo after",
        ],
    );
    wait_until("the job to run", || {
        json_as(&alice, &["show", &id.to_string()])["job"]["state"] == "running"
    });
    let before = gpu_holders(&[service_engine(&alice)]);
    assert_eq!(before.len(), 1, "{before:?}");

    let service = m.as_mut().unwrap();
    service.stop(); // prerm upgrade: systemctl stop
    dpkg_install(&next);
    service.start(); // postinst: systemctl restart
    assert_eq!(
        gpu_holders(&[service_engine(&alice)]).keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "the job's container survived the upgrade"
    );
    alice.write(&gate.join("go"), "");

    let j = wait_final(&alice, id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    assert_eq!(j["attempts"].as_array().unwrap().len(), 1, "started once: {j}");
    let logs = output_as(&alice, id);
    assert!(
        logs.contains("before") && logs.contains("after"),
        "output from both sides of the upgrade: {logs}"
    );
    assert_eq!(
        std::fs::read_to_string(CONFIG).unwrap(),
        config,
        "dpkg kept the admin's edited config"
    );
    let v = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "gantry"])
        .output()
        .unwrap();
    assert!(
        next.contains(&*String::from_utf8_lossy(&v.stdout)),
        "the new version is installed"
    );
    let _ = std::fs::remove_dir_all(&gate);
}
