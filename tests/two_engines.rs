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
    let held: Vec<i64> = (0..2)
        .map(|i| {
            a.submit_yaml(
                &format!("a{i}"),
                &format!("image: {IMAGE}\ncommand: sleep 6\ngpus: 1\n"),
            )
        })
        .collect();
    for id in &held {
        a.wait_state(*id, "running");
    }
    let late = b.submit_yaml("b", &format!("image: {IMAGE}\ncommand: echo second engine\ngpus: 1\n"));
    b.wait_until("the second engine to say why its job waits", || {
        let q = b.json(&["ls"]);
        q[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("in use outside this engine"))
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        b.show(late)["job"]["state"],
        "queued",
        "both GPUs are held by the first engine"
    );
    let ends: Vec<i64> = held
        .iter()
        .map(|id| a.wait_final(*id)["job"]["finished_at"].as_i64().unwrap())
        .collect();
    let j = b.wait_final(late);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    let started = j["attempts"][0]["started_at"].as_i64().unwrap();
    assert!(
        started >= *ends.iter().min().unwrap() - 1000,
        "the second engine started on a GPU the first still held"
    );
}

/// GPU UUIDs in each running container's `NVIDIA_VISIBLE_DEVICES`, for containers of these engines.
fn holders(engines: &[&Engine]) -> Vec<(String, Vec<String>)> {
    let mut out = vec![];
    for e in engines {
        for id in e.our_containers() {
            let env = std::process::Command::new("docker")
                .args([
                    "inspect",
                    "-f",
                    "{{.State.Running}} {{range .Config.Env}}{{println .}}{{end}}",
                    &id,
                ])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&env.stdout).into_owned();
            if !text.starts_with("true") {
                continue;
            }
            let uuids = text
                .lines()
                .filter_map(|l| l.split_once("NVIDIA_VISIBLE_DEVICES=").map(|(_, v)| v))
                .flat_map(|v| v.split(','))
                .map(String::from)
                .collect();
            out.push((id, uuids));
        }
    }
    out
}

#[test]
fn two_engines_placing_at_the_same_moment_never_share_a_gpu() {
    // A system engine and someone's own engine on one machine, each given more work than fits, at once:
    // both see the GPUs free at the same moment, so only the check after creating a container keeps
    // them apart.
    let machine = format!("sim:2x24GiB@race-{}", std::process::id());
    let sys = Engine::system_with(&["--gpus", &machine]);
    let own = Engine::start(&["--gpus", &machine]);
    let spec = format!("image: {IMAGE}\ncommand: sleep 2\ngpus: 1\n");
    let (a, b) = (sys.write_spec("a.yaml", &spec), own.write_spec("b.yaml", &spec));
    let submit = |e: &Engine, f: &std::path::Path, system: bool| {
        let mut c = std::process::Command::new(bin());
        if system {
            c.env("GANTRY_SYSTEM_SOCKET", sys.system_socket())
                .env_remove("GANTRY_STATE_DIR");
        } else {
            c.arg("--state-dir").arg(&e.state);
        }
        c.arg("submit").args(std::iter::repeat_n(f, 3)).output().unwrap()
    };
    std::thread::scope(|s| {
        s.spawn(|| assert!(submit(&sys, &a, true).status.success()));
        s.spawn(|| assert!(submit(&own, &b, false).status.success()));
    });
    let t = std::time::Instant::now();
    let mut most = 0;
    loop {
        let h = holders(&[&sys, &own]);
        let mut seen = std::collections::HashMap::new();
        for (c, uuids) in &h {
            for u in uuids {
                if let Some(other) = seen.insert(u.clone(), c.clone()) {
                    panic!("GPU {u} held by two jobs at once: containers {other} and {c}");
                }
            }
        }
        most = most.max(h.len());
        let idle = |e: &Engine, system: bool| {
            let mut c = std::process::Command::new(bin());
            if system {
                c.env("GANTRY_SYSTEM_SOCKET", sys.system_socket())
                    .env_remove("GANTRY_STATE_DIR");
            } else {
                c.arg("--state-dir").arg(&e.state);
            }
            let out = c.args(["ls", "--json"]).output().unwrap();
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .map(|v| v.as_array().is_some_and(|a| a.is_empty()))
                .unwrap_or(false)
        };
        if idle(&sys, true) && idle(&own, false) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the six jobs did not finish\n{}\n{}",
            sys.daemon_log(),
            own.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(most >= 1);
}

/// Issue 28 (smaller): two engines started with unnamed simulated GPUs (`--gpus sim:1x24GiB`, two
/// users' own test engines) on one Docker are two machines, as their machine locks say: one's job is
/// not "in use outside this engine" on the other's GPU of the same UUID. Before, the second engine's
/// job waited for the first one's to end.
#[test]
fn two_engines_with_unnamed_simulated_gpus_do_not_see_each_others_jobs_as_outside_use() {
    let a = Engine::start_unnamed(&["--gpus", "sim:1x24GiB"]);
    let b = Engine::start_unnamed(&["--gpus", "sim:1x24GiB"]);
    let long = a.submit_yaml("long", &format!("image: {IMAGE}\ngpus: 1\ncommand: sleep 60\n"));
    a.wait_state(long, "running");
    let quick = b.submit_yaml("quick", &format!("image: {IMAGE}\ngpus: 1\ncommand: echo quick ran\n"));
    assert_eq!(b.wait_final(quick)["job"]["state"], "succeeded");
    assert_eq!(
        a.show(long)["job"]["state"],
        "running",
        "the other engine's job ran beside this one's, not after it"
    );
    assert!(a.gantry(&["cancel", &long.to_string()]).status.success());
    a.wait_final(long);
}
