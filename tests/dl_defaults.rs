//! Container defaults for deep learning (issue 12 item 3): a PyTorch-style spec gets a large /dev/shm,
//! NVIDIA's ulimits, its owner's groups, a writable HOME and CPU/RAM limits from the lab's per-GPU
//! share; `ipc: host` and `home: mount` need the lab's consent; CPUs are scheduled like GPUs.

use std::process::Command;

use crate::helpers::*;
use gantry_core::scheduler::format_cpus;
use serde_json::Value;

const GIB: u64 = 1 << 30;

pub(crate) fn docker_inspect(cid: &str) -> Value {
    let out = Command::new("docker").args(["inspect", cid]).output().unwrap();
    assert!(
        out.status.success(),
        "docker inspect {cid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()[0].clone()
}

/// The container of a running job.
pub(crate) fn container_of(e: &Engine, id: i64) -> String {
    let d = e.wait_state(id, "running");
    d["attempts"].as_array().unwrap().last().unwrap()["container_id"]
        .as_str()
        .expect("a running job has a container")
        .to_string()
}

/// Submit `yaml` as `u` from a file in their home: the job id, or the error text.
pub(crate) fn submit_as(e: &Engine, u: &User, yaml: &str) -> Result<i64, String> {
    let dir = u.private_dir("dl");
    let f = u.write(&dir.join("train.yaml"), yaml);
    let out = e.gantry_user(u, &["--json", "submit", f.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["job_id"].as_i64().ok_or_else(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// CPU thousandths and RAM the engine gives jobs with the default lab config: the machine less
/// 1 CPU and 2 GiB, at least half of it (packaging/config.toml, `reserve_cpus`, `reserve_memory`).
pub(crate) fn capacity() -> (u64, u64) {
    let cpus = std::thread::available_parallelism().unwrap().get() as u64 * 1000;
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mem = kb * 1024;
    (
        cpus.saturating_sub(1000).max(cpus / 2),
        mem.saturating_sub(2 * GIB).max(mem / 2),
    )
}

/// Locked memory a container gets for `memlock: unlimited`: -1, or on a host whose runtime may not
/// raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE, e.g. Docker inside a container) the hard limit it has.
fn memlock_expected() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bnd = u64::from_str_radix(
        status
            .lines()
            .find(|l| l.starts_with("CapBnd:"))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap(),
        16,
    )
    .unwrap();
    if bnd & (1 << 24) != 0 {
        return -1;
    }
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let hard = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .unwrap()
        .split_whitespace()
        .nth(4)
        .unwrap();
    if hard == "unlimited" {
        -1
    } else {
        hard.parse().unwrap()
    }
}

#[test]
fn a_pytorch_style_job_gets_shm_ulimits_groups_home_and_cpu_ram_limits() {
    let alice = user("gantry-alice");
    add_to_group(&alice, "gantry-dl-lab");
    let lab_gid: u32 = String::from_utf8_lossy(
        &Command::new("getent")
            .args(["group", "gantry-dl-lab"])
            .output()
            .unwrap()
            .stdout,
    )
    .split(':')
    .nth(2)
    .unwrap()
    .parse()
    .unwrap();
    let e = Engine::start(&["--gpus", "sim:2x24GiB"]);
    let signal = alice.private_dir("dl-signal");
    // No shm_size, cpus or memory: everything below comes from the lab's defaults.
    let spec = format!(
        "name: train\nimage: {IMAGE}\ngpus: 1\nmounts: ['{}:/signal']\n\
         command: 'echo checkpoint > \"$HOME/model.pt\" && cat \"$HOME/model.pt\" && echo home=$HOME && until [ -e /signal/done ]; do sleep 0.1; done'\n",
        signal.display()
    );
    let id = submit_as(&e, &alice, &spec).unwrap();
    let c = docker_inspect(&container_of(&e, id));
    let hc = &c["HostConfig"];
    // Two GPUs: three equal shares of what jobs may use (one kept for CPU-only jobs); one GPU, one share.
    let (cpus, mem) = capacity();
    let (share_cpus, share_mem) = (cpus / 3, mem / 3);
    assert_eq!(hc["NanoCpus"].as_i64(), Some(share_cpus as i64 * 1_000_000), "{hc}");
    assert_eq!(hc["Memory"].as_i64(), Some(share_mem as i64), "{hc}");
    assert_eq!(
        hc["MemorySwap"], hc["Memory"],
        "no swap on top of the memory limit: {hc}"
    );
    assert_eq!(
        hc["ShmSize"].as_i64(),
        Some((share_mem / 2) as i64),
        "half the memory limit: {hc}"
    );
    let ulimit = |name: &str| {
        hc["Ulimits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["Name"] == name)
            .map(|u| (u["Soft"].as_i64().unwrap(), u["Hard"].as_i64().unwrap()))
    };
    let memlock = memlock_expected();
    assert_eq!(ulimit("memlock"), Some((memlock, memlock)), "{hc}");
    assert_eq!(ulimit("stack"), Some((67108864, 67108864)), "{hc}");
    assert!(
        hc["GroupAdd"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g == &Value::String(lab_gid.to_string())),
        "alice's supplementary group: {hc}"
    );
    assert_eq!(hc["IpcMode"], "private");
    let home = alice.home.display().to_string();
    assert!(
        c["Config"]["Env"]
            .as_array()
            .unwrap()
            .contains(&Value::String(format!("HOME={home}"))),
        "{}",
        c["Config"]["Env"]
    );
    assert!(
        hc["Tmpfs"][&home]
            .as_str()
            .is_some_and(|o| o.contains(&format!("uid={}", alice.uid))),
        "a per-job tmpfs HOME owned by alice: {hc}"
    );
    std::fs::write(signal.join("done"), "").unwrap();
    let d = e.wait_final(id);
    assert_eq!(
        d["job"]["state"],
        "succeeded",
        "the job writes to $HOME: {}",
        e.logs(id)
    );
    let logs = e.logs(id);
    assert!(
        logs.contains("checkpoint") && logs.contains(&format!("home={home}")),
        "{logs}"
    );
    assert!(
        !alice.home.join("model.pt").exists(),
        "the tmpfs HOME is the job's own, not alice's real home"
    );
}

#[test]
fn ipc_host_and_home_mount_are_refused_unless_the_lab_config_allows_them() {
    let alice = user("gantry-alice");
    let e = Engine::start(&[]);
    let ipc = format!("image: {IMAGE}\ngpus: 0\nipc: host\ncommand: sleep 300\n");
    let err = submit_as(&e, &alice, &ipc).unwrap_err();
    assert!(
        err.contains("`ipc: host` is not allowed on this machine") && err.contains("allow_ipc_host = true"),
        "{err}"
    );
    let err = submit_as(&e, &alice, &format!("image: {IMAGE}\ngpus: 0\nhome: mount\n")).unwrap_err();
    assert!(err.contains("`home: mount` is not enabled on this machine"), "{err}");
    drop(e);

    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(&lab, "[containers]\nallow_ipc_host = true\nhome = \"mount\"\n").unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap()]);
    let id = submit_as(&e, &alice, &ipc).unwrap();
    assert_eq!(docker_inspect(&container_of(&e, id))["HostConfig"]["IpcMode"], "host");
    assert!(e.gantry(&["cancel", &id.to_string()]).status.success());
    // HOME is alice's real home, read-write: the job's file lands there, owned by her.
    let mine = alice.private_dir("dl-home");
    let name = mine.file_name().unwrap().to_string_lossy().into_owned();
    let id = submit_as(
        &e,
        &alice,
        &format!("image: {IMAGE}\ngpus: 0\ncommand: 'echo saved > \"$HOME/{name}/out.txt\"'\n"),
    )
    .unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let out = mine.join("out.txt");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "saved\n");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&out).unwrap()),
        alice.uid
    );
}

#[test]
fn a_job_asking_more_cpus_than_are_free_waits_with_the_reason_while_a_smaller_one_starts() {
    let alice = user("gantry-alice");
    // One GPU: a CPU-only job may hold half the CPUs (the other half is the GPU's share), a 1-GPU
    // job all of them (no other GPU needs a share).
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    let (cap, _) = capacity();
    let cpus = |m: u64| format!("{}", m as f64 / 1000.0);
    let half = cap / 2;
    let big = submit_as(
        &e,
        &alice,
        &format!(
            "name: big\nimage: {IMAGE}\ngpus: 0\ncpus: {}\ncommand: sleep 300\n",
            cpus(half)
        ),
    )
    .unwrap();
    e.wait_state(big, "running");
    // A GPU is free, but not the CPUs it asks for.
    let whole = submit_as(
        &e,
        &alice,
        &format!(
            "name: whole\nimage: {IMAGE}\ngpus: 1\ncpus: {}\ncommand: 'true'\n",
            cpus(cap)
        ),
    )
    .unwrap();
    let small = submit_as(
        &e,
        &alice,
        &format!("name: small\nimage: {IMAGE}\ngpus: 1\ncpus: 0.1\ncommand: 'true'\n"),
    )
    .unwrap();
    assert_eq!(e.wait_final(small)["job"]["state"], "succeeded");
    let want = format!(
        "needs {} CPU{}, {} free (gantry-alice's job {big} uses {})",
        format_cpus(cap),
        if cap == 1000 { "" } else { "s" },
        format_cpus(cap - half),
        format_cpus(half)
    );
    // The one GPU shows the small job's process until the next sample: wait for the CPUs' reason.
    e.wait_until("the CPU reason", || {
        e.show(whole)["reason"].as_str() == Some(want.as_str())
    });
    let d = e.show(whole);
    assert_eq!(
        (d["job"]["state"].as_str(), d["reason"].as_str()),
        (Some("queued"), Some(want.as_str())),
        "{d}"
    );
    let ls = String::from_utf8_lossy(&e.gantry(&["ls"]).stdout).into_owned();
    assert!(ls.contains(&want), "`gantry ls` says why: {ls}");
    assert!(e.gantry(&["cancel", &big.to_string()]).status.success());
    assert_eq!(
        e.wait_final(whole)["job"]["state"],
        "succeeded",
        "it starts once the CPUs are free"
    );
}
