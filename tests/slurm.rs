//! The Slurm backend against a real single-node Slurm (scripts/slurm-up.sh: slurmctld, slurmd and
//! munged on this machine, 4 fake GPUs, jobcomp/filetxt). The engine runs as root and submits each
//! job as its owner; the batch script runs the job's container with `docker run`, so these tests'
//! users are in the docker group (as users of a Docker cluster's nodes are).
//!
//! These tests FAIL when Slurm is not up: CI starts it. They share one Slurm (4 GPUs), so they run
//! one at a time.

use crate::helpers::*;
use serde_json::Value;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// Where scripts/slurm-up.sh's Slurm takes job output from (shared storage on a real cluster).
const LOG_DIR: &str = "/var/lib/gantry-slurm-logs";

/// A user of the Slurm tests: a plain user in the docker group (the batch script runs `docker run`
/// as them on the node).
fn slurm_user(name: &str) -> User {
    let _g = USERADD.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new("id").arg("-u").arg(name).output().unwrap();
    if !out.status.success() {
        let out = Command::new("useradd")
            .args(["-m", "-U", "-s", "/bin/sh", name])
            .output()
            .unwrap();
        assert!(
            out.status.success() || Command::new("id").arg(name).output().unwrap().status.success(),
            "useradd: {out:?}"
        );
    }
    let out = Command::new("usermod")
        .args(["-a", "-G", "docker", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "usermod: {out:?}");
    let id = |f: &str| {
        String::from_utf8_lossy(&Command::new("id").arg(f).arg(name).output().unwrap().stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    let u = User {
        name: name.into(),
        uid: id("-u"),
        gid: id("-g"),
        home: format!("/home/{name}").into(),
    };
    std::fs::create_dir_all(&u.home).unwrap();
    chown(&u.home, u.uid, u.gid);
    chmod(&u.home, 0o700);
    u
}

/// Fails (never skips) without Slurm.
fn require_slurm() {
    let ping = Command::new("scontrol").arg("ping").output();
    let up = ping
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("is UP"))
        .unwrap_or(false);
    assert!(
        up,
        "Slurm is not running: start it with scripts/slurm-up.sh (CI does) — {ping:?}"
    );
}

/// Cancels every Slurm job of the test users when a test ends, passed or not.
struct Cleanup(Vec<String>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for u in &self.0 {
            let _ = Command::new("scancel").args(["-u", u]).output();
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            let out = Command::new("squeue")
                .args(["-h", "-t", "PD,R,CG", "-o", "%i"])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

struct Lab {
    e: Engine,
    ann: User,
    bob: User,
    _cleanup: Cleanup,
    _guard: std::sync::MutexGuard<'static, ()>,
    /// The machine has one Slurm: another test process (a second checkout's suite) must not cancel
    /// this test's jobs in its own cleanup (`scancel -u`), so the lock is a file, not only a mutex.
    _machine: std::fs::File,
    /// Its jobs' containers name the node's GPUs by index, which NVML engines count as in use.
    _gpus: std::sync::MutexGuard<'static, ()>,
}

fn lab() -> Lab {
    lab_with("")
}

/// [`lab`] with more `[slurm]` settings.
fn lab_with(slurm: &str) -> Lab {
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let machine = std::fs::File::create("/tmp/gantry-test-slurm.lock").unwrap();
    machine.lock().unwrap();
    let gpus = this_machines_gpus();
    require_slurm();
    let (ann, bob) = (slurm_user("gslurm-ann"), slurm_user("gslurm-bob"));
    let cleanup = Cleanup(vec![ann.name.clone(), bob.name.clone()]);
    drop(Cleanup(cleanup.0.clone())); // nothing left over from an earlier test
    std::fs::create_dir_all(LOG_DIR).unwrap();
    let cfg = tempfile::Builder::new()
        .prefix("gantry-slurm-")
        .suffix(".toml")
        .tempfile()
        .unwrap()
        .keep()
        .unwrap()
        .1;
    std::fs::write(
        &cfg,
        format!("backend = \"slurm\"\n[slurm]\npoll = \"500ms\"\nlog_dir = \"{LOG_DIR}\"\n{slurm}"),
    )
    .unwrap();
    chmod(&cfg, 0o644);
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    Lab {
        e,
        ann,
        bob,
        _cleanup: cleanup,
        _guard: guard,
        _machine: machine,
        _gpus: gpus,
    }
}

impl Lab {
    fn submit(&self, u: &User, name: &str, yaml: &str) -> i64 {
        let dir = u.private_dir("slurm-spec");
        let f = u.write(&dir.join(format!("{name}.yaml")), yaml);
        let v = self.e.json_as(u, &["submit", f.to_str().unwrap()]);
        v[0]["job_id"].as_i64().unwrap_or_else(|| panic!("submit failed: {v}"))
    }

    fn slurm_id(&self, id: i64) -> u64 {
        let mut sid = 0;
        self.e.wait_until(&format!("job {id} in Slurm"), || {
            sid = self.e.show(id)["attempts"]
                .as_array()
                .and_then(|a| a.last())
                .and_then(|a| a["slurm_job_id"].as_u64())
                .unwrap_or(0);
            sid > 0
        });
        sid
    }

    fn wait_final(&self, id: i64) -> Value {
        self.e.wait_final(id)
    }
}

/// `scontrol show job ID` as key=value pairs (read by key, never by position).
fn scontrol_job(id: u64) -> std::collections::HashMap<String, String> {
    let out = Command::new("scontrol")
        .args(["show", "job", "-o", &id.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every Slurm job (still known to squeue) carrying `marker` in its comment.
fn slurm_jobs_with_comment(prefix: &str) -> Vec<Value> {
    let out = Command::new("squeue").arg("--json").output().unwrap();
    let v: Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["comment"].as_str().unwrap_or("").starts_with(prefix))
        .cloned()
        .collect()
}

fn jobcomp(id: u64) -> String {
    String::from_utf8_lossy(&std::fs::read("/var/log/slurm/jobcomp.log").unwrap_or_default())
        .lines()
        .rev()
        .find(|l| l.starts_with(&format!("JobId={id} ")))
        .unwrap_or("")
        .to_string()
}

#[test]
fn slurm_runs_the_spec_as_its_owner_with_its_gres_cpus_memory_and_time_and_history_matches() {
    let l = lab();
    let t0 = Instant::now();
    let id = l.submit(
        &l.ann,
        "shape",
        &format!("name: shape\nimage: {IMAGE}\ncommand: 'id -u; echo CVD=$CUDA_VISIBLE_DEVICES GPUS=$GANTRY_SLURM_GPUS; sleep 3; echo done; exit 3'\ngpus: 2\ncpus: 2\nmemory: 256MiB\ntimeout: 10m\n"),
    );
    let sid = l.slurm_id(id);
    let ok = l.submit(
        &l.ann,
        "ok",
        &format!("name: ok\nimage: {IMAGE}\ncommand: echo fine\ngpus: 0\n"),
    );
    l.e.wait_state(id, "running");
    let j = scontrol_job(sid);
    assert_eq!(
        j["UserId"],
        format!("{}({})", l.ann.name, l.ann.uid),
        "submitted as the owner, never root: {j:?}"
    );
    assert!(j["TresPerNode"].contains("gpu:2"), "GRES: {j:?}");
    assert_eq!(j["NumCPUs"], "2", "{j:?}");
    assert_eq!(j["MinMemoryNode"], "256M", "{j:?}");
    assert_eq!(j["TimeLimit"], "00:10:00", "{j:?}");
    assert_eq!(j["Comment"], format!("gantry:{}:{id}:1", db_uid(&l.e)), "{j:?}");
    let q = l.e.json_as(&l.bob, &["ls"]);
    let row = q
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["job"]["id"] == id)
        .expect("others see the queue row");
    assert_eq!(row["job"]["state"], "running");
    assert_eq!(row["gpus_assigned"], serde_json::json!([0, 1]), "{row}");
    // The GPUs view lists the cluster's GPUs, node by node, with this job on the two it holds.
    l.e.wait_until("the node's GPUs with the job on 0 and 1", || {
        let g = l.e.json_as(&l.bob, &["gpus"]);
        let names: Vec<&str> = g["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x["name"].as_str())
            .collect();
        names.len() == 4
            && names.iter().all(|n| n.contains("Slurm node"))
            && g["holders"] == serde_json::json!([[0, [id]], [1, [id]]])
    });

    let done = l.wait_final(id);
    assert_eq!(
        (done["job"]["state"].as_str(), done["job"]["exit_code"].as_i64()),
        (Some("failed"), Some(3)),
        "{done}"
    );
    assert_eq!(done["attempts"][0]["reason"], "exited");
    let log = String::from_utf8_lossy(&l.e.gantry_user(&l.ann, &["logs", &id.to_string()]).stdout).into_owned();
    assert!(
        log.contains(&format!("{}\n", l.ann.uid)),
        "the container ran as ann: {log}"
    );
    assert!(
        log.contains("CVD=0,1 GPUS=0,1") && log.contains("done"),
        "Slurm's GPUs reach the container: {log}"
    );
    let theirs = l.e.gantry_user(&l.bob, &["logs", &id.to_string()]);
    assert!(!theirs.status.success(), "bob cannot read ann's log");
    assert_eq!(l.wait_final(ok)["job"]["state"], "succeeded");

    // history --json matches what Slurm recorded (jobcomp/filetxt and squeue).
    let h = l.e.json_as(&l.ann, &["history"]);
    let row = h
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{h}"));
    assert_eq!(
        (row["status"].as_str(), row["exit_code"].as_i64()),
        (Some("failed"), Some(3)),
        "{row}"
    );
    let rec = jobcomp(sid);
    assert!(rec.contains("JobState=FAILED") && rec.contains("ExitCode=3:0"), "{rec}");
    let sq = slurm_jobs_with_comment(&format!("gantry:{}:{id}:", db_uid(&l.e)));
    assert_eq!(sq.len(), 1, "submitted once: {sq:?}");
    assert_eq!(
        (sq[0]["job_state"].as_str(), sq[0]["exit_code"].as_i64()),
        (Some("FAILED"), Some(768))
    );
    eprintln!("shape test: {:?}", t0.elapsed());
}

/// The database's id (markers carry it): from the state dir's log names.
fn db_uid(e: &Engine) -> String {
    let rd = std::fs::read_dir(e.state.join("logs")).unwrap();
    rd.flatten()
        .filter_map(|f| {
            f.file_name()
                .to_string_lossy()
                .strip_suffix(".log")
                .and_then(|s| s.rsplit_once('-'))
                .map(|(d, _)| d.to_string())
        })
        .next()
        .expect("a job log")
}

#[test]
fn a_four_gpu_job_waits_with_slurms_reason_and_cancel_is_the_owners_only() {
    let l = lab();
    let small = l.submit(
        &l.ann,
        "small",
        &format!("name: small\nimage: {IMAGE}\ncommand: sleep 60\ngpus: 2\ntimeout: 5m\n"),
    );
    l.e.wait_state(small, "running");
    let big = l.submit(
        &l.ann,
        "big",
        &format!("name: big\nimage: {IMAGE}\ncommand: 'true'\ngpus: 4\ntimeout: 5m\n"),
    );
    let sid = l.slurm_id(big);
    let mut reason = String::new();
    l.e.wait_until("Slurm's reason in gantry ls", || {
        let q = l.e.json_as(&l.bob, &["ls"]);
        reason = q
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["job"]["id"] == big)
            .map(|r| r["reason"].as_str().unwrap_or("").to_string())
            .unwrap_or_default();
        reason.contains("(Resources)")
    });
    assert!(reason.contains(&format!("Slurm job {sid}")), "{reason}");
    let text = String::from_utf8_lossy(&l.e.gantry_user(&l.ann, &["ls"]).stdout).into_owned();
    assert!(
        text.contains("waiting for GPUs, CPUs or memory to free up in Slurm (Resources)"),
        "{text}"
    );

    // Bob may not cancel ann's jobs, through Gantry or Slurm.
    let out = l.e.gantry_user(&l.bob, &["cancel", &small.to_string()]);
    assert!(!out.status.success(), "bob cancelled ann's job: {out:?}");
    let small_sid = l.slurm_id(small);
    let out = l.bob.command("scancel").arg(small_sid.to_string()).output().unwrap();
    assert!(
        !out.status.success() || !String::from_utf8_lossy(&out.stderr).is_empty(),
        "Slurm let bob cancel ann's job: {out:?}"
    );
    assert_eq!(l.e.show(small)["job"]["state"], "running");

    // Ann cancels both: the pending one never started, the running one is stopped.
    assert!(l.e.gantry_user(&l.ann, &["cancel", &big.to_string()]).status.success());
    assert!(l
        .e
        .gantry_user(&l.ann, &["cancel", &small.to_string()])
        .status
        .success());
    let b = l.wait_final(big);
    assert_eq!(b["job"]["state"], "cancelled");
    assert!(
        b["attempts"][0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("before it started"),
        "{b}"
    );
    let s = l.wait_final(small);
    assert_eq!(
        (s["job"]["state"].as_str(), s["attempts"][0]["reason"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{s}"
    );
    let st = |sid: u64| {
        slurm_jobs_with_comment("gantry:")
            .into_iter()
            .find(|j| j["job_id"] == sid)
            .map(|j| j["job_state"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(st(small_sid).as_deref(), Some("CANCELLED"));
    assert_eq!(st(sid).as_deref(), Some("CANCELLED"));
}

#[test]
fn timeouts_are_enforced_and_gpu_sharing_without_shards_is_refused() {
    let l = lab();
    let slow = l.submit(
        &l.ann,
        "slow",
        &format!("name: slow\nimage: {IMAGE}\ncommand: sleep 120\ngpus: 1\ntimeout: 3s\n"),
    );
    let sid = l.slurm_id(slow);
    assert_eq!(
        scontrol_job(sid)["TimeLimit"],
        "00:01:00",
        "Slurm's limit is the timeout in whole minutes"
    );
    let j = l.wait_final(slow);
    assert_eq!(
        (j["job"]["state"].as_str(), j["attempts"][0]["reason"].as_str()),
        (Some("timed_out"), Some("timeout")),
        "{j}"
    );
    let ran = j["attempts"][0]["ended_at"].as_i64().unwrap() - j["job"]["started_at"].as_i64().unwrap();
    assert!(ran < 30_000, "stopped at its 3 s timeout, not Slurm's minute: {ran} ms");

    let dir = l.ann.private_dir("slurm-spec");
    let f = l
        .ann
        .write(&dir.join("share.yaml"), &format!("image: {IMAGE}\ngpu_memory: 8GiB\n"));
    let out = l.e.gantry_user(&l.ann, &["submit", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("`shard` GRES") && err.contains("remove `gpu_memory`"),
        "{err}"
    );
}

#[test]
fn a_job_killed_at_its_memory_limit_is_recorded_as_out_of_memory() {
    let l = lab();
    let id = l.submit(
        &l.ann,
        "hog",
        &format!("name: hog\nimage: {IMAGE}\ncommand: 'x=$(cat /dev/urandom)'\ngpus: 0\nmemory: 32MiB\ntimeout: 1m\n"),
    );
    let j = l.wait_final(id);
    assert_eq!(
        (
            j["job"]["state"].as_str(),
            j["attempts"][0]["reason"].as_str(),
            j["job"]["exit_code"].as_i64()
        ),
        (Some("failed"), Some("oom"), Some(137)),
        "{j}"
    );
}

#[test]
fn a_matrix_goes_to_slurm_as_one_job_array() {
    let l = lab();
    let dir = l.ann.private_dir("slurm-spec");
    let f = l.ann.write(
        &dir.join("sweep.yaml"),
        &format!(
            "name: sweep\nimage: {IMAGE}\ncommand: 'echo lr={{lr}}'\ngpus: 1\ntimeout: 5m\nmatrix: {{lr: [1, 2, 3]}}\n"
        ),
    );
    let v = l.e.json_as(&l.ann, &["submit", f.to_str().unwrap()]);
    let ids: Vec<i64> = v[0]["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j.as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{v}");
    let master = l.slurm_id(ids[0]);
    for (i, id) in ids.iter().enumerate() {
        let j = l.wait_final(*id);
        assert_eq!(j["job"]["state"], "succeeded", "{j}");
        let a = &j["attempts"][0];
        assert_eq!(
            (a["slurm_job_id"].as_u64(), a["slurm_array_task"].as_u64()),
            (Some(master), Some(i as u64)),
            "one array, task {i}: {j}"
        );
        assert!(l.e.logs(*id).contains(&format!("lr={}\n", i + 1)), "{}", l.e.logs(*id));
    }
    let tasks: Vec<Value> = slurm_jobs_with_comment(&format!("gantry:{}:array:", db_uid(&l.e)));
    let mut seen: Vec<(i64, i64)> = tasks
        .iter()
        .map(|t| {
            (
                t["array_job_id"].as_i64().unwrap(),
                t["array_task_id"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![(master as i64, 0), (master as i64, 1), (master as i64, 2)],
        "one sbatch, three tasks: {tasks:?}"
    );
}

#[test]
fn dependencies_become_afterok() {
    let l = lab();
    let a = l.submit(
        &l.ann,
        "first",
        &format!("name: first\nimage: {IMAGE}\ncommand: sleep 3\ngpus: 1\n"),
    );
    let b = l.submit(
        &l.ann,
        "second",
        &format!("name: second\nimage: {IMAGE}\ncommand: echo second\ngpus: 1\nafter: [first]\n"),
    );
    let (sa, sb) = (l.slurm_id(a), l.slurm_id(b));
    let dep = scontrol_job(sb);
    assert!(dep["Dependency"].starts_with(&format!("afterok:{sa}")), "{dep:?}");
    assert_eq!(l.e.show(b)["job"]["state"], "starting");
    assert_eq!(l.wait_final(a)["job"]["state"], "succeeded");
    let jb = l.wait_final(b);
    assert_eq!(jb["job"]["state"], "succeeded");
    assert!(
        jb["job"]["started_at"].as_i64() >= l.e.show(a)["job"]["finished_at"].as_i64().map(|t| t - 3000),
        "{jb}"
    );
}

#[test]
fn kill_9_of_the_engine_while_jobs_pend_and_run_then_restart_submits_nothing_twice() {
    let mut l = lab();
    let run = l.submit(
        &l.ann,
        "run",
        &format!("name: run\nimage: {IMAGE}\ncommand: 'sleep 4; exit 2'\ngpus: 2\ntimeout: 5m\n"),
    );
    // `pend` goes to Slurm only once `run` runs there: submitted together, their `sbatch`es race, and
    // Slurm (FIFO) may start the 4-GPU job first and finish it before the kill.
    l.e.wait_state(run, "running");
    let pend = l.submit(
        &l.ann,
        "pend",
        &format!("name: pend\nimage: {IMAGE}\ncommand: 'echo pend ran'\ngpus: 4\ntimeout: 5m\n"),
    );
    let (srun, spend) = (l.slurm_id(run), l.slurm_id(pend));
    l.e.kill9();
    // The crash window between `sbatch` and recording its id: the database has the intent, no id.
    let db = l.e.state.join("gantry.db");
    let out = Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('UPDATE attempts SET slurm_job_id = NULL WHERE job_id = ?', (int(sys.argv[2]),)); c.commit()"])
        .arg(&db)
        .arg(pend.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    l.e.restart();
    let r = l.wait_final(run);
    assert_eq!(
        (r["job"]["state"].as_str(), r["job"]["exit_code"].as_i64()),
        (Some("failed"), Some(2)),
        "{r}"
    );
    let p = l.wait_final(pend);
    assert_eq!(p["job"]["state"], "succeeded", "{p}");
    assert_eq!(p["attempts"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(
        p["attempts"][0]["slurm_job_id"].as_u64(),
        Some(spend),
        "found again by its marker, not submitted again: {p}"
    );
    assert_eq!(r["attempts"][0]["slurm_job_id"].as_u64(), Some(srun));
    let uid = db_uid(&l.e);
    for id in [run, pend] {
        let n = slurm_jobs_with_comment(&format!("gantry:{uid}:{id}:")).len();
        assert_eq!(n, 1, "job {id} was submitted {n} times");
    }
    assert!(l.e.logs(pend).contains("pend ran"), "{}", l.e.logs(pend));
}

#[test]
fn another_users_slurm_job_with_a_forged_marker_and_a_hostile_name_is_never_adopted() {
    let mut l = lab();
    let job = l.submit(&l.ann, "pend", &format!("name: pend\nimage: {IMAGE}\ncommand: 'if [ \"$GANTRY_ATTEMPT\" = 1 ]; then sleep 600; fi; echo pend ran'\ngpus: 1\ntimeout: 5m\n"));
    let sid = l.slurm_id(job);
    l.e.kill9();
    // The crash window before `sbatch` ran: the intent is in the database, nothing of ann's in Slurm.
    let set = |args: &[&str]| {
        assert!(
            Command::new("scontrol").args(args).output().unwrap().status.success(),
            "{args:?}"
        )
    };
    set(&["update", &format!("jobid={sid}"), "comment=moved"]);
    let _ = Command::new("scancel").arg(sid.to_string()).output();
    let db = l.e.state.join("gantry.db");
    let sql = "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('UPDATE attempts SET slurm_job_id = NULL WHERE job_id = ?', (int(sys.argv[2]),)); c.commit()";
    let out = Command::new("python3")
        .args(["-c", sql])
        .arg(&db)
        .arg(job.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Bob reads ann's marker from squeue and puts it on a job of his own, named with invalid UTF-8.
    let marker = format!("gantry:{}:{job}:1", db_uid(&l.e));
    let out = Command::new("runuser")
        .args([
            "-u",
            &l.bob.name,
            "--",
            "sh",
            "-c",
            &format!(
                "cd && sbatch --parsable --hold --comment={marker} --job-name=\"$(printf 'x\\377y')\" --wrap=true"
            ),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let forged: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    l.e.restart();
    let p = l.wait_final(job);
    let attempts = p["attempts"].as_array().unwrap();
    assert!(
        attempts.iter().all(|a| a["slurm_job_id"].as_u64() != Some(forged)),
        "bob's Slurm job was adopted as ann's: {p}"
    );
    assert_eq!(p["job"]["state"], "succeeded", "{p}");
    assert!(l.e.logs(job).contains("pend ran"), "{}", l.e.logs(job));
    let _ = Command::new("scancel").arg(forged.to_string()).output();
}

#[test]
fn a_user_who_swaps_their_output_for_a_link_to_shadow_gets_nothing() {
    let l = lab();
    let id = l.submit(
        &l.ann,
        "sneaky",
        &format!("name: sneaky\nimage: {IMAGE}\ncommand: 'echo before; sleep 4; echo after'\ngpus: 0\n"),
    );
    l.e.wait_state(id, "running");
    let dir = std::path::Path::new(LOG_DIR).join(l.ann.uid.to_string());
    let file = dir.join(format!("{}-{id}-a1.out", db_uid(&l.e)));
    l.e.wait_until("the job's output file", || file.exists());
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777
        ),
        (l.ann.uid, 0o700)
    );
    let out = l.ann.sh(&format!("rm -f {0} && ln -s /etc/shadow {0}", file.display()));
    assert!(out.status.success(), "{out:?}");
    l.wait_final(id);
    let log = String::from_utf8_lossy(&l.e.gantry_user(&l.ann, &["logs", &id.to_string()]).stdout).into_owned();
    assert!(!log.contains("root:"), "the engine followed the link: {log}");
    assert!(log.contains("cannot be read safely"), "{log}");
}

#[test]
fn the_gpus_view_shows_live_samples_of_nodes_that_run_the_node_agent() {
    let dir = tempfile::Builder::new().prefix("gantry-nodes-").tempdir().unwrap();
    let l = lab_with(&format!("node_samples = \"{}\"\n", dir.path().display()));
    let mut agent = Command::new(bin())
        .args(["daemon", "--node-agent"])
        .arg(dir.path())
        .args(["--gpus", "sim:4x24GiB"])
        .spawn()
        .unwrap();
    let mut last;
    let t = Instant::now();
    let live = loop {
        last = l.e.json_as(&l.bob, &["gpus"]);
        let g = last["gpus"].as_array().cloned().unwrap_or_default();
        if g.len() == 4
            && g.iter().all(|x| {
                x["memory_total"].as_u64() == Some(24 << 30) && x["name"].as_str().unwrap_or("").contains("(Slurm node")
            })
        {
            break true;
        }
        if t.elapsed() > Duration::from_secs(30) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = agent.wait();
    assert!(live, "the node agent's samples never reached the GPUs view: {last}");
}

#[test]
fn logs_follow_a_slurm_job_to_its_end() {
    let l = lab();
    let id = l.submit(
        &l.ann,
        "chatty",
        &format!("name: chatty\nimage: {IMAGE}\ncommand: 'for i in 1 2 3; do echo line $i; sleep 1; done'\ngpus: 0\n"),
    );
    l.e.wait_state(id, "running");
    let out = l
        .ann
        .command(bin())
        .arg("--state-dir")
        .arg(&l.e.state)
        .args(["logs", "-f", &id.to_string()])
        .current_dir("/")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("line 1\nline 2\nline 3\n"),
        "{out:?}"
    );
    assert_eq!(
        l.e.show(id)["job"]["state"],
        "succeeded",
        "logs -f returned once the job ended"
    );
}

/// Stop slurmctld (by its pid file) and start it again from its saved state.
fn restart_slurmctld() {
    let pid: i32 = std::fs::read_to_string("/run/slurmctld.pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).unwrap();
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(t.elapsed() < Duration::from_secs(30), "slurmctld did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file("/run/slurmctld.pid");
    assert!(Command::new("slurmctld").status().unwrap().success());
    while !String::from_utf8_lossy(&Command::new("scontrol").arg("ping").output().unwrap().stdout).contains("is UP") {
        assert!(t.elapsed() < Duration::from_secs(60), "slurmctld did not come back");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_slurmctld_restart_while_jobs_pend_and_run_loses_nothing() {
    let l = lab();
    let run = l.submit(
        &l.ann,
        "run",
        &format!("name: run\nimage: {IMAGE}\ncommand: 'sleep 4; echo ran'\ngpus: 2\ntimeout: 5m\n"),
    );
    let pend = l.submit(
        &l.ann,
        "pend",
        &format!("name: pend\nimage: {IMAGE}\ncommand: 'echo pend ran'\ngpus: 4\ntimeout: 5m\n"),
    );
    l.e.wait_state(run, "running");
    l.slurm_id(pend);
    restart_slurmctld();
    let (r, p) = (l.wait_final(run), l.wait_final(pend));
    assert_eq!(
        (r["job"]["state"].as_str(), p["job"]["state"].as_str()),
        (Some("succeeded"), Some("succeeded")),
        "{r}\n{p}"
    );
    let uid = db_uid(&l.e);
    for id in [run, pend] {
        assert_eq!(
            slurm_jobs_with_comment(&format!("gantry:{uid}:{id}:")).len(),
            1,
            "job {id} submitted once"
        );
    }
    assert!(l.e.logs(run).contains("ran") && l.e.logs(pend).contains("pend ran"));
}

/// Preemption on Slurm (issue 19): a preemptible job that counts steps into a file in its own mount
/// and saves a checkpoint on SIGUSR1 holds all 4 GPUs; a job 10 above it pends in Slurm for them;
/// Gantry sends the signal (`scancel --signal=USR1 --batch`, handed to the container by the batch
/// script), then `scontrol requeue`s it. The urgent job runs; the SAME Slurm job runs again (restart
/// count 1) and resumes from its checkpoint with GANTRY_RESTART_COUNT=1; every step is in the file
/// exactly once.
#[test]
fn gantry_preempts_a_slurm_job_by_requeue_and_it_resumes_from_its_checkpoint() {
    let l = lab_with("[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"1s\"\n");
    let work = l.ann.private_dir("slurm-ckpt");
    let train = l.submit(
        &l.ann,
        "train",
        &format!(
            "name: train\nimage: {IMAGE}\ngpus: 4\ntimeout: 30m\npreemptible: true\ncheckpoint: {{signal: SIGUSR1, grace: 1m}}\nmounts: ['{}:/work']\ncommand: |\n  n=$(cat /work/ckpt 2>/dev/null || echo 0)\n  echo \"restart=$GANTRY_RESTART_COUNT attempt=$GANTRY_ATTEMPT preemptible=$GANTRY_PREEMPTIBLE from=$n\"\n  stop=0\n  trap 'stop=1' USR1\n  while [ $n -lt 40 ]; do\n    if [ $stop = 1 ]; then echo $n > /work/ckpt; echo \"checkpoint at $n\"; exit 0; fi\n    n=$((n+1)); echo $n >> /work/steps; sleep 0.3\n  done\n  echo $n > /work/ckpt; echo finished\n",
            work.display()
        ),
    );
    let sid = l.slurm_id(train);
    l.e.wait_until("a few steps", || {
        std::fs::read_to_string(work.join("steps"))
            .map(|s| s.lines().count() >= 5)
            .unwrap_or(false)
    });
    let j = scontrol_job(sid);
    assert_eq!(j["Requeue"], "1", "{j:?}");
    let urgent = l.submit(
        &l.bob,
        "urgent",
        &format!("name: urgent\nimage: {IMAGE}\ngpus: 4\npriority: 10\ntimeout: 5m\ncommand: echo urgent ran\n"),
    );
    assert_eq!(l.wait_final(urgent)["job"]["state"], "succeeded");
    // Slurm starts a requeued job again only after its BeginTime, about 2 minutes on.
    let t = Instant::now();
    while l.e.show(train)["job"]["state"] != "succeeded" && t.elapsed() < Duration::from_secs(420) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let done = l.wait_final(train);
    assert_eq!(done["job"]["state"], "succeeded", "{done}");
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "one preempted attempt, one that finished: {done}");
    assert_eq!(
        (attempts[0]["reason"].as_str(), attempts[1]["reason"].as_str()),
        (Some("preempted"), Some("exited")),
        "{done}"
    );
    let msg = attempts[0]["message"].as_str().unwrap_or("");
    assert!(
        msg.starts_with(&format!(
            "preempted by job {urgent} (gslurm-bob's 4-GPU job has priority 10, this one 0)"
        )),
        "{msg}"
    );
    assert_eq!(
        (
            attempts[0]["slurm_job_id"].as_u64(),
            attempts[1]["slurm_job_id"].as_u64()
        ),
        (Some(sid), Some(sid)),
        "requeued, not submitted again: {done}"
    );
    assert_eq!(scontrol_job(sid)["Restarts"], "1", "Slurm restarted it once");
    assert_eq!(
        slurm_jobs_with_comment(&format!("gantry:{}:{train}:", db_uid(&l.e))).len(),
        1,
        "one Slurm job for train"
    );
    // The urgent job ran on the GPUs the preemption freed (Slurm's start is in whole seconds; the
    // preempted attempt's end is when Gantry saw the requeue).
    let u = l.e.show(urgent);
    assert!(
        u["attempts"][0]["started_at"].as_i64().unwrap() + 2_000 >= attempts[0]["ended_at"].as_i64().unwrap(),
        "urgent ran beside the job it preempted: {u} {done}"
    );
    assert!(
        attempts[1]["started_at"].as_i64().unwrap() >= u["attempts"][0]["started_at"].as_i64().unwrap(),
        "{u} {done}"
    );
    let log = l.e.logs(train);
    assert!(log.contains("restart=0 attempt=1 preemptible=1 from=0"), "{log}");
    assert!(
        log.contains("checkpoint at "),
        "the job got its checkpoint signal: {log}"
    );
    assert!(
        log.contains("restart=1 attempt=2 preemptible=1 from="),
        "resumed with GANTRY_RESTART_COUNT=1: {log}"
    );
    assert!(log.contains("finished"), "{log}");
    let steps: Vec<u32> = std::fs::read_to_string(work.join("steps"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(
        steps,
        (1..=40).collect::<Vec<u32>>(),
        "every step exactly once, in order"
    );
}

/// A requeue Gantry did not decide (an admin's `scontrol requeue`, as Slurm's own PreemptMode=REQUEUE
/// or a node failure does it): the attempt is recorded `preempted` by Slurm, not counted against
/// `retries` (0 here), and the next attempt follows the same Slurm job, which runs again with
/// GANTRY_RESTART_COUNT=1.
#[test]
fn a_requeue_slurm_decided_is_recorded_as_a_preemption_and_the_job_runs_again_in_the_same_slurm_job() {
    let l = lab_with("[preemption]\nenabled = true\n");
    let id = l.submit(
        &l.ann,
        "requeued",
        &format!("name: requeued\nimage: {IMAGE}\ngpus: 1\nretries: 0\ntimeout: 30m\npreemptible: true\ncommand: 'echo restart=$GANTRY_RESTART_COUNT; if [ \"$GANTRY_RESTART_COUNT\" = 0 ]; then sleep 600; fi; echo done'\n"),
    );
    let sid = l.slurm_id(id);
    l.e.wait_until("it runs", || l.e.logs(id).contains("restart=0"));
    let out = Command::new("scontrol")
        .args(["requeue", &sid.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let t = Instant::now();
    while l.e.show(id)["job"]["state"] != "succeeded" && t.elapsed() < Duration::from_secs(420) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let done = l.wait_final(id);
    assert_eq!(done["job"]["state"], "succeeded", "{done}");
    let a = done["attempts"].as_array().unwrap();
    assert_eq!(
        (a.len(), a[0]["reason"].as_str(), a[1]["reason"].as_str()),
        (2, Some("preempted"), Some("exited")),
        "{done}"
    );
    assert!(
        a[0]["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("preempted by Slurm (it requeued the job"),
        "{done}"
    );
    assert_eq!(
        (a[0]["slurm_job_id"].as_u64(), a[1]["slurm_job_id"].as_u64()),
        (Some(sid), Some(sid)),
        "{done}"
    );
    let log = l.e.logs(id);
    assert!(log.contains("restart=1") && log.contains("done"), "{log}");
}

/// Issue 30: `GANTRY_METRICS` on Slurm is a file beside the job's output in its owner's folder of
/// the shared log dir, written from inside the job's container and read by the engine as the owner;
/// a matrix's tasks each get their own. Others see none of it.
#[test]
fn a_slurm_jobs_metrics_file_beside_its_output_is_read_as_its_owner() {
    let l = lab();
    let id = l.submit(
        &l.ann,
        "metrics",
        &format!("name: metrics\nimage: {IMAGE}\ngpus: 0\ncommand: >-\n  sh -c 'echo \"{{\\\"step\\\": 1, \\\"loss\\\": 0.5}}\" >> $GANTRY_METRICS; echo \"{{\\\"step\\\": 2, \\\"loss\\\": 0.25}}\" >> $GANTRY_METRICS; echo metrics at $GANTRY_METRICS'\n"),
    );
    assert_eq!(l.wait_final(id)["job"]["state"], "succeeded", "{}", l.e.logs(id));
    let text = |u: &User, args: &[&str]| {
        let o = l.e.gantry_user(u, args);
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let show = text(&l.ann, &["show", &id.to_string()]);
    assert!(
        show.contains("0.25 @ step 2") && show.contains("[2 points]"),
        "{show}\n{}",
        l.e.logs(id)
    );
    let file = std::path::Path::new(LOG_DIR)
        .join(l.ann.uid.to_string())
        .join(format!("{}-{id}-a1-r0.metrics.jsonl", db_uid(&l.e)));
    let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        l.ann.uid,
        "written by its owner"
    );
    let bob = text(&l.bob, &["show", &id.to_string()]);
    assert!(!bob.contains("loss"), "{bob}");
    // A matrix goes as one job array: each task its own file.
    let dir = l.ann.private_dir("slurm-spec");
    let f = l.ann.write(
        &dir.join("sweep.yaml"),
        &format!("name: sweep\nimage: {IMAGE}\ngpus: 0\nmatrix: {{lr: [1, 2]}}\ncommand: >-\n  sh -c 'echo \"{{\\\"acc\\\": {{lr}}}}\" >> $GANTRY_METRICS'\n"),
    );
    let v = l.e.json_as(&l.ann, &["submit", f.to_str().unwrap()]);
    let ids: Vec<i64> = v[0]["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j.as_i64().unwrap())
        .collect();
    for id in &ids {
        assert_eq!(l.wait_final(*id)["job"]["state"], "succeeded", "{}", l.e.logs(*id));
    }
    let c = l.e.json_as(&l.ann, &["compare", "sweep", "--sort", "acc"]);
    let accs: Vec<f64> = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["last"]["acc"].as_f64().unwrap())
        .collect();
    assert_eq!(accs, [2.0, 1.0], "{c}");
}
