//! The NVML backend against the fake NVML library (tests/fake-nvml): what the engine reads from the
//! driver, who holds each GPU (this engine's jobs by their containers, everything else by pid, user and
//! command), and the GPU DeviceRequest of job containers (issue 12, items 1, 2 and 4).

use crate::helpers::*;
use serde_json::Value;
use std::process::{Child, Command};

const H100: &str = "NVIDIA H100 80GB HBM3";

/// A process that is killed when the test ends, pass or fail.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A container outside Gantry (`docker run --gpus`), removed when the test ends.
struct Outside(String);
impl Drop for Outside {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn text(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The main process of a running job's container, as the host sees it.
fn job_pid(e: &Engine, id: i64) -> (u32, String) {
    let d = e.wait_state(id, "running");
    let cid = d["attempts"].as_array().unwrap().last().unwrap()["container_id"]
        .as_str()
        .expect("a running job has a container")
        .to_string();
    (docker(&["inspect", "-f", "{{.State.Pid}}", &cid]).parse().unwrap(), cid)
}

fn users_on(g: &Value, gpu: u64) -> Vec<Value> {
    g["users"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["gpu"] == gpu)
        .cloned()
        .collect()
}

#[test]
fn nvml_backend_reports_the_drivers_gpus_and_names_the_library() {
    let gpus = FakeGpus::new();
    gpus.set(serde_json::json!([
        fake_gpu(&gpus.uuid(0), H100, 80, 0, &[]),
        fake_gpu(&gpus.uuid(1), "NVIDIA A100-SXM4-40GB", 40, 0, &[])
    ]));
    let e = Engine::start_nvml(&gpus, &[]);

    let g = e.json(&["gpus"]);
    assert_eq!(g["backend"], "nvml", "{g}");
    assert_eq!(
        g["library"].as_str(),
        Some(fake_nvml_lib().to_str().unwrap()),
        "a test double must be named: {g}"
    );
    let rows: Vec<(String, String, u64)> = g["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["uuid"].as_str().unwrap().into(),
                s["name"].as_str().unwrap().into(),
                s["memory_total"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (gpus.uuid(0), H100.into(), 80 << 30),
            (gpus.uuid(1), "NVIDIA A100-SXM4-40GB".into(), 40 << 30)
        ]
    );

    // Humans are told which library answers, in `gpus` and `status`.
    let listing = text(&e.gantry(&["gpus"]));
    assert!(
        listing.contains(&format!("NVML from {}", fake_nvml_lib().display())) && listing.contains("GANTRY_NVML_LIB"),
        "{listing}"
    );
    assert!(
        listing.lines().any(|l| l.contains(H100) && l.ends_with("free")),
        "{listing}"
    );
    let status = text(&e.gantry(&["status"]));
    assert!(
        status.contains(&format!("2 GPU(s), NVML from {}", fake_nvml_lib().display())),
        "{status}"
    );

    // The driver's readings change: the engine follows (the fake re-reads its file when it changes).
    let mut busy = fake_gpu(&gpus.uuid(0), H100, 80, 30, &[]);
    busy["utilization"] = 97.into();
    gpus.set(serde_json::json!([
        busy,
        fake_gpu(&gpus.uuid(1), "NVIDIA A100-SXM4-40GB", 40, 0, &[])
    ]));
    e.wait_until("the new reading", || {
        let g = e.json(&["gpus"]);
        g["gpus"][0]["utilization"] == 97 && g["gpus"][0]["memory_used"] == 30u64 << 30
    });
}

#[test]
fn a_process_outside_gantry_makes_its_gpu_busy_and_is_listed_with_its_user_and_command() {
    let bob = user("gantry-bob");
    let notebook = Proc(bob.command("sleep").arg("300").spawn().unwrap());
    let pid = notebook.0.id();
    let gpus = FakeGpus::new();
    gpus.set(serde_json::json!([
        fake_gpu(&gpus.uuid(0), H100, 80, 3, &[(pid, 3)]),
        fake_gpu(&gpus.uuid(1), H100, 80, 0, &[])
    ]));
    let e = Engine::start_nvml(&gpus, &[]);

    let g = e.json_as(&bob, &["gpus"]);
    let on0 = users_on(&g, 0);
    assert_eq!(on0.len(), 1, "{g}");
    assert_eq!(
        (
            on0[0]["pid"].as_u64(),
            on0[0]["user"].as_str(),
            on0[0]["command"].as_str(),
            on0[0]["job_id"].as_i64(),
            on0[0]["used_memory"].as_u64()
        ),
        (
            Some(pid as u64),
            Some("gantry-bob"),
            Some("sleep 300"),
            None,
            Some(3 << 30)
        ),
        "{g}"
    );
    assert!(users_on(&g, 1).is_empty(), "{g}");

    let listing = text(&e.gantry_user(&bob, &["gpus"]));
    let row0 = listing
        .lines()
        .find(|l| l.contains(H100) && l.trim_start().starts_with('0'))
        .unwrap();
    assert!(row0.ends_with("busy: outside Gantry"), "GPU 0 is not free: {listing}");
    assert!(
        listing.contains(&format!(
            "outside Gantry (pid {pid}, user gantry-bob, command sleep 300), 3.0 GiB"
        )),
        "{listing}"
    );
    let row1 = listing
        .lines()
        .find(|l| l.contains(H100) && l.trim_start().starts_with('1'))
        .unwrap();
    assert!(row1.ends_with("free"), "{listing}");

    // The scheduler agrees: a job that needs both GPUs waits, and says why.
    let id = e.submit_yaml("both", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 2\n"));
    e.wait_until("a reason naming the outside process", || {
        e.show(id)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("GPU 0 in use outside this engine"))
    });
    assert_eq!(e.show(id)["job"]["state"], "queued");
}

/// Issue 21 item 5: a process outside Gantry on a GPU that reads 0 % is shown "idle for …" (from
/// a minute on), so an admin can act; one on a busy GPU is not, and work ends the idleness.
#[test]
fn an_outside_process_on_an_idle_gpu_is_shown_idle_for_and_a_busy_one_is_not() {
    let forgotten = Proc(Command::new("sleep").arg("301").spawn().unwrap());
    let working = Proc(Command::new("sleep").arg("302").spawn().unwrap());
    let (idle_pid, busy_pid) = (forgotten.0.id(), working.0.id());
    let gpus = FakeGpus::new();
    let mut busy = fake_gpu(&gpus.uuid(1), H100, 80, 20, &[(busy_pid, 20)]);
    busy["utilization"] = 93.into();
    gpus.set(serde_json::json!([
        fake_gpu(&gpus.uuid(0), H100, 80, 3, &[(idle_pid, 3)]),
        busy
    ]));
    let e = Engine::start_nvml(&gpus, &[]);

    let line_of = |listing: &str, pid: u32| {
        listing
            .lines()
            .find(|l| l.contains(&format!("pid {pid},")))
            .map(String::from)
            .unwrap_or_default()
    };
    // Under a minute at 0 %: not called idle yet (a pause in a training loop is not idleness).
    let early = text(&e.gantry(&["gpus"]));
    assert!(
        line_of(&early, idle_pid).contains("outside Gantry") && !early.contains("idle for"),
        "{early}"
    );
    // A minute of 0 % samples (the engine samples at 1 Hz); generous: the machine is shared.
    let t = std::time::Instant::now();
    let listing = loop {
        let l = text(&e.gantry(&["gpus"]));
        if line_of(&l, idle_pid).contains("idle for") {
            break l;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(240),
            "no \"idle for\" after 4 min: {l}\n{}",
            e.daemon_log()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let idle = line_of(&listing, idle_pid);
    assert!(
        idle.contains(&format!(
            "outside Gantry (pid {idle_pid}, user root, command sleep 301), 3.0 GiB, idle for 1 min"
        )),
        "{listing}"
    );
    let other = line_of(&listing, busy_pid);
    assert!(
        other.contains("command sleep 302") && !other.contains("idle"),
        "the busy GPU's process is not idle: {listing}"
    );
    let g = e.json(&["gpus"]);
    let (on0, on1) = (users_on(&g, 0), users_on(&g, 1));
    assert!(
        on0[0]["idle_since"].as_i64().is_some() && on1[0].get("idle_since").is_none(),
        "{g}"
    );

    // The forgotten process starts working: no longer idle.
    let mut woke = fake_gpu(&gpus.uuid(0), H100, 80, 3, &[(idle_pid, 3)]);
    woke["utilization"] = 50.into();
    let mut busy = fake_gpu(&gpus.uuid(1), H100, 80, 20, &[(busy_pid, 20)]);
    busy["utilization"] = 93.into();
    gpus.set(serde_json::json!([woke, busy]));
    e.wait_until("GPU 0 used again", || !text(&e.gantry(&["gpus"])).contains("idle for"));
}

#[test]
fn processes_in_a_jobs_container_are_the_jobs_and_a_docker_run_container_is_named() {
    require_gpu_docker();
    let alice = user("gantry-alice");
    let gpus = FakeGpus::new();
    gpus.set(serde_json::json!([
        fake_gpu(&gpus.uuid(0), H100, 80, 0, &[]),
        fake_gpu(&gpus.uuid(1), H100, 80, 0, &[])
    ]));
    let e = Engine::start_nvml(&gpus, &[]);
    let dir = alice.private_dir("nvml-attr");
    let spec = alice.write(
        &dir.join("train.yaml"),
        &format!("name: train\nimage: {IMAGE}\ncommand: sleep 300\ngpus: 1\n"),
    );
    let id = e.json_as(&alice, &["submit", spec.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    let (pid, _) = job_pid(&e, id);
    let gpu = e.show(id)["attempts"].as_array().unwrap().last().unwrap()["gpus"][0]
        .as_u64()
        .unwrap();
    let other = 1 - gpu;

    // Someone's `docker run --gpus` on the other GPU.
    let name = format!("nvml-outside-{}", std::process::id());
    let outside = Outside(docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "--gpus",
        &format!("device={}", gpus.uuid(other as u32)),
        IMAGE,
        "sleep",
        "300",
    ]));
    let outside_pid: u32 = docker(&["inspect", "-f", "{{.State.Pid}}", &outside.0])
        .parse()
        .unwrap();

    let mut list = vec![Value::Null, Value::Null];
    list[gpu as usize] = fake_gpu(&gpus.uuid(gpu as u32), H100, 80, 2, &[(pid, 2)]);
    list[other as usize] = fake_gpu(&gpus.uuid(other as u32), H100, 80, 5, &[(outside_pid, 5)]);
    gpus.set(Value::Array(list));
    let mut g = Value::Null;
    e.wait_until("the engine to read both processes (and name the container)", || {
        g = e.json(&["gpus"]);
        users_on(&g, gpu).iter().any(|u| u["used_memory"] == 2u64 << 30)
            && users_on(&g, other)
                .iter()
                .any(|u| u["pid"] == outside_pid && u["container"] == name)
    });
    let mine = users_on(&g, gpu);
    assert_eq!(mine.len(), 1, "the job's process is the job, not an outsider: {g}");
    assert_eq!(
        (
            mine[0]["job_id"].as_i64(),
            mine[0]["job_name"].as_str(),
            mine[0]["user"].as_str()
        ),
        (Some(id), Some("train"), Some("gantry-alice")),
        "{g}"
    );
    let theirs = users_on(&g, other);
    assert_eq!(theirs.len(), 1, "{g}");
    assert_eq!(
        (
            theirs[0]["job_id"].as_i64(),
            theirs[0]["container"].as_str(),
            theirs[0]["command"].as_str()
        ),
        (None, Some(name.as_str()), Some("sleep 300")),
        "{g}"
    );

    let listing = text(&e.gantry(&["gpus"]));
    assert!(
        listing.contains(&format!("job {id} train (gantry-alice), 2.0 GiB")),
        "{listing}"
    );
    assert!(
        listing.contains(&format!(
            "outside Gantry (pid {outside_pid}, user root, command sleep 300) in container {name}, 5.0 GiB"
        )),
        "{listing}"
    );
    let row = |i: u64| {
        listing
            .lines()
            .find(|l| l.contains(H100) && l.trim_start().starts_with(&i.to_string()))
            .unwrap()
            .to_string()
    };
    assert!(row(gpu).ends_with(&format!("job {id}")), "{listing}");
    assert!(row(other).ends_with("busy: outside Gantry"), "{listing}");
}

#[test]
fn memory_used_outside_gantry_reduces_what_shared_jobs_may_pack() {
    require_gpu_docker();
    let gpus = FakeGpus::new();
    gpus.set(serde_json::json!([fake_gpu(&gpus.uuid(0), H100, 24, 0, &[])]));
    let e = Engine::start_nvml(&gpus, &[]);
    let a = e.submit_yaml(
        "a",
        &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\ngpu_memory: 4GiB\n"),
    );
    let (pid, _) = job_pid(&e, a);
    // Job a uses 1 GiB; 12 GiB more are used by something NVML lists no compute process for (a
    // display server, a process in another PID namespace). 24 - 4 declared - 12 = 8 GiB are left.
    gpus.set(serde_json::json!([fake_gpu(&gpus.uuid(0), H100, 24, 13, &[(pid, 1)])]));
    e.wait_until("the engine to read 13 GiB used", || {
        e.json(&["gpus"])["gpus"][0]["memory_used"] == 13u64 << 30
    });

    let b = e.submit_yaml(
        "b",
        &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\ngpu_memory: 10GiB\n"),
    );
    e.wait_until("b to wait with the reason", || {
        e.show(b)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("GPU 0 has 8.0 GiB free (12.0 GiB used outside Gantry), needs 10.0 GiB"))
    });
    assert_eq!(e.show(b)["job"]["state"], "queued");
    // It fits once the outsider is gone.
    gpus.set(serde_json::json!([fake_gpu(&gpus.uuid(0), H100, 24, 1, &[(pid, 1)])]));
    e.wait_state(b, "succeeded");
}

#[test]
fn gpu_jobs_carry_a_device_request_for_exactly_their_gpus_and_cpu_jobs_none() {
    require_gpu_docker();
    let gpus = FakeGpus::new();
    gpus.set(serde_json::json!((0..3)
        .map(|i| fake_gpu(&gpus.uuid(i), H100, 80, 0, &[]))
        .collect::<Vec<_>>()));
    let e = Engine::start_nvml(&gpus, &[]);
    let two = e.submit_yaml("two", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 2\n"));
    let one = e.submit_yaml("one", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\n"));
    let cpu = e.submit_yaml("cpu", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 0\n"));
    let requests = |id: i64| -> (Vec<String>, Value) {
        let (_, cid) = job_pid(&e, id);
        let d = e.show(id);
        let want = d["attempts"].as_array().unwrap().last().unwrap()["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| gpus.uuid(g.as_u64().unwrap() as u32))
            .collect();
        (
            want,
            serde_json::from_str(&docker(&["inspect", "-f", "{{json .HostConfig.DeviceRequests}}", &cid])).unwrap(),
        )
    };
    let mut seen = vec![];
    for (id, n) in [(two, 2), (one, 1)] {
        let (want, got) = requests(id);
        assert_eq!(want.len(), n);
        let r = got
            .as_array()
            .filter(|r| r.len() == 1)
            .unwrap_or_else(|| panic!("job {id}: one DeviceRequest, got {got}"));
        let ids: Vec<String> = r[0]["DeviceIDs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, want, "job {id}: {got}");
        assert_eq!(r[0]["Capabilities"], serde_json::json!([["gpu"]]), "job {id}: {got}");
        assert_eq!(r[0]["Driver"], "nvidia", "job {id}: {got}");
        assert!(
            r[0]["Count"].as_i64().unwrap_or(0) == 0,
            "never a count with device ids: {got}"
        );
        seen.extend(ids);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3, "no GPU in two jobs: {seen:?}");
    let (_, got) = requests(cpu);
    assert!(
        got.is_null() || got.as_array().is_some_and(|a| a.is_empty()),
        "a CPU-only job has no DeviceRequest: {got}"
    );
}

/// Issue 18 item 15: a job sharing a GPU that uses more than its `gpu_memory` (past the lab's
/// margin) is warned in its log, then stopped after the lab's grace with the reason in its history,
/// while its neighbour within its own declaration runs on.
#[test]
fn a_shared_job_over_its_declared_gpu_memory_is_warned_then_stopped() {
    require_gpu_docker();
    let gpus = FakeGpus::new();
    gpus.set(serde_json::json!([fake_gpu(&gpus.uuid(0), H100, 24, 0, &[])]));
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(&lab, "[jobs]\ngpu_memory_margin = \"20%\"\ngpu_memory_grace = \"3s\"\n").unwrap();
    let e = Engine::start_nvml(&gpus, &["--config", lab.to_str().unwrap()]);
    let greedy = e.submit_yaml(
        "greedy",
        &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\ngpu_memory: 4GiB\n"),
    );
    let fair = e.submit_yaml(
        "fair",
        &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\ngpu_memory: 4GiB\n"),
    );
    let (greedy_pid, _) = job_pid(&e, greedy);
    let (fair_pid, _) = job_pid(&e, fair);
    // Within the margin: nothing happens.
    gpus.set(serde_json::json!([fake_gpu(
        &gpus.uuid(0),
        H100,
        24,
        8,
        &[(greedy_pid, 4), (fair_pid, 4)]
    )]));
    e.wait_until("the engine to read 8 GiB used", || {
        e.json(&["gpus"])["gpus"][0]["memory_used"] == 8u64 << 30
    });
    // The greedy one takes 10 GiB.
    gpus.set(serde_json::json!([fake_gpu(
        &gpus.uuid(0),
        H100,
        24,
        14,
        &[(greedy_pid, 10), (fair_pid, 4)]
    )]));
    e.wait_until("the warning in its log", || e.logs(greedy).contains("WARNING: uses 10.0 GiB of GPU 0, more than its declared gpu_memory of 4.0 GiB and the lab's 20% margin (jobs.gpu_memory_margin in"));
    let d = e.wait_final(greedy);
    assert_eq!(d["job"]["state"], "failed", "{d}");
    let msg = d["job"]["message"].as_str().unwrap_or("");
    assert!(
        msg.starts_with("stopped: used 10.0 GiB of GPU 0 for 3s, more than its declared gpu_memory of 4.0 GiB")
            && msg.contains("`gpu_memory: 10GiB`"),
        "{d}"
    );
    assert_eq!(d["attempts"][0]["reason"], "oom", "{d}");
    let h = e.json(&["history"]);
    let row = h
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == greedy)
        .cloned()
        .unwrap();
    assert_eq!(row["status"], "failed", "{row}");
    assert!(!e.logs(fair).contains("WARNING"), "{}", e.logs(fair));
    assert_eq!(
        e.show(fair)["job"]["state"],
        "running",
        "the neighbour within its declaration runs on"
    );

    // The learned estimate is corrected: the same job again is placed, and held, at the 10 GiB it
    // used, not the 4 GiB it declares. 24 - 4 (fair) - 10 = 10 GiB are left: a 12 GiB job waits
    // (with the declaration trusted, 16 GiB would be left and it would start).
    gpus.set(serde_json::json!([fake_gpu(
        &gpus.uuid(0),
        H100,
        24,
        4,
        &[(fair_pid, 4)]
    )]));
    e.wait_until("the engine to read 4 GiB used", || {
        e.json(&["gpus"])["gpus"][0]["memory_used"] == 4u64 << 30
    });
    let again = e.submit_yaml(
        "greedy",
        &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\ngpu_memory: 4GiB\n"),
    );
    let (again_pid, _) = job_pid(&e, again);
    let big = e.submit_yaml(
        "big",
        &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\ngpu_memory: 12GiB\n"),
    );
    e.wait_until("the 12 GiB job to wait for the corrected memory", || {
        e.show(big)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("needs 12.0 GiB"))
    });
    assert_eq!(e.show(big)["job"]["state"], "queued", "{}", e.show(big));
    gpus.set(serde_json::json!([fake_gpu(
        &gpus.uuid(0),
        H100,
        24,
        14,
        &[(again_pid, 10), (fair_pid, 4)]
    )]));
    // Within what it is now held to (10 GiB + 20%), it is not warned.
    e.wait_until("the engine to read the rerun's 10 GiB", || {
        e.json(&["gpus"])["users"]
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u["job_id"] == again && u["used_memory"] == 10u64 << 30)
    });
    assert_eq!(e.show(again)["job"]["state"], "running");
    assert!(!e.logs(again).contains("WARNING"), "{}", e.logs(again));
}
