//! The lab policy (`daemon --config FILE`, as the system engine reads /etc/gantry/config.toml): checked
//! with line/column errors, enforced for real users, reloaded on SIGHUP.

use crate::helpers::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

/// A lab config in its own temp dir (kept for the test's life).
struct LabFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl LabFile {
    fn new(text: &str) -> LabFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        LabFile { _dir: dir, path }
    }
    fn set(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }
    fn arg(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Submit `yaml` as `u` from a file in their home; the job id, or the error text.
fn submit_as(e: &Engine, u: &User, yaml: &str) -> Result<i64, String> {
    let dir = u.private_dir("policy");
    let f = u.write(&dir.join("job.yaml"), yaml);
    let out = e.gantry_user(u, &["--json", "submit", f.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["job_id"].as_i64().ok_or_else(|| text(&out))
}

fn job(cmd: &str, gpus: u32, priority: i32) -> String {
    format!("image: {IMAGE}\ncommand: '{cmd}'\ngpus: {gpus}\npriority: {priority}\n")
}

fn queue_entry(e: &Engine, id: i64) -> Value {
    e.json(&["ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"]["id"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn a_bad_config_stops_the_engine_at_start_with_its_line_and_column_and_config_check_says_the_same() {
    let bad = LabFile::new("[limits]\npriority = [-10, 10]\nmax_queud_jobs = 5\n");
    let state = tempfile::tempdir().unwrap();
    let start = |f: &LabFile, gpus: &str| {
        Command::new(bin())
            .arg("--state-dir")
            .arg(state.path())
            .args(["daemon", "--gpus", gpus, "--config", f.arg()])
            .output()
            .unwrap()
    };
    let out = start(&bad, "sim:2x24GiB@policy-bad");
    assert!(!out.status.success(), "the engine must not start: {}", text(&out));
    let want = format!("{}:3:1: unknown field `max_queud_jobs`", bad.path.display());
    assert!(text(&out).contains(&want), "{}", text(&out));

    let check = Command::new(bin())
        .args(["config", "check", bad.arg()])
        .output()
        .unwrap();
    assert!(!check.status.success());
    assert!(text(&check).contains(&want), "{}", text(&check));
    // GANTRY_CONFIG names the file both read.
    let check = Command::new(bin())
        .args(["config", "check"])
        .env("GANTRY_CONFIG", bad.arg())
        .output()
        .unwrap();
    assert!(
        !check.status.success() && text(&check).contains(&want),
        "{}",
        text(&check)
    );

    // A GPU the machine lacks can only be found at start: still with line and column.
    let gpus = LabFile::new("# keep the last GPU for notebooks\ngpus = [0, 5]\n");
    let check = Command::new(bin())
        .args(["config", "check", gpus.arg()])
        .output()
        .unwrap();
    assert!(
        check.status.success() && text(&check).starts_with("OK"),
        "{}",
        text(&check)
    );
    let out = start(&gpus, "sim:2x24GiB@policy-bad");
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!(
            "{}:2:8: `gpus` names GPU 5, which this machine does not have",
            gpus.path.display()
        )),
        "{}",
        text(&out)
    );
}

#[test]
fn users_stay_in_the_priority_range_and_admin_group_members_go_beyond_it() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    add_to_group(&bob, "gantry-t-admins");
    let lab = LabFile::new(
        "[access]\nadmin_group = \"gantry-t-admins\"\n[limits]\npriority = [-5, 5]\nadmin_priority = [-500, 500]\n",
    );
    let e = Engine::start(&["--config", lab.arg()]);

    let err = submit_as(&e, &alice, &job("true", 0, 6)).unwrap_err();
    assert!(
        err.contains("priority 6 is outside the range you may use (-5..5)") && err.contains(lab.arg()),
        "{err}"
    );
    let id = submit_as(&e, &alice, &job("sleep 30", 1, 5)).unwrap();
    let raise = e.gantry_user(&alice, &["priority", &id.to_string(), "100"]);
    assert!(
        !raise.status.success() && text(&raise).contains("(-5..5)"),
        "{}",
        text(&raise)
    );

    let big = submit_as(&e, &bob, &job("true", 0, 500))
        .unwrap_or_else(|err| panic!("an admin may use the admin range: {err}"));
    assert_eq!(e.show(big)["job"]["priority"], 500);
    // Admins act on others' jobs (as root does), and see what they run.
    let cancel = e.gantry_user(&bob, &["cancel", &id.to_string()]);
    assert!(cancel.status.success(), "{}", text(&cancel));
    assert_eq!(e.json_as(&bob, &["show", &id.to_string()])["job"]["spec_hidden"], false);
    assert_eq!(
        e.json_as(&alice, &["show", &big.to_string()])["job"]["spec_hidden"],
        true,
        "alice is no admin"
    );
}

#[test]
fn a_user_at_the_gpu_cap_waits_with_the_reason_while_a_gpu_is_free() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let lab = LabFile::new("[limits]\nmax_running_gpus = 1\n");
    let e = Engine::start(&["--config", lab.arg(), "--gpus", "sim:3x24GiB"]);
    let first = submit_as(&e, &bob, &job("sleep 60", 1, 0)).unwrap();
    e.wait_state(first, "running");
    let second = submit_as(&e, &bob, &job("sleep 60", 1, 0)).unwrap();
    let mut reason = String::new();
    e.wait_until("bob's second job to be explained", || {
        reason = queue_entry(&e, second)["reason"].as_str().unwrap_or("").to_string();
        reason.contains("lab limit")
    });
    assert_eq!(reason, "gantry-bob already runs 1 GPU; the lab limit is 1 per user");
    // The GPUs bob may not take are free for others.
    let other = submit_as(&e, &alice, &job("sleep 60", 1, 0)).unwrap();
    e.wait_state(other, "running");
    assert_eq!(e.show(second)["job"]["state"], "queued");
    let err = submit_as(&e, &bob, &job("true", 2, 0)).unwrap_err();
    assert!(
        err.contains("the job asks for 2 GPUs; the lab limit is 1 GPUs per user"),
        "{err}"
    );
}

#[test]
fn gpus_left_out_of_the_config_are_never_assigned_and_show_as_reserved() {
    let lab = LabFile::new("gpus = [0, 2]\n");
    let e = Engine::start(&["--config", lab.arg(), "--gpus", "sim:3x24GiB"]);
    let ids: Vec<i64> = (0..3)
        .map(|i| e.submit_yaml(&format!("g{i}"), &job("sleep 1", 1, 0)))
        .collect();
    for id in &ids {
        let d = e.wait_final(*id);
        assert_eq!(d["job"]["state"], "succeeded", "{d}");
        let gpus: Vec<u64> = d["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|a| a["gpus"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()))
            .collect();
        assert!(!gpus.is_empty() && !gpus.contains(&1), "job {id} got GPU 1: {gpus:?}");
    }
    assert_eq!(e.json(&["gpus"])["reserved"], serde_json::json!([1]));
    let human = String::from_utf8_lossy(&e.gantry(&["gpus"]).stdout).into_owned();
    assert!(
        human
            .lines()
            .any(|l| l.trim_start().starts_with('1') && l.ends_with("reserved for interactive use")),
        "{human}"
    );
    let f = e.write_spec("three.yaml", &job("true", 3, 0));
    let out = e.gantry(&["submit", f.to_str().unwrap()]);
    assert!(
        !out.status.success()
            && text(&out).contains("this machine has 2 for Gantry jobs (GPU 1 kept for interactive use"),
        "{}",
        text(&out)
    );
}

fn sighup(e: &Engine) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(e.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

#[test]
fn sighup_applies_a_new_limit_without_a_restart_and_a_broken_file_keeps_the_old_one() {
    let alice = user("gantry-alice");
    let lab = LabFile::new("[limits]\nmax_queued_jobs = 1\n");
    let e = Engine::start(&["--config", lab.arg(), "--gpus", "sim:1x24GiB"]);
    let running = submit_as(&e, &alice, &job("sleep 60", 1, 0)).unwrap();
    e.wait_state(running, "running");
    submit_as(&e, &alice, &job("true", 1, 0)).unwrap();
    let err = submit_as(&e, &alice, &job("true", 1, 0)).unwrap_err();
    assert!(
        err.contains("limit of 1 queued jobs per user (limits.max_queued_jobs in"),
        "{err}"
    );

    lab.set("[limits]\nmax_queued_jobs = 3\n");
    sighup(&e);
    e.wait_until("the reload", || {
        e.daemon_log().contains("limits.max_queued_jobs: 1 -> 3")
    });
    submit_as(&e, &alice, &job("true", 1, 0)).unwrap();
    submit_as(&e, &alice, &job("true", 1, 0)).unwrap();

    lab.set("[limits]\nmax_queued_jobs = \"lots\"\n");
    sighup(&e);
    let want = format!("{}:2:19:", lab.path.display());
    e.wait_until("the failed reload", || e.daemon_log().contains(&want));
    assert!(
        e.daemon_log()
            .contains("lab config not reloaded, the policy in force stays"),
        "{}",
        e.daemon_log()
    );
    let err = submit_as(&e, &alice, &job("true", 1, 0)).unwrap_err();
    assert!(
        err.contains("limit of 3 queued jobs per user"),
        "the last good policy stays: {err}"
    );
}

#[test]
fn usage_totals_match_history() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let e = Engine::start(&[]);
    let ids = [
        submit_as(&e, &alice, &job("sleep 1", 1, 0)).unwrap(),
        submit_as(&e, &alice, &job("true", 0, 0)).unwrap(),
        submit_as(&e, &bob, &job("sleep 1", 2, 0)).unwrap(),
    ];
    for id in ids {
        assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
    }
    let usage = e.json(&["usage", "--since", "1h"]);
    let history = e.json(&["history", "--since", "1h"]);
    let rows = history.as_array().unwrap();
    for name in [&alice.name, &bob.name] {
        let u = usage["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["user"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} missing: {usage}"));
        let mine: Vec<&Value> = rows.iter().filter(|r| r["owner"] == name.as_str()).collect();
        let hours: f64 = mine
            .iter()
            .map(|r| {
                (r["finished_at"].as_i64().unwrap() - r["started_at"].as_i64().unwrap()) as f64 / 3_600_000.0
                    * r["gpus"].as_array().unwrap().len() as f64
            })
            .sum();
        assert!(
            (u["gpu_hours"].as_f64().unwrap() - hours).abs() < 1e-9,
            "{name}: usage {u} vs history {hours}"
        );
        assert_eq!(u["jobs_finished"].as_u64().unwrap(), mine.len() as u64, "{u}");
        assert!(
            u["mean_wait_ms"].is_i64() && u["fair_share_usage"].as_f64().unwrap() > 0.0,
            "{u}"
        );
    }
    let table = e.gantry_user(&alice, &["usage"]);
    assert!(
        table.status.success() && text(&table).contains("GPU-HOURS") && text(&table).contains("gantry-bob"),
        "everyone may see usage: {}",
        text(&table)
    );
}
