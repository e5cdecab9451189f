//! A hostile local user against the rules of the guide's "Security model" (docs/book/src/security.md): each test is
//! a hole found by attacking a root engine as real users, and fails on the code before its fix.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::helpers::*;

fn submit(e: &Engine, u: &User, spec: &Path) -> Result<i64, String> {
    let out = e.gantry_user(u, &["submit", "--json", spec.to_str().unwrap()]);
    if out.status.success() {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        Ok(v[0]["job_id"].as_i64().unwrap_or_else(|| panic!("no job id in {v}")))
    } else {
        // `--json` reports a refused file in its output.
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Submit as `u`; the spec must be refused with a message containing `want`. A spec the engine takes is
/// run to its end and reported with what it printed.
fn refused(e: &Engine, u: &User, spec: &Path, want: &str) -> String {
    match submit(e, u, spec) {
        Ok(id) => {
            let j = e.wait_final(id);
            panic!(
                "ACCEPTED as job {id}, which ended {}; it printed:\n{}",
                j["job"]["state"],
                e.logs(id)
            )
        }
        Err(msg) => {
            assert!(
                msg.contains(want),
                "refused, but the message lacks {want:?}: {msg}\n{}",
                e.daemon_log()
            );
            msg
        }
    }
}

/// The path-check helper is a fork of the engine: without care it holds every file the engine has
/// open, and `/proc/self/fd/N` leads alice past directories she may not enter, here into bob's drop
/// folder inside his private home.
#[test]
fn a_mount_of_proc_self_fd_does_not_reach_what_the_engine_has_open() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let inbox = bob.private_dir("redteam-fd").join("inbox"); // in bob's 700 home and a 700 folder
    let out = bob.sh(&format!(
        "mkdir -m 755 {0} && echo 'FLAG{{bob}}' > {0}/.secret && chmod 644 {0}/.secret",
        inbox.display()
    ));
    assert!(out.status.success(), "{out:?}");
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    assert!(
        alice.sh(&format!("ls {}", inbox.display())).status.code() != Some(0),
        "alice cannot reach bob's drop folder herself"
    );
    // The engine keeps its drop folder open; alice would simply try every small number.
    let fd = std::fs::read_dir(format!("/proc/{}/fd", e.pid()))
        .unwrap()
        .flatten()
        .find(|f| std::fs::read_link(f.path()).is_ok_and(|t| t == inbox))
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .expect("the engine holds its drop folder open");
    let dir = alice.private_dir("redteam-fd");
    for (name, mount) in [
        ("fd", format!("/proc/self/fd/{fd}:/x:ro")),
        ("cwd", "/proc/self/cwd:/x:ro".to_string()),
    ] {
        let spec = alice.write(
            &dir.join(format!("{name}.yaml")),
            &format!("image: {IMAGE}\ngpus: 0\nmounts: ['{mount}']\ncommand: cat /x/.secret\n"),
        );
        refused(&e, &alice, &spec, &mount);
    }
}

/// `matrix` counts its combinations with a plain product: 64 keys of 2 values overflow it (a panic in
/// a debug build, a wrap to 0 that passes the 1,000-job limit and then expands forever in a release one).
#[test]
fn a_matrix_whose_size_overflows_is_refused_and_the_engine_lives_on() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("redteam-matrix");
    let keys: Vec<String> = (0..64).map(|i| format!("k{i}: [0, 1]")).collect();
    let spec = alice.write(
        &dir.join("huge.yaml"),
        &format!("image: {IMAGE}\ngpus: 0\nmatrix: {{{}}}\n", keys.join(", ")),
    );
    refused(&e, &alice, &spec, "the limit is 1000");
    assert!(
        e.gantry_user(&alice, &["status"]).status.success(),
        "the engine keeps serving: {}",
        e.daemon_log()
    );
}

/// One request may not make the engine store a gigabyte: a 1 MB spec times a 1,000-job matrix.
#[test]
fn a_sweep_that_would_store_huge_specs_is_refused() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("redteam-size");
    let blob = "x".repeat(100_000);
    let vals: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
    let spec = alice.write(
        &dir.join("big.yaml"),
        &format!(
            "image: {IMAGE}\ngpus: 0\ncommand: sleep 1\nenv: {{BLOB: {blob}}}\nmatrix: {{i: [{}]}}\n",
            vals.join(", ")
        ),
    );
    let msg = refused(&e, &alice, &spec, "limit");
    assert!(
        msg.contains("matrix"),
        "the message says the sweep is the problem: {msg}"
    );
    assert!(
        e.json_as(&alice, &["ls"]).as_array().unwrap().is_empty(),
        "nothing was queued"
    );
}

/// Every mount is checked by forking a helper, one at a time: thousands of mounts in one spec tie up
/// the engine's path checks (everyone's submissions and launches) for a long time.
#[test]
fn a_spec_with_thousands_of_mounts_is_refused() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("redteam-mounts");
    let mounts: Vec<String> = (0..5000).map(|i| format!("'{}:/m{i}:ro'", dir.display())).collect();
    let spec = alice.write(
        &dir.join("many.yaml"),
        &format!(
            "image: {IMAGE}\ngpus: 0\ncommand: 'true'\nmounts: [{}]\n",
            mounts.join(", ")
        ),
    );
    refused(&e, &alice, &spec, "has 5000 `mounts`; the limit is 100");
}

/// A job's name is on everyone's queue. The 200-character limit held for `name`, but a matrix value
/// went into the expanded name whole.
#[test]
fn names_made_by_a_matrix_stay_short() {
    let e = Engine::start(&["--gpus", "sim:1x24GiB"]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("redteam-name");
    let long = "A".repeat(50_000);
    let spec = alice.write(
        &dir.join("n.yaml"),
        &format!("name: sweep\nimage: {IMAGE}\ngpus: 1\ncommand: sleep 60\nmatrix: {{v: ['{long}']}}\n"),
    );
    let id = submit(&e, &alice, &spec).expect("a sweep with a long value is fine");
    let q = e.json_as(&user("gantry-bob"), &["ls"]);
    let name = q.as_array().unwrap().iter().find(|j| j["job"]["id"] == id).unwrap()["job"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        name.chars().count() <= 200 && name.starts_with("sweep[v=AAA"),
        "{} characters: {}...",
        name.len(),
        &name[..60.min(name.len())]
    );
    assert!(e.gantry_user(&alice, &["cancel", &id.to_string()]).status.success());
}

/// Docker (runc) makes a missing mount point or working directory as root, inside whatever host folder
/// is mounted there: a job could put root-owned entries into any folder its owner may write, such as a
/// shared 1777 folder, through a nested mount or `workdir`.
#[test]
fn nested_mounts_and_workdir_never_make_root_owned_host_paths() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let shared = tempfile::Builder::new()
        .prefix("gantry-redteam-shared-")
        .tempdir_in("/tmp")
        .unwrap();
    chmod(shared.path(), 0o1777);
    let s = shared.path().display();
    let dir = alice.private_dir("redteam-nested");
    let data = alice.write(&dir.join("data.txt"), "data\n");
    let cases = [
        (
            "workdir",
            format!("mounts: ['{s}:/t']\nworkdir: /t/made-by-root\n"),
            "/t/made-by-root",
        ),
        (
            "nested",
            format!("mounts: ['{s}:/t', '{}:/t/sub/data.txt:ro']\n", data.display()),
            "/t/sub",
        ),
        (
            "dotdot",
            format!("mounts: ['{s}:/t']\nworkdir: /t/x/../made-by-root\n"),
            "/t/made-by-root",
        ),
    ];
    let mut problems = vec![];
    for (name, extra, want) in cases {
        let spec = alice.write(
            &dir.join(format!("{name}.yaml")),
            &format!("image: {IMAGE}\ngpus: 0\ncommand: 'true'\n{extra}"),
        );
        match submit(&e, &alice, &spec) {
            Ok(id) => {
                e.wait_final(id);
                problems.push(format!("{name}: accepted as job {id}"));
            }
            Err(m) if !m.contains(want) || !m.contains("does not exist") => {
                problems.push(format!("{name}: message lacks {want:?}: {m}"))
            }
            Err(_) => {}
        }
    }
    let made: Vec<(PathBuf, u32)> = std::fs::read_dir(shared.path())
        .unwrap()
        .flatten()
        .map(|f| (f.path(), f.metadata().unwrap().uid()))
        .collect();
    assert!(made.is_empty(), "Docker made host paths: {made:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // What already exists is fine: a data folder nested in a project folder, a workdir inside it.
    let out = alice.sh(&format!(
        "mkdir -p {0}/proj/data {0}/proj/src {0}/ds && cp {1} {0}/ds/",
        dir.display(),
        data.display()
    ));
    assert!(out.status.success(), "{out:?}");
    let spec = alice.write(
        &dir.join("ok.yaml"),
        &format!("image: {IMAGE}\ngpus: 0\nworkdir: /w/src\nmounts: ['{0}/proj:/w', '{0}/ds:/w/data:ro']\ncommand: cat ../data/data.txt\n", dir.display()),
    );
    let id = submit(&e, &alice, &spec).unwrap_or_else(|m| panic!("an existing nested path is fine: {m}"));
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
}

/// Job names reach other users' terminals and the engine's log: a name with escapes or line breaks
/// (from the spec or from a dropped file's name) is refused at the source.
#[test]
fn names_with_terminal_escapes_or_line_breaks_are_refused() {
    let alice = user("gantry-alice");
    let inbox = alice.private_dir("redteam-esc");
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    let dir = alice.private_dir("redteam-esc-specs");
    let spec = alice.write(
        &dir.join("esc.yaml"),
        &format!("name: \"ok\\e[2J\\e[31mroot's job\"\nimage: {IMAGE}\ngpus: 0\n"),
    );
    refused(&e, &alice, &spec, "control characters");
    let bad = "fake\n2026-01-01T00:00:00Z ERROR forged\u{1b}[31m.yaml";
    let out = alice
        .command("sh")
        .arg("-c")
        .arg(format!("printf 'image: {IMAGE}\\ngpus: 0\\n' > \"$0\""))
        .arg(inbox.join(bad))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let error_file = inbox.join("rejected").join(format!("{bad}.error.txt"));
    // The file is moved aside first and its error file written next: wait for the error file's text.
    e.wait_until("the dropped file's error file", || {
        std::fs::read_to_string(&error_file).is_ok_and(|r| r.contains("rename the file"))
    });
    let report = std::fs::read_to_string(&error_file).unwrap_or_default();
    assert!(
        report.contains("control characters") && report.contains("rename the file"),
        "{report:?}\n{}",
        e.daemon_log()
    );
    assert!(
        e.json_as(&alice, &["ls"]).as_array().unwrap().is_empty()
            && e.json_as(&alice, &["history"]).as_array().unwrap().is_empty()
    );
}
