//! End-to-end tests: real `gantry daemon` processes in temp dirs, simulated GPUs, the real Docker
//! engine and a locally built busybox image. Each test runs its own engine, so they run in parallel.

mod bookings;
mod cpus;
mod disk;
mod dl_defaults;
mod docker_access;
mod efficiency;
mod engine_lock;
mod exactly_once;
mod faults;
mod gpu_select;
mod helpers;
mod identity;
mod images;
mod job_output;
mod limits;
mod log_readers;
mod mcp;
mod metrics;
mod notify;
mod nvml;
mod policy;
mod preemption;
mod preemption_nvml;
mod remote;
mod results;
mod results_mlflow;
mod run_and_hold;
mod security_api;
mod security_forwards;
mod security_hooks;
mod security_inbox;
mod security_mounts;
mod security_mounts_race;
mod security_network;
mod security_pins;
mod security_redteam;
mod security_rules;
mod security_state;
mod sessions;
mod shares;
mod sim_gpus;
mod slurm;
mod start_times;
mod system_engine;
mod two_engines;
mod user_inboxes;
mod usual_env;

use helpers::*;
use serde_json::Value;

#[test]
fn cli_submit_and_drop_folder_both_run_to_success() {
    let e = Engine::start(&[]);
    let id = e.submit_yaml(
        "cli",
        &format!("image: {IMAGE}\ncommand: echo hello from the cli\ngpus: 1\n"),
    );
    e.drop_file(
        "dropped.yaml",
        &format!("image: {IMAGE}\ncommand: [echo, hello from the inbox]\ngpus: 1\n"),
    );
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded");
    assert!(
        e.logs(id).lines().any(|l| l == "hello from the cli"),
        "the job's output, line by line as it printed it: {}",
        e.logs(id)
    );

    let accepted = e.wait_for_file("accepted", "-dropped.yaml");
    let dropped_id: i64 = accepted
        .split('-')
        .next()
        .unwrap()
        .parse()
        .expect("accepted file is named <job id>-<name>");
    let j = e.wait_final(dropped_id);
    assert_eq!(j["job"]["state"], "succeeded");
    assert!(j["job"]["source"].as_str().unwrap().starts_with("inbox:"));
    assert!(e.logs(dropped_id).contains("hello from the inbox"));

    let h = e.json(&["history"]);
    let ids: Vec<i64> = h
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert!(ids.contains(&id) && ids.contains(&dropped_id), "{h}");
    let row = h.as_array().unwrap().iter().find(|r| r["id"] == id).unwrap();
    for k in [
        "name",
        "owner",
        "status",
        "exit_code",
        "gpus",
        "started_at",
        "finished_at",
    ] {
        assert!(!row[k].is_null(), "history --json lacks {k}: {row}");
    }
}

#[test]
fn container_sees_exactly_its_assigned_gpus() {
    let e = Engine::start(&["--gpus", "sim:4x24GiB"]);
    let id = e.submit_yaml(
        "env",
        &format!("image: {IMAGE}\ncommand: env\ngpus: 2\nenv: {{CUDA_VISIBLE_DEVICES: '3'}}\n"),
    );
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded");
    let uuids: Vec<String> = j["attempts"][0]["gpu_uuids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect();
    assert_eq!(uuids.len(), 2);
    let log = e.logs(id);
    assert!(
        log.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))),
        "{log}"
    );
    assert!(
        log.contains("CUDA_VISIBLE_DEVICES=0,1\n"),
        "spec must not override the binding: {log}"
    );
    assert!(log.contains(&format!("GANTRY_GPU_UUIDS={}", uuids.join(","))), "{log}");
    assert!(log.contains(&format!("GANTRY_JOB_ID={id}")), "{log}");
    let gpus = e.json(&["gpus"]);
    assert_eq!(gpus["backend"], "simulated");
    assert_eq!(gpus["gpus"].as_array().unwrap().len(), 4);
}

#[test]
fn two_gpus_run_two_jobs_and_the_third_waits() {
    let e = Engine::start(&[]);
    let ids: Vec<i64> = (0..3)
        .map(|i| {
            e.submit_yaml(
                &format!("j{i}"),
                &format!("image: {IMAGE}\ncommand: sleep 3\ngpus: 1\n"),
            )
        })
        .collect();
    e.wait_until("two jobs running and one queued", || {
        let q = e.json(&["ls"]);
        let states: Vec<&str> = q
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["job"]["state"].as_str().unwrap())
            .collect();
        states.iter().filter(|s| **s == "running").count() == 2
            && states.iter().filter(|s| **s == "queued").count() == 1
    });
    let q = e.json(&["ls"]);
    let waiting = q
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"]["state"] == "queued")
        .unwrap();
    assert_eq!(waiting["job"]["id"], ids[2]);
    assert!(
        waiting["reason"].as_str().unwrap().contains("needs 1 free GPU"),
        "{waiting}"
    );
    let done: Vec<Value> = ids.iter().map(|id| e.wait_final(*id)).collect();
    for d in &done {
        assert_eq!(d["job"]["state"], "succeeded");
    }
    let first_end = done[..2]
        .iter()
        .map(|d| d["job"]["finished_at"].as_i64().unwrap())
        .min()
        .unwrap();
    assert!(
        done[2]["attempts"][0]["started_at"].as_i64().unwrap() >= first_end,
        "third job started before a GPU was free"
    );
    let g0: Vec<u64> = done[..2]
        .iter()
        .map(|d| d["attempts"][0]["gpus"][0].as_u64().unwrap())
        .collect();
    assert_ne!(g0[0], g0[1], "the two concurrent jobs must be on different GPUs");
}

#[test]
fn big_job_does_not_block_a_later_small_job() {
    let e = Engine::start(&[]);
    let a = e.submit_yaml("a", &format!("image: {IMAGE}\ncommand: sleep 4\ngpus: 1\n"));
    e.wait_state(a, "running");
    let big = e.submit_yaml("big", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 2\n"));
    let small = e.submit_yaml("small", &format!("image: {IMAGE}\ncommand: sleep 1\ngpus: 1\n"));
    let s = e.wait_final(small);
    assert_eq!(s["job"]["state"], "succeeded");
    let b = e.json(&["show", &big.to_string()]);
    assert!(
        b["job"]["state"] == "queued"
            || b["job"]["started_at"].as_i64().unwrap() > s["job"]["started_at"].as_i64().unwrap(),
        "the small job should have started first: {b}"
    );
    assert_eq!(e.wait_final(big)["job"]["state"], "succeeded");
}

#[test]
fn exit_codes_timeouts_cancels_and_retries_are_recorded() {
    let e = Engine::start(&[]);
    let fail = e.submit_yaml(
        "fail",
        &format!("image: {IMAGE}\ncommand: 'echo failing; exit 3'\ngpus: 0\n"),
    );
    let slow = e.submit_yaml(
        "slow",
        &format!("image: {IMAGE}\ncommand: sleep 60\ngpus: 0\ntimeout: 1s\n"),
    );
    let cancel_me = e.submit_yaml("cancel", &format!("image: {IMAGE}\ncommand: sleep 60\ngpus: 0\n"));
    let retry = e.submit_yaml(
        "retry",
        &format!("image: {IMAGE}\ncommand: 'exit 1'\ngpus: 0\nretries: 1\n"),
    );

    let j = e.wait_final(fail);
    assert_eq!(
        (j["job"]["state"].as_str(), j["job"]["exit_code"].as_i64()),
        (Some("failed"), Some(3))
    );
    assert_eq!(j["attempts"][0]["reason"], "exited");

    let j = e.wait_final(slow);
    assert_eq!(j["job"]["state"], "timed_out");
    assert_eq!(j["attempts"][0]["reason"], "timeout");

    e.wait_state(cancel_me, "running");
    let out = e.gantry(&["cancel", &cancel_me.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let j = e.wait_final(cancel_me);
    assert_eq!(j["job"]["state"], "cancelled");
    assert_eq!(j["attempts"][0]["reason"], "cancelled");

    let j = e.wait_final(retry);
    assert_eq!(j["job"]["state"], "failed");
    assert_eq!(
        j["attempts"].as_array().unwrap().len(),
        2,
        "one retry after the failure: {j}"
    );

    // A queued job cancels at once and never starts.
    let hold = e.submit_yaml("hold", &format!("image: {IMAGE}\ncommand: sleep 30\ngpus: 2\n"));
    e.wait_state(hold, "running");
    let queued = e.submit_yaml("queued", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\n"));
    assert_eq!(e.show(queued)["job"]["state"], "queued");
    assert!(e.gantry(&["cancel", &queued.to_string()]).status.success());
    let j = e.show(queued);
    assert_eq!(j["job"]["state"], "cancelled");
    assert!(j["attempts"].as_array().unwrap().is_empty(), "never started: {j}");
    assert!(e.gantry(&["cancel", &hold.to_string()]).status.success());
    assert_eq!(e.wait_final(hold)["job"]["state"], "cancelled");
}

#[test]
fn oversized_requests_and_missing_images_fail_clearly() {
    let e = Engine::start(&[]);
    let f = e.write_spec("three.yaml", &format!("image: {IMAGE}\ngpus: 3\n"));
    let out = e.gantry(&["submit", f.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("this machine has 2"),
        "{out:?}"
    );

    let id = e.submit_yaml(
        "noimg",
        "image: gantry-test/does-not-exist:1\ncommand: 'true'\ngpus: 0\n",
    );
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "failed");
    assert!(
        j["job"]["message"].as_str().unwrap().contains("could not be pulled"),
        "{j}"
    );
    // Pulled before placing (tests/images.rs): a missing image never gets an attempt, or a retry.
    assert_eq!(
        j["attempts"].as_array().unwrap().len(),
        0,
        "no attempt, no endless retry: {j}"
    );
}

#[test]
fn engine_killed_mid_job_records_each_job_once_with_its_real_exit_code() {
    let mut e = Engine::start(&[]);
    let short = e.submit_yaml(
        "short",
        &format!("image: {IMAGE}\ncommand: 'sleep 2; exit 7'\ngpus: 1\n"),
    );
    let long = e.submit_yaml(
        "long",
        &format!("image: {IMAGE}\ncommand: 'echo before; sleep 8; echo after'\ngpus: 1\n"),
    );
    let short_container = dl_defaults::container_of(&e, short);
    e.wait_state(long, "running");
    e.kill9();
    // `short` ends while no engine runs (its exit is what the restarted engine must find and record).
    let waited = std::process::Command::new("docker")
        .args(["wait", &short_container])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&waited.stdout).trim(), "7");
    e.restart();
    let s = e.wait_final(short);
    assert_eq!(
        (s["job"]["state"].as_str(), s["job"]["exit_code"].as_i64()),
        (Some("failed"), Some(7)),
        "{s}"
    );
    assert_eq!(s["attempts"].as_array().unwrap().len(), 1);
    let l = e.wait_final(long);
    assert_eq!(l["job"]["state"], "succeeded", "{l}");
    assert_eq!(l["attempts"].as_array().unwrap().len(), 1, "the job must not run twice");
    let log = e.logs(long);
    assert!(
        log.contains("before") && log.contains("after"),
        "output after reattaching is kept: {log}"
    );
    for j in [&s, &l] {
        let finals = j["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|ev| ["succeeded", "failed"].contains(&ev["to"].as_str().unwrap()))
            .count();
        assert_eq!(finals, 1, "recorded once: {j}");
    }
    // A container is removed only after its end is committed, so `wait_final` can see the end first.
    e.wait_until("the containers to be removed once their ends are recorded", || {
        e.our_containers().is_empty()
    });
}

#[test]
fn malformed_specs_are_rejected_with_clear_errors_and_the_engine_keeps_running() {
    let e = Engine::start(&[]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad-yaml.yaml", b"image: [unclosed\n".to_vec(), "line 1"),
        (
            "unknown.yaml",
            format!("image: {IMAGE}\ngpu: 2\n").into_bytes(),
            "unknown field `gpu`",
        ),
        (
            "negative.toml",
            format!("image = \"{IMAGE}\"\ngpus = -1\n").into_bytes(),
            "must be 0 or more",
        ),
        (
            "emptyimage.yaml",
            b"image: ''\ncommand: echo\n".to_vec(),
            "`image` is empty",
        ),
        ("huge.yaml", vec![b'#'; 10 * 1024 * 1024], "limited to"),
        ("notes.txt", b"hello".to_vec(), "not a job file"),
    ];
    for (name, body, _) in &cases {
        e.drop_bytes(name, body);
    }
    let target = e.write_spec("target.yaml", &format!("image: {IMAGE}\n"));
    std::os::unix::fs::symlink(&target, e.inbox().join("link.yaml")).unwrap();
    for (name, body, want) in
        cases
            .iter()
            .map(|(n, b, w)| (*n, b.clone(), *w))
            .chain([("link.yaml", vec![], "symbolic link")])
    {
        let report = e.wait_for_rejection(name);
        assert!(report.contains(want), "{name}: {report}");
        assert!(
            report.contains("fix:"),
            "{name}: the report says how to fix it: {report}"
        );
        let kept = std::fs::symlink_metadata(e.inbox().join("rejected").join(name)).expect("the user's file is kept");
        if name != "link.yaml" {
            assert_eq!(
                std::fs::read(e.inbox().join("rejected").join(name)).unwrap(),
                body,
                "the file is unchanged"
            );
        } else {
            assert!(kept.file_type().is_symlink());
        }
    }
    assert!(target.exists(), "the link's target is untouched");
    // A second file with a taken name does not overwrite the first.
    e.drop_bytes("unknown.yaml", b"image: x\nbogus: 1\n");
    e.wait_for_file("rejected", "unknown.yaml.1.error.txt");
    // Still alive and accepting good work.
    e.drop_file("good.yaml", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 0\n"));
    let name = e.wait_for_file("accepted", "-good.yaml");
    let id: i64 = name.split('-').next().unwrap().parse().unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
}

#[test]
fn template_folder_turns_each_config_into_a_job() {
    let e = Engine::start(&[]);
    let t = e.inbox().join("paddle-train");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(
        t.join("gantry.toml"),
        format!("image = \"{IMAGE}\"\ncommand = \"cat {{config}}\"\ngpus = 1\n"),
    )
    .unwrap();
    e.drop_bytes("paddle-train/exp-lr0.1.yaml", b"learning_rate: 0.1\n");
    let name = e.wait_for_file("paddle-train/accepted", "-exp-lr0.1.yaml");
    let id: i64 = name.split('-').next().unwrap().parse().unwrap();
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded");
    assert_eq!(j["job"]["name"], "paddle-train:exp-lr0.1");
    assert!(e.logs(id).contains("learning_rate: 0.1"));
}

#[test]
fn config_files_with_spaces_parentheses_and_colons_run_through_a_string_command_template() {
    let e = Engine::start(&[]);
    let t = e.inbox().join("sweep");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(
        t.join("gantry.toml"),
        format!("image = \"{IMAGE}\"\ncommand = \"cat {{config}}\"\ngpus = 0\n"),
    )
    .unwrap();
    for (name, body) in [
        ("my run.yaml", "a: 1\n"),
        ("lr01 (1).yaml", "b: 2\n"),
        ("lr=0.1:bs=32.yaml", "c: 3\n"),
    ] {
        e.drop_bytes(&format!("sweep/{name}"), body.as_bytes());
        let moved = e.wait_for_file("sweep/accepted", &format!("-{name}"));
        let id: i64 = moved.split('-').next().unwrap().parse().unwrap();
        let j = e.wait_final(id);
        assert_eq!(j["job"]["state"], "succeeded", "{name}: {j}");
        assert!(
            e.logs(id).contains(body.trim()),
            "{name}: the job read its config: {}",
            e.logs(id)
        );
    }
}

#[test]
fn jobs_run_as_their_submitter_and_only_the_owner_may_cancel() {
    let e = Engine::start(&[]);
    let f = e.write_spec("mine.yaml", &format!("image: {IMAGE}\ncommand: 'id -u; id -g; cat /proc/self/status | grep -E \"^(CapEff|NoNewPrivs)\"; sleep 30'\ngpus: 0\n"));
    let out = e.gantry_as(1000, &["submit", "--json", f.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v[0]["job_id"].as_i64().unwrap();
    e.wait_state(id, "running");
    let denied = e.gantry_as(1001, &["cancel", &id.to_string()]);
    assert!(!denied.status.success());
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("only its owner"),
        "{denied:?}"
    );
    let ok = e.gantry_as(1000, &["cancel", &id.to_string()]);
    assert!(ok.status.success(), "{ok:?}");
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "cancelled");
    assert_eq!(j["job"]["owner_uid"], 1000);
    let log = e.logs(id);
    assert!(log.lines().any(|l| l == "1000"), "runs as uid 1000: {log}");
    assert!(log.contains("CapEff:\t0000000000000000"), "no capabilities: {log}");
    assert!(log.contains("NoNewPrivs:\t1"), "no-new-privileges: {log}");
}

#[test]
fn cli_explains_when_no_engine_runs_and_prints_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let out = gantry_in(dir.path(), &["ls"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no Gantry engine is running") && err.contains("gantry daemon"),
        "{err}"
    );
    let out = gantry_in(dir.path(), &["schema"]);
    let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        schema["properties"]["gpu_memory"]["type"]
            .to_string()
            .contains("string"),
        "{schema}"
    );
    assert_eq!(
        schema["properties"]["image"]["default"], "host",
        "no image: this machine's own folders: {schema}"
    );
}

#[test]
fn a_second_engine_on_the_same_state_dir_is_refused() {
    let e = Engine::start(&[]);
    let out = e.gantry(&["daemon", "--gpus", "sim:1x1GiB"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already"), "{out:?}");
    assert!(e.gantry(&["status"]).status.success(), "the first engine keeps running");
}

#[test]
fn job_arrays_dependencies_and_start_estimates() {
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    let prep = e.submit_yaml(
        "prep",
        &format!("name: prep\nimage: {IMAGE}\ncommand: sleep 2\ngpus: 1\nexpected_runtime: 2s\n"),
    );
    let f = e.write_spec("sweep.yaml", &format!(
        "name: sweep\nimage: {IMAGE}\ncommand: 'echo lr={{lr}} bs=$BS'\ngpus: 1\nexpected_runtime: 10m\nafter: [prep]\nmatrix: {{lr: [0.1, 0.01], bs: [32]}}\n"));
    let v = e.json(&["submit", f.to_str().unwrap()]);
    let ids: Vec<i64> = v[0]["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{v}");
    e.wait_until("the sweep to wait for prep", || {
        let q = e.json(&["ls"]);
        q.as_array().unwrap().iter().any(|j| {
            j["job"]["id"] == ids[0]
                && j["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains(&format!("waiting for job {prep} to succeed"))
        }) || e.show(prep)["job"]["state"] == "succeeded"
    });
    for id in &ids {
        assert_eq!(e.wait_final(*id)["job"]["state"], "succeeded");
    }
    let logs: Vec<String> = ids.iter().map(|id| e.logs(*id)).collect();
    assert!(
        logs[0].contains("lr=0.1 bs=32") && logs[1].contains("lr=0.01 bs=32"),
        "{logs:?}"
    );
    let first = e.show(ids[0]);
    assert!(
        first["attempts"][0]["started_at"].as_i64() >= e.show(prep)["job"]["finished_at"].as_i64(),
        "ran after its dependency"
    );

    // A failed dependency fails the dependent job instead of leaving it queued forever.
    let bad = e.submit_yaml(
        "bad",
        &format!("name: bad\nimage: {IMAGE}\ncommand: 'exit 2'\ngpus: 0\n"),
    );
    let dep = e.submit_yaml("dep", &format!("image: {IMAGE}\ngpus: 0\nafter: [{bad}]\n"));
    let j = e.wait_final(dep);
    assert_eq!(j["job"]["state"], "failed");
    assert!(
        j["job"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("dependency job {bad} ended failed")),
        "{j}"
    );

    // Start estimates: a 1-GPU machine busy with a declared 1-hour job.
    let long = e.submit_yaml(
        "long",
        &format!("image: {IMAGE}\ncommand: sleep 60\ngpus: 1\nexpected_runtime: 1h\n"),
    );
    e.wait_state(long, "running");
    let next = e.submit_yaml("next", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\n"));
    e.wait_until("an estimated start", || {
        let q = e.json(&["ls"]);
        q.as_array()
            .unwrap()
            .iter()
            .any(|j| j["job"]["id"] == next && j["estimated_start"].as_i64().is_some())
    });
    let q = e.json(&["ls"]);
    let eta = q.as_array().unwrap().iter().find(|j| j["job"]["id"] == next).unwrap()["estimated_start"]
        .as_i64()
        .unwrap();
    let started = e.show(long)["attempts"][0]["started_at"].as_i64().unwrap();
    assert!(
        (eta - (started + 3_600_000)).abs() < 5_000,
        "starts when the 1-hour job ends: {eta} vs {started}"
    );
    assert!(e.gantry(&["cancel", &long.to_string()]).status.success());
}
