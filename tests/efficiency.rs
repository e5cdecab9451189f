//! How well each run used what it held, measured by the engine with no action from its owner
//! (issue 30 item 3): CPU efficiency and peak RAM from the container's cgroup, GPU memory from the
//! GPU samples, and the GPU memory a job shape was stopped for using, kept across restarts.

use crate::helpers::*;
use serde_json::Value;

/// A job's `efficiency` once its end is recorded.
fn efficiency(e: &Engine, id: i64) -> Value {
    let d = e.wait_final(id);
    assert_eq!(d["job"]["state"], "succeeded", "{d}");
    d["efficiency"].clone()
}

/// The CPU time the shell's children used, from the `times` line a job printed last (`0m4.980s 0m0.010s`).
fn children_cpu_s(log: &str) -> f64 {
    let line = log
        .lines()
        .rfind(|l| l.split_whitespace().count() == 2 && l.trim_end().ends_with('s') && l.contains('m'))
        .unwrap_or_else(|| panic!("no `times` line in {log}"));
    line.split_whitespace()
        .map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m').unwrap();
            m.parse::<f64>().unwrap() * 60.0 + s.parse::<f64>().unwrap()
        })
        .sum()
}

#[test]
fn a_busy_loop_uses_its_cpu_and_a_sleeper_does_not_with_an_image_and_without() {
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    // Half a CPU each (what a CPU-only job may hold on a 2-CPU machine with one GPU), for 5 s: a busy loop (which then prints the CPU time it got), and a sleeper.
    let busy = "gpus: 0\ncpus: 0.5\nmemory: 256MiB\ncommand: sh -c 'timeout 5 sh -c \"while :; do :; done\"; times'\n";
    let sleeper = "gpus: 0\ncpus: 0.5\nmemory: 256MiB\ncommand: sleep 5\n";
    let ids = [
        e.submit_yaml("busy", &format!("image: {IMAGE}\n{busy}")),
        e.submit_yaml("sleeper", &format!("image: {IMAGE}\n{sleeper}")),
        // Image-less: the container made of this machine's own folders.
        e.submit_yaml("busy-host", &format!("image: host\n{busy}")),
    ];
    let [b, s, h] = ids.map(|id| efficiency(&e, id));
    for (name, eff) in [("busy", &b), ("sleeper", &s), ("busy-host", &h)] {
        assert_eq!(eff["cpus_held"], 0.5, "{name}: {eff}");
        assert!(eff["ram_peak"].as_u64().is_some_and(|r| r > 0), "{name}: {eff}");
        assert!(eff["measured_ms"].as_i64().is_some_and(|m| m >= 3000), "{name}: {eff}");
        assert_eq!(eff["ram_held"].as_u64(), Some(256 << 20), "{name}: {eff}");
        assert!(
            eff["gpu_util"].is_null() && eff["gpu_memory_peak"].is_null(),
            "no GPU: {eff}"
        );
    }
    // A busy loop's efficiency is the share of its CPU it was given: all of it on an idle machine,
    // less on a loaded one (this machine's other tests). What it says must be what the job itself
    // counted (`times`), and far above a sleeper's.
    let sleeper_cpu = s["cpu"].as_f64().expect("measured");
    assert!(sleeper_cpu < 0.05, "a sleeper uses next to no CPU: {s}");
    for (name, id, eff) in [("busy", ids[0], &b), ("busy-host", ids[2], &h)] {
        let cpu = eff["cpu"].as_f64().unwrap_or(0.0);
        let own = children_cpu_s(&e.logs(id)) / 5.0 / 0.5;
        assert!(
            (cpu - own).abs() <= 0.1 + 0.25 * own,
            "{name}: the engine says {cpu:.3}, the job counted {own:.3} CPU-s per s: {eff}"
        );
        assert!(
            cpu > 4.0 * sleeper_cpu && cpu > 0.03,
            "{name} keeps its CPU busy: {eff} vs {s}"
        );
    }
    // `gantry show` prints them.
    let out = e.gantry(&["show", &ids[1].to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("efficiency (measured over"), "{text}");
    assert!(
        text.contains("  CPU:        0% (0.00 of 0.5 CPUs held)") || text.contains("  CPU:        1%"),
        "{text}"
    );
    // And the usage report counts their CPU efficiency.
    let r = e.json(&["usage", "--efficiency", "--since", "1h"]);
    let me = &r["users"][0];
    assert_eq!(me["runs"], 3, "{r}");
    assert!(me["cpu"].as_f64().is_some_and(|c| c > sleeper_cpu), "{r}");
}

#[test]
fn a_simulated_gpu_jobs_gpu_memory_peak_is_its_declaration() {
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    let shared = e.submit_yaml(
        "shared",
        &format!("image: {IMAGE}\ngpus: 1\ngpu_memory: 6GiB\ncpus: 0.5\nmemory: 256MiB\ncommand: sleep 3\n"),
    );
    let eff = efficiency(&e, shared);
    assert_eq!(eff["gpu_memory_peak"].as_u64(), Some(6 << 30), "{eff}");
    assert_eq!(eff["gpu_memory_simulated"], true, "{eff}");
    assert_eq!(eff["gpu_memory_total"].as_u64(), Some(24 << 30), "{eff}");
    assert!(eff["gpu_util"].as_f64().is_some_and(|u| u > 0.0 && u <= 1.0), "{eff}");
    // Its GPU-hours count as held and used in the report, per user and for the day.
    let r = e.json(&["usage", "--efficiency", "--since", "1h"]);
    assert!(r["users"][0]["gpu_hours_held"].as_f64().is_some_and(|h| h > 0.0), "{r}");
    assert!(r["users"][0]["gpu_hours_used"].as_f64().is_some_and(|h| h > 0.0), "{r}");
    assert!(r["days"][0]["gpu_hours_held"].as_f64().is_some_and(|h| h > 0.0), "{r}");
    // A CPU-only job has no GPU figures.
    let cpu = e.submit_yaml(
        "cpu",
        &format!("image: {IMAGE}\ngpus: 0\ncpus: 0.5\nmemory: 256MiB\ncommand: sleep 2\n"),
    );
    let eff = efficiency(&e, cpu);
    assert!(eff["gpu_memory_peak"].is_null() && eff["gpu_util"].is_null(), "{eff}");
}

/// The GPU memory a shape was stopped for using is stored: after an engine restart, the same job
/// of the same user is still placed and held at what it used, not at what it declares.
#[test]
fn learned_gpu_memory_survives_an_engine_restart() {
    require_gpu_docker();
    let gpus = FakeGpus::new();
    gpus.set(serde_json::json!([fake_gpu(
        &gpus.uuid(0),
        "NVIDIA H100 80GB HBM3",
        24,
        0,
        &[]
    )]));
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(&lab, "[jobs]\ngpu_memory_margin = \"20%\"\ngpu_memory_grace = \"2s\"\n").unwrap();
    let mut e = Engine::start_nvml(&gpus, &["--config", lab.to_str().unwrap()]);
    let spec = format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\ngpu_memory: 4GiB\n");
    let greedy = e.submit_yaml("greedy", &spec);
    let pid = container_pid(&e, greedy);
    gpus.set(serde_json::json!([fake_gpu(
        &gpus.uuid(0),
        "NVIDIA H100 80GB HBM3",
        24,
        10,
        &[(pid, 10)]
    )]));
    let d = e.wait_final(greedy);
    assert!(
        d["job"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("stopped: used 10.0 GiB")),
        "{d}"
    );
    gpus.set(serde_json::json!([fake_gpu(
        &gpus.uuid(0),
        "NVIDIA H100 80GB HBM3",
        24,
        0,
        &[]
    )]));
    e.kill9();
    e.restart();
    // 24 GiB: the rerun held at 10 GiB leaves 14; a 16 GiB job waits (at 4 GiB it would start).
    let again = e.submit_yaml("greedy", &spec);
    e.wait_state(again, "running");
    let big = e.submit_yaml(
        "big",
        &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\ngpu_memory: 16GiB\n"),
    );
    e.wait_until("the 16 GiB job to wait for the learned memory", || {
        e.show(big)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("needs 16.0 GiB"))
    });
    assert_eq!(e.show(big)["job"]["state"], "queued", "{}", e.show(big));
    for id in [again, big] {
        e.gantry(&["cancel", &id.to_string()]);
    }
}

/// The main process of a running job's container, as the host sees it.
fn container_pid(e: &Engine, id: i64) -> u32 {
    let d = e.wait_state(id, "running");
    let cid = d["attempts"].as_array().unwrap().last().unwrap()["container_id"]
        .as_str()
        .expect("a running job has a container")
        .to_string();
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Pid}}", &cid])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}
