//! The engine's state on a shared machine: other users reach the socket, but cannot list the state
//! dir nor read the database (every user's specs and environment) or anyone's logs.

use crate::helpers::*;
use std::os::unix::fs::PermissionsExt;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_database_and_logs_are_private_to_the_engine_and_the_socket_stays_reachable() {
    let e = Engine::start(&[]);
    let bob = user("gantry-bob");
    let id = e.submit_yaml(
        "secret",
        &format!("image: {IMAGE}\ncommand: echo the-secret-output\nenv: {{TOKEN: hunter2}}\n"),
    );
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
    assert_eq!(mode(&e.state), 0o711, "state dir");
    assert_eq!(mode(&e.state.join("gantry.db")), 0o600, "database");
    assert_eq!(mode(&e.state.join("logs")), 0o700, "logs dir");
    let logs: Vec<_> = std::fs::read_dir(e.state.join("logs"))
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .collect();
    let log = logs
        .iter()
        .find(|p| p.to_string_lossy().ends_with(&format!("-{id}.log")))
        .expect("log named <db id>-<job id>.log");
    assert_eq!(mode(log), 0o600, "job log");
    let state = e.state.display();
    for (what, script) in [
        ("list the state dir", format!("ls {state}")),
        ("read the database", format!("cat {state}/gantry.db")),
        ("read the WAL", format!("cat {state}/gantry.db-wal")),
        ("read a log", format!("cat {}", log.display())),
    ] {
        let out = bob.sh(&script);
        assert!(
            !out.status.success(),
            "bob could {what}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
    }
    // ...but the socket works for him (his identity comes from it).
    let out = e.gantry_user(&bob, &["ls"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The engine's identity is stored in its database, not derived from where the state dir lies: after
/// the dir is moved (or Rust's hasher changes in an upgrade), running containers are still its own.
#[test]
fn a_moved_state_dir_keeps_its_engine_identity_and_reattaches() {
    let mut e = Engine::start(&[]);
    let id = e.submit_yaml(
        "long",
        &format!("image: {IMAGE}\ncommand: 'echo before; sleep 5; echo after'\n"),
    );
    e.wait_state(id, "running");
    let engine_id = e.engine_id.clone();
    e.kill9();
    let moved = e.state.with_file_name("moved-state");
    std::fs::rename(&e.state, &moved).unwrap();
    e.state = moved;
    e.restart();
    assert_eq!(e.engine_id, engine_id, "the engine id survives a move");
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    assert_eq!(j["attempts"].as_array().unwrap().len(), 1, "reattached, not run again");
    let log = e.logs(id);
    assert_eq!(
        (log.matches("before").count(), log.matches("after").count()),
        (1, 1),
        "{log}"
    );
}
