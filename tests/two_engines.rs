//! Two engines on one machine (a system one and someone's embedded one) never place jobs on the same GPU:
//! each treats the other's running GPU containers as busy.

use crate::helpers::*;
use std::time::Duration;

#[test]
fn a_second_engine_never_places_a_job_on_gpus_another_engine_holds() {
    // The same simulated machine: the same two GPUs (same UUIDs), as on one real workstation.
    let machine = format!("sim:2x24GiB@two-engines-{}", std::process::id());
    // Forced up side by side: the system engine takes no machine lock, so an embedded one can still start.
    let a = Engine::system_with(&["--gpus", &machine]);
    let b = Engine::start(&["--gpus", &machine]);
    let held: Vec<i64> = (0..2).map(|i| a.submit_yaml(&format!("a{i}"), &format!("image: {IMAGE}\ncommand: sleep 6\ngpus: 1\n"))).collect();
    for id in &held {
        a.wait_state(*id, "running");
    }
    let late = b.submit_yaml("b", &format!("image: {IMAGE}\ncommand: echo second engine\ngpus: 1\n"));
    b.wait_until("the second engine to say why its job waits", || {
        let q = b.json(&["ls"]);
        q[0]["reason"].as_str().is_some_and(|r| r.contains("in use outside this engine"))
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(b.show(late)["job"]["state"], "queued", "both GPUs are held by the first engine");
    let ends: Vec<i64> = held.iter().map(|id| a.wait_final(*id)["job"]["finished_at"].as_i64().unwrap()).collect();
    let j = b.wait_final(late);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    let started = j["attempts"][0]["started_at"].as_i64().unwrap();
    assert!(started >= *ends.iter().min().unwrap() - 1000, "the second engine started on a GPU the first still held");
}
