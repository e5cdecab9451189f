//! Issue 28 item 5 against real Docker on the NVML backend (the fake `libnvidia-ml.so.1` of
//! tests/fake-nvml): one urgent 1-GPU job preempts one of two preemptible 1-GPU jobs, never both.
//! Before, the first victim's GPU process, still listed by NVML after its container ended, read as
//! use outside the engine, so its GPU looked busy and a second victim was chosen ~2 ms later.
//!
//! The driver's lag is made deterministic: each job's GPU process, as NVML lists it, is a process of
//! the test whose cgroup names the job's container (as a process of that container's does) and which
//! outlives the container, as a process the real driver still lists after its container ended.

use crate::helpers::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

const H100: &str = "NVIDIA H100 80GB HBM3";

/// A process of the test in a cgroup `<hierarchy>/gantry-test-stale-<pid>/<container id>`: its
/// `/proc/PID/cgroup` names the container (the engine finds a GPU process's container there). Killed
/// and its cgroup removed when the test ends, pass or fail.
struct Stale {
    child: Child,
    dir: PathBuf,
}

impl Stale {
    fn of(container: &str) -> Stale {
        // cgroup v2 (/sys/fs/cgroup), v1 with a unified hierarchy beside it, or v1's pids hierarchy.
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/pids"]
            .iter()
            .map(Path::new)
            .find(|r| r.join("cgroup.procs").exists())
            .expect("a cgroup hierarchy under /sys/fs/cgroup");
        let dir = root
            .join(format!("gantry-test-stale-{}", std::process::id()))
            .join(container);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {} (as root): {e}", dir.display()));
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        let stale = Stale { child, dir };
        std::fs::write(stale.dir.join("cgroup.procs"), stale.pid().to_string()).unwrap();
        stale
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Stale {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.dir);
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn attempts(e: &Engine, id: i64) -> Vec<Value> {
    e.show(id)["attempts"].as_array().unwrap().clone()
}

fn preempted(e: &Engine, id: i64) -> usize {
    attempts(e, id).iter().filter(|a| a["reason"] == "preempted").count()
}

#[test]
fn one_urgent_job_preempts_one_of_two_jobs_while_the_driver_still_lists_the_first_victims_process() {
    require_gpu_docker();
    let gpus = FakeGpus::new();
    let idle = |procs: &[(u32, u32)]| {
        Value::Array(
            (0..2)
                .map(|i| {
                    let on: Vec<(u32, u64)> = procs.iter().filter(|p| p.1 == i).map(|p| (p.0, 2)).collect();
                    fake_gpu(&gpus.uuid(i), H100, 80, 2 * on.len() as u64, &on)
                })
                .collect(),
        )
    };
    gpus.set(idle(&[]));
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"1s\"\n",
    )
    .unwrap();
    let e = Engine::start_nvml(&gpus, &["--config", lab.to_str().unwrap()]);
    let job = "gpus: 1\npreemptible: true\ncheckpoint: {signal: SIGUSR1, grace: 30s}\ncommand: |\n  trap 'echo saved; exit 0' USR1\n  i=0; while [ $i -lt 3000 ]; do sleep 0.2; i=$((i+1)); echo step $i; done\n";
    let a = e.submit_yaml("a", &format!("image: {IMAGE}\nname: a\n{job}"));
    let b = e.submit_yaml("b", &format!("image: {IMAGE}\nname: b\n{job}"));
    // Both past min_run (1 s): ten steps of 0.2 s each.
    e.wait_until("both past min_run", || {
        e.logs(a).contains("step 10\n") && e.logs(b).contains("step 10\n")
    });
    // Each job's GPU process, as the driver lists it.
    let mut stale = vec![];
    for id in [a, b] {
        let last = attempts(&e, id).last().unwrap().clone();
        let container = last["container_id"].as_str().expect("a running job's container");
        let gpu = last["gpus"][0].as_u64().unwrap() as u32;
        stale.push((Stale::of(container), gpu));
    }
    let listed: Vec<(u32, u32)> = stale.iter().map(|(s, g)| (s.pid(), *g)).collect();
    gpus.set(idle(&listed));
    e.wait_until("the engine to see each job's GPU process as the job's", || {
        let g = e.json(&["gpus"]);
        let users = g["users"].as_array().cloned().unwrap_or_default();
        [a, b]
            .iter()
            .all(|id| users.iter().any(|u| u["job_id"].as_i64() == Some(*id)))
    });

    let urgent = e.submit_yaml(
        "urgent",
        &format!("image: {IMAGE}\ngpus: 1\npriority: 10\ncommand: sleep 600\n"),
    );
    // Until the urgent job runs, or both jobs were preempted for it (then nothing is free: the
    // victims' processes are still listed).
    e.wait_until("the urgent job to start, or a second victim", || {
        e.show(urgent)["job"]["state"] == "running" || preempted(&e, a) + preempted(&e, b) == 2
    });
    let (pa, pb) = (preempted(&e, a), preempted(&e, b));
    let urgent_ran = e.show(urgent)["job"]["state"] == "running";
    // The driver lets go of the processes; everything ends.
    gpus.set(idle(&[]));
    drop(stale);
    for id in [urgent, a, b] {
        let _ = e.gantry(&["cancel", &id.to_string()]);
    }
    assert_eq!(pa + pb, 1, "one victim for one GPU: a preempted {pa} times, b {pb}");
    assert!(urgent_ran, "the urgent job started on the first victim's GPU");
    for id in [urgent, a, b] {
        e.wait_final(id);
    }
}
