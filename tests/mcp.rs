//! Issue 31: `gantry mcp` driven by the official MCP Python SDK (tests/mcp_agent.py, in the venv of
//! scripts/mcp-venv.sh) as real users: the owner's agent session (tools, schemas, annotations, queue,
//! a finished job's log, preview then submit, cancel, triage), then another user's agent is refused
//! the owner's log, the owner's job and the owner's booking.

use crate::helpers::*;
use serde_json::Value;

/// The venv's python (made on first use).
fn python() -> String {
    let out = std::process::Command::new("scripts/mcp-venv.sh")
        .output()
        .expect("run scripts/mcp-venv.sh");
    assert!(
        out.status.success(),
        "scripts/mcp-venv.sh could not make the MCP SDK's venv (python3-venv and PyPI are needed): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Run the session script as `u`; its `RESULT {...}` line.
fn session(e: &Engine, u: &User, py: &str, script: &std::path::Path, args: &[&str]) -> Value {
    let out = u
        .command(py)
        .arg(script)
        .args(args)
        .current_dir(&u.home)
        .output()
        .expect("run the MCP session");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the MCP session as {} failed:\n{stdout}\n{}\n{}",
        u.name,
        String::from_utf8_lossy(&out.stderr),
        e.daemon_log()
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("a RESULT line");
    serde_json::from_str(line).unwrap()
}

#[test]
fn an_agent_works_through_mcp_as_its_user_and_another_users_agent_is_refused() {
    let py = python();
    let (alice, mallory) = (user("gantry-alice"), user("gantry-mallory"));
    let e = Engine::start(&[]);
    let dir = alice.private_dir("mcp");
    let script = alice.write(&dir.join("mcp_agent.py"), include_str!("mcp_agent.py"));
    let state = e.state.to_str().unwrap();
    let got = session(&e, &alice, &py, &script, &["owner", bin(), state, IMAGE]);
    assert_eq!(
        got["user"], "gantry-alice",
        "the engine saw the user who started `gantry mcp`"
    );
    let (finished, running) = (got["finished"].as_i64().unwrap(), got["running"].as_i64().unwrap());
    let booking = got["booking"].as_i64().unwrap();
    assert_eq!(e.show(finished)["job"]["owner"], "gantry-alice");

    let theirs = mallory.private_dir("mcp");
    let script = mallory.write(&theirs.join("mcp_agent.py"), include_str!("mcp_agent.py"));
    session(
        &e,
        &mallory,
        &py,
        &script,
        &[
            "intruder",
            bin(),
            state,
            &finished.to_string(),
            &running.to_string(),
            &booking.to_string(),
        ],
    );
    let theirs = e.json_as(&alice, &["bookings"]);
    assert_eq!(
        theirs["bookings"][0]["id"].as_i64(),
        Some(booking),
        "alice's booking is still there: {theirs}"
    );
    assert_eq!(theirs["bookings"][0]["state"], "booked");
    assert_eq!(e.show(running)["job"]["state"], "running", "alice's job still runs");
    assert!(e.gantry(&["cancel", &running.to_string()]).status.success());
}
