//! The drop folder. Files dropped into the inbox become jobs; each one ends in `accepted/` (named
//! `<job id>-<file name>`) or in `rejected/` next to `<file>.error.txt`. A user's file is never
//! deleted or overwritten.
//!
//! The engine may run as root while users own the drop folder, so it never follows a symbolic link a
//! user could have made: it works on directory file descriptors, opens folders with
//! `O_NOFOLLOW|O_DIRECTORY` and files with `O_NOFOLLOW`, moves with `renameat2(RENAME_NOREPLACE)`
//! between folder descriptors, and creates error files `O_EXCL` and hands them over with `fchown`.
//! The rules:
//! - a dropped file counts only if its owner owns the drop folder; the job runs as that owner;
//! - a template is used only if the template file belongs to the dropper or to root (lab-wide);
//! - `accepted/` and `rejected/` must be real folders of the owner of the folder they sit in; the
//!   engine creates them when missing.
//!
//! A file that breaks an ownership or folder rule stays where it is, with `<file>.error.txt` next to
//! it, and is not looked at again until it changes. A transient error (out of file descriptors or
//! memory, an I/O error, database trouble) leaves the file to be tried again on the next event or
//! rescan: it is never rejected for the engine's own trouble.
//!
//! Only complete files are read: the watcher acts on "closed after write" and "renamed in" events,
//! never on a file still being written. A scan every [`INBOX_RESCAN`] is the safety net (events the
//! kernel dropped, folders not watched, files dropped while the engine was down): it reads a file only
//! once it is unchanged since the scan before, 5 s old, and not written to without a close since.
//!
//! One user's folder tree cannot take the machine's inotify watches: a drop folder holds at most the
//! lab's `[inbox] max_watches` (the folder and its folders, one level deep; deeper ones are never
//! looked into); past it, or when the kernel refuses a watch, the rest is scanned, a bound's worth
//! of folders per scan, and `gantry inbox` and `gantry-folders.error.txt` say so.
//!
//! A file refused for now by what only time lifts (its owner's queue is full) stays, with one error
//! file, and is tried again after a wait that doubles ([`WAIT_FIRST`] to [`WAIT_MAX`]); every
//! name the log shows goes through [`log_safe`].
//!
//! A subfolder holding `gantry.toml` (or `.yaml`) is a template folder: any other file dropped there
//! becomes a job from the template with that file mounted read-only at `/gantry/config/<name>`.
//! A subfolder without one, named like a lab-wide template folder (`<templates_dir>/<name>/`), uses that
//! template, but only if root owns it and its folder. The user makes the subfolder (`mkdir`).
//!
//! One watcher runs per drop folder; [`users`] starts them (the engine's own, and each user's under
//! the system engine) and stops them on shutdown.

mod fsops;
mod retry;
pub mod users;
mod watch;

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, renameat2, AtFlags, OFlag, RenameFlags};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use tokio::io::unix::AsyncFd;
use tracing::{debug, info, warn};

use crate::defaults::INBOX_RESCAN;

use crate::engine::submit::{Spec, Submission};
use crate::engine::{Engine, EngineError};
use crate::spec::{self, Format, SpecError, MAX_SPEC_BYTES, TEMPLATE_NAMES};
use crate::store::Owner;

use fsops::*;
use retry::*;
pub use watch::run;
use watch::*;

pub const ACCEPTED: &str = "accepted";
pub const REJECTED: &str = "rejected";

const DIR: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);
const NOFOLLOW: AtFlags = AtFlags::AT_SYMLINK_NOFOLLOW;

/// What happened to one dropped file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Accepted {
        job_id: i64,
        moved_to: PathBuf,
    },
    Rejected {
        moved_to: PathBuf,
        error: String,
    },
    /// An ownership or folder problem: the file stays where it is, with `<name>.error.txt` next to it.
    Refused {
        error: String,
    },
    /// A transient problem, not the file's fault: the file stays and is tried again later.
    Retry {
        reason: String,
    },
    /// Refused for now by something only time lifts (the owner's queue is full): the file stays,
    /// with one `<name>.error.txt` saying so, and is tried again after a wait (see [`Waiting`]).
    Waiting {
        reason: String,
        key: (u64, u64, i64, i64),
    },
    /// Not a job file (template itself, hidden/temporary file, our own folders), or already handled.
    Ignored,
}

/// Why a file was not queued on this pass.
#[derive(Debug)]
enum Stop {
    Ignore,
    Retry(String),
    /// Refused until something changes that is not the file (the queue cap): wait, then try again.
    Wait(String),
    Refuse(SpecError),
    Reject(SpecError),
}

/// Look up a user name for a uid, falling back to the number.
pub use crate::access::user_name;

/// Errors that say nothing about the file: the engine is short of descriptors, memory or disk, or the
/// disk or network file system hiccupped. EIO counts: a bad sector is not the user's mistake, and
/// retrying only costs a warning per rescan.
pub fn transient(e: Errno) -> bool {
    matches!(
        e,
        Errno::EMFILE
            | Errno::ENFILE
            | Errno::ENOMEM
            | Errno::ENOBUFS
            | Errno::EAGAIN
            | Errno::EINTR
            | Errno::EIO
            | Errno::ENOSPC
            | Errno::EDQUOT
            | Errno::ESTALE
    )
}

fn ignorable(name: &str) -> bool {
    name == ACCEPTED
        || name == REJECTED
        || name.starts_with('.')
        || name.ends_with(".error.txt")
        || name.ends_with('~')
        || [".tmp", ".part", ".swp", ".crdownload"]
            .iter()
            .any(|s| name.ends_with(s))
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(0))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ids {
    uid: u32,
    gid: u32,
}

impl Ids {
    fn of(st: &FileStat) -> Ids {
        Ids {
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }
}

/// An open drop folder.
pub struct Inbox {
    pub path: PathBuf,
    fd: OwnedFd,
    /// The only user whose files count here.
    owner: Ids,
    /// What is only scanned, not watched, and why (`gantry inbox` shows it); `None` when all is watched.
    pub note: Arc<Mutex<Option<String>>>,
}

/// The inbox itself or one template folder in it.
struct Folder {
    fd: OwnedFd,
    path: PathBuf,
    /// Owner of this folder: its `accepted/` and `rejected/` belong to them.
    owner: Ids,
    /// The template folder's name; `None` for the inbox itself.
    template: Option<String>,
    /// The template is the lab-wide one of that name, not a file in this folder.
    lab: bool,
}

/// `text` for the engine's log: control characters (a line break in a file name) escaped, so what
/// a user names a file can never forge a line of the log.
pub fn log_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().collect::<String>()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

impl Inbox {
    /// Open the drop folder (creating it if missing) and make its `accepted/` and `rejected/`.
    pub fn open(path: PathBuf) -> std::io::Result<Inbox> {
        let fd = open_dir_path(&path, true)?;
        Inbox::at(path, fd)
    }

    /// The drop folder open at `fd` (reached safely by the caller): the owner of the folder is the
    /// only user whose files count. Makes its `accepted/` and `rejected/`.
    pub fn at(path: PathBuf, fd: OwnedFd) -> std::io::Result<Inbox> {
        let owner = Ids::of(&fstat(&fd)?);
        let ib = Inbox {
            path,
            fd,
            owner,
            note: Arc::default(),
        };
        for d in [ACCEPTED, REJECTED] {
            // A problem here is explained next to each dropped file; the engine still starts.
            if let Err(e) = subdir(&ib.fd, &ib.path, d, owner) {
                warn!(
                    "drop folder {}: {}",
                    log_safe(&ib.path.display().to_string()),
                    log_safe(&format!("{e:?}"))
                );
            }
        }
        Ok(ib)
    }

    /// Whether `name` in the inbox is a real folder that may be a template folder.
    fn subfolder(&self, name: &str) -> bool {
        name != ACCEPTED
            && name != REJECTED
            && !name.starts_with('.')
            && fstatat(&self.fd, name, NOFOLLOW).is_ok_and(|st| kind(&st) == SFlag::S_IFDIR)
    }

    fn handle(&self, engine: &Engine, w: &mut Watches, sub: Option<&str>, name: &str) {
        let key = (sub.map(String::from), name.to_string());
        let path = sub
            .map(|s| self.path.join(s))
            .unwrap_or_else(|| self.path.clone())
            .join(name);
        let shown = log_safe(&path.display().to_string()).into_owned();
        let prev = w.waiting.get(&key).copied();
        let outcome = self.process_waited(engine, sub, name, prev.map(|p| p.key));
        if !matches!(outcome, Outcome::Waiting { .. } | Outcome::Retry { .. }) {
            w.waiting.remove(&key);
        }
        match outcome {
            Outcome::Accepted { job_id, moved_to } => info!(
                job = job_id,
                "accepted {shown} -> {}",
                log_safe(&moved_to.display().to_string())
            ),
            Outcome::Rejected { moved_to, error } => warn!(
                "rejected {shown}: {} (see {}.error.txt)",
                log_safe(&error),
                log_safe(&moved_to.display().to_string())
            ),
            Outcome::Refused { error } => warn!("refused {shown}: {} (see {shown}.error.txt)", log_safe(&error)),
            Outcome::Retry { reason } => warn!("{shown}: {}; will retry", log_safe(&reason)),
            Outcome::Waiting { reason, key: file } => {
                let next = Waiting::after(prev.as_ref(), file, tokio::time::Instant::now());
                let wait = crate::units::duration_setting(next.delay);
                if prev.is_some_and(|p| p.key == file) {
                    debug!("{shown}: still refused ({}); tried again in {wait}", log_safe(&reason));
                } else {
                    warn!("{shown}: not queued for now: {} (see {shown}.error.txt); tried again in {wait}, then less often", log_safe(&reason));
                }
                w.waiting.insert(key, next);
            }
            Outcome::Ignored => {}
        }
    }

    /// The inbox itself (`None`) or a template folder in it; `None` for anything else.
    fn folder(&self, engine: &Engine, sub: Option<&str>) -> Result<Option<Folder>, Stop> {
        let retry = |e: Errno| Stop::Retry(format!("cannot open its folder: {e}"));
        let Some(d) = sub else {
            let fd = openat(&self.fd, ".", DIR, Mode::empty()).map_err(retry)?;
            return Ok(Some(Folder {
                fd,
                path: self.path.clone(),
                owner: self.owner,
                template: None,
                lab: false,
            }));
        };
        if d == ACCEPTED || d == REJECTED || d.starts_with('.') {
            return Ok(None);
        }
        let fd = match openat(&self.fd, d, DIR, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) if transient(e) => return Err(retry(e)),
            Err(_) => return Ok(None), // gone, or not a folder (then it is an entry of the inbox itself)
        };
        let mut is_template = false;
        for t in TEMPLATE_NAMES {
            match fstatat(&fd, *t, NOFOLLOW) {
                Ok(_) => is_template = true,
                Err(e) if transient(e) => return Err(retry(e)),
                Err(_) => {}
            }
        }
        let lab = !is_template && has_lab_template(engine, d)?;
        if !is_template && !lab {
            return Ok(None); // a plain subfolder
        }
        let owner = Ids::of(&fstat(&fd).map_err(retry)?);
        Ok(Some(Folder {
            fd,
            path: self.path.join(d),
            owner,
            template: Some(d.to_string()),
            lab,
        }))
    }

    /// Turn one dropped file into a job, or say why not.
    pub fn process(&self, engine: &Engine, sub: Option<&str>, name: &str) -> Outcome {
        self.process_waited(engine, sub, name, None)
    }

    /// [`Inbox::process`] for a file that has waited (`waited`: its identity when it was refused for
    /// now): a file still waiting gets no new error file.
    fn process_waited(
        &self,
        engine: &Engine,
        sub: Option<&str>,
        name: &str,
        waited: Option<(u64, u64, i64, i64)>,
    ) -> Outcome {
        if ignorable(name) || (sub.is_some() && TEMPLATE_NAMES.contains(&name)) {
            return Outcome::Ignored;
        }
        let f = match self.folder(engine, sub) {
            Ok(Some(f)) => f,
            Ok(None) => return Outcome::Ignored,
            Err(s) => return stopped(s),
        };
        let st = match fstatat(&f.fd, name, NOFOLLOW) {
            Ok(st) => st,
            Err(e) if transient(e) => {
                return Outcome::Retry {
                    reason: format!("cannot stat it: {e}"),
                }
            }
            Err(_) => return Outcome::Ignored, // already moved (duplicate event)
        };
        if !matches!(kind(&st), SFlag::S_IFREG | SFlag::S_IFLNK) || explained(&f.fd, name, &st) {
            return Outcome::Ignored;
        }
        let dirs = self.check(&f, &st).and_then(|()| {
            let accepted = subdir(&f.fd, &f.path, ACCEPTED, f.owner)?;
            Ok((accepted, subdir(&f.fd, &f.path, REJECTED, f.owner)?))
        });
        let (accepted, rejected) = match dirs {
            Ok(d) => d,
            Err(Stop::Refuse(e)) => return refuse(&f, name, &st, e),
            Err(s) => return stopped(s),
        };
        let queued = self.queue(engine, &f, name, &st);
        if queued.is_ok() || (waited.is_some() && !matches!(queued, Err(Stop::Wait(_) | Stop::Retry(_)))) {
            // An error file next to it is out of date (it waited, or it changed since): remove it.
            let _ = unlinkat(&f.fd, format!("{name}.error.txt").as_str(), UnlinkatFlags::NoRemoveDir);
        }
        match queued {
            Ok(id) => {
                let moved = move_noreplace(&f.fd, name, &accepted, &format!("{id}-{name}"));
                match moved {
                    Ok(n) => Outcome::Accepted {
                        job_id: id,
                        moved_to: f.path.join(ACCEPTED).join(n),
                    },
                    Err(e) => {
                        warn!(
                            "job {id} queued but {} could not be moved to accepted/: {e}",
                            log_safe(&f.path.join(name).display().to_string())
                        );
                        Outcome::Accepted {
                            job_id: id,
                            moved_to: f.path.join(name),
                        }
                    }
                }
            }
            Err(Stop::Reject(e)) => reject(&f, name, &st, &rejected, e),
            Err(Stop::Refuse(e)) => refuse(&f, name, &st, e),
            Err(Stop::Wait(reason)) => wait(&f, name, &st, reason, waited),
            Err(s) => stopped(s),
        }
    }

    /// Ownership rules: the file belongs to the owner of the drop folder, and a template folder to
    /// that owner or root.
    fn check(&self, f: &Folder, st: &FileStat) -> Result<(), Stop> {
        let (me, them) = (user_name(self.owner.uid), user_name(st.st_uid));
        if st.st_uid != self.owner.uid {
            return Err(Stop::Refuse(SpecError::new(
                format!("this file is owned by {them}, but this drop folder ({}) belongs to {me}", self.path.display()),
                format!("drop files into your own drop folder; {me} can queue this job by copying the file (a copy is owned by whoever makes it)"),
            )));
        }
        if f.owner.uid != self.owner.uid && f.owner.uid != 0 {
            return Err(Stop::Refuse(SpecError::new(
                format!(
                    "the template folder {} belongs to {}, not to {me}, who owns this drop folder",
                    f.path.display(),
                    user_name(f.owner.uid)
                ),
                format!("{me} can make their own template folder (a copy of this one)"),
            )));
        }
        Ok(())
    }

    /// Read, validate and queue the file: `Stop::Reject` for the file's own faults.
    fn queue(&self, engine: &Engine, f: &Folder, name: &str, st: &FileStat) -> Result<i64, Stop> {
        if kind(st) == SFlag::S_IFLNK {
            return Err(Stop::Reject(link_error("the dropped file")));
        }
        let (fst, text) = read_at(&f.fd, name, "the dropped file")?;
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) {
            return Err(Stop::Retry("it was replaced while being read".into()));
        }
        // Jobs run with the owner's own groups: in a setgid folder the file's group is the folder's.
        let owner = Owner {
            uid: fst.st_uid,
            gid: crate::access::primary_gid(fst.st_uid, fst.st_gid),
            name: user_name(fst.st_uid),
        };
        let key = format!(
            "{}:{}:{}:{}",
            fst.st_dev,
            fst.st_ino,
            fst.st_size,
            fst.st_mtime_nsec + fst.st_mtime * 1_000_000_000
        );
        if let Some(id) = engine.source_known(&key) {
            // Queued before a crash, not yet moved: finish the move, do not queue it twice.
            return Ok(id);
        }
        let source = format!("inbox:{}", f.path.join(name).display());
        // A template folder's template is read for each file: it may have changed since the last one.
        let template = match &f.template {
            Some(folder) => Some((folder, read_template(engine, f, fst.st_uid)?)),
            None => None,
        };
        let spec = match &template {
            None => Spec::File {
                text: &text,
                file_name: name,
                base_dir: Some(f.path.clone()),
                begin: None,
            },
            Some((folder, template)) => Spec::Template {
                template,
                folder,
                file_name: name,
                base_dir: f.path.clone(),
                accepted_dir: f.path.join(ACCEPTED),
            },
        };
        finish(engine.submit(Submission {
            spec,
            owner: &owner,
            source,
            source_key: Some(key),
            idempotency_key: None,
        }))
    }
}

/// A submission's result as the drop folder acts on it: the file's own faults reject it.
fn finish(result: Result<Vec<i64>, EngineError>) -> Result<i64, Stop> {
    match result.map(|ids| ids[0]) {
        Ok(id) => Ok(id),
        Err(EngineError::Spec(e)) => Err(Stop::Reject(e)),
        // A limit only time lifts (the owner's queue is full): wait, and try again later.
        Err(EngineError::Refused(why)) => Err(Stop::Wait(why)),
        // Not the file's fault (database trouble): leave it in place to retry later.
        Err(e) => Err(Stop::Retry(format!("could not queue it: {e}"))),
    }
}

/// Whether the lab-wide template folder has an entry named `name` (judged when a file is dropped).
fn has_lab_template(engine: &Engine, name: &str) -> Result<bool, Stop> {
    let Some(dir) = &engine.cfg.templates_dir else {
        return Ok(false);
    };
    let top = match open_dir_path(dir, false) {
        Ok(fd) => fd,
        Err(e) if transient(errno_of(&e)) => {
            return Err(Stop::Retry(format!(
                "cannot open the lab templates {}: {e}",
                dir.display()
            )))
        }
        Err(e) if errno_of(&e) == Errno::ENOENT => return Ok(false),
        Err(e) => {
            warn!(
                "lab templates in {} are not used: {}",
                dir.display(),
                log_safe(&e.to_string())
            );
            return Ok(false);
        }
    };
    match fstatat(&top, name, NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(e) if transient(e) => Err(Stop::Retry(format!("cannot look up the lab template {name}: {e}"))),
        Err(_) => Ok(false),
    }
}

/// The lab-wide template folder `name`: a real folder that root owns.
fn lab_folder(engine: &Engine, name: &str) -> Result<(OwnedFd, PathBuf), Stop> {
    let Some(dir) = &engine.cfg.templates_dir else {
        return Err(Stop::Ignore);
    };
    let path = dir.join(name);
    let fix = "ask an admin to fix the lab template; then drop this file again (it was not the problem)";
    let fd = open_dir_path(dir, false)
        .map_err(|e| Stop::Retry(format!("cannot open the lab templates {}: {e}", dir.display())))
        .and_then(|top| match openat(&top, name, DIR, Mode::empty()) {
            Ok(fd) => Ok(fd),
            Err(e) if transient(e) => Err(Stop::Retry(format!("cannot open {}: {e}", path.display()))),
            Err(e) => Err(Stop::Reject(SpecError::new(
                format!("the lab template {} is not a folder Gantry may use ({}); Gantry never follows symbolic links there", path.display(), e.desc()),
                fix,
            ))),
        })?;
    let st = fstat(&fd).map_err(|e| Stop::Retry(format!("cannot stat {}: {e}", path.display())))?;
    if st.st_uid != 0 {
        return Err(Stop::Reject(SpecError::new(
            format!("the lab template folder {} belongs to {}, not to root; lab templates are used only when root owns them", path.display(), user_name(st.st_uid)),
            format!("an admin can make it root's (`chown -R root: {}`) if it is trusted; then drop this file again (it was not the problem)", path.display()),
        )));
    }
    Ok((fd, path))
}

/// The folder's template: its own, if the file belongs to the dropper or to root; or the lab-wide
/// one, if root owns it and its folder.
fn read_template(engine: &Engine, f: &Folder, dropper: u32) -> Result<spec::JobSpec, Stop> {
    let lab = if f.lab {
        Some(lab_folder(engine, f.template.as_deref().unwrap_or_default())?)
    } else {
        None
    };
    let (dir, dir_path) = lab.as_ref().map(|(fd, p)| (fd, p)).unwrap_or((&f.fd, &f.path));
    let Some(tname) = TEMPLATE_NAMES.iter().find(|t| fstatat(dir, **t, NOFOLLOW).is_ok()) else {
        return match &lab {
            Some((_, p)) => Err(Stop::Reject(SpecError::new(
                format!(
                    "the lab template folder {} holds no {}",
                    p.display(),
                    TEMPLATE_NAMES.join(" or ")
                ),
                "ask an admin to add the template; then drop this file again (it was not the problem)",
            ))),
            None => Err(Stop::Ignore),
        };
    };
    let tpath = dir_path.join(tname);
    let what = format!("the template {}", tpath.display());
    let (tst, text) = read_at(dir, tname, &what).map_err(|s| match s {
        Stop::Reject(e) => Stop::Reject(SpecError::new(
            e.message,
            format!("{}; this file was not the problem and can be dropped again", e.hint),
        )),
        s => s,
    })?;
    if lab.is_some() && tst.st_uid != 0 {
        return Err(Stop::Reject(SpecError::new(
            format!(
                "{what} belongs to {}, not to root; lab templates are used only when root owns them",
                user_name(tst.st_uid)
            ),
            "ask an admin to make it root's; then drop this file again (it was not the problem)",
        )));
    }
    if tst.st_uid != dropper && tst.st_uid != 0 {
        return Err(Stop::Reject(SpecError::new(
            format!("{what} belongs to {}; a template is used only for its owner's files, or for everyone's when root owns it", user_name(tst.st_uid)),
            format!(
                "{} can replace it with a copy of their own (`cp {tname} mine && mv mine {tname}`), or an admin can install a lab-wide template owned by root; then drop this file again",
                user_name(dropper)
            ),
        )));
    }
    spec::parse_template(&text, Format::from_name(tname).unwrap_or(Format::Toml)).map_err(|e| {
        Stop::Reject(SpecError::new(
            format!("the template {} is invalid: {e}", tpath.display()),
            "fix the template; this file was not the problem and can be dropped again",
        ))
    })
}

fn stopped(s: Stop) -> Outcome {
    match s {
        Stop::Retry(reason) | Stop::Wait(reason) => Outcome::Retry { reason },
        Stop::Ignore => Outcome::Ignored,
        // Callers handle these with the folder at hand.
        Stop::Refuse(e) | Stop::Reject(e) => Outcome::Refused { error: e.to_string() },
    }
}

/// Leave the file where it is and explain next to it.
fn refuse(f: &Folder, name: &str, st: &FileStat, e: SpecError) -> Outcome {
    let report = format!(
        "Gantry did not queue {name:?}:\n\n{e}\n\nThe file was left where it is, unchanged, and will not be looked at again until it changes.\n\
         Once the problem is fixed, drop it again (or `touch` it).\n"
    );
    match write_error(&f.fd, name, Ids::of(st), &report) {
        Ok(()) => Outcome::Refused { error: e.to_string() },
        Err(err) if transient(err) => Outcome::Retry {
            reason: format!("cannot write its error file: {err}"),
        },
        Err(err) => {
            warn!(
                "cannot write {}.error.txt: {err}",
                log_safe(&f.path.join(name).display().to_string())
            );
            Outcome::Refused { error: e.to_string() }
        }
    }
}

/// Move the file to `rejected/` and explain next to it there.
fn reject(f: &Folder, name: &str, st: &FileStat, rejected: &OwnedFd, e: SpecError) -> Outcome {
    let moved = match move_noreplace(&f.fd, name, rejected, name) {
        Ok(n) => n,
        Err(err) => {
            return Outcome::Retry {
                reason: format!("rejected ({e}), but it could not be moved to rejected/: {err}"),
            };
        }
    };
    let report = format!(
        "Gantry could not queue {name:?}:\n\n{e}\n\nThe file was moved here unchanged. Fix it and drop it into the inbox again.\n\
         `gantry schema` prints every field a job spec may have.\n"
    );
    if let Err(err) = write_error(rejected, &moved, Ids::of(st), &report) {
        warn!(
            "cannot write the error file for {}: {err}",
            log_safe(&f.path.join(REJECTED).join(&moved).display().to_string())
        );
    }
    Outcome::Rejected {
        moved_to: f.path.join(REJECTED).join(moved),
        error: e.to_string(),
    }
}
#[cfg(test)]
mod tests;
