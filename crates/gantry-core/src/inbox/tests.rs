use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("gantry-inbox-unit-").tempdir().unwrap()
}

fn dirfd(p: &Path) -> OwnedFd {
    nix::fcntl::open(p, DIR, Mode::empty()).unwrap()
}

fn me() -> Ids {
    Ids {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    }
}

/// Issue 18, item 16: a refusal only time lifts waits 30 s, then twice as long each time, at
/// most 10 minutes; a changed file starts again from the first wait.
#[test]
fn a_waiting_file_backs_off_and_a_changed_one_starts_over() {
    let now = tokio::time::Instant::now();
    let (a, b) = ((1, 2, 3, 4), (1, 2, 3, 5));
    let mut w = Waiting::after(None, a, now);
    let mut delays = vec![w.delay.as_secs()];
    for _ in 0..6 {
        w = Waiting::after(Some(&w), a, now);
        delays.push(w.delay.as_secs());
    }
    assert_eq!(delays, [30, 60, 120, 240, 480, 600, 600]);
    assert_eq!(w.next, now + WAIT_MAX);
    assert_eq!(Waiting::after(Some(&w), b, now).delay, WAIT_FIRST, "the file changed");
}

/// Issue 18, item 17: a user's file name cannot forge a line of the engine's log.
#[test]
fn names_are_logged_with_control_characters_escaped() {
    assert_eq!(log_safe("plain name.yaml"), "plain name.yaml");
    assert_eq!(
        log_safe("a\n2026-01-01 INFO forged\r\u{1b}[2J.yaml"),
        "a\\n2026-01-01 INFO forged\\r\\u{1b}[2J.yaml"
    );
    assert_eq!(log_safe("caf\u{e9}.yaml"), "caf\u{e9}.yaml", "other text is kept");
}

#[test]
fn only_engine_trouble_is_transient() {
    for e in [
        Errno::EMFILE,
        Errno::ENFILE,
        Errno::ENOMEM,
        Errno::EAGAIN,
        Errno::EINTR,
        Errno::EIO,
        Errno::ENOSPC,
    ] {
        assert!(transient(e), "{e}");
    }
    for e in [
        Errno::ENOENT,
        Errno::EACCES,
        Errno::ELOOP,
        Errno::ENOTDIR,
        Errno::EISDIR,
        Errno::EINVAL,
    ] {
        assert!(!transient(e), "{e}");
    }
}

#[test]
fn missing_accepted_folder_is_made_and_a_symlink_or_file_is_refused() {
    let d = tmp();
    let fd = dirfd(d.path());
    assert!(subdir(&fd, d.path(), ACCEPTED, me()).is_ok());
    assert!(std::fs::symlink_metadata(d.path().join(ACCEPTED)).unwrap().is_dir());
    let target = tmp();
    std::os::unix::fs::symlink(target.path(), d.path().join(REJECTED)).unwrap();
    match subdir(&fd, d.path(), REJECTED, me()) {
        Err(Stop::Refuse(e)) => assert!(e.message.contains("symbolic link") && e.hint.contains("rm "), "{e}"),
        r => panic!("{r:?}"),
    }
    std::fs::remove_file(d.path().join(REJECTED)).unwrap();
    std::fs::write(d.path().join(REJECTED), "x").unwrap();
    assert!(
        matches!(subdir(&fd, d.path(), REJECTED, me()), Err(Stop::Refuse(e)) if e.message.contains("not a folder"))
    );
    assert_eq!(
        std::fs::read_dir(target.path()).unwrap().count(),
        0,
        "nothing was made through the link"
    );
}

#[test]
fn a_folder_owned_by_someone_else_is_refused_and_a_new_one_is_handed_to_the_owner() {
    if !nix::unistd::geteuid().is_root() {
        return; // needs chown; the suite runs as root
    }
    let d = tmp();
    let fd = dirfd(d.path());
    let other = Ids { uid: 4242, gid: 4242 };
    std::fs::create_dir(d.path().join(ACCEPTED)).unwrap();
    assert!(
        matches!(subdir(&fd, d.path(), ACCEPTED, other), Err(Stop::Refuse(e)) if e.message.contains("belongs to root"))
    );
    subdir(&fd, d.path(), REJECTED, other).unwrap();
    assert_eq!(std::fs::metadata(d.path().join(REJECTED)).unwrap().uid(), 4242);
}

#[test]
fn error_files_are_fresh_files_that_mark_the_file_as_explained() {
    let d = tmp();
    let fd = dirfd(d.path());
    std::fs::write(d.path().join("a.yaml"), "x").unwrap();
    let st = fstatat(&fd, "a.yaml", NOFOLLOW).unwrap();
    assert!(!explained(&fd, "a.yaml", &st));
    // A link in the way is replaced, never written through.
    let victim = d.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, d.path().join("a.yaml.error.txt")).unwrap();
    write_error(&fd, "a.yaml", me(), "why").unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert_eq!(
        std::fs::read_to_string(d.path().join("a.yaml.error.txt")).unwrap(),
        "why"
    );
    assert!(explained(&fd, "a.yaml", &st));
    // Changed after the report: looked at again.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(d.path().join("a.yaml"), "y").unwrap();
    assert!(!explained(&fd, "a.yaml", &fstatat(&fd, "a.yaml", NOFOLLOW).unwrap()));
    let names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 3, "no temporary file is left: {names:?}");
}

#[test]
fn files_are_read_without_following_links_and_within_limits() {
    let d = tmp();
    let fd = dirfd(d.path());
    std::fs::write(d.path().join("ok.yaml"), "image: x\n").unwrap();
    assert_eq!(read_at(&fd, "ok.yaml", "f").unwrap().1, "image: x\n");
    std::os::unix::fs::symlink(d.path().join("ok.yaml"), d.path().join("link.yaml")).unwrap();
    assert!(matches!(read_at(&fd, "link.yaml", "f"), Err(Stop::Reject(e)) if e.message.contains("symbolic link")));
    std::fs::hard_link(d.path().join("ok.yaml"), d.path().join("hard.yaml")).unwrap();
    assert!(matches!(read_at(&fd, "hard.yaml", "f"), Err(Stop::Reject(e)) if e.message.contains("hard link")));
    std::fs::write(d.path().join("big.yaml"), vec![b'#'; MAX_SPEC_BYTES as usize + 1]).unwrap();
    assert!(matches!(read_at(&fd, "big.yaml", "f"), Err(Stop::Reject(e)) if e.message.contains("limited to")));
    assert!(matches!(read_at(&fd, "gone.yaml", "f"), Err(Stop::Ignore)));
}

#[test]
fn the_drop_folder_path_follows_only_links_root_alone_controls() {
    if !nix::unistd::geteuid().is_root() {
        return; // the rule is about root-owned links
    }
    let d = tmp(); // root's, mode 0700
    std::fs::create_dir(d.path().join("real")).unwrap();
    std::os::unix::fs::symlink("real", d.path().join("link")).unwrap();
    let inbox = d.path().join("link/inbox");
    open_dir_path(&inbox, true).unwrap();
    assert!(d.path().join("real/inbox").is_dir(), "missing folders are made");
    // The same link in a folder others may write: refused.
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = open_dir_path(&inbox, true).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::lchown(d.path().join("link"), Some(4242), None).unwrap();
    assert!(
        open_dir_path(&inbox, true).is_err(),
        "a link owned by a user is never followed"
    );
}
