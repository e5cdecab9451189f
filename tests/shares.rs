//! One user's CPU/RAM ask cannot idle the other GPUs (issue 18 item 10), as reported: on a 4-GPU
//! box, bob's 1-GPU job asking for every CPU jobs get is refused at submit, saying what it may have
//! (the capacity less each other GPU's share) and why; at that ceiling it runs next to alice's three
//! 1-GPU jobs, all started. CPU-only jobs count in fair share.

use crate::dl_defaults::{capacity, submit_as};
use crate::helpers::*;
use gantry_core::scheduler::format_cpus;

fn cpus(milli: u64) -> String {
    format!("{}", milli as f64 / 1000.0)
}

#[test]
fn a_jobs_cpu_share_leaves_the_other_gpus_theirs() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let e = Engine::start(&["--gpus", "sim:4x24GiB"]);
    let (cap, _) = capacity();
    // The lab's default share: the CPUs for jobs split into one per GPU plus one for CPU-only jobs.
    let share = cap / 5;
    let ceiling = cap - 3 * share;
    let err = submit_as(
        &e,
        &bob,
        &format!("image: {IMAGE}\ngpus: 1\ncpus: {}\ncommand: sleep 300\n", cpus(cap)),
    )
    .unwrap_err();
    assert!(
        err.contains(&format!(
            "a 1-GPU job may hold at most {} CPU{} here, so that the other 3 GPUs keep their share",
            format_cpus(ceiling),
            if ceiling == 1000 { "" } else { "s" }
        )) && err.contains(&format!("ask for at most `cpus: {}`", format_cpus(ceiling))),
        "{err}"
    );
    // At the ceiling it runs, and alice's three 1-GPU jobs (the default share each) all start beside it.
    let bobs = submit_as(
        &e,
        &bob,
        &format!("image: {IMAGE}\ngpus: 1\ncpus: {}\ncommand: sleep 300\n", cpus(ceiling)),
    )
    .unwrap();
    e.wait_state(bobs, "running");
    let hers: Vec<i64> = (0..3)
        .map(|_| submit_as(&e, &alice, &format!("image: {IMAGE}\ngpus: 1\ncommand: sleep 300\n")).unwrap())
        .collect();
    for id in &hers {
        e.wait_state(*id, "running");
    }
    for id in hers.iter().chain([&bobs]) {
        assert!(e.gantry(&["cancel", &id.to_string()]).status.success());
        assert_eq!(e.wait_final(*id)["job"]["state"], "cancelled");
    }

    // A CPU-only job counts in its owner's fair share (its CPU share in GPUs' worth).
    let carol = user("gantry-carol");
    let cpu_only = submit_as(&e, &carol, &format!("image: {IMAGE}\ngpus: 0\ncommand: sleep 2\n")).unwrap();
    assert_eq!(e.wait_final(cpu_only)["job"]["state"], "succeeded");
    let usage = e.json(&["usage", "--since", "1h"]);
    let u = usage["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["user"] == carol.name.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{usage}"));
    assert!(
        u["fair_share_usage"].as_f64().unwrap() > 0.0,
        "a CPU-only job counts in fair share: {u}"
    );
}
