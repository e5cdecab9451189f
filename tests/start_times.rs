//! Issue 31: dry runs (`gantry submit --dry-run`, `gantry run --dry-run`) and start times (`begin:`,
//! `gantry run --begin`) against the real engine and Docker.

use crate::helpers::*;
use serde_json::Value;

fn ls(e: &Engine) -> Value {
    e.json(&["ls", "--all"])
}

#[test]
fn a_dry_run_queues_nothing_and_names_the_gpus_or_the_wait() {
    let e = Engine::start(&[]);
    // Other engines' GPU containers (parallel tests) can make GPUs look taken for a moment: the
    // claim is that a dry run names the GPU it would get once one is free.
    let dry = [
        "run",
        "--dry-run",
        "--gpus",
        "1",
        "--image",
        IMAGE,
        "--name",
        "try",
        "--shell",
        "true",
    ];
    let mut p = Value::Null;
    e.wait_until("a dry run that starts now", || {
        p = e.json(&dry);
        p["jobs"][0]["starts_now"] == true
    });
    assert_eq!(p["jobs"][0]["job"]["name"], "try");
    assert_eq!(p["jobs"][0]["gpus"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(ls(&e), serde_json::json!([]), "nothing queued");

    let blocker = e.submit_yaml(
        "blocker",
        &format!("name: blocker\nimage: {IMAGE}\ngpus: 2\nexpected_runtime: 1h\ncommand: sleep 600\n"),
    );
    e.wait_state(blocker, "running");
    let spec = e.write_spec(
        "train.yaml",
        &format!("name: train\nimage: {IMAGE}\ngpus: 1\ncommand: 'true'\n"),
    );
    let before = ls(&e);
    let out = e.gantry(&["submit", "--dry-run", spec.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("would queue 1 job (dry run: nothing queued)"), "{text}");
    assert!(
        text.contains("would wait:") && text.contains("estimated start:"),
        "{text}"
    );
    assert!(text.contains("ok: priority 0 is within your range"), "{text}");
    let p = e.json(&["submit", "--dry-run", spec.to_str().unwrap()]);
    assert_eq!(p[0]["preview"]["jobs"][0]["starts_now"], false, "{p}");
    let p = e.json(&["submit", "--dry-run", "--begin", "+2h", spec.to_str().unwrap()]);
    let j = &p[0]["preview"]["jobs"][0];
    assert!(j["reason"].as_str().unwrap_or("").starts_with("starts at "), "{p}");
    assert!(j["job"]["begin_ms"].as_i64().is_some(), "{p}");
    let bad = e.write_spec("bad.yaml", &format!("image: {IMAGE}\npriority: 99999\n"));
    let out = e.gantry(&["submit", "--dry-run", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("outside the range"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ls(&e), before, "the dry runs queued nothing");
    let next = e.submit_yaml("next", &format!("image: {IMAGE}\ngpus: 0\ncommand: 'true'\n"));
    assert_eq!(next, blocker + 1, "no dry run took a job id");
    e.gantry(&["cancel", &blocker.to_string()]);
}

#[test]
fn begin_holds_a_job_until_its_time_and_nothing_meanwhile() {
    let e = Engine::start(&[]);
    let run = |args: &[&str]| {
        e.json(&[&["run", "--image", IMAGE, "--gpus", "2"][..], args].concat())["job_id"]
            .as_i64()
            .unwrap()
    };
    let later = run(&["--begin", "+30s", "--name", "later", "--shell", "true"]);
    let now = run(&["--name", "now", "--shell", "true"]);
    e.wait_until("the begin job to say when it starts", || {
        ls(&e)
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["job"]["id"] == later && q["reason"].as_str().unwrap_or("").starts_with("starts at "))
    });
    let begin = e.show(later)["job"]["not_before"].as_i64().unwrap();
    let first = e.wait_state(now, "succeeded");
    assert!(
        first["job"]["started_at"].as_i64().unwrap() < begin,
        "the later job, queued first, held the GPUs until its begin"
    );
    let d = e.wait_state(later, "succeeded");
    let waited = d["job"]["started_at"].as_i64().unwrap() - d["job"]["submitted_at"].as_i64().unwrap();
    assert!(
        waited >= 29_000,
        "started {waited} ms after it was queued; its begin was +30s"
    );
}
