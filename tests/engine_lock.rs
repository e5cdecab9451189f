//! One non-system engine per machine's GPUs: a second `gantry daemon` (or app) on the same GPUs refuses
//! to start and names whose engine holds them, instead of double-booking the GPUs.

use crate::helpers::*;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run a daemon that should refuse to start; one that runs instead is stopped, so the test fails
/// rather than hangs.
fn refused(mut c: Command) -> Output {
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    child.wait_with_output().unwrap()
}

fn refusal(user: &str, pid: u32, socket: &std::path::Path) -> String {
    format!(
        "the Gantry engine of {user} (pid {pid}, socket {}) already manages this machine's GPUs: use it, or ask an admin to install the Gantry service",
        socket.display()
    )
}

#[test]
fn a_second_engine_on_the_same_gpus_exits_naming_the_first() {
    let machine = format!("sim:2x24GiB@lock-same-{}", std::process::id());
    let first = Engine::start(&["--gpus", &machine]);
    let other = tempfile::tempdir().unwrap();
    let out = refused({
        let mut c = Command::new(bin());
        c.arg("--state-dir")
            .arg(other.path())
            .args(["daemon", "--gpus", &machine]);
        c
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second engine must not run: {err}");
    assert!(
        err.contains(&refusal("root", first.pid(), &first.state.join("gantry.sock"))),
        "{err}"
    );
    assert!(
        !other.path().join("gantry.sock").exists(),
        "the refused engine opened no socket"
    );
    assert!(
        first.gantry(&["status"]).status.success(),
        "the first engine keeps running"
    );
}

#[test]
fn bobs_engine_is_refused_while_alices_holds_the_machine() {
    ensure_image();
    let machine = format!("sim:1x24GiB@lock-users-{}", std::process::id());
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let alice_state = alice.private_dir("lock").join("state");
    let mut alices = alice
        .command(bin())
        .arg("--state-dir")
        .arg(&alice_state)
        .args(["daemon", "--gpus", &machine])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !alice
        .command(bin())
        .arg("--state-dir")
        .arg(&alice_state)
        .arg("status")
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(t.elapsed() < Duration::from_secs(60), "alice's engine did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let bob_state = bob.private_dir("lock").join("state");
    let out = refused({
        let mut c = bob.command(bin());
        c.arg("--state-dir")
            .arg(&bob_state)
            .args(["daemon", "--gpus", &machine])
            .current_dir("/");
        c
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(alices.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = alices.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "bob's engine must not run beside alice's: {err}");
    assert!(
        err.contains(&refusal("gantry-alice", alices.id(), &alice_state.join("gantry.sock"))),
        "{err}"
    );
}
