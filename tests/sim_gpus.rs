//! Simulated GPUs count Gantry's own jobs once (issue 22 item 4): their memory shows as the processes
//! of Gantry's containers, as NVML reports a real job's, never as "used outside Gantry".

use crate::helpers::*;

#[test]
fn three_shared_jobs_pack_one_simulated_card_to_its_full_memory() {
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    // Small CPU and RAM shares, so only GPU memory decides.
    let ids: Vec<i64> = (0..3)
        .map(|i| {
            e.submit_yaml(
                &format!("share{i}"),
                &format!("image: {IMAGE}\ngpus: 1\ngpu_memory: 8GiB\ncpus: 0.1\nmemory: 256MiB\ncommand: sleep 300\n"),
            )
        })
        .collect();
    for id in &ids {
        let d = e.wait_state(*id, "running");
        assert_eq!(d["attempts"][0]["gpus"], serde_json::json!([0]), "{d}");
    }
    // The next sample (1 Hz) shows them.
    let mut g = serde_json::Value::Null;
    e.wait_until("the GPU's sample to show the three jobs", || {
        g = e.json(&["gpus"]);
        g["gpus"][0]["processes"].as_array().is_some_and(|p| p.len() == 3)
    });
    let gpu = &g["gpus"][0];
    assert_eq!(gpu["memory_used"].as_u64(), Some(24 << 30), "{g}");
    assert_eq!(
        gpu["processes"].as_array().unwrap().len(),
        3,
        "one process per job's container: {g}"
    );
    let users = g["users"].as_array().unwrap();
    assert!(
        ids.iter().all(|id| users
            .iter()
            .any(|u| u["job_id"] == *id && u["used_memory"].as_u64() == Some(8 << 30))),
        "each job with its memory: {g}"
    );
    // The card is full: a fourth waits, for Gantry's jobs, not for memory "used outside Gantry".
    let fourth = e.submit_yaml(
        "share3",
        &format!("image: {IMAGE}\ngpus: 1\ngpu_memory: 8GiB\ncpus: 0.1\nmemory: 256MiB\ncommand: sleep 300\n"),
    );
    e.wait_until("a reason for the fourth job", || {
        e.show(fourth)["reason"].as_str().is_some_and(|r| !r.is_empty())
    });
    let reason = e.show(fourth)["reason"].as_str().unwrap().to_string();
    assert!(!reason.contains("outside Gantry"), "{reason}");
    for id in ids.iter().chain([&fourth]) {
        assert!(e.gantry(&["cancel", &id.to_string()]).status.success());
    }
}

/// Simulated GPUs are not the machine's: someone's `docker run --gpus device=0` or `--gpus all` (here,
/// on the fake driver) holds the machine's GPUs, not the simulation's, so a simulated GPU 0 stays
/// free, is listed free, and a job starts on it. (It was "busy: outside Gantry", and a job waited for
/// as long as any test's GPU container ran.)
#[test]
fn containers_naming_the_machines_gpus_leave_simulated_gpus_free() {
    require_gpu_docker();
    let _gpus = this_machines_gpus(); // these containers hold the (fake) machine's GPUs meanwhile
    let mut theirs = vec![];
    for gpus in ["device=0", "all"] {
        let out = std::process::Command::new("docker")
            .args(["run", "-d", "--rm", "--gpus", gpus, IMAGE, "sleep", "300"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        theirs.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    struct Remove(Vec<String>);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f"])
                .args(&self.0)
                .output();
        }
    }
    let _remove = Remove(theirs);
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    let id = e.submit_yaml("on-sim", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\n"));
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    // The job's own container shows on its GPU until the next sample; then nothing is on it.
    e.wait_until("simulated GPU 0 to be listed free", || {
        e.json(&["gpus"])["users"].as_array().unwrap().is_empty()
    });
}
