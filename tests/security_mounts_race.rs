//! Issue 7, hole 1, the race after the check: a user who swaps a component of her checked mount path
//! for a symlink before Docker mounts it must not get the symlink's target. A root engine pins the very
//! file her check opened under its state dir and gives Docker that path; pinned mounts are read-only when
//! asked and are released once the container has started (issue 29, hole 0), also across engine restarts.
//!
//! The swap must land between the check and the container's start. Through the CLI that window cannot be
//! hit deterministically, so the first test drives the engine's own steps (check as the user, pin, then
//! create and start with the real Docker executor) and swaps in between.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gantry_core::access::{check_mounts, Cred, Forbidden, ResolvedMount};
use gantry_core::executor::{DockerExecutor, Executor, GpuBinding, Launch};
use gantry_core::spec::{validate_text, Format, Mount, Origin};
use gantry_core::staging::Staging;

use crate::helpers::*;

/// Mount points at or below `dir` with their options (mountinfo fields 5 and 6).
fn mounts_under(dir: &Path) -> HashMap<String, String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[4] == dir || f[4].starts_with(&format!("{dir}/"))).then(|| (f[4].to_string(), f[5].to_string()))
        })
        .collect()
}

/// Run `command` as `u` in a container with `mounts`; its output.
async fn output_of(exec: &DockerExecutor, name: &str, u: &User, command: &str, mounts: Vec<ResolvedMount>) -> String {
    let job = validate_text(
        &format!("image: {IMAGE}\ngpus: 0\ncommand: {command:?}\n"),
        Format::Yaml,
        &Origin::default(),
    )
    .unwrap();
    let l = Launch {
        engine_id: "race-test",
        db_uid: "race-test",
        name: name.into(),
        job_id: 1,
        attempt_id: 1,
        attempt_n: 1,
        job: &job,
        uid: u.uid,
        gid: u.gid,
        groups: vec![u.gid],
        mounts,
        gpus: vec![],
        gpu_uuids: vec![],
        gpu_total_memory: None,
        binding: GpuBinding::EnvOnly,
        container: Default::default(),
        preemptible: false,
        restart_count: 0,
        results_env: vec![],
        start_gate: None,
        command: None,
        image: None,
    };
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    let cid = exec.create(&l).await.unwrap();
    exec.start(&cid).await.unwrap();
    exec.wait(&cid).await.unwrap();
    let out = Command::new("docker").args(["logs", &cid]).output().unwrap();
    exec.remove(&cid).await.unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Releases a test's pinned mounts even when it fails.
struct Release<'a>(&'a Staging, &'a str);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = self.0.release(self.1);
    }
}

#[test]
fn a_path_swapped_after_the_check_cannot_redirect_the_mount() {
    ensure_image();
    let alice = user("gantry-alice");
    let dir = alice.private_dir("race");
    let data = dir.join("data");
    let made = alice.sh(&format!("mkdir {0} && echo alice-data > {0}/file.txt", data.display()));
    assert!(made.status.success(), "{made:?}");
    // A 755 folder with a 644 file, reachable only through root's 700 folder: once mounted, alice could read it.
    let secret = tempfile::Builder::new()
        .prefix("gantry-secret-")
        .tempdir_in("/root")
        .unwrap();
    chmod(secret.path(), 0o700);
    let inner = secret.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    chmod(&inner, 0o755);
    std::fs::write(inner.join("file.txt"), "FLAG{root}\n").unwrap();
    chmod(&inner.join("file.txt"), 0o644);

    // The engine's steps: check as alice, then pin what her check opened.
    let state = tempfile::tempdir().unwrap();
    let staging = Staging::in_state_dir(state.path());
    let mount = Mount {
        host: data.to_string_lossy().into_owned(),
        container: "/d".into(),
        read_only: true,
    };
    let checked = check_mounts(
        &Cred::of_user(alice.uid, alice.gid),
        &[mount],
        None,
        &Forbidden::default(),
    )
    .unwrap();
    let unpinned = vec![checked[0].mount.clone()];
    assert_eq!(unpinned[0].host, data);
    let name = format!("gantry-race-test-{}", std::process::id());
    let pinned = staging.stage(&name, checked).unwrap();
    let _release = Release(&staging, &name);

    // Now alice swaps her checked directory for a symlink into root's secret directory.
    let swapped = alice.sh(&format!(
        "mv {0} {0}.old && ln -s {1} {0}",
        data.display(),
        inner.display()
    ));
    assert!(swapped.status.success(), "{swapped:?}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let exec = DockerExecutor::connect().unwrap();
    let seen = rt.block_on(output_of(
        &exec,
        &name,
        &alice,
        "cat /d/file.txt; touch /d/new || echo write refused",
        pinned.clone(),
    ));
    assert!(
        seen.contains("alice-data") && !seen.contains("FLAG"),
        "the job must see what alice's check opened: {seen}"
    );
    assert!(
        seen.contains("write refused") && seen.contains("Read-only file system"),
        ":ro holds: {seen}"
    );
    assert!(!dir.join("data.old/new").exists());
    assert!(
        pinned[0].host.starts_with(staging.root()),
        "a root engine gives Docker its staging path: {pinned:?}"
    );
    // Control: Docker given the checked path (what the engine did before pinning) follows the swap as root.
    let unsafe_seen = rt.block_on(output_of(&exec, &name, &alice, "cat /d/file.txt", unpinned));
    assert!(
        unsafe_seen.contains("FLAG"),
        "the swap must be a real attack for this test to mean anything: {unsafe_seen}"
    );

    staging.release(&name).unwrap();
    assert!(mounts_under(state.path()).is_empty(), "released");
    assert_eq!(
        std::fs::read_to_string(dir.join("data.old/file.txt")).unwrap(),
        "alice-data\n",
        "alice's files are untouched"
    );
}

/// A spec by `u` whose job mounts `data` read-only and `out` read-write, then waits for `out/<go>`.
fn waiting_spec(u: &User, dir: &Path, name: &str, data: &Path, out: &Path, go: &str) -> PathBuf {
    let command = format!(
        "cat /d/in.txt; echo result > /o/{name}.txt; if touch /d/new 2>/dev/null; then echo WROTE-RO; else echo ro-refused; fi; \
         while [ ! -e /o/{go} ]; do sleep 0.1; done"
    );
    let text = format!(
        "image: {IMAGE}\ngpus: 0\nmounts: ['{}:/d:ro', '{}:/o']\ncommand: {command:?}\n",
        data.display(),
        out.display()
    );
    u.write(&dir.join(format!("{name}.yaml")), &text)
}

fn submit_as(e: &Engine, u: &User, spec: &Path) -> i64 {
    let v = e.json_as(u, &["submit", spec.to_str().unwrap()]);
    v[0]["job_id"].as_i64().unwrap_or_else(|| panic!("{v}"))
}

#[test]
fn pinned_mounts_are_read_only_when_asked_and_released_when_jobs_end() {
    let mut e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("pinned");
    let (data, out, spare) = (dir.join("data"), dir.join("out"), dir.join("spare"));
    let made = alice.sh(&format!(
        "mkdir {0} {1} {2} && echo input-data > {0}/in.txt && echo keep > {2}/keep.txt",
        data.display(),
        out.display(),
        spare.display()
    ));
    assert!(made.status.success(), "{made:?}");
    let staging = e.state.join("mnt");

    let id = submit_as(&e, &alice, &waiting_spec(&alice, &dir, "one", &data, &out, "go1"));
    e.wait_state(id, "running");
    // Pinned from create to start only (issue 29, hole 0): the running container holds its own binds.
    let pinned = mounts_under(&staging);
    assert!(
        pinned.is_empty(),
        "nothing stays pinned under the state dir while the job runs: {pinned:?}"
    );
    assert!(alice.sh(&format!("touch {}/go1", out.display())).status.success());
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}");
    let log = e.logs(id);
    assert!(
        log.contains("input-data") && log.contains("ro-refused") && !log.contains("WROTE-RO"),
        "{log}"
    );
    assert!(!data.join("new").exists());
    let result = std::fs::metadata(out.join("one.txt")).expect("the read-write mount reaches alice's folder");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&result), alice.uid);
    // Released right after the end is recorded (which `wait_final` sees).
    let state = e.state.clone();
    let released = || mounts_under(&state).is_empty() && std::fs::read_dir(&staging).unwrap().count() == 0;
    e.wait_until("no pinned mount or staging path to outlive its job", released);

    // Across an engine restart: stale pins (their container is gone) are released at start, and releasing
    // never deletes what was mounted.
    let id = submit_as(&e, &alice, &waiting_spec(&alice, &dir, "two", &data, &out, "go2"));
    e.wait_state(id, "running");
    e.kill9();
    let stale = staging.join("gantry-gone-j999-a1").join("0");
    std::fs::create_dir_all(&stale).unwrap();
    let bound = Command::new("mount")
        .args(["--bind", spare.to_str().unwrap(), stale.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(bound.status.success(), "{bound:?}");
    e.restart();
    e.wait_until("the stale pinned mount to be released", || {
        !stale.parent().unwrap().exists()
    });
    assert!(
        mounts_under(&staging).is_empty(),
        "the running job needs no pins: {:?}",
        mounts_under(&staging)
    );
    assert_eq!(std::fs::read_to_string(spare.join("keep.txt")).unwrap(), "keep\n");
    assert!(alice.sh(&format!("touch {}/go2", out.display())).status.success());
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
    e.wait_until("the pinned mounts to be released after the restart too", released);
}
