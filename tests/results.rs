//! What runs achieved (issue 30): metrics written to `GANTRY_METRICS` by real jobs, a `matrix`
//! sweep compared best first, other users kept out, hostile metric files, and results across an
//! engine restart. One engine per test, real users acting through the CLI.

use crate::helpers::*;
use serde_json::Value;
use std::path::Path;

fn submit_as(e: &Engine, u: &User, dir: &Path, file: &str, text: &str) -> Vec<i64> {
    let f = u.write(&dir.join(file), text);
    let v = e.json_as(u, &["submit", f.to_str().unwrap()]);
    v[0]["job_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("submit failed: {v}"))
        .iter()
        .map(|j| j.as_i64().unwrap())
        .collect()
}

fn out(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_sweep_logging_json_lines_is_compared_best_first_and_only_by_its_owner() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = alice.private_dir("results-sweep");
    // val/loss is the run's lr (lower is better: lr 0.001 wins); one garbage line, one NaN.
    let spec = format!(
        "name: sweep\nimage: {IMAGE}\ngpus: 0\nmatrix: {{lr: [0.1, 0.01, 0.001]}}\ncommand: >-\n  sh -c 'echo \"{{\\\"step\\\": 1, \\\"val/loss\\\": 1.5, \\\"acc\\\": 0.1}}\" >> $GANTRY_METRICS;\n  echo not-json >> $GANTRY_METRICS;\n  echo \"{{\\\"step\\\": 2, \\\"val/loss\\\": {{lr}}, \\\"acc\\\": 0.5, \\\"grad\\\": NaN}}\" >> $GANTRY_METRICS'\n"
    );
    let ids = submit_as(&e, &alice, &dir, "sweep.yaml", &spec);
    assert_eq!(ids.len(), 3);
    for id in &ids {
        assert_eq!(e.wait_final(*id)["job"]["state"], "succeeded", "{}", e.logs(*id));
    }
    let c = e.json_as(&alice, &["compare", "sweep"]);
    assert_eq!(c["sort"]["name"], "acc", "the first metric every run has, by name: {c}");
    assert_eq!(c["differing"], serde_json::json!(["lr"]));
    assert_eq!(c["rows"][0]["last"]["grad"], "NaN");
    // Sorted by val/loss: lower is better by its name.
    let c = e.json_as(&alice, &["compare", "sweep", "--sort", "val/loss"]);
    let rows = c["rows"].as_array().unwrap();
    let lrs: Vec<&str> = rows.iter().map(|r| r["params"]["lr"].as_str().unwrap()).collect();
    assert_eq!(lrs, ["0.001", "0.01", "0.1"], "{c}");
    assert_eq!(
        (c["sort"]["goal"].as_str(), rows[0]["last"]["val/loss"].as_f64()),
        (Some("min"), Some(0.001))
    );
    // By ids, as a table.
    let ids_text: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let args: Vec<&str> = ["compare"]
        .into_iter()
        .chain(ids_text.iter().map(String::as_str))
        .collect();
    let text = out(&e.gantry_user(&alice, &[&args[..], &["--sort", "val/loss"]].concat()));
    assert!(text.contains("val/loss* (min)") && text.contains("lr"), "{text}");
    let first_row = text.lines().nth(1).unwrap();
    assert!(first_row.contains("0.001") && first_row.contains("succeeded"), "{text}");
    let csv = out(&e.gantry_user(&alice, &["compare", "sweep", "--csv"]));
    assert!(
        csv.starts_with("id,name,state,lr,acc,grad,val/loss,duration_s,gpu_hours\n"),
        "{csv}"
    );
    // gantry show: last and best, params, the garbage line counted.
    let show = out(&e.gantry_user(&alice, &["show", &ids[2].to_string()]));
    assert!(show.contains("lr = 0.001"), "{show}");
    assert!(show.contains("0.001 @ step 2 (min)"), "{show}");
    assert!(show.contains("1 garbage lines"), "{show}");
    // history --metric adds the column, for the owner.
    let h = e.json_as(&alice, &["history", "--metric", "val/loss"]);
    let mine: Vec<f64> = h
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["metric"].as_f64())
        .collect();
    assert_eq!(mine.len(), 3, "{h}");
    // Bob sees the rows, not what they logged.
    let b = e.json_as(&bob, &["compare", "sweep"]);
    assert!(
        b["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["hidden"] == true && r["params"] == serde_json::json!({}) && r["last"] == serde_json::json!({})),
        "{b}"
    );
    let bh = e.json_as(&bob, &["history", "--metric", "val/loss"]);
    assert!(
        bh.as_array()
            .unwrap()
            .iter()
            .all(|r| r.get("metric").is_none_or(Value::is_null)),
        "{bh}"
    );
    let bs = out(&e.gantry_user(&bob, &["show", &ids[0].to_string()]));
    assert!(!bs.contains("val/loss") && !bs.contains("lr = "), "{bs}");
}

#[test]
fn a_metrics_file_linked_to_a_root_only_file_reads_nothing_and_garbage_is_never_fatal() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-hostile");
    // A root-only file that would read as metrics.
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "{\"root_secret\": 42}\n").unwrap();
    chmod(secret.path(), 0o600);
    let spec = format!(
        "name: linker\nimage: {IMAGE}\ngpus: 0\ncommand: sh -c 'ln -s {} $GANTRY_METRICS'\n",
        secret.path().display()
    );
    let id = submit_as(&e, &alice, &dir, "link.yaml", &spec)[0];
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(!show.contains("root_secret"), "{show}");
    assert!(show.contains("not readable as gantry-alice"), "{show}");
    // Binary garbage, a huge name count and a line far too long: counted, the rest kept.
    let spec = format!(
        "name: garbage\nimage: {IMAGE}\ngpus: 0\ncommand: >-\n  sh -c 'head -c 300000 /dev/urandom >> $GANTRY_METRICS; echo >> $GANTRY_METRICS;\n  i=0; while [ $i -lt 500 ]; do echo \"{{\\\"m$i\\\": $i}}\"; i=$((i+1)); done >> $GANTRY_METRICS;\n  echo \"{{\\\"loss\\\": 0.5}}\" >> $GANTRY_METRICS'\n"
    );
    let id = submit_as(&e, &alice, &dir, "garbage.yaml", &spec)[0];
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(show.contains("points of 301 names not kept"), "{show}");
    assert!(show.contains("max_series"), "{show}");
    let status = e.gantry(&["status"]);
    assert!(status.status.success(), "{}", out(&status));
}

#[test]
fn results_survive_an_engine_restart_without_a_point_lost_or_repeated() {
    let mut e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-restart");
    let spec = format!(
        "name: longrun\nimage: {IMAGE}\ngpus: 0\ncommand: >-\n  sh -c 'echo \"{{\\\"loss\\\": 1}}\" >> $GANTRY_METRICS; sleep 8; echo \"{{\\\"loss\\\": 0.5}}\" >> $GANTRY_METRICS'\n"
    );
    let id = submit_as(&e, &alice, &dir, "long.yaml", &spec)[0];
    e.wait_until("the first point read", || {
        out(&e.gantry_user(&alice, &["show", &id.to_string()])).contains("[1 points]")
    });
    e.kill9();
    e.restart();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(show.contains("0.5 @ step 1") && show.contains("[2 points]"), "{show}");
}

/// The venv `scripts/results-venv.sh` makes (made here when missing).
fn results_venv() -> String {
    let venv =
        std::env::var("GANTRY_TEST_RESULTS_VENV").unwrap_or_else(|_| "/var/cache/gantry-test/results-venv".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/results-venv.sh");
    let out = std::process::Command::new(script)
        .output()
        .expect("run scripts/results-venv.sh");
    assert!(out.status.success(), "scripts/results-venv.sh: {}", self::out(&out));
    venv
}

#[test]
fn a_real_summary_writer_in_an_image_less_job_is_read_from_its_tensorboard_folder() {
    let venv = results_venv();
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-tb");
    let d = dir.display();
    let spec = format!(
        "name: tb\nimage: host\ngpus: 0\nworkdir: {d}\nmounts: ['{d}:{d}', '{venv}:{venv}:ro']\ntensorboard: runs\ncommand: >-\n  {venv}/bin/python -c \"from tensorboardX import SummaryWriter; w = SummaryWriter('runs/exp1'); [w.add_scalar('train/loss', 1.0 / (i + 1), i) for i in range(50)]; w.add_scalar('val/acc', 0.75, 49); w.add_scalar('diverged', float('nan'), 49); w.close()\"\n"
    );
    let id = submit_as(&e, &alice, &dir, "tb.yaml", &spec)[0];
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(
        show.contains("train/loss") && show.contains("0.02 @ step 49") && show.contains("[50 points]"),
        "{show}"
    );
    assert!(show.contains("val/acc") && show.contains("0.75 @ step 49"), "{show}");
    assert!(show.contains("NaN @ step 49"), "{show}");
    assert!(!show.contains("garbage") && !show.contains("bad event"), "{show}");
}

/// `GET /v1/jobs/{id}/results` as `u`, with curl on the socket (`max_points` points per series).
fn results_as(e: &Engine, u: &User, id: i64, max_points: u32) -> Value {
    let out = u
        .command("curl")
        .args(["-sS", "--unix-socket"])
        .arg(e.state.join("gantry.sock"))
        .arg(format!("http://gantry/v1/jobs/{id}/results?max_points={max_points}"))
        .current_dir("/")
        .output()
        .unwrap();
    assert!(out.status.success(), "curl as {}: {}", u.name, self::out(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|err| panic!("{err}: {}", self::out(&out)))
}

/// The engine's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

/// Until job `id` ends: how long `gantry status` takes each time (the slowest), as `u`.
fn slowest_status_until_final(e: &Engine, u: &User, id: i64) -> std::time::Duration {
    let mut slowest = std::time::Duration::ZERO;
    e.wait_until(&format!("job {id} to end"), || {
        let t = std::time::Instant::now();
        let s = e.gantry_user(u, &["status"]);
        slowest = slowest.max(t.elapsed());
        assert!(s.status.success(), "{}", out(&s));
        let v = e.show(id);
        ["succeeded", "failed", "cancelled", "timed_out"].contains(&v["job"]["state"].as_str().unwrap_or(""))
    });
    slowest
}

/// The state database's size on disk (with its write-ahead log).
fn db_size(e: &Engine) -> u64 {
    ["gantry.db", "gantry.db-wal"]
        .iter()
        .map(|f| std::fs::metadata(e.state.join(f)).map(|m| m.len()).unwrap_or(0))
        .sum()
}

#[test]
fn a_metrics_file_grown_to_1_gb_is_read_to_the_labs_bound_with_the_engine_answering_and_its_memory_flat() {
    const BOUND: u64 = 8 << 20;
    let e = Engine::start_with_lab("[results]\nmax_bytes_per_job = \"8MiB\"\n", &[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-1gb");
    let before = peak_rss(e.pid());
    // A first point with infinities (kept as such), then 1 GiB of the same line.
    let spec = format!(
        "name: flood\nimage: {IMAGE}\ngpus: 0\ncommand: >-\n  sh -c 'echo \"{{\\\"step\\\": 0, \\\"gain\\\": Infinity, \\\"drift\\\": -Infinity}}\" >> $GANTRY_METRICS;\n  yes \"{{\\\"loss\\\": 1}}\" | head -c 1073741824 >> $GANTRY_METRICS'\n"
    );
    let id = submit_as(&e, &alice, &dir, "flood.yaml", &spec)[0];
    let slowest = slowest_status_until_final(&e, &alice, id);
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let grew = peak_rss(e.pid()).saturating_sub(before);
    eprintln!(
        "1 GiB metrics file: slowest `gantry status` {slowest:?}, engine peak RSS grew {} MiB",
        grew >> 20
    );
    let r = results_as(&e, &alice, id, 0);
    let i = &r["ingest"];
    let read = i["bytes_read"].as_u64().unwrap();
    assert!(read <= BOUND, "read {read} bytes, more than the lab's 8 MiB: {i}");
    assert!(read > BOUND - (64 << 10), "read up to the bound: {i}");
    assert_eq!(i["bytes_limit_reached"], true, "{i}");
    assert_eq!(
        i["bytes_unread"].as_u64().unwrap(),
        (1u64 << 30) + 50 - read,
        "the owner is told how much was not read: {i}"
    );
    let m = |name: &str| {
        r["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}: {r}"))
    };
    assert_eq!(
        (m("gain")["last"].clone(), m("drift")["last"].clone()),
        ("Infinity".into(), "-Infinity".into())
    );
    assert!(m("loss")["count"].as_u64().unwrap() > 600_000, "{r}");
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    eprintln!("{show}");
    assert!(
        show.contains("max_bytes_per_job") && show.contains("more not read"),
        "{show}"
    );
    // The engine answered throughout and did not take the file into memory.
    assert!(
        slowest < std::time::Duration::from_secs(5),
        "`gantry status` took {slowest:?}"
    );
    assert!(grew < 128 << 20, "the engine's peak RSS grew {} MiB", grew >> 20);
}

#[test]
fn a_million_distinct_metric_names_keep_the_labs_series_the_rest_counted_and_the_database_small() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-names");
    let db_before = db_size(&e);
    // `loss` first; then 500,000 names one per line and 500,000 more 2,000 to a line.
    let spec = format!(
        "name: names\nimage: {IMAGE}\ngpus: 0\ncommand: >-\n  sh -c 'echo \"{{\\\"loss\\\": 0.5}}\" >> $GANTRY_METRICS;\n  awk \"BEGIN {{ for (i = 0; i < 500000; i++) printf(\\\"{{\\\\\\\"n%d\\\\\\\": %d}}\\\\n\\\", i, i) }}\" >> $GANTRY_METRICS;\n  awk \"BEGIN {{ for (l = 0; l < 250; l++) {{ s = \\\"{{\\\"; for (i = 0; i < 2000; i++) s = s (i ? \\\", \\\" : \\\"\\\") \\\"\\\\\\\"w\\\" l \\\"_\\\" i \\\"\\\\\\\": 1\\\"; print s \\\"}}\\\" }} }}\" >> $GANTRY_METRICS'\n"
    );
    let id = submit_as(&e, &alice, &dir, "names.yaml", &spec)[0];
    let slowest = slowest_status_until_final(&e, &alice, id);
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let grew = db_size(&e).saturating_sub(db_before);
    eprintln!(
        "a million names: slowest `gantry status` {slowest:?}, database grew {} KiB",
        grew >> 10
    );
    let r = results_as(&e, &alice, id, 0);
    let metrics = r["metrics"].as_array().unwrap();
    assert_eq!(metrics.len(), 200, "the default max_series: {}", r["ingest"]);
    assert!(
        metrics.iter().any(|m| m["name"] == "loss"),
        "the first name logged is kept"
    );
    let i = &r["ingest"];
    assert_eq!(i["garbage_lines"], 0, "{i}");
    assert_eq!(i["dropped_names"], 1_000_001 - 200, "{i}");
    assert_eq!(i["dropped_points"], 1_000_001 - 200, "{i}");
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    eprintln!("{show}");
    assert!(
        show.contains("points of 999801 names not kept") && show.contains("max_series"),
        "{show}"
    );
    assert!(
        slowest < std::time::Duration::from_secs(5),
        "`gantry status` took {slowest:?}"
    );
    assert!(grew < 16 << 20, "the database grew {} MiB", grew >> 20);
}

#[test]
fn a_preempted_runs_metrics_from_both_attempts_are_joined_by_step() {
    let e = Engine::start_with_lab(
        "[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"1s\"\n",
        &[],
    );
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-preempt");
    let d = dir.display();
    // Each step logs `progress`; on its checkpoint signal it saves the step and stops.
    let spec = format!(
        "name: train\nimage: {IMAGE}\ngpus: 1\npreemptible: true\ncheckpoint: {{signal: SIGUSR1, grace: 30s}}\nmounts: ['{d}:/work']\ncommand: |\n  n=$(cat /work/ckpt 2>/dev/null || echo 0)\n  stop=0\n  trap 'stop=1' USR1\n  while [ $n -lt 30 ]; do\n    if [ $stop = 1 ]; then echo $n > /work/ckpt; exit 0; fi\n    n=$((n+1)); echo \"{{\\\"step\\\": $n, \\\"progress\\\": $n}}\" >> $GANTRY_METRICS; sleep 0.2\n  done\n"
    );
    let id = submit_as(&e, &alice, &dir, "train.yaml", &spec)[0];
    e.wait_until("a few steps read", || {
        results_as(&e, &alice, id, 0)["metrics"][0]["count"]
            .as_u64()
            .unwrap_or(0)
            >= 5
    });
    let urgent = e.submit_yaml(
        "urgent",
        &format!("image: {IMAGE}\ngpus: 2\npriority: 10\ncommand: echo urgent ran\n"),
    );
    assert_eq!(e.wait_final(urgent)["job"]["state"], "succeeded");
    let done = e.wait_final(id);
    assert_eq!(done["job"]["state"], "succeeded", "{done}");
    let reasons: Vec<&str> = done["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["reason"].as_str())
        .filter(|r| *r != "engine_error")
        .collect();
    assert_eq!(reasons.first(), Some(&"preempted"), "{done}");
    let r = results_as(&e, &alice, id, 1000);
    let p = &r["metrics"][0];
    assert_eq!(p["name"], "progress", "{r}");
    let points = p["points"].as_array().unwrap();
    let steps: Vec<i64> = points.iter().map(|x| x["step"].as_i64().unwrap()).collect();
    assert_eq!(steps, (1..=30).collect::<Vec<i64>>(), "every step once, in order: {p}");
    let attempts: Vec<u64> = points.iter().map(|x| x["attempt"].as_u64().unwrap()).collect();
    let (first, last) = (attempts[0], attempts[attempts.len() - 1]);
    assert!(last > first, "points from both attempts: {attempts:?}");
    assert!(attempts.windows(2).all(|w| w[0] <= w[1]), "{attempts:?}");
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(show.contains("30 @ step 30") && show.contains("[30 points]"), "{show}");
    let c = e.json_as(&alice, &["compare", &id.to_string()]);
    assert_eq!(c["rows"][0]["last"]["progress"], 30.0, "{c}");
}

#[test]
fn a_jobs_results_folder_goes_once_it_ends_for_good_and_its_results_stay() {
    let mut e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-folder");
    // The first attempt fails: its retry writes beside it, then the job ends.
    let spec = format!(
        "name: twice\nimage: {IMAGE}\ngpus: 0\nretries: 1\ncommand: >-\n  sh -c 'echo \"{{\\\"step\\\": $GANTRY_ATTEMPT, \\\"loss\\\": $GANTRY_ATTEMPT}}\" >> $GANTRY_METRICS; ls /gantry/results; [ $GANTRY_ATTEMPT = 2 ]'\n"
    );
    let id = submit_as(&e, &alice, &dir, "twice.yaml", &spec)[0];
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    assert!(
        e.logs(id).contains("metrics-1.jsonl\nmetrics-2.jsonl"),
        "{}",
        e.logs(id)
    );
    let folder = e.state.join("results").join(id.to_string());
    e.wait_until("its results folder removed", || !folder.exists());
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(show.contains("2 @ step 2") && show.contains("[2 points]"), "{show}");
    // A folder left by an engine that stopped before removing it goes at the next start.
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("metrics-1.jsonl"), "{\"loss\": 1}\n").unwrap();
    e.kill9();
    e.restart();
    e.wait_until("the stale results folder removed", || !folder.exists());
    assert!(out(&e.gantry_user(&alice, &["show", &id.to_string()])).contains("[2 points]"));
}
