//! The system engine serves each user's own drop folder in their home: made for members of the
//! drop-folder group, set up by anyone with `gantry inbox init`. Files count only as the folder's
//! owner's, links in a home are never followed, and lab templates count only when root owns them.

use crate::helpers::*;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GROUP: &str = "gantry-lab";

/// A per-test drop folder path (`<top>/inbox`, relative to each home), removed from every home at the end.
struct InboxPath {
    top: String,
    homes: Vec<PathBuf>,
}

impl InboxPath {
    fn new(top_prefix: &str, users: &[&User]) -> InboxPath {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        InboxPath {
            top: format!("{top_prefix}{:x}", n ^ u128::from(std::process::id()) << 64),
            homes: users.iter().map(|u| u.home.clone()).collect(),
        }
    }
    fn rel(&self) -> String {
        format!("{}/inbox", self.top)
    }
    fn of(&self, u: &User) -> PathBuf {
        u.home.join(self.rel())
    }
}

impl Drop for InboxPath {
    fn drop(&mut self) {
        for h in &self.homes {
            let p = h.join(&self.top);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => drop(std::fs::remove_file(&p)),
                Ok(_) => drop(std::fs::remove_dir_all(&p)),
                Err(_) => {}
            }
        }
    }
}

/// `gantry ARGS` as `u`, who finds the system engine without configuration.
fn as_user(e: &Engine, u: &User, args: &[&str]) -> Output {
    u.command(bin())
        .env("GANTRY_SYSTEM_SOCKET", e.system_socket())
        .env_remove("GANTRY_STATE_DIR")
        .args(args)
        .current_dir("/")
        .output()
        .expect("run gantry")
}

fn json_as(e: &Engine, u: &User, args: &[&str]) -> Value {
    let out = as_user(e, u, &[args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "gantry {args:?} as {}: {}\n{}",
        u.name,
        String::from_utf8_lossy(&out.stderr),
        e.daemon_log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every job the engine knows (root sees them all).
fn all_jobs(e: &Engine) -> String {
    let root = |args: &[&str]| {
        let out = Command::new(bin())
            .env("GANTRY_SYSTEM_SOCKET", e.system_socket())
            .env_remove("GANTRY_STATE_DIR")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    root(&["ls", "--json"]) + &root(&["history", "--json"])
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

/// The job id once `dir/name` was accepted (`accepted/<id>-<name>`); panics with the report if rejected.
fn accepted_id(e: &Engine, dir: &Path, name: &str) -> i64 {
    let find = || -> Option<Result<String, String>> {
        let accepted = std::fs::read_dir(dir.join("accepted"))
            .ok()?
            .flatten()
            .map(|f| f.file_name().to_string_lossy().into_owned())
            .find(|f| f.ends_with(&format!("-{name}")));
        let report =
            || std::fs::read_to_string(dir.join("rejected").join(format!("{name}.error.txt"))).unwrap_or_default();
        accepted
            .map(Ok)
            .or_else(|| dir.join("rejected").join(name).exists().then(|| Err(report())))
    };
    e.wait_until(&format!("{name} to be accepted or rejected"), || find().is_some());
    let file = find().unwrap().unwrap_or_else(|r| panic!("{name} was rejected: {r}"));
    assert_eq!(
        std::fs::metadata(dir.join("accepted").join(&file)).unwrap().uid(),
        std::fs::metadata(dir).unwrap().uid(),
        "the accepted file stays its owner's"
    );
    file.split('-').next().unwrap().parse().unwrap()
}

/// Wait until `id` ended as `u` sees it; returns (`show --json`, its output).
fn finished_as(e: &Engine, u: &User, id: i64) -> (Value, String) {
    let mut last = Value::Null;
    e.wait_until(&format!("job {id} to end"), || {
        last = json_as(e, u, &["show", &id.to_string()]);
        ["succeeded", "failed", "cancelled", "timed_out"].contains(&last["job"]["state"].as_str().unwrap_or(""))
    });
    (
        last,
        String::from_utf8_lossy(&as_user(e, u, &["logs", &id.to_string()]).stdout).into_owned(),
    )
}

fn spec(cmd: &str) -> String {
    format!("image: {IMAGE}\ncommand: {cmd}\ngpus: 1\n")
}

#[test]
fn a_group_member_gets_her_own_drop_folder_and_only_her_files_run_there_as_her() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    add_to_group(&alice, GROUP);
    let p = InboxPath::new("Gantry/test-", &[&alice]);
    let e = Engine::system_with(&["--inbox-group", GROUP, "--inbox-path", &p.rel()]);
    let inbox = p.of(&alice);
    e.wait_until("the engine to make alice's drop folder", || {
        inbox.join("accepted").is_dir() && inbox.join("rejected").is_dir()
    });
    for d in [
        inbox.parent().unwrap().to_path_buf(),
        inbox.clone(),
        inbox.join("accepted"),
        inbox.join("rejected"),
    ] {
        assert_eq!(
            std::fs::metadata(&d).unwrap().uid(),
            alice.uid,
            "{} is alice's",
            d.display()
        );
    }
    assert_eq!(
        std::fs::metadata(&inbox).unwrap().mode() & 0o777,
        0o700,
        "made as alice, private"
    );
    let info = json_as(&e, &alice, &["inbox"]);
    assert_eq!(
        (info["path"].as_str(), info["watched"].as_bool()),
        (inbox.to_str(), Some(true)),
        "{info}"
    );
    let human = String::from_utf8_lossy(&as_user(&e, &alice, &["inbox"]).stdout).into_owned();
    assert!(
        human.contains(inbox.to_str().unwrap()) && human.contains("the engine watches it"),
        "{human}"
    );

    run_as(
        &alice,
        &format!(
            "printf '{}' > {}/whoami.yaml",
            spec("id -u").replace('\n', "\\n"),
            inbox.display()
        ),
    );
    let id = accepted_id(&e, &inbox, "whoami.yaml");
    let (job, logs) = finished_as(&e, &alice, id);
    assert_eq!(job["job"]["state"], "succeeded", "{job}");
    assert_eq!(job["job"]["owner_uid"], alice.uid);
    assert!(
        logs.lines()
            .any(|l| l.split_whitespace().last() == Some(&alice.uid.to_string())),
        "the container ran as alice: {logs}"
    );

    // A careless alice lets others write her drop folder, and bob's own file lands in it. (alice's
    // home stays private for the other tests: root makes bob's move.)
    chmod(&inbox, 0o1777);
    let bobs = bob.private_dir("move-in");
    bob.write(&bobs.join("bobs-job.yaml"), &spec("id -u"));
    std::fs::rename(bobs.join("bobs-job.yaml"), inbox.join("bobs-job.yaml")).unwrap();
    let report = inbox.join("bobs-job.yaml.error.txt");
    e.wait_until("bob's file to be explained", || report.exists());
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(
        text.contains("owned by gantry-bob") && text.contains("belongs to gantry-alice"),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(&report).unwrap().uid(),
        bob.uid,
        "the explanation is the file owner's"
    );
    assert_eq!(
        std::fs::metadata(inbox.join("bobs-job.yaml")).unwrap().uid(),
        bob.uid,
        "bob's file is left where it is"
    );
    assert!(
        !all_jobs(&e).contains("bobs-job"),
        "bob's file ran as nobody:\n{}",
        all_jobs(&e)
    );
    let _ = std::fs::remove_dir_all(&bobs);
}

#[test]
fn a_user_outside_the_group_sets_up_her_folder_with_inbox_init_and_it_survives_a_restart() {
    let carol = user("gantry-carol");
    let p = InboxPath::new("Gantry/test-", &[&carol]);
    let mut e = Engine::system_with(&["--inbox-path", &p.rel()]);
    let inbox = p.of(&carol);
    let before = json_as(&e, &carol, &["inbox"]);
    assert_eq!(before["watched"], false, "{before}");
    assert!(
        before["problem"].as_str().unwrap().contains("gantry inbox init"),
        "{before}"
    );
    assert!(!inbox.exists());

    let out = as_user(&e, &carol, &["inbox", "init"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        e.daemon_log()
    );
    assert!(
        text.contains(&format!("Your drop folder is ready: {}", inbox.display())) && text.contains("accepted/"),
        "{text}"
    );
    let m = std::fs::metadata(&inbox).unwrap();
    assert_eq!(
        (m.uid(), m.mode() & 0o777),
        (carol.uid, 0o700),
        "made by carol's own CLI"
    );
    run_as(
        &carol,
        &format!(
            "printf '{}' > {}/one.yaml",
            spec("id -u").replace('\n', "\\n"),
            inbox.display()
        ),
    );
    let id = accepted_id(&e, &inbox, "one.yaml");
    let (job, logs) = finished_as(&e, &carol, id);
    assert_eq!(
        (job["job"]["state"].as_str(), job["job"]["owner_uid"].as_u64()),
        (Some("succeeded"), Some(u64::from(carol.uid))),
        "{job}"
    );
    assert!(logs.contains(&carol.uid.to_string()), "{logs}");

    // Recorded by the engine: watched again after a restart, without another `init`.
    e.kill9();
    e.restart();
    e.wait_until("carol's folder to be watched again", || {
        json_as(&e, &carol, &["inbox"])["watched"] == true
    });
    run_as(
        &carol,
        &format!(
            "printf '{}' > {}/two.yaml",
            spec("echo again").replace('\n', "\\n"),
            inbox.display()
        ),
    );
    let id = accepted_id(&e, &inbox, "two.yaml");
    assert_eq!(finished_as(&e, &carol, id).0["job"]["owner_uid"], carol.uid);
}

#[test]
fn a_drop_folder_path_through_a_symbolic_link_in_a_home_is_refused() {
    let (alice, carol) = (user("gantry-alice"), user("gantry-carol"));
    add_to_group(&alice, GROUP);
    let p = InboxPath::new("Gantry-test-", &[&alice, &carol]);
    // alice's `~/Gantry-…` leads to /etc; carol's to a folder of her own elsewhere.
    run_as(&alice, &format!("ln -s /etc ~/{}", p.top));
    let elsewhere = carol.private_dir("elsewhere");
    run_as(&carol, &format!("ln -s {} ~/{}", elsewhere.display(), p.top));
    let e = Engine::system_with(&["--inbox-group", GROUP, "--inbox-path", &p.rel()]);
    e.wait_until("alice's folder to be skipped", || {
        e.daemon_log()
            .lines()
            .any(|l| l.contains("drop folder of gantry-alice skipped") && l.contains("symbolic link"))
    });
    assert!(
        !Path::new("/etc/inbox").exists(),
        "nothing is made through alice's link"
    );
    let info = json_as(&e, &alice, &["inbox"]);
    assert_eq!(info["watched"], false, "{info}");
    assert!(
        info["problem"].as_str().unwrap().contains("is a symbolic link"),
        "{info}"
    );

    let out = as_user(&e, &carol, &["inbox", "init"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "init through a link must fail");
    assert!(
        err.contains(&format!("{} is a symbolic link", carol.home.join(&p.top).display()))
            && err.contains("replace the link with a real folder"),
        "{err}"
    );
    assert_eq!(json_as(&e, &carol, &["inbox"])["watched"], false);
    assert!(
        !elsewhere.join("inbox/accepted").exists(),
        "the engine made nothing behind carol's link"
    );
    let _ = std::fs::remove_dir_all(&elsewhere);
}

#[test]
fn lab_templates_apply_to_drops_in_their_folder_only_when_root_owns_them() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    add_to_group(&alice, GROUP);
    let p = InboxPath::new("Gantry/test-", &[&alice]);
    let e = Engine::system_with(&["--inbox-group", GROUP, "--inbox-path", &p.rel()]);
    let lab = e.system_root().join("etc/gantry/templates");
    for (name, owner) in [("train", 0), ("bobs", bob.uid)] {
        std::fs::create_dir_all(lab.join(name)).unwrap();
        std::fs::write(
            lab.join(name).join("gantry.toml"),
            format!("image = \"{IMAGE}\"\ncommand = \"id -u; cat {{config}}\"\ngpus = 1\n"),
        )
        .unwrap();
        std::os::unix::fs::chown(lab.join(name), Some(owner), None).unwrap();
        std::fs::set_permissions(lab.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let inbox = p.of(&alice);
    e.wait_until("alice's drop folder", || inbox.join("accepted").is_dir());
    let info = json_as(&e, &alice, &["inbox"]);
    assert_eq!(
        info["lab_templates"],
        serde_json::json!(["train"]),
        "only root's templates are offered: {info}"
    );

    run_as(
        &alice,
        &format!(
            "cd {}; mkdir train bobs; echo lr=0.1 > train/exp.cfg; echo lr=0.2 > bobs/exp.cfg",
            inbox.display()
        ),
    );
    let id = accepted_id(&e, &inbox.join("train"), "exp.cfg");
    let (job, logs) = finished_as(&e, &alice, id);
    assert_eq!(
        (job["job"]["state"].as_str(), job["job"]["name"].as_str()),
        (Some("succeeded"), Some("train:exp")),
        "{job}"
    );
    assert_eq!(job["job"]["owner_uid"], alice.uid);
    assert!(
        logs.contains("lr=0.1") && logs.contains(&alice.uid.to_string()),
        "the lab template ran on alice's config, as alice: {logs}"
    );

    let rejected = inbox.join("bobs/rejected");
    e.wait_until("alice's file in bobs/ to be rejected", || {
        rejected.join("exp.cfg.error.txt").exists()
    });
    let report = std::fs::read_to_string(rejected.join("exp.cfg.error.txt")).unwrap();
    assert!(
        report.contains(&format!(
            "the lab template folder {} belongs to gantry-bob, not to root",
            lab.join("bobs").display()
        )),
        "{report}"
    );
    for f in ["exp.cfg", "exp.cfg.error.txt"] {
        assert_eq!(
            std::fs::metadata(rejected.join(f)).unwrap().uid(),
            alice.uid,
            "{f} is alice's"
        );
    }
    assert!(!all_jobs(&e).contains("bobs"), "bob's template never ran");
}

/// The inotify watches a process holds (every `inotify wd:` line of its inotify descriptors).
fn inotify_watches(pid: u32) -> usize {
    let mut n = 0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy().contains("inotify")) {
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy()))
                .unwrap_or_default();
            n += info.lines().filter(|l| l.starts_with("inotify wd:")).count();
        }
    }
    n
}

/// Issue 18, item 6: bob's drop folder with hundreds of folders takes at most the lab's bound of
/// watches, says so (in `gantry inbox` and an error file), is still served, and never starves
/// alice's; removing the folders gives the watches back.
#[test]
fn one_users_tree_of_folders_cannot_use_up_the_watches_or_starve_anothers_drop_folder() {
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let p = InboxPath::new("Gantry/test-", &[&alice, &bob]);
    let conf = bob.private_dir("watch-bound");
    let lab = conf.join("config.toml");
    std::fs::write(&lab, "[inbox]\nmax_watches = 8\n").unwrap();
    let e = Engine::system_with(&["--inbox-path", &p.rel(), "--config", lab.to_str().unwrap()]);
    for u in [&alice, &bob] {
        run_as(u, &format!("mkdir -p {}", p.of(u).display()));
        let out = as_user(&e, u, &["inbox", "init"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (ai, bi) = (p.of(&alice), p.of(&bob));
    run_as(
        &bob,
        &format!(
            "cd {}; i=0; while [ $i -lt 300 ]; do mkdir d$i; i=$((i+1)); done",
            bi.display()
        ),
    );
    let note = bi.join("gantry-folders.error.txt");
    e.wait_until("bob's drop folder to say that it is not all watched", || note.exists());
    let text = std::fs::read_to_string(&note).unwrap();
    assert!(
        text.contains("watches at most 8 folders per user")
            && text.contains("max_watches")
            && text.contains("Remove the folders"),
        "{text}"
    );
    assert_eq!(std::fs::metadata(&note).unwrap().uid(), bob.uid, "the note is bob's");
    let info = json_as(&e, &bob, &["inbox"]);
    assert_eq!(info["watched"], true, "{info}");
    assert!(
        info["problem"]
            .as_str()
            .unwrap_or_default()
            .contains("watches at most 8 folders per user"),
        "{info}"
    );
    assert!(
        String::from_utf8_lossy(&as_user(&e, &bob, &["inbox"]).stdout).contains("Note: "),
        "`gantry inbox` says it too"
    );
    let watches = inotify_watches(e.pid());
    assert!(watches <= 8 + 8 + 1, "bob's 300 folders hold {watches} watches");
    assert!(
        json_as(&e, &alice, &["inbox"])["problem"].is_null(),
        "alice's folder is all watched"
    );

    // Both are still served: alice's drop promptly, bob's top-level file too.
    run_as(
        &alice,
        &format!(
            "printf '{}' > {}/alice.yaml",
            spec("echo alice").replace('\n', "\\n"),
            ai.display()
        ),
    );
    accepted_id(&e, &ai, "alice.yaml");
    run_as(
        &bob,
        &format!(
            "printf '{}' > {}/bob.yaml",
            spec("echo bob").replace('\n', "\\n"),
            bi.display()
        ),
    );
    accepted_id(&e, &bi, "bob.yaml");

    // Removing the folders gives the watches back and the note goes.
    run_as(&bob, &format!("cd {}; rmdir d*", bi.display()));
    e.wait_until("bob's note to go", || {
        !note.exists() && json_as(&e, &bob, &["inbox"])["problem"].is_null()
    });
    assert!(
        inotify_watches(e.pid()) <= 2 * 3 + 1,
        "{} watches after the folders went",
        inotify_watches(e.pid())
    );
    run_as(
        &bob,
        &format!(
            "printf '{}' > {}/again.yaml",
            spec("echo again").replace('\n', "\\n"),
            bi.display()
        ),
    );
    accepted_id(&e, &bi, "again.yaml");
    let _ = std::fs::remove_dir_all(&conf);
}
