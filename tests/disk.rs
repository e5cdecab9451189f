//! One user's job cannot fill the disk every job shares (issue 18 item 2): each job's writable
//! layer is bounded where Docker's storage driver can (`[disk] layer_size`), `gantry status` says
//! whether it is, and below the lab's `[disk] min_free` on Docker's root dir no new job starts: the
//! reason names the top writers (`gantry status`, the job's reason) until space is freed or the
//! threshold lowered.

use std::process::Command;

use crate::dl_defaults::{container_of, docker_inspect};
use crate::helpers::*;

fn reload(e: &Engine, lab: &std::path::Path, text: &str) {
    std::fs::write(lab, text).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(e.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

#[test]
fn below_the_labs_free_space_no_job_starts_and_the_top_writers_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    // Two CPU-only jobs at once (the writer stays while the second waits for disk, not for the one
    // CPU-only share the lab keeps by default): CPU-only jobs get no share here.
    std::fs::write(
        &lab,
        "[containers]\ncpu_only_cpus = \"none\"\ncpu_only_memory = \"none\"\n[disk]\nmin_free = \"1GiB\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap()]);

    // A job that writes 30 MiB into its container's writable layer, then stays.
    let writer = e.submit_yaml("writer", &format!("image: {IMAGE}\ngpus: 0\ncommand: '/bin/busybox dd if=/dev/zero of=/tmp/fill bs=1M count=30 2>/dev/null; echo written; sleep 300'\n"));
    let cid = container_of(&e, writer);
    e.wait_until("the writer to write", || e.logs(writer).contains("written"));

    // Where the driver can bound a layer the container is bounded; where not, `gantry status` says so.
    let info = String::from_utf8_lossy(
        &Command::new("docker")
            .args(["info", "-f", "{{.Driver}} {{json .DriverStatus}}"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    let status = String::from_utf8_lossy(&e.gantry(&["status"]).stdout).into_owned();
    let opt = docker_inspect(&cid)["HostConfig"]["StorageOpt"].clone();
    if info.starts_with("overlay2") && info.contains("extfs") {
        assert!(status.contains("disk: jobs' writable layers are NOT bounded: Docker's overlay2 is on extfs; Docker bounds it only on xfs with `pquota`, btrfs or zfs"), "{status}");
        assert!(opt.is_null(), "{opt}");
    } else {
        assert!(
            status.contains("disk: each job's writable layer is bounded to 100.0 GiB"),
            "{info}\n{status}"
        );
        assert_eq!(opt["size"], (100u64 << 30).to_string(), "{opt}");
    }

    // The lab asks for more free space than Docker's disk has ("100%" can never be met).
    reload(
        &e,
        &lab,
        "[containers]\ncpu_only_cpus = \"none\"\ncpu_only_memory = \"none\"\n[disk]\nmin_free = \"100%\"\n",
    );
    let mut problem = String::new();
    e.wait_until("the disk problem in gantry status", || {
        problem = e.json(&["status"])["disk_problem"].as_str().unwrap_or("").to_string();
        !problem.is_empty()
    });
    assert!(
        problem.contains("free, below the lab's minimum of 100% (disk.min_free in")
            && problem.contains("no new job starts until space is freed"),
        "{problem}"
    );
    assert!(
        problem.contains(&format!("top writers: job {writer} (root) 30.0 MiB")),
        "{problem}"
    );
    assert!(String::from_utf8_lossy(&e.gantry(&["status"]).stdout).contains(&format!("WARNING: {problem}")));
    let waits = e.submit_yaml("waits", &format!("image: {IMAGE}\ngpus: 0\ncommand: echo started\n"));
    e.wait_until("the new job to wait for disk space", || {
        e.show(waits)["reason"].as_str().is_some_and(|r| r == problem)
    });
    assert_eq!(e.show(waits)["job"]["state"], "queued");

    // Lowered again: the job starts.
    reload(
        &e,
        &lab,
        "[containers]\ncpu_only_cpus = \"none\"\ncpu_only_memory = \"none\"\n[disk]\nmin_free = \"1GiB\"\n",
    );
    assert_eq!(e.wait_final(waits)["job"]["state"], "succeeded", "{}", e.logs(waits));
    assert!(e.json(&["status"])["disk_problem"].is_null());
    assert!(e.gantry(&["cancel", &writer.to_string()]).status.success());
    assert_eq!(e.wait_final(writer)["job"]["state"], "cancelled");
}
