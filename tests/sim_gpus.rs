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
