//! Issue 8, item 6: `gantry run` queues a job from flags (no file), checked like a written spec;
//! `gantry hold` / `release` keep a queued job from starting, for its owner only.

use crate::helpers::*;
use serde_json::Value;

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
fn run_queues_a_job_from_flags_with_the_command_as_a_list() {
    let e = Engine::start(&[]);
    // `--json` before `--`: everything after it is the job's command.
    let out = e.gantry(&[
        "--json",
        "run",
        "--gpus",
        "0",
        "--image",
        IMAGE,
        "--name",
        "quick",
        "--env",
        "GREETING=hi there",
        "--",
        "echo",
        "hello run",
        "$GREETING",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["job_id"].as_i64().unwrap_or_else(|| panic!("{v}"));
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    assert!(
        e.logs(id).contains("hello run $GREETING"),
        "exec form, no shell: {}",
        e.logs(id)
    );
    let spec = &j["job"]["job"]["spec"];
    assert_eq!(
        spec["command"],
        serde_json::json!(["echo", "hello run", "$GREETING"]),
        "{j}"
    );
    assert_eq!(spec["env"]["GREETING"], "hi there");
    assert_eq!(j["job"]["name"], "quick");
    assert_eq!(j["job"]["gpus"], 0);

    // Bad values get the spec's own messages (without line numbers of a file nobody wrote).
    let out = e.gantry(&[
        "run",
        "--gpus",
        "0",
        "--image",
        IMAGE,
        "--timeout",
        "soon",
        "--",
        "true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("`timeout` \"soon\" is not a duration") && !err.contains("line "),
        "{err}"
    );
}

#[test]
fn run_mounts_are_checked_as_the_user_and_relative_to_the_working_directory() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let mine = alice.private_dir("run");
    alice.write(&mine.join("data.txt"), "alice's data\n");
    // Relative to where alice runs the command, like a spec file's folder.
    let out = alice
        .command(bin())
        .args([
            "--state-dir",
            e.state.to_str().unwrap(),
            "--json",
            "run",
            "--gpus",
            "0",
            "--image",
            IMAGE,
            "--mount",
            "data.txt:/d.txt:ro",
            "--",
            "cat",
            "/d.txt",
        ])
        .current_dir(&mine)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["job_id"]
        .as_i64()
        .unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
    assert!(e.logs(id).contains("alice's data"));

    let secret = bob.private_dir("run-secret");
    let mount = format!("{}:/s:ro", secret.display());
    let out = e.gantry_user(
        &alice,
        &[
            "run", "--gpus", "0", "--image", IMAGE, "--mount", &mount, "--", "ls", "/s",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "alice must not mount bob's private folder: {err}"
    );
    assert!(
        err.contains(&format!("mount \"{mount}\": gantry-alice cannot")) && err.contains("permission denied"),
        "{err}"
    );
    assert!(e.json(&["ls"]).as_array().unwrap().is_empty(), "nothing was queued");
}

#[test]
fn a_held_job_waits_with_a_reason_until_its_owner_releases_it() {
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let run = |name: &str, cmd: &str| -> i64 {
        let v = e.json_as(
            &alice,
            &["run", "--gpus", "1", "--image", IMAGE, "--name", name, "--shell", cmd],
        );
        v["job_id"].as_i64().unwrap()
    };
    let blocker = run("blocker", "sleep 60");
    e.wait_state(blocker, "running");
    // Issue 28 (smaller): `gantry run` says preemptible and checkpoint as a spec would.
    let held = e.json_as(
        &alice,
        &[
            "run",
            "--gpus",
            "1",
            "--image",
            IMAGE,
            "--name",
            "held",
            "--preemptible",
            "--checkpoint",
            "usr1:45s",
            "--shell",
            "echo held ran",
        ],
    )["job_id"]
        .as_i64()
        .unwrap();
    let spec = &e.show(held)["job"]["job"]["spec"];
    assert_eq!(spec["preemptible"], true, "{spec}");
    assert_eq!(
        spec["checkpoint"],
        serde_json::json!({"signal": "usr1", "grace": "45s"}),
        "{spec}"
    );
    let out = e.gantry_user(&alice, &["hold", &held.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Bob can neither hold nor release alice's job.
    for verb in ["release", "hold"] {
        let out = e.gantry_user(&bob, &[verb, &held.to_string()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("belongs to gantry-alice") && err.contains("only its owner or root"),
            "{verb}: {err}"
        );
    }

    let later = run("later", "echo later ran");
    assert!(e.gantry(&["cancel", &blocker.to_string()]).status.success());
    assert_eq!(
        e.wait_final(later)["job"]["state"],
        "succeeded",
        "a later job runs while the held one waits"
    );
    e.wait_until("the held job's reason", || {
        queue_entry(&e, held)["reason"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("held by its owner (`gantry release {held}`)"))
    });
    let j = e.show(held);
    assert_eq!(j["job"]["state"], "queued", "{j}");
    // Issue 28 (smaller): `gantry logs` of a queued job says so (it printed nothing).
    let out = e.gantry_user(&alice, &["logs", &held.to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && err.contains(&format!("job {held} is queued, not started yet: held by its owner"))
            && err.contains(&format!("`gantry logs -f {held}` waits for its output")),
        "{err}"
    );
    assert!(j["attempts"].as_array().unwrap().is_empty(), "never started: {j}");
    assert!(
        j["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|ev| ev["message"] == "held by gantry-alice"),
        "{j}"
    );

    let out = e.gantry_user(&alice, &["release", &held.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(e.wait_final(held)["job"]["state"], "succeeded");
    assert!(e.logs(held).contains("held ran"));
    let out = e.gantry_user(&alice, &["hold", &held.to_string()]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("only queued jobs can be held"),
        "{out:?}"
    );
}

/// Issue 22, item 6: what `ls`, `show`, `history` and `usage` print means what it says. A CPU job says
/// "CPU only" (not "on GPU " or "GPU []"), `ls` labels the request ASKS and `history` the GPUs a run
/// had ON GPU, a `gantry run` job says it came from `gantry run` (there is no file), and the
/// fair-share half-life reads as the lab config writes it.
#[test]
fn what_ls_show_history_and_usage_print_says_what_it_means() {
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    let text = |args: &[&str]| {
        let out = e.gantry(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let run = |args: &[&str]| text(&[&["--json", "run", "--image", IMAGE][..], args].concat());
    let id_of = |out: String| serde_json::from_str::<Value>(&out).unwrap()["job_id"].as_i64().unwrap();
    let cpu = id_of(run(&["--gpus", "0", "--name", "cpu-job", "--", "sleep", "60"]));
    let gpu = id_of(run(&["--gpus", "1", "--name", "gpu-job", "--", "sleep", "60"]));
    e.wait_state(cpu, "running");
    e.wait_state(gpu, "running");

    let ls = text(&["ls"]);
    let header = ls.lines().next().unwrap();
    assert!(
        header.contains("ASKS") && !header.contains("GPUS"),
        "the request is labelled: {ls}"
    );
    let row = |id: i64| {
        ls.lines()
            .find(|l| l.trim_start().starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no row for {id}: {ls}"))
            .to_string()
    };
    assert!(row(cpu).contains("CPU only") && !row(cpu).contains("GPU"), "{ls}");
    assert!(
        row(gpu).contains("1 GPU") && row(gpu).trim_end().ends_with("on GPU 0"),
        "{ls}"
    );

    let show = text(&["show", &cpu.to_string()]);
    assert!(
        show.contains("gpus:      CPU only") && show.contains("attempt 1: CPU only ") && !show.contains("GPU []"),
        "{show}"
    );
    assert!(show.contains("from gantry run") && !show.contains("api:"), "{show}");
    assert_eq!(e.show(gpu)["job"]["source"], "gantry run");
    let show = text(&["show", &gpu.to_string()]);
    assert!(show.contains("attempt 1: GPU 0 "), "{show}");

    for id in [cpu, gpu] {
        assert!(e.gantry(&["cancel", &id.to_string()]).status.success());
    }
    for id in [cpu, gpu] {
        e.wait_final(id);
    }
    let history = text(&["history"]);
    let header = history.lines().next().unwrap();
    assert!(
        header.contains("ON GPU") && !header.contains("GPUS"),
        "the GPUs a run had are labelled: {history}"
    );

    let usage = text(&["usage"]);
    assert!(usage.contains("GPU-hours halve every 1d)"), "{usage}");
}
