//! A plain user who starts their own engine without Docker access is told why jobs wait and who can
//! fix it — not "start Docker", which they cannot do and which is not the problem.

use crate::helpers::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn an_engine_without_docker_access_says_permission_denied_and_how_to_fix_it() {
    ensure_image();
    let alice = user("gantry-alice");
    let dir = alice.private_dir("own-engine");
    let state = dir.join("state");
    let mut daemon = alice
        .command(bin())
        .arg("--state-dir")
        .arg(&state)
        .args(["daemon", "--gpus", "sim:1x24GiB"])
        .env_remove("DOCKER_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let as_alice = |args: &[&str]| {
        alice
            .command(bin())
            .arg("--state-dir")
            .arg(&state)
            .args(args)
            .output()
            .unwrap()
    };
    let t = Instant::now();
    while !as_alice(&["status"]).status.success() {
        assert!(t.elapsed() < Duration::from_secs(60), "alice's engine did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let spec = alice.write(
        &dir.join("job.yaml"),
        &format!("image: {IMAGE}\ncommand: echo hi\ngpus: 0\n"),
    );
    assert!(as_alice(&["submit", spec.to_str().unwrap()]).status.success());
    let mut reason = String::new();
    while t.elapsed() < Duration::from_secs(60) {
        let out = as_alice(&["ls", "--json"]);
        let q: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        reason = q[0]["reason"].as_str().unwrap_or("").to_string();
        if reason.contains("permission denied") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = String::from_utf8_lossy(&as_alice(&["status"]).stdout).into_owned();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
    assert!(
        reason.contains("you cannot use Docker (permission denied on /var/run/docker.sock)"),
        "queued reason: {reason:?}"
    );
    assert!(
        reason.contains("install the Gantry service") && !reason.contains("start it"),
        "{reason:?}"
    );
    assert!(status.contains("permission denied"), "{status}");
}
