//! Faults that must lose nothing (issue 7, items 10-12 and kill -9 during a burst): a full state
//! disk, a lost WAL, a Docker outage and an engine killed while work pours in. Each fault is real:
//! a tmpfs filled to the last byte, a truncated or deleted WAL file, a socket proxy that hangs up
//! on the engine, SIGKILL.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

/// `Some(running)` for an existing container, `None` once it is removed.
fn container_running(id: &str) -> Option<bool> {
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", id])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim() == "true")
}

fn finals(j: &Value, state: &str) -> usize {
    j["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|ev| ev["to"] == state)
        .count()
}

/// Item 10. A 3 MB state dir fills up while a job runs: its end cannot be committed, so the engine
/// keeps the container, says why, starts nothing new, and records the end once space returns.
#[test]
fn full_disk_pauses_the_engine_and_never_runs_a_finished_job_twice() {
    let disk = Tmpfs::mount("3m");
    let mut e = Engine::stopped(&["--gpus", "sim:1x24GiB"]);
    e.state = disk.path().to_path_buf();
    e.restart();
    // `$((6*7))`: the output (`disk-42`) differs from the command text, so an echoed command never counts.
    let a = e.submit_yaml(
        "a",
        &format!("image: {IMAGE}\ncommand: 'sleep 3; echo disk-$((6*7))'\ngpus: 1\nretries: 2\n"),
    );
    let b = e.submit_yaml(
        "b",
        &format!("image: {IMAGE}\ncommand: 'echo second-$((6*7))'\ngpus: 1\n"),
    );
    let cid = e.wait_state(a, "running")["attempts"][0]["container_id"]
        .as_str()
        .expect("a running attempt has a container")
        .to_string();
    let filler = disk.fill();

    e.wait_until("job a's command to end", || container_running(&cid) != Some(true));
    let mut status = Value::Null;
    e.wait_until(
        "`gantry status --json` to report the failed write in `store_problem`",
        || {
            status = e.json(&["status"]);
            status["store_problem"].as_str().is_some_and(|p| !p.trim().is_empty())
        },
    );
    std::thread::sleep(Duration::from_secs(3)); // room for the engine to act on the end it cannot record
    assert_eq!(
        container_running(&cid),
        Some(false),
        "the container was removed although its end is not committed: {status}\n{}",
        e.daemon_log()
    );
    let q = e.json(&["ls"]);
    let queued = q
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"]["id"] == b)
        .unwrap_or_else(|| panic!("job b left the queue: {q}"));
    assert_eq!(
        queued["job"]["state"], "queued",
        "no job starts while the database cannot be written: {q}"
    );
    let reason = queued["reason"].as_str().unwrap_or("").to_lowercase();
    assert!(
        reason.contains("disk") || reason.contains("write"),
        "job b's reason names the problem: {queued}"
    );
    assert!(
        e.show(b)["attempts"].as_array().unwrap().is_empty(),
        "job b never started"
    );

    std::fs::remove_file(&filler).unwrap();
    let ja = e.wait_final(a);
    assert_eq!(ja["job"]["state"], "succeeded", "{ja}");
    assert_eq!(
        ja["attempts"].as_array().unwrap().len(),
        1,
        "one attempt, no retry because of our own failed write: {ja}"
    );
    assert_eq!(finals(&ja, "succeeded"), 1, "recorded once: {ja}");
    assert_eq!(
        count(&e.logs(a), "disk-42"),
        1,
        "the output written while the disk was full is kept once: {}",
        e.logs(a)
    );
    e.wait_until("the problem to clear in `gantry status`", || {
        e.json(&["status"])["store_problem"]
            .as_str()
            .is_none_or(|p| p.is_empty())
    });
    e.wait_until("job a's container to be removed once its end is recorded", || {
        container_running(&cid).is_none()
    });
    let jb = e.wait_final(b);
    assert_eq!(jb["job"]["state"], "succeeded", "{jb}");
    assert!(e.logs(b).contains("second-42"));

    // After a restart the job stays done: recovery must not find it "lost" and run it again.
    e.kill9();
    e.restart();
    let c = e.submit_yaml("c", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\n"));
    assert_eq!(e.wait_final(c)["job"]["state"], "succeeded"); // recovery ran before this pass
    let ja = e.show(a);
    assert_eq!(
        (ja["job"]["state"].as_str(), ja["attempts"].as_array().unwrap().len()),
        (Some("succeeded"), 1),
        "{ja}"
    );
    assert_eq!(count(&e.logs(a), "disk-42"), 1, "ran once: {}", e.logs(a));
}

/// Item 11. The WAL holds every commit since the engine started; it is cut while the engine is
/// down (SIGKILL leaves no checkpoint). The engine must not reuse ids, hand alice's log to bob,
/// clash with a leftover container's name, or adopt that container under a new job.
fn lost_wal(cut: impl FnOnce(&Path)) {
    let mut e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let (adir, bdir) = (alice.private_dir("wal"), bob.private_dir("wal"));
    let submit = |e: &Engine, u: &User, dir: &Path, name: &str, cmd: &str| -> i64 {
        let f = u.write(
            &dir.join(format!("{name}.yaml")),
            &format!("image: {IMAGE}\ncommand: '{cmd}'\ngpus: 0\n"),
        );
        e.json_as(u, &["submit", f.to_str().unwrap()])[0]["job_id"]
            .as_i64()
            .unwrap()
    };
    let secret = submit(&e, &alice, &adir, "secret", "echo alice-secret");
    assert_eq!(e.wait_final(secret)["job"]["state"], "succeeded");
    assert!(e.logs(secret).contains("alice-secret"));
    let long = submit(&e, &alice, &adir, "long", "sleep 120");
    let orphan = e.wait_state(long, "running")["attempts"][0]["container_id"]
        .as_str()
        .unwrap()
        .to_string();
    let _cleanup = RemoveContainers(vec![orphan.clone()]); // its engine label may not be this engine's any more
    let name = String::from_utf8_lossy(
        &Command::new("docker")
            .args(["inspect", "-f", "{{.Name}}", &orphan])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .trim_start_matches('/')
    .to_string();
    let seen = secret.max(long);

    e.kill9();
    let wal = e.state.join("gantry.db-wal");
    assert!(
        std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) > 0,
        "the WAL holds the recent commits"
    );
    cut(&wal);
    e.restart();

    let bobs: Vec<i64> = (0..3)
        .map(|i| submit(&e, &bob, &bdir, &format!("b{i}"), "echo bob-$((2+3))"))
        .collect();
    let mut problems: Vec<String> = vec![];
    for &id in &bobs {
        if id <= seen {
            problems.push(format!(
                "bob's new job got id {id}, but ids up to {seen} were used before the WAL was lost"
            ));
        }
        let j = e.wait_final(id);
        if j["job"]["state"] != "succeeded" {
            problems.push(format!(
                "bob's job {id} did not succeed (container name clash?): {}",
                j["job"]["message"]
            ));
        }
        let log = e.logs(id);
        if log.contains("alice-secret") {
            problems.push(format!("bob's job {id} shows alice's old output: {log}"));
        }
        if !log.contains("bob-5") {
            problems.push(format!("bob's job {id} lacks its own output: {log}"));
        }
    }
    // Every job the engine now knows (recovery ran before bob's jobs started) must not own the orphan.
    let mut ids: Vec<i64> = e
        .json(&["history", "--limit", "1000"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    ids.extend(
        e.json(&["ls"])
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["job"]["id"].as_i64().unwrap()),
    );
    for id in ids {
        if e.show(id)["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["container_id"] == orphan.as_str())
        {
            problems.push(format!("the leftover container {name} was adopted as job {id}"));
        }
    }
    let log = e.daemon_log();
    let reported = log
        .lines()
        .any(|l| l.to_lowercase().contains("orphan") && (l.contains(&orphan[..12]) || l.contains(&name)));
    if !reported {
        problems.push(format!(
            "no daemon log line reports the orphan container {name} ({})",
            &orphan[..12]
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}\n--- daemon log ---\n{log}");
}

#[test]
fn truncated_wal_never_reuses_ids_logs_or_containers() {
    lost_wal(|wal| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(wal)
            .unwrap()
            .set_len(0)
            .unwrap()
    });
}

#[test]
fn deleted_wal_never_reuses_ids_logs_or_containers() {
    lost_wal(|wal| std::fs::remove_file(wal).unwrap());
}

/// Item 12. Docker goes away for 3 s while a job prints 60 lines; the job keeps running. The log
/// must have every line exactly once, in order.
#[test]
fn docker_outage_mid_job_keeps_every_output_line_exactly_once() {
    let proxy = DockerProxy::start();
    let mut e = Engine::stopped(&[]);
    e.env.push(("DOCKER_HOST".into(), proxy.docker_host()));
    e.restart();
    let id = e.submit_yaml(
        "talker",
        &format!("image: {IMAGE}\ncommand: '{}'\ngpus: 0\n", ticker(60, "0.15")),
    );
    e.wait_until("the first 10 lines in the log", || ticks(&e.logs(id)).len() >= 10);
    proxy.cut();
    std::thread::sleep(Duration::from_secs(3));
    proxy.restore();
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}\n{}", e.daemon_log());
    assert_eq!(j["attempts"].as_array().unwrap().len(), 1, "{j}");
    let log = e.logs(id);
    assert_eq!(
        ticks(&log),
        (1..=60).collect::<Vec<u32>>(),
        "every line once, in order:\n{log}"
    );
}

/// Submit one spec file with a bounded wait; `Some(job id)` when the engine answered success.
fn submit_once(state: &Path, file: &Path) -> Option<i64> {
    let out = Command::new("timeout")
        .arg("60")
        .arg(bin())
        .arg("--state-dir")
        .arg(state)
        .args(["submit", "--json"])
        .arg(file)
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("success without a job id ({e}): {out:?}"));
    Some(
        v[0]["job_id"]
            .as_i64()
            .unwrap_or_else(|| panic!("success without a job id: {v}")),
    )
}

/// kill -9, five times, in the middle of 200 submissions from 4 parallel CLIs that retry until they
/// get an answer: every submission that got an id back on the first try is there exactly once, and every
/// job ran once and succeeded.
#[test]
fn kill9_during_a_burst_of_200_submissions_keeps_each_accepted_job_exactly_once() {
    const N: usize = 200;
    // One GPU each on 8 simulated GPUs: at most 8 containers at a time. 200 at once (gpus: 0) time
    // out a small machine's dockerd and test Docker instead of the engine.
    let mut e = Engine::start(&["--gpus", "sim:8x24GiB"]);
    let files: Vec<_> = (0..N)
        .map(|n| {
            e.write_spec(
                &format!("burst-{n}.yaml"),
                &format!("name: burst-{n}\nimage: {IMAGE}\ncommand: 'echo mark-{n}-$((6*7))'\ngpus: 1\n"),
            )
        })
        .collect();
    let state = e.state.clone();
    let next = AtomicUsize::new(0);
    // (n, job id, whether an earlier try failed: then the engine may also hold that earlier try).
    let answered: Mutex<Vec<(usize, i64, bool)>> = Mutex::new(vec![]);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= N {
                    break;
                }
                for tries in 0.. {
                    if let Some(id) = submit_once(&state, &files[n]) {
                        answered.lock().unwrap().push((n, id, tries > 0));
                        break;
                    }
                    assert!(tries < 600, "burst-{n} still refused after 60 s");
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        // Five kills, each aimed at the riskiest moment: jobs between "attempt begun" and "container running".
        for at in [30, 60, 90, 120, 150] {
            let t = std::time::Instant::now();
            while answered.lock().unwrap().len() < at && t.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(5));
            }
            for _ in 0..200 {
                let q = e.gantry(&["ls", "--json"]);
                if serde_json::from_slice::<Value>(&q.stdout)
                    .is_ok_and(|q| q.as_array().unwrap().iter().any(|j| j["job"]["state"] == "starting"))
                {
                    break;
                }
            }
            e.kill9();
            std::thread::sleep(Duration::from_millis(300)); // some submissions find no engine
            e.restart();
        }
    });
    let answered = answered.into_inner().unwrap();
    assert!(
        answered.iter().any(|a| a.2),
        "no submission met the dead engine; the kill landed after the burst"
    );

    e.wait_long("every burst job to end", Duration::from_secs(900), || {
        e.json(&["ls"]).as_array().unwrap().is_empty()
    });
    let rows = e.json(&["history", "--limit", "1000"]);
    let mut by_n: HashMap<usize, Vec<i64>> = HashMap::new();
    for r in rows.as_array().unwrap() {
        if let Some(n) = r["name"]
            .as_str()
            .and_then(|s| s.strip_prefix("burst-"))
            .and_then(|n| n.parse().ok())
        {
            by_n.entry(n).or_default().push(r["id"].as_i64().unwrap());
        }
    }
    let mut problems: Vec<String> = vec![];
    for (n, id, retried) in &answered {
        let have = by_n.get(n).cloned().unwrap_or_default();
        let ok = if *retried {
            have.contains(id) && have.len() <= 2
        } else {
            have == [*id]
        };
        if !ok {
            problems.push(format!(
                "burst-{n} was answered with job {id}{}; the engine has {have:?}",
                if *retried { " after a retry" } else { "" }
            ));
        }
    }
    for (n, ids) in &by_n {
        for id in ids {
            let j = e.show(*id);
            let ran = j["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| !a["exit_code"].is_null())
                .count();
            let marks = count(&e.logs(*id), &format!("mark-{n}-42"));
            if j["job"]["state"] != "succeeded" || ran != 1 || marks != 1 {
                problems.push(format!(
                    "job {id} (burst-{n}): state {}, {ran} attempts with an exit code, output {marks} times: {}",
                    j["job"]["state"], j["attempts"]
                ));
            }
        }
    }
    let retried = answered.iter().filter(|a| a.2).count();
    assert!(
        problems.is_empty(),
        "{} answered at once, {retried} after retries:\n{problems:#?}\n{}",
        N - retried,
        e.daemon_log()
    );
}

/// kill -9 twice while a job prints a line every 0.1 s: after reattaching, every line is in its
/// log exactly once.
#[test]
fn kill9_twice_while_a_job_prints_keeps_every_output_line_exactly_once() {
    let mut e = Engine::start(&[]);
    let id = e.submit_yaml(
        "ticker",
        &format!("image: {IMAGE}\ncommand: '{}'\ngpus: 0\n", ticker(80, "0.1")),
    );
    e.wait_state(id, "running");
    let mut seen = 0;
    for _ in 0..2 {
        let want = seen + 10;
        e.wait_until(&format!("line {want}, or the job's end"), || {
            seen = ticks(&e.logs(id)).into_iter().max().unwrap_or(0);
            seen >= want || e.show(id)["job"]["state"] != "running"
        });
        e.kill9();
        std::thread::sleep(Duration::from_millis(500)); // the job prints while no engine runs
        e.restart();
    }
    let j = e.wait_final(id);
    assert_eq!(
        (j["job"]["state"].as_str(), j["attempts"].as_array().unwrap().len()),
        (Some("succeeded"), 1),
        "{j}"
    );
    let log = e.logs(id);
    assert_eq!(
        ticks(&log),
        (1..=80).collect::<Vec<u32>>(),
        "every line once, in order:\n{log}"
    );
}
