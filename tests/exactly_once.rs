//! One job per submit and one start per attempt across kill -9 (issue 18, items 13 and 14). Each
//! fault is real: SIGKILL, with a proxy keeping the moment open (an answer that never reaches its
//! client; a `docker start` still in flight when the next engine looks).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;

fn jobs_named(e: &Engine, name: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = e
        .json(&["ls"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["job"]["name"] == name)
        .map(|j| j["job"]["id"].as_i64().unwrap())
        .collect();
    ids.extend(
        e.json(&["history", "--limit", "1000"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["name"] == name)
            .map(|r| r["id"].as_i64().unwrap()),
    );
    ids.sort();
    ids.dedup();
    ids
}

/// Item 13. The engine commits a submit and is killed before its answer reaches the CLI (the proxy
/// keeps the answer; the engine is killed and started again; then the CLI's connection ends). The
/// CLI sends the submit once more, with the same idempotency key, and is answered with the job
/// the first try queued: one job, the id the CLI printed.
#[test]
fn a_submit_whose_answer_died_with_the_engine_is_sent_again_and_queued_once() {
    let mut e = Engine::start(&[]);
    let proxy = ApiProxy::start(&e.state.join("gantry.sock"));
    let spec = e.write_spec(
        "once.yaml",
        &format!("name: once\nimage: {IMAGE}\ncommand: 'true'\ngpus: 0\n"),
    );
    proxy.lose_next_answer();
    let mut cli = Command::new(bin());
    cli.arg("--state-dir")
        .arg(proxy.state_dir())
        .args(["submit", "--json"])
        .arg(&spec);
    let cli = std::thread::spawn(move || cli.output().expect("run gantry"));
    e.wait_until("the engine to answer the submit (the proxy keeps the answer)", || {
        proxy.answer_lost()
    });
    e.kill9();
    e.restart();
    proxy.hang_up();
    let out = cli.join().unwrap();
    assert!(
        out.status.success(),
        "the CLI gave up: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        e.daemon_log()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v[0]["job_id"].as_i64().unwrap_or_else(|| panic!("no job id: {v}"));
    assert_eq!(
        jobs_named(&e, "once"),
        [id],
        "one job, the one the CLI was told about\n{}",
        e.daemon_log()
    );
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
}

/// `POST /v1/jobs` as `u`, straight to the socket with curl (what a hostile user can send):
/// the answer's JSON.
fn raw_submit(e: &Engine, u: &User, key: &str, text: &str) -> Value {
    let body =
        serde_json::json!({"text": text, "file_name": "k.yaml", "base_dir": null, "idempotency_key": key}).to_string();
    let sock = e.state.join("gantry.sock");
    let out = u
        .command("curl")
        .args(["-sS", "--unix-socket"])
        .arg(&sock)
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
            "http://gantry/v1/jobs",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl as {}: {}",
        u.name,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Item 13, as a hostile local user: bob sends alice's key (even with her very spec) and gets a job
/// of his own, never hers, and alice's key still answers with hers. A key is the sender's own.
#[test]
fn bob_replaying_alices_idempotency_key_gets_his_own_job_never_hers() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let text = format!("name: keyed\nimage: {IMAGE}\ncommand: 'sleep 1'\ngpus: 0\n");
    let key = "0123456789abcdef0123456789abcdef";
    let a = raw_submit(&e, &alice, key, &text);
    let a_id = a["job_id"].as_i64().unwrap_or_else(|| panic!("alice's submit: {a}"));
    assert_eq!(
        raw_submit(&e, &alice, key, &text)["job_id"],
        a_id,
        "alice's resend is answered with her job"
    );

    let b = raw_submit(&e, &bob, key, &text);
    let b_id = b["job_id"].as_i64().unwrap_or_else(|| panic!("bob's submit: {b}"));
    assert_ne!(b_id, a_id, "bob was handed alice's job: {b}");
    assert!(
        !b["job_ids"].as_array().unwrap().contains(&Value::from(a_id)),
        "bob's answer names alice's job: {b}"
    );
    let bj = e.show(b_id);
    assert_eq!(bj["job"]["owner"], bob.name.as_str(), "{bj}");
    assert_eq!(
        raw_submit(&e, &bob, key, &text)["job_id"],
        b_id,
        "bob's own resend finds his own job"
    );
    assert_eq!(
        raw_submit(&e, &alice, key, &text)["job_id"],
        a_id,
        "bob's use of the key changed nothing for alice"
    );
    assert_eq!(jobs_named(&e, "keyed"), {
        let mut v = vec![a_id, b_id];
        v.sort();
        v
    });
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// Item 14. The engine is killed inside `docker start` (the proxy keeps the start in flight, so it
/// still is when the next engine looks: Docker lists the container as `created`, then the start
/// goes through and the job begins). Recovery must let the start settle and see that the job began
/// (inspect: `State.StartedAt`/`Pid`) and follow it, never remove it and start it again: the job
/// appends one line to a mounted file each time it starts; `retries: 0`.
#[test]
fn an_engine_killed_inside_docker_start_starts_the_attempt_once() {
    let proxy = DockerProxy::start();
    let mut e = Engine::stopped(&[]);
    e.env.push(("DOCKER_HOST".into(), proxy.docker_host()));
    e.restart();
    let dir = tempfile::Builder::new().prefix("gantry-once-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let starts = dir.path().join("starts");
    let seen = starts.clone();
    // Once the held start goes through: wait for the job's line, so a removal after it cannot hide a second start.
    proxy.hold_next_start(move || {
        let t = Instant::now();
        while lines(&seen).is_empty() && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let id = e.submit_yaml(
        "once",
        &format!("image: {IMAGE}\ncommand: 'echo began >> /data/starts; sleep 2'\ngpus: 0\nretries: 0\nmounts: ['{}:/data']\n", dir.path().display()),
    );
    e.wait_until("the engine's docker start to be in flight", || proxy.held_starts() == 1);
    e.kill9();
    e.restart();
    let j = e.wait_final(id);
    let log = e.daemon_log();
    assert_eq!(
        lines(&starts),
        ["began"],
        "the job started {} times\n{j}\n{log}",
        lines(&starts).len()
    );
    assert_eq!(j["job"]["state"], "succeeded", "{j}\n{log}");
    assert_eq!(
        j["attempts"].as_array().unwrap().len(),
        1,
        "one attempt (`retries: 0`): {j}\n{log}"
    );
    assert_eq!(proxy.held_starts(), 0);
    assert!(
        log.contains("reattaching to running container"),
        "recovery followed the job it found running:\n{log}"
    );
}
