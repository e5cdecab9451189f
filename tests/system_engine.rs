//! `gantry daemon --system`: one engine for every user, found without any configuration.

use crate::helpers::*;
use serde_json::Value;
use std::process::Output;

/// alice's CLI with no state dir of her own configured: only the (test) system socket to find.
fn alice_gantry(e: &Engine, u: &User, args: &[&str]) -> Output {
    u.command(bin())
        .env("GANTRY_SYSTEM_SOCKET", e.system_socket())
        .env_remove("GANTRY_STATE_DIR")
        .args(args)
        .current_dir("/")
        .output()
        .expect("run gantry as alice")
}

fn json(out: Output) -> Value {
    assert!(
        out.status.success(),
        "gantry failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn a_user_without_configuration_finds_the_system_engine_and_her_job_runs_as_her() {
    let e = Engine::system();
    assert!(
        e.system_socket().exists(),
        "the system socket is where clients look: {}",
        e.daemon_log()
    );
    let alice = user("gantry-alice");

    let s = json(alice_gantry(&e, &alice, &["status", "--json"]));
    assert_eq!(s["found_by"], "system", "{s}");
    assert_eq!(s["socket"], e.system_socket().display().to_string());
    assert_eq!(s["state_dir"], e.state.display().to_string());
    let human = String::from_utf8_lossy(&alice_gantry(&e, &alice, &["status"]).stdout).into_owned();
    assert!(
        human.starts_with(&format!("system engine at {}", e.system_socket().display())),
        "{human}"
    );

    let dir = alice.private_dir("system-engine");
    let spec = alice.write(
        &dir.join("whoami.yaml"),
        &format!("image: {IMAGE}\ncommand: id -u\ngpus: 1\n"),
    );
    let sub = json(alice_gantry(&e, &alice, &["--json", "submit", spec.to_str().unwrap()]));
    let id = sub[0]["job_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no job id in {sub}"));
    let ls = alice_gantry(&e, &alice, &["ls"]);
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));

    let mut last = Value::Null;
    e.wait_until(&format!("job {id} to succeed"), || {
        last = json(alice_gantry(&e, &alice, &["show", "--json", &id.to_string()]));
        last["job"]["state"] == "succeeded"
    });
    assert_eq!(last["job"]["owner_uid"], alice.uid);
    let logs = alice_gantry(&e, &alice, &["logs", &id.to_string()]);
    let logs = String::from_utf8_lossy(&logs.stdout).into_owned();
    assert!(
        logs.lines()
            .any(|l| l.split_whitespace().last() == Some(&alice.uid.to_string())),
        "the job ran as alice: {logs}"
    );
}

#[test]
fn an_explicit_state_dir_wins_over_the_system_engine() {
    let sys = Engine::system();
    let own = Engine::start(&[]);
    let alice = user("gantry-alice");
    let out = alice
        .command(bin())
        .env("GANTRY_SYSTEM_SOCKET", sys.system_socket())
        .env("GANTRY_STATE_DIR", &own.state)
        .args(["status", "--json"])
        .current_dir("/")
        .output()
        .unwrap();
    let s = json(out);
    assert_eq!(s["found_by"], "state_dir", "{s}");
    assert_eq!(s["state_dir"], own.state.display().to_string());
    assert_eq!(s["socket"], own.state.join("gantry.sock").display().to_string());
}
