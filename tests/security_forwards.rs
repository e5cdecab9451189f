//! Issue 29, hole 1 and a weak point: a `gantry open` URL is never answered by another user, also
//! while the engine is away (killed, restarting) and after the job ended; the same URL works again
//! after a restart without a new `gantry open`; another user's connect flood costs the log a line or
//! two, not a line a connection. As real users against a real root engine.

use crate::helpers::*;
use crate::sessions::{ensure_session_image, SESSION_IMAGE};

/// `curl URL` as `u` (empty when the connection is refused or closed before an answer).
fn fetch_as(u: &User, url: &str) -> String {
    let out = u
        .command("curl")
        .args(["-s", "--max-time", "10", url])
        .current_dir("/")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What happens when `u` tries to listen on `host:port`, as a squatter would.
fn bind_as(u: &User, host: &str, port: &str) -> String {
    let py = format!(
        "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         try:\n    s.bind(('{host}', {port})); s.listen(); print('BOUND')\nexcept OSError as e:\n    print(e)\n"
    );
    let out = u
        .command("/usr/bin/python3")
        .args(["-c", &py])
        .current_dir("/")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `gantry ARGS` as `u` against the system engine `e`.
fn gantry(e: &Engine, u: &User, args: &[&str]) -> std::process::Output {
    u.command(bin())
        .env("GANTRY_SYSTEM_SOCKET", e.system_socket())
        .env_remove("GANTRY_STATE_DIR")
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
}

#[test]
fn a_forwards_url_is_never_answered_by_another_user_after_a_restart_or_the_jobs_end() {
    ensure_session_image();
    let mut e = Engine::system();
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let run = gantry(
        &e,
        &alice,
        &[
            "run",
            "--json",
            "--gpus",
            "0",
            "--image",
            SESSION_IMAGE,
            "--port",
            "8080",
            "--",
            "httpd",
            "-f",
            "-p",
            "127.0.0.1:8080",
            "-h",
            "/www",
        ],
    );
    assert!(run.status.success(), "{run:?}");
    let id = serde_json::from_slice::<serde_json::Value>(&run.stdout).unwrap()["job_id"]
        .as_i64()
        .unwrap();
    e.wait_state(id, "running");
    let out = gantry(&e, &alice, &["open", &id.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let at = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let (host, port) = at.rsplit_once(':').unwrap();
    e.wait_until("alice's forward to answer her", || {
        fetch_as(&alice, &url).contains("served-by-busybox")
    });

    // bob's connect flood is refused, and logged once, not once a connection.
    let flood = bob
        .command("/usr/bin/python3")
        .args([
            "-c",
            &format!("import socket\nfor _ in range(300):\n    s = socket.create_connection(('{host}', {port})); s.recv(1); s.close()\n"),
        ])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(flood.status.success(), "{flood:?}");
    let refusals = e
        .daemon_log()
        .lines()
        .filter(|l| l.contains("refused") && l.contains(&format!("job {id}'s port")))
        .count();
    assert!(
        (1..=2).contains(&refusals),
        "{refusals} log lines for 300 refused connections"
    );

    // The engine dies (an upgrade, a crash): the job runs on, and bob cannot take the address.
    e.kill9();
    assert_eq!(fetch_as(&alice, &url), "", "nothing answers while the engine is away");
    let squat = bind_as(&bob, host, port);
    assert!(
        squat.contains("Permission denied"),
        "bob bound alice's URL while the engine was away: {squat}"
    );

    // Back: the same URL answers her again at once, without a new `gantry open`.
    e.restart();
    e.wait_until("her open tab's URL to answer again", || {
        fetch_as(&alice, &url).contains("served-by-busybox")
    });
    let again = gantry(&e, &alice, &["open", &id.to_string()]);
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), url, "{again:?}");
    assert_eq!(fetch_as(&bob, &url), "", "bob reached alice's port");

    // The job ends: the URL is refused, and still no one else may listen there.
    assert!(gantry(&e, &alice, &["cancel", &id.to_string()]).status.success());
    e.wait_final(id);
    e.wait_until("the forward to close with the job", || {
        fetch_as(&alice, &url).is_empty()
    });
    let squat = bind_as(&bob, host, port);
    assert!(
        squat.contains("Permission denied"),
        "bob bound alice's URL after her job ended: {squat}"
    );
}
