//! A root engine watching drop folders that users own: it never follows their links, never runs one
//! user's file or template as another user, and never rejects a file for its own trouble.

use crate::helpers::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A folder under /tmp owned by `u` with `mode` (others reach it only if the mode lets them).
fn tmp_dir_of(u: &User, tag: &str, mode: u32) -> PathBuf {
    let d = tempfile::Builder::new()
        .prefix(&format!("gantry-{tag}-"))
        .tempdir_in("/tmp")
        .unwrap()
        .keep();
    chown(&d, u.uid, u.gid);
    chmod(&d, mode);
    d
}

fn run_as(u: &User, script: &str) {
    let out = u.sh(&format!("set -e; {script}"));
    assert!(
        out.status.success(),
        "as {}: {script}\n{}",
        u.name,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A unique tag for this test's file names (the random suffix of a test folder).
fn tag_of(dir: &Path) -> String {
    dir.file_name()
        .unwrap()
        .to_string_lossy()
        .rsplit('-')
        .next()
        .unwrap()
        .to_string()
}

/// Entries of a folder with (uid, mode), and the folder's own (uid, mode).
fn snapshot(dir: &str) -> (BTreeMap<String, (u32, u32)>, (u32, u32)) {
    let entries = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let m = std::fs::symlink_metadata(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), (m.uid(), m.mode())))
        })
        .collect();
    let m = std::fs::metadata(dir).unwrap();
    (entries, (m.uid(), m.mode()))
}

/// Wait until `dir/name` is explained by an error file next to it, or has gone (moved by the engine).
fn wait_handled(e: &Engine, dir: &Path, name: &str) -> Option<String> {
    let (file, report) = (dir.join(name), dir.join(format!("{name}.error.txt")));
    e.wait_until(&format!("{} to be handled", file.display()), || {
        report.exists() || std::fs::symlink_metadata(&file).is_err()
    });
    std::fs::read_to_string(&report).ok()
}

/// Wait until `name` was accepted or rejected in `dir`; Ok(accepted name) or Err(error report).
fn wait_verdict(e: &Engine, dir: &Path, name: &str) -> Result<String, String> {
    let find = || {
        let accepted = std::fs::read_dir(dir.join("accepted"))
            .ok()?
            .flatten()
            .map(|f| f.file_name().to_string_lossy().into_owned())
            .find(|f| f.ends_with(&format!("-{name}")));
        // A rejected file is moved aside first, then its error file appears (renamed in whole): wait for both.
        let report = std::fs::read_to_string(dir.join("rejected").join(format!("{name}.error.txt")));
        accepted.map(Ok).or_else(|| {
            (dir.join("rejected").join(name).exists() && report.is_ok()).then(|| Err(report.unwrap_or_default()))
        })
    };
    e.wait_until(&format!("{name} to be accepted or rejected"), || find().is_some());
    find().unwrap()
}

fn assert_no_jobs(e: &Engine) {
    let q = e.json(&["ls"]);
    let h = e.json(&["history"]);
    assert!(
        q.as_array().unwrap().is_empty() && h.as_array().unwrap().is_empty(),
        "no job was queued:\n{q}\n{h}"
    );
}

#[test]
fn links_in_a_users_drop_folder_are_never_followed() {
    let alice = user("gantry-alice");
    let inbox = alice.private_dir("inbox");
    let tag = tag_of(&inbox);
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    let (etc, root) = (snapshot("/etc"), snapshot("/root"));
    // t1's rejected/ and the inbox's own rejected/ point at /etc; t2's accepted/ at a path in /root.
    run_as(
        &alice,
        &format!(
            "cd {}; mkdir t1 t2; printf 'image = \"{IMAGE}\"\\ncommand = \"cat {{config}}\"\\n' > t1/gantry.toml; cp t1/gantry.toml t2/; \
             ln -s /etc t1/rejected; ln -s /root/gantry-{tag} t2/accepted; rmdir rejected; ln -s /etc rejected",
            inbox.display()
        ),
    );
    let drops = [
        ("t1", format!("good-{tag}.yaml")),
        ("t1", format!("bad-{tag}.yaml")),
        ("t2", format!("good-{tag}.yaml")),
        (".", format!("good-{tag}.yaml")),
        (".", format!("bad-{tag}.yaml")),
    ];
    for (dir, name) in &drops {
        let body = if name.starts_with("bad") {
            r"\377\376 [unclosed".to_string()
        } else {
            format!("image: {IMAGE}\\ncommand: [echo, hi]\\n")
        };
        run_as(
            &alice,
            &format!("cd {}/{dir}; printf '{body}' > {name}", inbox.display()),
        );
    }
    let reports: Vec<_> = drops
        .iter()
        .map(|(dir, name)| wait_handled(&e, &inbox.join(dir), name))
        .collect();
    for (dir, before) in [("/etc", etc), ("/root", root)] {
        let after = snapshot(dir);
        assert_eq!(after.1, before.1, "{dir} itself is unchanged");
        for (name, (uid, _)) in &after.0 {
            assert!(
                !name.contains(&tag) && *uid != alice.uid,
                "nothing of alice's lands in {dir}: {name}"
            );
        }
        for (name, m) in &before.0 {
            if let Some(now) = after.0.get(name) {
                assert_eq!(now.0, m.0, "{dir}/{name} keeps its owner");
            }
        }
    }
    for ((dir, name), report) in drops.iter().zip(reports) {
        let folder = inbox.join(dir);
        assert!(
            std::fs::symlink_metadata(folder.join(name)).is_ok(),
            "{dir}/{name} stays in alice's folder"
        );
        let report = report.unwrap_or_else(|| panic!("{dir}/{name} is explained next to it"));
        assert!(
            report.contains("is a symbolic link") && report.contains("remove the link"),
            "{dir}/{name}: {report}"
        );
        let owner = std::fs::metadata(folder.join(format!("{name}.error.txt")))
            .unwrap()
            .uid();
        assert_eq!(owner, alice.uid, "the error file is alice's");
    }
    assert!(
        !Path::new(&format!("/root/gantry-{tag}")).exists(),
        "nothing is created in /root"
    );
    assert_no_jobs(&e);
    assert_eq!(
        std::fs::metadata(inbox.join("accepted")).unwrap().uid(),
        alice.uid,
        "the engine made accepted/ for the folder's owner"
    );
}

#[test]
fn a_template_folder_open_to_all_cannot_run_its_owners_command_as_another_user() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let inbox = tmp_dir_of(&alice, "inbox", 0o755);
    let tag = tag_of(&inbox);
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    // alice's template writes into whatever home it mounts, as whoever drops a config.
    run_as(
        &alice,
        &format!(
            "cd {}; mkdir shared; chmod 1777 shared; \
             printf 'image = \"{IMAGE}\"\\ncommand = \"id -u > /b/pwned-{tag}; cat {{config}}\"\\nmounts = [\"{}:/b\"]\\n' > shared/gantry.toml",
            inbox.display(),
            bob.home.display()
        ),
    );
    let name = format!("exp-{tag}.yaml");
    run_as(&bob, &format!("echo 'lr: 0.1' > {}/shared/{name}", inbox.display()));
    let report = wait_handled(&e, &inbox.join("shared"), &name);
    let kept = std::fs::metadata(inbox.join("shared").join(&name));
    assert!(
        kept.as_ref().is_ok_and(|m| m.uid() == bob.uid),
        "bob's file is left where he put it: {kept:?}"
    );
    let report = report.expect("an error file explains");
    assert!(
        report.contains("owned by gantry-bob")
            && report.contains("belongs to gantry-alice")
            && report.contains("drop files into your own drop folder"),
        "{report}"
    );
    assert_eq!(
        std::fs::metadata(inbox.join("shared").join(format!("{name}.error.txt")))
            .unwrap()
            .uid(),
        bob.uid
    );
    assert!(!bob.home.join(format!("pwned-{tag}")).exists(), "no job ran as bob");
    assert_no_jobs(&e);
}

#[test]
fn a_template_owned_by_another_user_is_not_used() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let inbox = tmp_dir_of(&alice, "inbox", 0o755);
    let tag = tag_of(&inbox);
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    run_as(&alice, &format!("mkdir {0}/t; chmod 1777 {0}/t", inbox.display()));
    run_as(
        &bob,
        &format!(
            "printf 'image = \"{IMAGE}\"\\ncommand = \"cat {{config}}\"\\n' > {}/t/gantry.toml",
            inbox.display()
        ),
    );
    let name = format!("exp-{tag}.yaml");
    run_as(&alice, &format!("echo 'lr: 0.1' > {}/t/{name}", inbox.display()));
    let report = wait_verdict(&e, &inbox.join("t"), &name).expect_err("alice's config is not run with bob's template");
    assert!(
        report.contains("belongs to gantry-bob") && report.contains("owned by root"),
        "{report}"
    );
    assert!(inbox.join("t/rejected").join(&name).exists(), "alice's file is kept");
    assert_no_jobs(&e);
}

#[test]
fn a_file_moved_in_from_another_user_does_not_run_as_them() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let inbox = tmp_dir_of(&alice, "inbox", 0o700);
    let share = tmp_dir_of(&alice, "share", 0o1777);
    let tag = tag_of(&inbox);
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    let name = format!("job-{tag}.yaml");
    run_as(
        &bob,
        &format!(
            "printf 'image: {IMAGE}\\ncommand: id -u\\n' > {}/{name}",
            share.display()
        ),
    );
    // alice owns the shared folder, so she may move bob's file out of it into her drop folder.
    run_as(&alice, &format!("mv {}/{name} {}/", share.display(), inbox.display()));
    let report = wait_handled(&e, &inbox, &name);
    let kept = std::fs::metadata(inbox.join(&name));
    assert!(
        kept.as_ref().is_ok_and(|m| m.uid() == bob.uid),
        "bob's file stays where alice put it: {kept:?}"
    );
    let report = report.expect("an error file explains");
    assert!(
        report.contains("owned by gantry-bob") && report.contains("belongs to gantry-alice"),
        "{report}"
    );
    assert_no_jobs(&e);
    let _ = std::fs::remove_dir_all(&share);
}

#[test]
fn a_spec_saved_with_a_byte_order_mark_is_accepted() {
    let e = Engine::start(&[]);
    e.drop_bytes(
        "bom.yaml",
        format!("\u{feff}image: {IMAGE}\ncommand: [echo, bom yaml ok]\ngpus: 0\n").as_bytes(),
    );
    e.drop_bytes(
        "bom.toml",
        format!("\u{feff}image = \"{IMAGE}\"\ncommand = \"echo bom toml ok\"\ngpus = 0\n").as_bytes(),
    );
    for (name, want) in [("bom.yaml", "bom yaml ok"), ("bom.toml", "bom toml ok")] {
        let accepted = wait_verdict(&e, &e.inbox(), name).unwrap_or_else(|r| panic!("{name} was rejected: {r}"));
        let id: i64 = accepted.split('-').next().unwrap().parse().unwrap();
        assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
        assert!(e.logs(id).contains(want));
    }
    let f = e.write_spec(
        "cli-bom.yaml",
        &format!("\u{feff}image: {IMAGE}\ncommand: [echo, cli ok]\ngpus: 0\n"),
    );
    let id = e.json(&["submit", f.to_str().unwrap()])[0]["job_id"].as_i64().unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
}

/// The engine's `RLIMIT_NOFILE` as (soft, hard), or set it.
fn nofile(pid: u32, set: Option<&str>) -> String {
    let mut c = Command::new("prlimit");
    c.arg("--pid").arg(pid.to_string());
    match set {
        Some(v) => c.arg(format!("--nofile={v}")),
        None => c.args(["--nofile", "--raw", "--noheadings", "--output=SOFT,HARD"]),
    };
    let out = c.output().expect("run prlimit");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn a_file_dropped_while_the_engine_is_out_of_file_descriptors_is_queued_later() {
    let e = Engine::start(&[]);
    let pid = e.pid();
    let limits = nofile(pid, None);
    let hard = limits.split(':').nth(1).unwrap().to_string();
    // Descriptors 0-2 stay open, so with a limit of 3 every new open fails with EMFILE, as when
    // others hold all of the engine's descriptors.
    nofile(pid, Some(&format!("3:{hard}")));
    e.drop_file(
        "starved.yaml",
        &format!("image: {IMAGE}\ncommand: [echo, fed]\ngpus: 0\n"),
    );
    let dropped = e.inbox().join("starved.yaml");
    e.wait_until("the engine to try the file", || {
        !dropped.exists()
            || e.daemon_log()
                .lines()
                .any(|l| l.contains("starved.yaml") && l.contains("will retry"))
    });
    nofile(pid, Some(&limits));
    let verdict = wait_verdict(&e, &e.inbox(), "starved.yaml");
    let accepted = verdict.unwrap_or_else(|r| panic!("the file was rejected for the engine's own trouble: {r}"));
    let id: i64 = accepted.split('-').next().unwrap().parse().unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
    assert!(e.logs(id).contains("fed"));
}

#[test]
fn a_file_dropped_into_a_setgid_folder_does_not_hand_its_dropper_the_folders_group() {
    let bob = user("gantry-sgid-bob");
    let _g = USERADD.lock().unwrap_or_else(|p| p.into_inner());
    let _ = Command::new("groupadd").arg("-f").arg("gantry-sgid-lab").output();
    drop(_g);
    let lab = String::from_utf8(
        Command::new("getent")
            .args(["group", "gantry-sgid-lab"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let lab_gid: u32 = lab.split(':').nth(2).unwrap().parse().unwrap();
    // A lab-only dataset.
    let data = tempfile::Builder::new()
        .prefix("gantry-sgid-data-")
        .tempdir_in("/tmp")
        .unwrap()
        .keep();
    std::fs::write(data.join("secret.txt"), "lab only\n").unwrap();
    chown(&data, 0, lab_gid);
    chmod(&data, 0o750);
    chown(&data.join("secret.txt"), 0, lab_gid);
    chmod(&data.join("secret.txt"), 0o640);
    // bob's drop folder, set up by an admin in the lab's group and setgid (bob himself is not in the lab).
    let inbox = tempfile::Builder::new()
        .prefix("gantry-sgid-inbox-")
        .tempdir_in("/tmp")
        .unwrap()
        .keep();
    chown(&inbox, bob.uid, lab_gid);
    chmod(&inbox, 0o2775);
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    let spec = format!(
        "image: {IMAGE}\ngpus: 0\ncommand: cat /data/secret.txt\nmounts: ['{}:/data:ro']\n",
        data.display()
    );
    // The file takes the folder's group (checked before it is renamed in, so the engine sees it whole).
    run_as(
        &bob,
        &format!(
            "cd {}; printf '%b' \"{}\" > .x.tmp; test \"$(stat -c %g .x.tmp)\" = {lab_gid}; mv .x.tmp read.yaml",
            inbox.display(),
            spec.replace('\n', "\\n")
        ),
    );
    match wait_verdict(&e, &inbox, "read.yaml") {
        Err(report) => assert!(
            report.contains("/data") || report.contains(&data.display().to_string()),
            "refused for the mount: {report}"
        ),
        Ok(accepted) => {
            let id: i64 = accepted.split('-').next().unwrap().parse().unwrap();
            let j = e.wait_final(id);
            panic!(
                "bob's job ran with the lab's group ({}): {}",
                j["job"]["state"],
                e.logs(id)
            );
        }
    }
}

/// Issue 18, item 16: a drop that only time can let in (its owner's queue is full) waits with one
/// error file, is not read again at every rescan, and is queued once there is room.
#[test]
fn a_drop_refused_by_a_full_queue_waits_with_one_error_file_and_is_queued_once_there_is_room() {
    let bob = user("gantry-bob");
    let inbox = tmp_dir_of(&bob, "inbox", 0o700);
    let tag = tag_of(&inbox);
    let specs = tmp_dir_of(&bob, "specs", 0o700);
    let lab = specs.join("config.toml");
    std::fs::write(&lab, "[limits]\nmax_queued_jobs = 1\n").unwrap();
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap(), "--config", lab.to_str().unwrap()]);
    // bob's queue is full: a job holds both GPUs and another waits behind it.
    let submit = |name: &str, text: String| {
        let f = bob.write(&specs.join(name), &text);
        e.json_as(&bob, &["submit", f.to_str().unwrap()])[0]["job_id"]
            .as_i64()
            .unwrap()
    };
    let hog = submit(
        "hog.yaml",
        format!("name: hog\nimage: {IMAGE}\ngpus: 2\ncommand: [sleep, '300']\n"),
    );
    e.wait_state(hog, "running");
    let waiter = submit(
        "waiter.yaml",
        format!("name: waiter\nimage: {IMAGE}\ngpus: 1\ncommand: [echo, waited]\n"),
    );
    let names: Vec<String> = (0..4).map(|i| format!("wait-{i}-{tag}.yaml")).collect();
    for n in &names {
        run_as(
            &bob,
            &format!(
                "printf 'image: {IMAGE}\\ngpus: 1\\ncommand: [echo, dropped]\\n' > {}/{n}",
                inbox.display()
            ),
        );
    }
    let report = |n: &str| inbox.join(format!("{n}.error.txt"));
    e.wait_until("an error file next to each waiting drop", || {
        names.iter().all(|n| report(n).exists())
    });
    let mtimes: Vec<_> = names
        .iter()
        .map(|n| std::fs::metadata(report(n)).unwrap().modified().unwrap())
        .collect();
    for n in &names {
        let text = std::fs::read_to_string(report(n)).unwrap();
        assert!(
            text.contains("did not queue")
                && text.contains("queued jobs per user")
                && text.contains("tries it again by itself"),
            "{text}"
        );
        assert_eq!(
            std::fs::metadata(report(n)).unwrap().uid(),
            bob.uid,
            "the report is bob's"
        );
        assert!(inbox.join(n).exists(), "the file stays where it is");
    }
    // Two rescans (every 10 s) pass: a waiting file is not read, checked and logged again at each.
    std::thread::sleep(std::time::Duration::from_secs(25));
    let log = e.daemon_log();
    for (n, m) in names.iter().zip(&mtimes) {
        assert_eq!(
            std::fs::metadata(report(n)).unwrap().modified().unwrap(),
            *m,
            "{n}: one error file, written once"
        );
        let lines = log.lines().filter(|l| l.contains(n.as_str())).count();
        assert_eq!(lines, 1, "{n} is logged once while it waits:\n{log}");
    }
    // Room for one: one of the files is queued at its next try, and its error file goes.
    assert!(e.gantry(&["cancel", &waiter.to_string()]).status.success());
    e.wait_until("a waiting drop to be queued", || {
        std::fs::read_dir(inbox.join("accepted")).unwrap().flatten().count() == 1
    });
    let accepted = std::fs::read_dir(inbox.join("accepted"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
    let queued = names.iter().find(|n| accepted.ends_with(n.as_str())).unwrap();
    assert!(!report(queued).exists(), "the queued file's error file is gone");
    assert_eq!(
        names
            .iter()
            .filter(|n| inbox.join(n).exists() && report(n).exists())
            .count(),
        3,
        "the others wait on"
    );
    let _ = std::fs::remove_dir_all(&specs);
}

/// Issue 18, item 17: a file name with a line break cannot forge a line in the engine's log.
#[test]
fn a_file_name_with_a_line_break_cannot_forge_a_line_in_the_engines_log() {
    let alice = user("gantry-alice");
    let inbox = tmp_dir_of(&alice, "inbox", 0o700);
    let tag = tag_of(&inbox);
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    let forged = format!("2026-01-01T00:00:00.000000Z  INFO gantry: forged-{tag} job 1 ran as root");
    run_as(
        &alice,
        &format!(
            "cd {}; n=\"$(printf 'evil\\n{forged}.yaml')\"; printf 'not: [valid' > \"$n\"",
            inbox.display()
        ),
    );
    let name = format!("evil\n{forged}.yaml");
    e.wait_until("the file to be rejected", || {
        inbox.join("rejected").join(format!("{name}.error.txt")).exists()
    });
    let log = e.daemon_log();
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01T00:00:00.000000Z")),
        "a forged line in the engine's log:\n{log}"
    );
    assert!(
        log.contains(&format!("evil\\n{forged}.yaml")),
        "the name is logged escaped:\n{log}"
    );
}

/// Issue 18, item 17: a file its writer keeps open is not read half-written, however long the
/// writer pauses: only its close (or a rename into the folder) counts.
#[test]
fn a_file_still_being_written_is_queued_once_from_the_whole_file() {
    let alice = user("gantry-alice");
    let inbox = tmp_dir_of(&alice, "inbox", 0o700);
    let tag = tag_of(&inbox);
    let side = tmp_dir_of(&alice, "side", 0o700);
    let e = Engine::start(&["--inbox", inbox.to_str().unwrap()]);
    let (file, go) = (inbox.join(format!("slow-{tag}.yaml")), side.join("go"));
    let mut writer = alice
        .command("sh")
        .arg("-c")
        .arg(format!(
            "exec 3> {}; printf 'image: {IMAGE}\\ngpus: 0\\n' >&3; while [ ! -e {} ]; do sleep 0.2; done; printf 'command: [echo, whole-{tag}]\\n' >&3; exec 3>&-",
            file.display(),
            go.display()
        ))
        .spawn()
        .unwrap();
    // A failed test must not leave the writer waiting forever (it holds the test's output open).
    struct Stop(std::path::PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, "");
        }
    }
    let _stop = Stop(go.clone());
    e.wait_until("the first half to be written", || {
        std::fs::metadata(&file).is_ok_and(|m| m.len() > 0)
    });
    // The writer pauses past two rescans (every 10 s), holding the file open.
    std::thread::sleep(std::time::Duration::from_secs(25));
    assert!(file.exists(), "the half-written file was taken: {}", e.daemon_log());
    std::fs::write(&go, "").unwrap();
    assert!(writer.wait().unwrap().success());
    let id = wait_verdict(&e, &inbox, &format!("slow-{tag}.yaml")).unwrap_or_else(|r| panic!("rejected: {r}"));
    let id: i64 = id.split('-').next().unwrap().parse().unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
    assert!(
        e.logs(id).contains(&format!("whole-{tag}")),
        "the job ran the whole file: {}",
        e.logs(id)
    );
    let jobs = e.json(&["history"]).as_array().unwrap().len() + e.json(&["ls"]).as_array().unwrap().len();
    assert_eq!(jobs, 1, "exactly one job");
    let _ = std::fs::remove_dir_all(&side);
}
