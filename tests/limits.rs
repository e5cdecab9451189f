//! One user's job cannot take the shared machine down (issue 18 item 1): a fork bomb stops at the
//! job's process limit (the lab's `pids_limit`, which a spec may lower but never raise) while the
//! machine, the engine and other jobs carry on.

use std::process::Command;

use crate::dl_defaults::{container_of, docker_inspect};
use crate::helpers::*;

/// A cgroup file (`pids.current`, `pids.max`) of container `cid` (cgroup v1 or v2, either driver).
fn pids_file(cid: &str, file: &str) -> String {
    let candidates = [
        format!("/sys/fs/cgroup/pids/docker/{cid}/{file}"),
        format!("/sys/fs/cgroup/pids/system.slice/docker-{cid}.scope/{file}"),
        format!("/sys/fs/cgroup/system.slice/docker-{cid}.scope/{file}"),
        format!("/sys/fs/cgroup/docker/{cid}/{file}"),
    ];
    let path = candidates
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| panic!("no pids cgroup for {cid}: {candidates:?}"));
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// Every process forks for ever (a shell that cannot fork gives up, so the bomb churns at the
/// limit); the job's own process becomes `sleep` once the bomb is lit, so the job lives on.
const BOMB: &str =
    "exec 2>/dev/null\nuntil [ -e /t/go ]; do sleep 0.1; done\nb() { while :; do b & done; }\nb &\nexec sleep 300\n";

#[test]
fn a_fork_bomb_stops_at_the_jobs_process_limit_and_the_machine_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    std::fs::write(dir.path().join("bomb.sh"), BOMB).unwrap();
    chmod(&dir.path().join("bomb.sh"), 0o644);
    let lab = dir.path().join("config.toml");
    // Three CPU-only jobs run at once here: their CPU/RAM is not counted (by default CPU-only jobs
    // together hold one share, issue 33).
    std::fs::write(
        &lab,
        "[containers]\npids_limit = 200\ncpu_only_cpus = \"none\"\ncpu_only_memory = \"none\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap()]);
    // A spec may not raise the lab's limit.
    let greedy = e.write_spec("greedy.yaml", &format!("image: {IMAGE}\ngpus: 0\npids_limit: 5000\n"));
    let out = e.gantry(&["submit", greedy.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("`pids_limit` is 5000; this machine allows at most 200 processes per job"),
        "{err}"
    );
    // The lab's limit is every job's default.
    let plain = e.submit_yaml("plain", &format!("image: {IMAGE}\ngpus: 0\ncommand: sleep 300\n"));
    assert_eq!(docker_inspect(&container_of(&e, plain))["HostConfig"]["PidsLimit"], 200);
    assert!(e.gantry(&["cancel", &plain.to_string()]).status.success());

    let id = e.submit_yaml(
        "bomb",
        &format!(
            "image: {IMAGE}\ngpus: 0\npids_limit: 100\nmounts: ['{}:/t:ro']\ncommand: [sh, /t/bomb.sh]\n",
            dir.path().display()
        ),
    );
    let cid = container_of(&e, id);
    let c = docker_inspect(&cid);
    // Checked before the bomb goes off: without a limit it would take this machine down.
    assert_eq!(
        c["HostConfig"]["PidsLimit"], 100,
        "a spec may lower the lab's limit: {}",
        c["HostConfig"]
    );
    assert_eq!(pids_file(&cid, "pids.max"), "100");
    std::fs::write(dir.path().join("go"), "").unwrap();
    e.wait_until("the bomb to reach its limit", || {
        pids_file(&cid, "pids.current").parse::<u32>().unwrap() >= 95
    });
    for _ in 0..20 {
        let n: u32 = pids_file(&cid, "pids.current").parse().unwrap();
        assert!(n <= 100, "{n} processes, past the job's limit of 100");
        // The machine stays usable: it forks, the engine answers, another job runs.
        assert!(Command::new("true").status().unwrap().success());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let other = e.submit_yaml("other", &format!("image: {IMAGE}\ngpus: 0\ncommand: echo still fine\n"));
    assert_eq!(e.wait_final(other)["job"]["state"], "succeeded", "{}", e.logs(other));
    assert!(e.logs(other).contains("still fine"));
    assert!(e.gantry(&["cancel", &id.to_string()]).status.success());
    assert_eq!(e.wait_final(id)["job"]["state"], "cancelled");
    e.wait_until("the bomb's container to be gone", || e.our_containers().is_empty());
}
