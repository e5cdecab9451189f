//! Issue 7, holes 1, 2 and 9: a job mounts a host path only if its submitter, with their own uid, gid
//! and groups, can reach it, read it and (read-write) write it; nothing that exposes the container engine
//! or Gantry's state; and a bind mount never creates a host path.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::helpers::*;

/// A CPU job spec in `dir`, owned by `u`, with one mount.
fn spec(u: &User, dir: &Path, name: &str, mount: &str, command: &str) -> PathBuf {
    u.write(
        &dir.join(format!("{name}.yaml")),
        &format!("image: {IMAGE}\ngpus: 0\nmounts: ['{mount}']\ncommand: {command:?}\n"),
    )
}

fn submit(e: &Engine, u: &User, spec: &Path) -> Result<i64, String> {
    let out = e.gantry_user(u, &["submit", spec.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        Ok(stdout
            .trim()
            .rsplit(' ')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("no job id in {stdout:?}")))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Submit each case as `u`. Each must be refused with a message that names its mount (`host:container`)
/// and contains `want`. A case the engine takes is run to its end and reported with what it printed.
fn all_refused(e: &Engine, u: &User, cases: &[(PathBuf, String, &str)]) -> Vec<String> {
    let mut problems = vec![];
    let mut messages = vec![];
    for (spec, names, want) in cases {
        match submit(e, u, spec) {
            Ok(id) => {
                let j = e.wait_final(id);
                problems.push(format!(
                    "{names}: ACCEPTED as job {id}, which ended {}; it printed:\n{}",
                    j["job"]["state"],
                    e.logs(id)
                ));
            }
            Err(msg) if !msg.contains(&format!("mount \"{names}")) || !msg.contains(want) => problems.push(format!(
                "{names}: refused, but the message does not name the mount or lacks {want:?}: {msg}"
            )),
            Err(msg) => messages.push(msg),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n---\n"));
    messages
}

/// A root-only secret: `/root/<dir 700>/flag.txt` (644).
fn root_secret() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::Builder::new()
        .prefix("gantry-secret-")
        .tempdir_in("/root")
        .unwrap();
    chmod(d.path(), 0o700);
    let flag = d.path().join("flag.txt");
    std::fs::write(&flag, "FLAG{root}\n").unwrap();
    chmod(&flag, 0o644);
    (d, flag)
}

#[test]
fn mounts_the_submitter_cannot_read_or_write_are_refused() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = alice.private_dir("mounts");
    let (_root_dir, flag) = root_secret();
    let bob_file = bob.write(&bob.private_dir("notes").join("notes.txt"), "FLAG{bob}\n"); // 644, in bob's 700 home
                                                                                          // The same root file, relative to the spec file in alice's folder.
    let up = "../".repeat(dir.components().count() - 1);
    let rel = format!("{up}{}", flag.strip_prefix("/").unwrap().display());
    let (f, b) = (flag.display().to_string(), bob_file.display().to_string());
    let cases = [
        (
            spec(&alice, &dir, "root", &format!("{f}:/f:ro"), "cat /f"),
            format!("{f}:/f:ro"),
            "permission denied on /root",
        ),
        (
            spec(&alice, &dir, "bob", &format!("{b}:/f:ro"), "cat /f"),
            format!("{b}:/f:ro"),
            "permission denied on /home/gantry-bob",
        ),
        (
            spec(&alice, &dir, "relative", &format!("{rel}:/f:ro"), "cat /f"),
            format!("{f}:/f:ro"),
            "gantry-alice cannot reach",
        ),
        // Readable, but a read-write mount needs write access: alice cannot write /etc.
        (
            spec(&alice, &dir, "etc", &format!("{up}../etc:/etc2"), "ls /etc2"),
            "/etc:/etc2".into(),
            "gantry-alice cannot write /etc",
        ),
    ];
    let messages = all_refused(&e, &alice, &cases);
    for m in &messages {
        assert!(
            m.contains("submitter's own permissions"),
            "the message must say whose permissions count: {m}"
        );
    }
    assert!(
        messages[3].contains(":ro"),
        "a refused read-write mount suggests `:ro`: {}",
        messages[3]
    );
    assert!(e.our_containers().is_empty(), "no container may have been created");
}

#[test]
fn mounts_that_expose_the_container_engine_or_gantry_are_refused() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("expose");
    let sock = dir.join("sock");
    std::os::unix::fs::symlink("/var/run/docker.sock", &sock).unwrap();
    chown(&sock, alice.uid, alice.gid);
    let state = e.state.display().to_string();
    let cases = [
        (
            spec(&alice, &dir, "varrun", "/var/run:/r:ro", "ls -l /r"),
            "/var/run:/r:ro".to_string(),
            "contains the Docker socket",
        ),
        (
            spec(&alice, &dir, "run", "/run:/r:ro", "ls -l /r"),
            "/run:/r:ro".into(),
            "contains the Docker socket",
        ),
        (
            spec(&alice, &dir, "state", &format!("{state}:/g:ro"), "ls -l /g"),
            format!("{state}:/g:ro"),
            "is the Gantry state directory",
        ),
        (
            spec(
                &alice,
                &dir,
                "sock",
                &format!("{}:/var/run/docker.sock", sock.display()),
                "ls -l /var/run/docker.sock",
            ),
            format!("{}:/var/run/docker.sock", sock.display()),
            "is the Docker socket",
        ),
        (
            spec(&alice, &dir, "host", "/:/host:ro", "ls /host/root"),
            "/:/host:ro".into(),
            "whole host file system",
        ),
    ];
    let messages = all_refused(&e, &alice, &cases);
    assert!(
        messages[3].contains("which leads to /run/docker.sock"),
        "the message shows where the symlink led: {}",
        messages[3]
    );
    assert!(e.our_containers().is_empty());
}

#[test]
fn missing_mount_paths_are_refused_and_never_created() {
    let e = Engine::start(&[]);
    let (alice, _bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = alice.private_dir("missing");
    let tag = dir.file_name().unwrap().to_string_lossy().into_owned();
    let cron = PathBuf::from(format!("/etc/cron.d/gantry-{tag}"));
    let in_bob = PathBuf::from(format!("/home/gantry-bob/{tag}"));
    let mine = dir.join("not-yet");
    let cases = [
        (
            spec(&alice, &dir, "cron", &format!("{}:/x", cron.display()), "true"),
            format!("{}:/x", cron.display()),
            "does not exist",
        ),
        // bob's home is closed to alice: she learns nothing about what is in it.
        (
            spec(&alice, &dir, "bob", &format!("{}:/x", in_bob.display()), "true"),
            format!("{}:/x", in_bob.display()),
            "permission denied",
        ),
        (
            spec(&alice, &dir, "mine", &format!("{}:/x", mine.display()), "true"),
            format!("{}:/x", mine.display()),
            "never creates host paths",
        ),
    ];
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| all_refused(&e, &alice, &cases)));
    let created: Vec<String> = [&cron, &in_bob, &mine]
        .iter()
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    for p in &created {
        let _ = std::fs::remove_dir(p);
    }
    assert!(created.is_empty(), "host paths were created: {created:?}");
    result.unwrap();
}

#[test]
fn own_folders_mount_read_write_as_the_owner_and_symlinks_mount_their_target() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("own");
    let out = dir.join("out");
    alice.sh(&format!(
        "mkdir {0} && echo hello > {0}/hello.txt && ln -s {0} {1}/link",
        out.display(),
        dir.display()
    ));
    let s = spec(
        &alice,
        &dir,
        "write",
        &format!("{}:/out", out.display()),
        "echo written > /out/result.txt",
    );
    let id = submit(&e, &alice, &s).unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let meta = std::fs::metadata(out.join("result.txt")).expect("the job wrote into alice's folder");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), alice.uid);

    // Through a symlink in her folder: Docker gets the link's target, pinned under the state dir.
    let s = spec(
        &alice,
        &dir,
        "link",
        &format!("{}/link:/d:ro", dir.display()),
        "cat /d/hello.txt; ls -di /d; sleep 60",
    );
    let id = submit(&e, &alice, &s).unwrap();
    e.wait_state(id, "running");
    let ps = Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=dev.gantry.engine={}", e.engine_id),
        ])
        .args(["--filter", &format!("label=dev.gantry.job={id}")])
        .output()
        .unwrap();
    let cid = String::from_utf8_lossy(&ps.stdout).trim().to_string();
    // The job's own mount (the container also gets its owner's /etc/passwd and /etc/group).
    let mounts = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{range .Mounts}}{{if eq .Destination \"/d\"}}{{.Type}} {{.Source}} {{.RW}};{{end}}{{end}}",
            &cid,
        ])
        .output()
        .unwrap();
    let mounts = String::from_utf8_lossy(&mounts.stdout).trim().to_string();
    let source = mounts
        .strip_prefix("bind ")
        .and_then(|m| m.strip_suffix(" false;"))
        .unwrap_or_else(|| panic!("{mounts}"));
    assert!(Path::new(source).starts_with(e.state.join("mnt")), "{mounts}");
    // Unpinned once the container started (issue 29, hole 0): it holds its own copy of the bind.
    assert!(
        !Path::new(source).exists(),
        "{source} is still pinned under the state dir"
    );
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&out).unwrap());
    e.wait_until("the job to show its /d's inode", || {
        e.logs(id)
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [ino.to_string().as_str(), "/d"])
    });
    assert!(e.gantry_user(&alice, &["cancel", &id.to_string()]).status.success());
    e.wait_final(id);
    assert!(e.logs(id).contains("hello"), "{}", e.logs(id));
}

#[test]
fn a_folder_shared_through_a_group_mounts_for_its_members_only() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    add_to_group(&alice, "gantry-lab");
    let gid = Command::new("getent").args(["group", "gantry-lab"]).output().unwrap();
    let gid: u32 = String::from_utf8_lossy(&gid.stdout)
        .split(':')
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    let top = tempfile::Builder::new().prefix("gantry-lab-").tempdir().unwrap();
    chmod(top.path(), 0o755);
    let lab = top.path().join("datasets");
    std::fs::create_dir(&lab).unwrap();
    std::fs::write(lab.join("data.txt"), "lab data\n").unwrap();
    chown(&lab, 0, gid);
    chown(&lab.join("data.txt"), 0, gid);
    chmod(&lab, 0o750);
    chmod(&lab.join("data.txt"), 0o640);
    let mount = format!("{}:/lab:ro", lab.display());

    let s = spec(&alice, &alice.private_dir("lab"), "lab", &mount, "cat /lab/data.txt");
    let id = submit(&e, &alice, &s).unwrap_or_else(|m| panic!("a member of gantry-lab may mount it: {m}"));
    assert_eq!(
        e.wait_final(id)["job"]["state"],
        "succeeded",
        "the job reads through the group too: {}",
        e.logs(id)
    );
    assert!(e.logs(id).contains("lab data"));

    let s = spec(&bob, &bob.private_dir("lab"), "lab", &mount, "cat /lab/data.txt");
    let msg = all_refused(&e, &bob, &[(s, mount.clone(), "gantry-bob cannot read")]);
    assert!(msg[0].contains(&lab.display().to_string()), "{}", msg[0]);
}

#[test]
fn a_mount_that_became_unreadable_while_queued_fails_at_launch_and_never_runs() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("launch");
    let data = dir.join("data");
    alice.sh(&format!("mkdir {}", data.display()));
    let blocker = alice.write(
        &dir.join("blocker.yaml"),
        &format!("image: {IMAGE}\ngpus: 2\ncommand: sleep 300\n"),
    );
    let blocker = submit(&e, &alice, &blocker).unwrap();
    e.wait_state(blocker, "running");
    let s = alice.write(
        &dir.join("waits.yaml"),
        &format!(
            "image: {IMAGE}\ngpus: 1\nretries: 2\nmounts: ['{}:/d:ro']\ncommand: echo RAN\n",
            data.display()
        ),
    );
    let id = submit(&e, &alice, &s).expect("readable at submit time");
    assert_eq!(e.show(id)["job"]["state"], "queued");
    chmod(&data, 0o000); // as root, while the job waits for a GPU
    assert!(e
        .gantry_user(&alice, &["cancel", &blocker.to_string()])
        .status
        .success());

    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "failed", "{j}");
    assert_eq!(
        j["attempts"].as_array().unwrap().len(),
        1,
        "a refused mount is not retried: {j}"
    );
    let log = e.logs(id);
    assert!(!log.contains("RAN"), "the job must never run: {log}");
    let want = format!("mount \"{}:/d:ro\": gantry-alice cannot read", data.display());
    assert!(log.contains(&want), "the log says why: {log}");
    assert!(
        j["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|ev| ev["message"].as_str().is_some_and(|m| m.contains(&want))),
        "{j}"
    );
}
