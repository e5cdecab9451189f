//! CPUs that frameworks see (issue 22 item 3): a whole-CPU share is pinned CPUs (the job's `nproc`
//! and affinity say so), never the same CPUs as another job's, and `OMP_NUM_THREADS` /
//! `MKL_NUM_THREADS` say how many threads to run unless the spec says; a fractional share stays a quota.

use crate::dl_defaults::{container_of, docker_inspect};
use crate::helpers::*;

const SEE: &str = "echo nproc=$(busybox nproc); busybox grep Cpus_allowed_list /proc/self/status; echo omp=$OMP_NUM_THREADS mkl=$MKL_NUM_THREADS; until [ -e /t/go ]; do sleep 0.1; done";

/// Whether a container of an engine other than `ours` is pinned to CPUs: other tests' engines on this
/// machine pin too, and every engine pins around every Gantry container's CPUs.
fn others_pinned(ours: &[&Engine]) -> bool {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=dev.gantry.cpus",
            "--filter",
            "status=running",
            "--filter",
            "status=created",
            "--format",
            "{{.Label \"dev.gantry.engine\"}}",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| !ours.iter().any(|e| e.engine_id == l))
}

/// Run `phase` (it says whether the jobs it started were pinned, and which they are) until it ran
/// while no other test's engine held pins, cancelling its jobs between tries.
fn in_a_quiet_moment(e: &Engine, ours: &[&Engine], mut phase: impl FnMut() -> (bool, Vec<i64>)) {
    for _ in 0..20 {
        e.wait_until("no other test's pinned jobs", || !others_pinned(ours));
        let (pinned, ids) = phase();
        if pinned {
            return;
        }
        assert!(
            others_pinned(ours),
            "a job was not pinned though no other engine held pins"
        );
        for id in ids {
            e.gantry(&["cancel", &id.to_string()]);
            e.wait_final(id);
        }
    }
    panic!("other tests held pinned CPUs all along");
}

/// The job's output lines (not Gantry's).
fn out(e: &Engine, id: i64) -> Vec<String> {
    e.logs(id)
        .lines()
        .filter(|l| !l.starts_with("[gantry"))
        .map(String::from)
        .collect()
}

#[test]
fn whole_cpu_shares_are_pinned_to_cpus_of_their_own_and_frameworks_are_told_their_threads() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    // No reserve: every CPU of this machine goes to jobs, so two 1-CPU jobs run side by side here;
    // no per-GPU CPU share, so no CPU is kept for the (idle, simulated) GPUs and a job may ask for all.
    let lab = dir.path().join("config.toml");
    // CPU-only jobs pinned side by side: they may hold every share (by default one, issue 33).
    std::fs::write(
        &lab,
        "[containers]\nreserve_cpus = 0\ncpus_per_gpu = \"none\"\ncpu_only_shares = 3\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap()]);
    let spec = |name: &str, extra: &str| {
        format!(
            "name: {name}\nimage: {IMAGE}\ngpus: 0\nmemory: 256MiB\n{extra}mounts: ['{}:/t:ro']\ncommand: '{SEE}'\n",
            dir.path().display()
        )
    };
    let (mut pinned, mut sets) = (vec![], vec![]);
    in_a_quiet_moment(&e, &[&e], || {
        pinned = (0..cpus.min(2))
            .map(|i| e.submit_yaml(&format!("one{i}"), &spec(&format!("one{i}"), "cpus: 1\n")))
            .collect();
        sets = pinned
            .iter()
            .map(|id| {
                docker_inspect(&container_of(&e, *id))["HostConfig"]["CpusetCpus"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        (sets.iter().all(|s| !s.is_empty()), pinned.clone())
    });
    assert!(
        sets.iter().all(|s| s.parse::<u32>().is_ok()),
        "one CPU of its own each: {sets:?}"
    );
    let mut distinct = sets.clone();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        sets.len(),
        "two jobs are never pinned to the same CPU: {sets:?}"
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    for (id, set) in pinned.iter().zip(&sets) {
        assert_eq!(e.wait_final(*id)["job"]["state"], "succeeded", "{}", e.logs(*id));
        assert_eq!(
            out(&e, *id),
            vec![
                "nproc=1".to_string(),
                format!("Cpus_allowed_list:\t{set}"),
                "omp=1 mkl=1".into()
            ],
            "the job sees its one CPU"
        );
    }
    std::fs::remove_file(dir.path().join("go")).unwrap();
    let own_threads = e.submit_yaml("half", &spec("half", "cpus: 0.5\nenv: {OMP_NUM_THREADS: '3'}\n"));
    let hc = docker_inspect(&container_of(&e, own_threads))["HostConfig"].clone();
    assert_eq!(
        (hc["CpusetCpus"].as_str().unwrap_or_default(), hc["NanoCpus"].as_i64()),
        ("", Some(500_000_000)),
        "half a CPU stays a quota: {hc}"
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(
        e.wait_final(own_threads)["job"]["state"],
        "succeeded",
        "{}",
        e.logs(own_threads)
    );
    assert_eq!(
        out(&e, own_threads)[2],
        "omp=3 mkl=1",
        "the spec's own OMP_NUM_THREADS is kept; half a CPU runs one thread"
    );

    // Another engine on this machine pins around this one's jobs; with no CPU free of pins, its job
    // gets the quota instead (never a CPU pinned to another job), and its log says so.
    std::fs::remove_file(dir.path().join("go")).unwrap();
    let (mut all, mut held) = (0, String::new());
    in_a_quiet_moment(&e, &[&e], || {
        all = e.submit_yaml("all", &spec("all", &format!("cpus: {cpus}\n")));
        held = docker_inspect(&container_of(&e, all))["HostConfig"]["CpusetCpus"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (!held.is_empty(), vec![all])
    });
    let count: usize = held
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('-').map_or(1, |(a, b)| {
                b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1
            })
        })
        .sum();
    assert_eq!(count, cpus, "every CPU: {held}");
    let other = Engine::start(&["--config", lab.to_str().unwrap()]);
    let late = other.submit_yaml("late", &spec("late", "cpus: 1\n"));
    let hc = docker_inspect(&container_of(&other, late))["HostConfig"].clone();
    assert_eq!(
        (hc["CpusetCpus"].as_str().unwrap_or_default(), hc["NanoCpus"].as_i64()),
        ("", Some(1_000_000_000)),
        "{hc}"
    );
    let note = format!("not pinned to CPUs: it asks for 1, and 0 of the {cpus} CPUs here are free of other jobs' pins; it gets a quota of 1 CPU instead, on the CPUs it shares");
    assert!(other.logs(late).contains(&note), "{}", other.logs(late));
    std::fs::write(dir.path().join("go"), "").unwrap();
    for (eng, id) in [(&e, all), (&other, late)] {
        assert_eq!(eng.wait_final(id)["job"]["state"], "succeeded", "{}", eng.logs(id));
    }
    assert_eq!(out(&other, late)[2], "omp=1 mkl=1");
}
