//! Host paths checked as the submitter.
//!
//! The engine runs as root, so it may not judge a user's mount by what it can open itself. A short-lived
//! helper process takes the submitter's uid, gid and supplementary groups and opens the path with
//! `O_PATH`: the kernel then checks search permission on every component and follows symlinks as that
//! user, with every permission rule it knows (ACLs, LSMs, root-squashing NFS). The helper reports the
//! resolved path, its type, device and inode, and whether the user may read (and write) it, and hands
//! the opened file itself back to the engine (SCM_RIGHTS). A root engine mounts exactly that file (see
//! [`crate::staging`]), so swapping a path component afterwards changes nothing; any other engine mounts
//! the resolved path, never the one written in the spec.
//!
//! The engine is multi-threaded, so the forked helper only makes raw, async-signal-safe calls: every
//! buffer is prepared before `fork`, and the helper never allocates.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod helper;
mod rules;
use helper::*;
pub use rules::*;

/// How long one path check may take (a path on a hung network file system must not hang the engine).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Whose permissions a check uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (including `gid`).
    pub groups: Vec<u32>,
    /// For messages: the login name, or the uid when it has none.
    pub name: String,
}

impl Cred {
    /// The user's credentials as a login would set them: supplementary groups from the group database.
    pub fn of_user(uid: u32, gid: u32) -> Cred {
        use nix::unistd::{getgrouplist, Gid, Uid, User};
        let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
        let groups = user
            .as_ref()
            .and_then(|u| CString::new(u.name.as_str()).ok())
            .and_then(|n| getgrouplist(&n, Gid::from_raw(gid)).ok())
            .map(|g| g.into_iter().map(Gid::as_raw).collect())
            .unwrap_or_else(|| vec![gid]);
        Cred {
            uid,
            gid,
            groups,
            name: user.map(|u| u.name).unwrap_or_else(|| uid.to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    File,
    /// Socket, device, fifo: never mounted.
    Other(&'static str),
}

/// A path as the user's own open resolved it.
#[derive(Debug)]
pub struct Resolved {
    /// Absolute, every symlink followed.
    pub path: PathBuf,
    pub kind: FileKind,
    pub dev: u64,
    pub ino: u64,
    /// The file the user's open reached (`O_PATH`).
    pub file: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("{} does not exist", path.display())]
    Missing { path: PathBuf },
    /// The user cannot get to the path: `blocked` says where (a directory without search permission or a
    /// symlink leading somewhere they cannot go), when known.
    #[error("permission denied{}", blocked.as_ref().map(|b| format!(" {b}")).unwrap_or_default())]
    Unreachable { path: PathBuf, blocked: Option<String> },
    #[error("cannot read {}", path.display())]
    NoRead { path: PathBuf },
    #[error("cannot write {}{}", path.display(), if *read_only_fs { " (it is on a read-only file system)" } else { "" })]
    NoWrite { path: PathBuf, read_only_fs: bool },
    #[error("this engine runs as uid {engine_uid} and cannot check paths as uid {uid}")]
    CannotActAs { engine_uid: u32, uid: u32 },
    #[error("no answer within {}s (is it on a network file system that does not respond?)", CHECK_TIMEOUT.as_secs())]
    Timeout { path: PathBuf },
    #[error("{} changed while it was being checked", path.display())]
    Changed { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

impl AccessError {
    /// Where the path led, when the user got that far.
    fn resolved(&self) -> Option<&Path> {
        match self {
            AccessError::NoRead { path } | AccessError::NoWrite { path, .. } => Some(path),
            _ => None,
        }
    }
}

// ---- The helper ----

fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFREG => FileKind::File,
        libc::S_IFSOCK => FileKind::Other("socket"),
        libc::S_IFCHR | libc::S_IFBLK => FileKind::Other("device"),
        libc::S_IFIFO => FileKind::Other("named pipe"),
        _ => FileKind::Other("special file"),
    }
}

/// Resolve `host` (absolute) as `cred` would: every component searched and every symlink followed with
/// the user's own permissions, then read (and, with `write`, write) access checked on what it leads to.
pub fn resolve_as(cred: &Cred, host: &Path, write: bool) -> Result<Resolved, AccessError> {
    let io = |source: std::io::Error| AccessError::Io {
        path: host.to_path_buf(),
        source,
    };
    if !host.is_absolute() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an absolute path",
        )));
    }
    if host.as_os_str().len() >= PATH_CAP {
        return Err(io(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG)));
    }
    let c = CString::new(host.as_os_str().as_bytes()).map_err(|e| io(e.into()))?;
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 && euid != cred.uid {
        return Err(AccessError::CannotActAs {
            engine_uid: euid,
            uid: cred.uid,
        });
    }
    let (r, file) = run_helper(cred, &c, Op::Probe { write }, euid == 0).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut => AccessError::Timeout {
            path: host.to_path_buf(),
        },
        _ => io(e),
    })?;
    let resolved = PathBuf::from(std::ffi::OsStr::from_bytes(&r.path[..r.len as usize]));
    let os = std::io::Error::from_raw_os_error(r.errno);
    match r.stage {
        OK => {}
        STAGE_OPEN if r.errno == libc::ENOENT || r.errno == libc::ENOTDIR => {
            return Err(AccessError::Missing {
                path: host.to_path_buf(),
            })
        }
        STAGE_OPEN if r.errno == libc::EACCES => {
            return Err(AccessError::Unreachable {
                path: host.to_path_buf(),
                blocked: blocked_at(host, r.denied_at as usize),
            })
        }
        STAGE_READ => return Err(AccessError::NoRead { path: resolved }),
        STAGE_WRITE => {
            return Err(AccessError::NoWrite {
                path: resolved,
                read_only_fs: r.errno == libc::EROFS,
            })
        }
        STAGE_CRED => {
            return Err(io(std::io::Error::new(
                os.kind(),
                format!("cannot set up the path check as uid {}: {os}", cred.uid),
            )))
        }
        _ => return Err(io(os)),
    }
    let file = file.ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the path-check helper sent no file",
        ))
    })?;
    // The path the user's open led to must still be that file now, seen by the engine (which Docker is).
    match std::fs::metadata(&resolved) {
        Ok(m) if m.dev() == r.dev && m.ino() == r.ino => {}
        Ok(_) => {
            return Err(AccessError::Changed {
                path: host.to_path_buf(),
            })
        }
        Err(source) => return Err(AccessError::Io { path: resolved, source }),
    }
    Ok(Resolved {
        path: resolved,
        kind: kind_of(r.mode),
        dev: r.dev,
        ino: r.ino,
        file,
    })
}

/// `mkdir -p path` (mode 0700) as `cred`, in a helper process with the user's own ids: a folder in a
/// home is made only where the user could make it, and a link they made leads only where they may go.
pub fn make_dirs_as(cred: &Cred, path: &Path) -> Result<(), AccessError> {
    let io = |source: std::io::Error| AccessError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !path.is_absolute() || path.as_os_str().len() >= PATH_CAP {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an absolute path of a sensible length",
        )));
    }
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| io(e.into()))?;
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 && euid != cred.uid {
        return Err(AccessError::CannotActAs {
            engine_uid: euid,
            uid: cred.uid,
        });
    }
    let (r, _) = run_helper(cred, &c, Op::MakeDirs, euid == 0).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut => AccessError::Timeout {
            path: path.to_path_buf(),
        },
        _ => io(e),
    })?;
    let os = std::io::Error::from_raw_os_error(r.errno);
    match r.stage {
        OK => Ok(()),
        STAGE_MKDIR => {
            let failed = Path::new(std::ffi::OsStr::from_bytes(
                &c.as_bytes()[..(r.denied_at as usize).min(c.as_bytes().len())],
            ));
            Err(io(std::io::Error::new(
                os.kind(),
                format!("{} cannot create {}: {os}", cred.name, failed.display()),
            )))
        }
        _ => Err(io(std::io::Error::new(
            os.kind(),
            format!("cannot act as {}: {os}", cred.name),
        ))),
    }
}

/// Where a path stopped the user: the prefix that failed is a symlink they could not follow, or lies in
/// a directory they may not search. Only for the message: the decision was the kernel's.
fn blocked_at(host: &Path, denied_at: usize) -> Option<String> {
    let bytes = host.as_os_str().as_bytes();
    if denied_at == 0 || denied_at > bytes.len() {
        return None;
    }
    let prefix = Path::new(std::ffi::OsStr::from_bytes(&bytes[..denied_at]));
    if std::fs::symlink_metadata(prefix).is_ok_and(|m| m.file_type().is_symlink()) {
        return Some(format!("following the symlink {}", prefix.display()));
    }
    prefix
        .parent()
        .map(|p| format!("on {} (no permission to enter it)", p.display()))
}

/// A user's name (their uid as text when the user database does not know it).
pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// The group a user's jobs run with: their primary group from the user database, never a group the
/// request or file happens to carry (a file made in a setgid folder has the folder's group; a process
/// may run a setgid program). `fallback` only for a uid the user database does not know.
pub fn primary_gid(uid: u32, fallback: u32) -> u32 {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or(fallback, |u| u.gid.as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Mount;
    use std::ffi::CStr;

    fn forbidden() -> Forbidden {
        Forbidden {
            entries: vec![
                (PathBuf::from("/run/docker.sock"), "the Docker socket"),
                (PathBuf::from("/srv/g"), "the Gantry state directory"),
                (PathBuf::from("/srv/g/gantry.sock"), "the Gantry socket"),
            ],
            exempt: vec![PathBuf::from("/srv/g/inbox")],
        }
    }

    #[test]
    fn forbidden_refuses_the_paths_their_ancestors_and_their_contents() {
        let f = forbidden();
        let refused = |p: &str| f.refusal(Path::new(p));
        assert_eq!(refused("/").as_deref(), Some("is the root of the host file system"));
        assert_eq!(refused("/run/docker.sock").as_deref(), Some("is the Docker socket"));
        assert!(
            refused("/run").unwrap().starts_with("contains the Docker socket"),
            "{:?}",
            refused("/run")
        );
        assert!(refused("/srv").unwrap().contains("contains the Gantry state directory"));
        assert_eq!(refused("/srv/g").as_deref(), Some("is the Gantry state directory"));
        assert!(refused("/srv/g/logs")
            .unwrap()
            .starts_with("lies inside the Gantry state directory"));
        assert!(refused("/srv/g/gantry.sock").is_some());
        // The drop folder may live in the state dir: what lies in it may be mounted, the state dir may not.
        assert_eq!(refused("/srv/g/inbox/paddle/accepted/7-exp.yaml"), None);
        assert_eq!(refused("/srv/g/inbox"), None);
        assert!(refused("/srv/g/inboxes").is_some());
        // Whole components only: neighbours with a common prefix are fine.
        for ok in ["/run2", "/srv/gx", "/srv/other", "/home/alice", "/run/user/1000"] {
            assert_eq!(refused(ok), None, "{ok}");
        }
    }

    #[test]
    fn forbidden_for_the_system_engine_covers_the_socket_folder() {
        let d = tempfile::tempdir().unwrap();
        let p = crate::config::Paths::system(d.path());
        let f = Forbidden::for_engine(&p.state_dir, &p.socket(), &p.inbox);
        let run = d.path().join("run/gantry");
        assert!(f.refusal(&run).unwrap().starts_with("contains the Gantry socket"));
        assert!(f
            .refusal(&run.join("x"))
            .unwrap()
            .starts_with("lies inside the Gantry socket's folder"));
        assert!(f
            .refusal(&d.path().join("run"))
            .unwrap()
            .starts_with("contains the Gantry socket"));
        assert!(f.refusal(&d.path().join("var/lib/gantry")).is_some());
        assert_eq!(f.refusal(&d.path().join("run/other")), None);
    }

    #[test]
    fn forbidden_for_engine_resolves_symlinks_and_missing_sockets() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // The engine named its state dir through a symlink, and its socket does not exist yet.
        let f = Forbidden::for_engine(&link, &link.join("gantry.sock"), &link.join("inbox"));
        assert_eq!(f.refusal(&real).as_deref(), Some("is the Gantry state directory"));
        assert!(f.refusal(&real.join("gantry.sock")).is_some());
        assert!(f
            .refusal(d.path())
            .unwrap()
            .starts_with("contains the Gantry state directory"));
        assert!(f.refusal(Path::new("/var/run/docker.sock")).is_some());
        assert!(f.refusal(&std::fs::canonicalize("/var/run").unwrap()).is_some());
    }

    #[test]
    fn what_lies_inside_a_mount_must_exist_there_without_links() {
        let d = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(top.join("proj/src")).unwrap();
        std::os::unix::fs::symlink("/etc", top.join("proj/link")).unwrap();
        let m = |host: &Path, c: &str| Mount {
            host: host.to_string_lossy().into_owned(),
            container: c.into(),
            read_only: true,
        };
        let none = Forbidden::default();
        let check = |mounts: &[Mount], wd: Option<&str>| {
            check_mounts(&me(), mounts, wd, &none)
                .map(|_| ())
                .map_err(|e| e.message)
        };
        let proj = top.join("proj");
        assert_eq!(
            check(&[m(&proj, "/w"), m(&top, "/w/src")], Some("/w/src/../src")),
            Ok(())
        );
        assert_eq!(check(&[m(&proj, "/w")], Some("/w")), Ok(()));
        assert_eq!(
            check(&[m(&proj, "/w")], Some("/elsewhere/new")),
            Ok(()),
            "the image's own folders are Docker's business"
        );
        let e = check(&[m(&proj, "/w"), m(&top, "/w/data/x")], None).unwrap_err();
        assert!(
            e.contains("mount point /w/data/x lies inside the mount of") && e.contains("does not exist"),
            "{e}"
        );
        let e = check(&[m(&proj, "/w")], Some("/w/src/../new")).unwrap_err();
        assert!(
            e.contains("`workdir` /w/new") && e.contains("Docker would create it as root"),
            "{e}"
        );
        let e = check(&[m(&proj, "/w")], Some("/w/link")).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!proj.join("data").exists() && !proj.join("new").exists());
    }

    #[test]
    fn fd_link_formats_numbers() {
        for (fd, want) in [
            (0, "/proc/self/fd/0"),
            (7, "/proc/self/fd/7"),
            (1234, "/proc/self/fd/1234"),
        ] {
            let mut b = [0u8; 32];
            fd_link(fd, &mut b);
            assert_eq!(CStr::from_bytes_until_nul(&b).unwrap().to_str().unwrap(), want);
        }
    }

    fn me() -> Cred {
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        Cred::of_user(uid, gid)
    }

    #[test]
    fn resolve_as_follows_symlinks_and_reports_what_it_found() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(d.path()).unwrap().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&dir, d.path().join("link")).unwrap();
        let r = resolve_as(&me(), &d.path().join("link"), true).unwrap();
        assert_eq!(r.path, dir);
        assert_eq!(r.kind, FileKind::Directory);
        assert_eq!(r.ino, std::fs::metadata(&dir).unwrap().ino());
        // The helper hands back the file its open reached.
        assert_eq!(nix::sys::stat::fstat(&r.file).unwrap().st_ino, r.ino);
        assert!(matches!(
            resolve_as(&me(), &d.path().join("nope/x"), false),
            Err(AccessError::Missing { .. })
        ));
    }

    #[test]
    fn the_check_uses_the_users_permissions_not_the_engines() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(d.path()).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let secret = dir.join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("flag"), "x").unwrap(); // 644
        std::os::unix::fs::symlink(secret.join("flag"), dir.join("link")).unwrap();
        let nobody = Cred {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            name: "nobody".into(),
        };
        let got = resolve_as(&nobody, &secret.join("flag"), false);
        if !nix::unistd::geteuid().is_root() {
            assert!(
                matches!(got, Err(AccessError::CannotActAs { uid: 65534, .. })),
                "{got:?}"
            );
            return;
        }
        match got {
            Err(AccessError::Unreachable { blocked: Some(b), .. }) => {
                assert_eq!(b, format!("on {} (no permission to enter it)", dir.display()))
            }
            other => panic!("{other:?}"),
        }
        // The way in is open, the last step is not: the message names the symlink that led there.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
        match resolve_as(&nobody, &dir.join("link"), false) {
            Err(AccessError::Unreachable { blocked: Some(b), .. }) => {
                assert_eq!(b, format!("following the symlink {}", dir.join("link").display()))
            }
            other => panic!("{other:?}"),
        }
        // Readable but not writable: fine read-only, refused read-write with a fix.
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            resolve_as(&nobody, &dir.join("link"), false).unwrap().path,
            secret.join("flag")
        );
        let m = Mount {
            host: dir.join("link").to_string_lossy().into_owned(),
            container: "/f".into(),
            read_only: false,
        };
        let e = check_mounts(&nobody, &[m], None, &Forbidden::default()).unwrap_err();
        assert!(
            e.message.contains("nobody cannot write") && e.message.contains("which leads to"),
            "{e}"
        );
        assert!(e.hint.contains(":ro"), "{e}");
    }

    #[test]
    fn folders_are_made_with_the_users_permissions_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(d.path()).unwrap();
        make_dirs_as(&me(), &top.join("a/b/c")).unwrap();
        make_dirs_as(&me(), &top.join("a/b/c")).unwrap(); // already there: fine
        assert_eq!(
            std::fs::metadata(top.join("a/b/c")).unwrap().permissions().mode() & 0o777,
            0o700
        );
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // nobody's link into a folder only root may write: followed as nobody, so nothing is made.
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o755)).unwrap();
        let home = top.join("home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::lchown(&home, Some(65534), Some(65534)).unwrap();
        std::os::unix::fs::symlink(top.join("a"), home.join("link")).unwrap();
        let nobody = Cred {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            name: "nobody".into(),
        };
        let e = make_dirs_as(&nobody, &home.join("link/x")).unwrap_err();
        assert!(
            e.to_string().contains("nobody cannot create") && e.to_string().contains("link/x"),
            "{e}"
        );
        assert!(!top.join("a/x").exists());
        make_dirs_as(&nobody, &home.join("G/inbox")).unwrap();
        assert_eq!(std::fs::metadata(home.join("G/inbox")).unwrap().uid(), 65534);
    }

    #[test]
    fn check_mounts_mounts_the_resolved_path_and_never_a_missing_one() {
        let d = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(d.path()).unwrap();
        std::os::unix::fs::symlink(&real, real.join("link")).unwrap();
        let m = |host: &Path, ro| Mount {
            host: host.to_string_lossy().into_owned(),
            container: "/d".into(),
            read_only: ro,
        };
        let none = Forbidden::default();
        let got: Vec<ResolvedMount> = check_mounts(&me(), &[m(&real.join("link"), true)], None, &none)
            .unwrap()
            .into_iter()
            .map(|c| c.mount)
            .collect();
        assert_eq!(
            got,
            vec![ResolvedMount {
                host: real.clone(),
                container: "/d".into(),
                read_only: true
            }]
        );
        let e = check_mounts(&me(), &[m(&real.join("missing"), false)], None, &none).unwrap_err();
        assert!(
            e.message.contains("does not exist") && e.message.contains("missing:/d"),
            "{e}"
        );
        assert!(e.hint.contains("never creates host paths"), "{e}");
        assert!(!real.join("missing").exists());
        let e = check_mounts(&me(), &[m(Path::new("/"), true)], None, &none).unwrap_err();
        assert!(e.message.contains("root of the host file system"), "{e}");
    }
}
