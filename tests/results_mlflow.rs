//! The MLflow endpoint (issue 30): a real `mlflow-skinny` client in an image-less job logs to the
//! endpoint its attempt is given; another user's job and a host process cannot reach it, a wrong
//! token, an oversized body and an unknown endpoint are refused without harm; and attempts leave
//! no file descriptor or thread behind in the engine.

use crate::helpers::*;
use serde_json::Value;
use std::path::Path;

fn submit_as(e: &Engine, u: &User, dir: &Path, file: &str, text: &str) -> i64 {
    let f = u.write(&dir.join(file), text);
    let v = e.json_as(u, &["submit", f.to_str().unwrap()]);
    v[0]["job_ids"][0]
        .as_i64()
        .unwrap_or_else(|| panic!("submit failed: {v}"))
}

fn out(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The venv `scripts/mlflow-venv.sh` makes (made here when missing).
fn mlflow_venv() -> String {
    let venv = std::env::var("GANTRY_TEST_MLFLOW_VENV").unwrap_or_else(|_| "/var/cache/gantry-test/mlflow-venv".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mlflow-venv.sh");
    let o = std::process::Command::new(script)
        .output()
        .expect("run scripts/mlflow-venv.sh");
    assert!(o.status.success(), "scripts/mlflow-venv.sh: {}", out(&o));
    venv
}

/// An image-less job in `dir` running `command` with the venv's python first on PATH.
fn python_job(name: &str, dir: &Path, venv: &str, command: &str) -> String {
    let d = dir.display();
    format!(
        "name: {name}\nimage: host\ngpus: 0\nworkdir: {d}\nmounts: ['{d}:{d}', '{venv}:{venv}:ro']\nenv: {{PATH: '{venv}/bin:/usr/local/bin:/usr/bin:/bin'}}\ncommand: {command}\n"
    )
}

const TRAIN: &str = r#"import mlflow
mlflow.set_experiment("sweep")
with mlflow.start_run(run_name="lr-0.01"):
    mlflow.log_param("lr", 0.01)
    mlflow.log_params({"batch_size": 32, "optimizer": "adam"})
    for step in range(20):
        mlflow.log_metric("train/loss", 1.0 / (step + 1), step=step)
    mlflow.log_metrics({"val/acc": 0.91, "diverged": float("nan")}, step=19)
    mlflow.set_tag("stage", "dev")
    try:
        mlflow.log_artifact("train.py")
    except Exception as e:
        print("artifact refused:", e)
print("trained")
"#;

#[test]
fn a_real_mlflow_client_in_an_image_less_job_logs_metrics_params_and_tags() {
    let venv = mlflow_venv();
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-mlflow");
    alice.write(&dir.join("train.py"), TRAIN);
    let id = submit_as(
        &e,
        &alice,
        &dir,
        "train.yaml",
        &python_job("train", &dir, &venv, "python train.py"),
    );
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    assert!(e.logs(id).contains("trained"), "{}", e.logs(id));
    // Artifacts are not kept, and the client says so (rather than copying files somewhere).
    assert!(
        e.logs(id).contains("artifact refused") && e.logs(id).contains("ENDPOINT_NOT_FOUND"),
        "{}",
        e.logs(id)
    );
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    for want in [
        "lr = 0.01",
        "batch_size = 32",
        "optimizer = adam",
        "train/loss",
        "0.05 @ step 19",
        "[20 points]",
        "val/acc",
        "0.91 @ step 19",
        "NaN @ step 19",
        "stage = dev",
        "mlflow.runName = lr-0.01",
        "mlflow.experimentName = sweep",
    ] {
        assert!(show.contains(want), "{want:?} missing from:\n{show}");
    }
}

const LONG: &str = r#"import os, time
import mlflow
with mlflow.start_run(run_name="long"):
    mlflow.log_metric("loss", 1.0, step=0)
    open("logged", "w").close()
    while not os.path.exists("restarted"):
        time.sleep(0.1)
    mlflow.log_metric("loss", 0.5, step=1)
    mlflow.log_param("after", "restart")
print("finished")
"#;

#[test]
fn an_mlflow_run_goes_on_across_an_engine_restart() {
    let venv = mlflow_venv();
    let mut e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-mlflow-restart");
    alice.write(&dir.join("long.py"), LONG);
    let id = submit_as(
        &e,
        &alice,
        &dir,
        "long.yaml",
        &python_job("long", &dir, &venv, "python long.py"),
    );
    e.wait_until("the first point logged", || dir.join("logged").exists());
    // The engine dies (its listener with it) and comes back: it binds the same endpoint again.
    let old = e.pid();
    e.kill9();
    e.restart();
    assert_ne!(e.pid(), old);
    std::fs::write(dir.join("restarted"), "").unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(
        show.contains("0.5 @ step 1") && show.contains("[2 points]") && show.contains("after = restart"),
        "{show}"
    );
}

/// Alice's job: records what its endpoint says to requests it should refuse, then holds on until
/// the test has tried to reach the endpoint from outside.
const PROBE: &str = r#"import json, os, time, urllib.request, urllib.error
uri, tok = os.environ["MLFLOW_TRACKING_URI"], os.environ["MLFLOW_TRACKING_TOKEN"]
def call(method, route, body=None, token=tok, raw=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(uri + "/api/2.0/mlflow/" + route, data=data, method=method)
    req.add_header("Authorization", "Bearer " + token)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return [r.status, json.loads(r.read() or b"{}")]
    except urllib.error.HTTPError as e:
        return [e.code, json.loads(e.read() or b"{}")]
    except OSError as e:
        return ["refused", str(e)]
out = {"wrong_token": call("POST", "runs/create", {}, token="0" * len(tok)),
       "no_token": call("POST", "runs/create", {}, token=""),
       "huge": call("POST", "runs/log-batch", raw=b"{" + b" " * (3 << 20) + b"}"),
       "unknown": call("GET", "runs/search")}
st, run = call("POST", "runs/create", {"run_name": "probe"})
out["create"] = st
out["after"] = call("POST", "runs/log-metric", {"run_id": run["run"]["info"]["run_id"], "key": "after_huge", "value": 1, "step": 0})[0]
json.dump(out, open("probe.tmp", "w"))
open("uri.tmp", "w").write(uri)
os.rename("probe.tmp", "probe.json")
os.rename("uri.tmp", "uri")
for _ in range(3000):
    if os.path.exists("go"):
        break
    time.sleep(0.1)
"#;

const CONNECT: &str = "import socket, sys\ns = socket.socket()\ns.settimeout(5)\nprint('connect:', s.connect_ex(('127.0.0.1', int(sys.argv[1]))))\n";

#[test]
fn another_users_job_and_host_processes_cannot_reach_a_jobs_mlflow_endpoint_and_bad_requests_do_no_harm() {
    let venv = mlflow_venv();
    // Bob's job runs while Alice's holds on (CPU-only jobs otherwise share one slot).
    let e = Engine::start_unbounded_cpu_only(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = alice.private_dir("results-mlflow-probe");
    alice.write(&dir.join("probe.py"), PROBE);
    let id = submit_as(
        &e,
        &alice,
        &dir,
        "probe.yaml",
        &python_job("probe", &dir, &venv, "python probe.py"),
    );
    e.wait_until("the probe's answers", || dir.join("uri").exists());
    let probe: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("probe.json")).unwrap()).unwrap();
    assert_eq!(probe["wrong_token"][0], 401, "{probe}");
    assert_eq!(probe["wrong_token"][1]["error_code"], "UNAUTHENTICATED", "{probe}");
    assert_eq!(probe["no_token"][0], 401, "{probe}");
    // 413, or the connection closed while the client was still sending: nothing read, nothing kept.
    assert!(probe["huge"][0] == 413 || probe["huge"][0] == "refused", "{probe}");
    assert_eq!(probe["unknown"][0], 404, "{probe}");
    assert_eq!(probe["unknown"][1]["error_code"], "ENDPOINT_NOT_FOUND", "{probe}");
    let msg = probe["unknown"][1]["message"].as_str().unwrap();
    assert!(
        msg.contains("runs/log-batch") && msg.contains("MLFLOW_TRACKING_URI"),
        "{msg}"
    );
    assert_eq!(
        (probe["create"].clone(), probe["after"].clone()),
        (200.into(), 200.into()),
        "{probe}"
    );
    let uri = std::fs::read_to_string(dir.join("uri")).unwrap();
    let port = uri.trim().rsplit(':').next().unwrap().to_string();

    // Bob knows the port. His own job (its own network namespace) is refused...
    let bdir = bob.private_dir("results-mlflow-bob");
    bob.write(&bdir.join("connect.py"), CONNECT);
    let bid = submit_as(
        &e,
        &bob,
        &bdir,
        "connect.yaml",
        &python_job("connect", &bdir, &venv, &format!("python connect.py {port}")),
    );
    assert_eq!(e.wait_final(bid)["job"]["state"], "succeeded", "{}", e.logs(bid));
    assert!(
        e.logs(bid).contains("connect: 111"),
        "ECONNREFUSED expected: {}",
        e.logs(bid)
    );
    // ...and so is he on the host (as is root: nothing listens there).
    let host = bob
        .command("/usr/bin/python3")
        .args(["-c", CONNECT, &port])
        .output()
        .unwrap();
    assert!(out(&host).contains("connect: 111"), "{}", out(&host));
    assert_eq!(e.json(&["show", &id.to_string()])["job"]["state"], "running");

    std::fs::write(dir.join("go"), "").unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let show = out(&e.gantry_user(&alice, &["show", &id.to_string()]));
    assert!(
        show.contains("after_huge") && show.contains("mlflow.runName = probe"),
        "{show}"
    );
    let bob_sees = out(&e.gantry_user(&bob, &["show", &id.to_string()]));
    assert!(!bob_sees.contains("after_huge"), "{bob_sees}");
}

const GET: &str = "import os, urllib.request as u\nr = u.Request(os.environ['MLFLOW_TRACKING_URI'] + '/api/2.0/mlflow/experiments/get?experiment_id=0', headers={'Authorization': 'Bearer ' + os.environ['MLFLOW_TRACKING_TOKEN']})\nprint(u.urlopen(r).status)\n";

fn fds_and_threads(pid: u32) -> (usize, usize) {
    let n = |d: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{d}"))
            .map(|r| r.count())
            .unwrap_or(0)
    };
    (n("fd"), n("task"))
}

#[test]
fn mlflow_endpoints_answer_a_string_commands_first_connection_and_leave_no_fd_or_thread_behind() {
    let e = Engine::start_unbounded_cpu_only(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("results-mlflow-leak");
    // Each attempt connects to its endpoint once (a listener and a connection on the engine's side).
    alice.write(&dir.join("get.py"), GET);
    let d = dir.display();
    let spec =
        format!("name: leak\nimage: host\ngpus: 0\nworkdir: {d}\nmounts: ['{d}:{d}']\ncommand: python3 get.py\n");
    let warm = submit_as(&e, &alice, &dir, "leak.yaml", &spec);
    assert_eq!(e.wait_final(warm)["job"]["state"], "succeeded", "{}", e.logs(warm));
    assert!(e.logs(warm).contains("200"), "{}", e.logs(warm));
    let before = fds_and_threads(e.pid());
    let n = 12;
    let ids: Vec<i64> = (0..n)
        .map(|_| submit_as(&e, &alice, &dir, "leak.yaml", &spec))
        .collect();
    for id in &ids {
        assert_eq!(e.wait_final(*id)["job"]["state"], "succeeded", "{}", e.logs(*id));
        assert!(e.logs(*id).contains("200"), "{}", e.logs(*id));
    }
    // Idle connections to Docker and the blocking pool's threads come and go: a few either way.
    let mut after = fds_and_threads(e.pid());
    e.wait_until("the engine's fds and threads back where they were", || {
        after = fds_and_threads(e.pid());
        after.0 <= before.0 + 4 && after.1 <= before.1 + 4
    });
    assert!(
        after.0 < before.0 + n,
        "fds before {before:?}, after {n} attempts {after:?}"
    );
    eprintln!("engine fds and threads: {before:?} before, {after:?} after {n} attempts");
}
