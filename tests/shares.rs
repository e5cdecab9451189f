//! One user's CPU/RAM ask cannot idle the other GPUs (issue 18 item 10), as reported: on a 4-GPU
//! box, bob's 1-GPU job asking for every CPU jobs get is refused at submit, saying what it may have
//! (the capacity less each other GPU's share) and why; at that ceiling it runs next to alice's three
//! 1-GPU jobs, all started. CPU-only jobs count in fair share. CPU-only jobs together hold the
//! CPU-only share and never idle a GPU that someone's GPU job waits for (issue 33).

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

/// The states of `ids`, in order.
fn states(e: &Engine, ids: &[i64]) -> Vec<String> {
    ids.iter()
        .map(|id| e.show(*id)["job"]["state"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Issue 33, as reported: with the packaged defaults on 4 simulated GPUs, bob (no GPU-hours at all)
/// submits six CPU-only jobs; one starts (CPU-only jobs together hold the one CPU-only share), the
/// others wait saying so and how to change it, and alice's 1-GPU job then starts at once, where all
/// four GPUs once sat idle while it waited for the CPU bob's jobs held.
#[test]
fn cpu_only_jobs_hold_the_cpu_only_share_and_never_idle_the_gpus() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let e = Engine::start(&["--gpus", "sim:4x24GiB"]);
    let his: Vec<i64> = (0..6)
        .map(|_| submit_as(&e, &bob, &format!("image: {IMAGE}\ngpus: 0\ncommand: sleep 300\n")).unwrap())
        .collect();
    e.wait_until(
        "one of bob's CPU-only jobs to run, the others to wait for the CPU-only share",
        || {
            let s = states(&e, &his);
            s.iter().filter(|s| *s == "running").count() == 1
                && his.iter().zip(&s).filter(|(_, s)| *s == "queued").all(|(id, _)| {
                    e.show(*id)["reason"]
                        .as_str()
                        .is_some_and(|r| r.starts_with("CPU-only jobs may hold ") && r.contains("`cpu_only_shares`"))
                })
        },
    );
    let hers = submit_as(&e, &alice, &format!("image: {IMAGE}\ngpus: 1\ncommand: sleep 300\n")).unwrap();
    e.wait_state(hers, "running");
    assert_eq!(
        states(&e, &his).iter().filter(|s| *s == "running").count(),
        1,
        "bob's queued CPU-only jobs stay behind the CPU-only share"
    );
    for id in his.iter().chain([&hers]) {
        e.gantry(&["cancel", &id.to_string()]);
    }
    for id in his.iter().chain([&hers]) {
        e.wait_final(*id);
    }
}

/// Issue 33, where the lab lets CPU-only work use more (`cpu_only_shares = 5`, preemption on):
/// bob's five preemptible CPU-only jobs fill the idle machine's CPUs, and alice's 1-GPU job, whose GPU
/// is free, preempts one of them (never waits for CPU-only work with a GPU idle); the preempted job
/// waits for the CPU again.
#[test]
fn a_preemptible_cpu_only_job_is_preempted_for_a_gpu_job_whose_gpu_is_free() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[containers]\ncpu_only_shares = 5\n[preemption]\nenabled = true\nmin_run = \"1s\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap(), "--gpus", "sim:4x24GiB"]);
    let his: Vec<i64> = (0..5)
        .map(|_| {
            submit_as(
                &e,
                &bob,
                &format!("image: {IMAGE}\ngpus: 0\npreemptible: true\ncommand: sleep 300\n"),
            )
            .unwrap()
        })
        .collect();
    e.wait_until("bob's five preemptible CPU-only jobs to run", || {
        states(&e, &his).iter().all(|s| s == "running")
    });
    let hers = submit_as(&e, &alice, &format!("image: {IMAGE}\ngpus: 1\ncommand: sleep 300\n")).unwrap();
    e.wait_state(hers, "running");
    let s = states(&e, &his);
    assert_eq!(s.iter().filter(|s| *s == "running").count(), 4, "{s:?}");
    let preempted = his[s.iter().position(|s| s != "running").unwrap()];
    let d = e.show(preempted);
    assert_eq!(d["attempts"][0]["reason"], "preempted", "{d}");
    assert_eq!(d["job"]["state"], "queued", "{d}");
    for id in his.iter().chain([&hers]) {
        e.gantry(&["cancel", &id.to_string()]);
    }
    for id in his.iter().chain([&hers]) {
        e.wait_final(*id);
    }
}

/// Issue 28 item 6: a job sharing a GPU by declared memory gets its part of the GPU's CPU/RAM share,
/// not a whole GPU's: on 4 simulated 24 GiB GPUs, seven 8 GiB jobs all run (each with a third of a
/// share; a whole share each let five start and left a GPU idle while the others waited for CPU).
#[test]
fn gpu_sharing_jobs_get_their_part_of_the_gpus_cpu_share() {
    use crate::dl_defaults::{container_of, docker_inspect};
    let alice = user("gantry-alice");
    let e = Engine::start(&["--gpus", "sim:4x24GiB"]);
    let (cap, mem) = capacity();
    let ids: Vec<i64> = (0..7)
        .map(|_| {
            submit_as(
                &e,
                &alice,
                &format!("image: {IMAGE}\ngpus: 1\ngpu_memory: 8GiB\ncommand: sleep 300\n"),
            )
            .unwrap()
        })
        .collect();
    e.wait_until("all seven GPU-sharing jobs to run", || {
        states(&e, &ids).iter().all(|s| s == "running")
    });
    let hc = docker_inspect(&container_of(&e, ids[0]))["HostConfig"].clone();
    assert_eq!(
        (hc["NanoCpus"].as_i64(), hc["Memory"].as_i64()),
        (Some((cap / 5 / 3) as i64 * 1_000_000), Some((mem / 5 / 3) as i64)),
        "a third of a GPU's share: {hc}"
    );
    for id in &ids {
        e.gantry(&["cancel", &id.to_string()]);
    }
    for id in &ids {
        e.wait_final(*id);
    }
}
