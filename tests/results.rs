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
