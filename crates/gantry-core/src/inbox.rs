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

pub mod users;

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

/// Events a drop folder's watches report: complete files (closed after writing, renamed in), new
/// entries (folders, links), and writes (a file written to and not closed yet is never read).
const EVENTS: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_ONLYDIR)
    .union(AddWatchFlags::IN_DONT_FOLLOW)
    // No events for entries once unlinked (nix names no constant for it).
    .union(AddWatchFlags::from_bits_retain(libc::IN_EXCL_UNLINK));

/// A file written to and never closed is read by a scan after this long without a write: a writer
/// that keeps a file open an hour without writing is taken to be gone (a crashed writer's file is
/// closed by the kernel, which the watch reports at once).
const WRITER_GONE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The name of the error file that says why some folders of a drop folder are scanned, not watched.
pub const WATCH_NOTE: &str = "gantry-folders";

struct InotifyFd(Inotify);

impl std::os::fd::AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsFd::as_fd(&self.0).as_raw_fd()
    }
}

/// Why a folder is not watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unwatched {
    /// The user's bound (`inbox.max_watches`) is reached.
    Bound,
    /// The kernel refused (no inotify instance, `fs.inotify.max_user_watches` used up).
    Kernel,
}

/// One drop folder's inotify watches: the folder itself and at most the lab's bound of its folders
/// (`[inbox] max_watches`, the folder included), each on its own, one level deep. A watch goes in
/// O(1) when its folder goes (`IN_IGNORED`), so deleting many folders costs one event each.
/// A file as the last scan saw it: (device, inode, size, mtime s, mtime ns).
type FileLook = (u64, u64, u64, i64, i64);

struct Watches {
    fd: Option<AsyncFd<InotifyFd>>,
    /// Watch -> `None` (the drop folder) or the folder's name.
    folders: HashMap<i32, Option<String>>,
    names: HashMap<String, WatchDescriptor>,
    top: Option<WatchDescriptor>,
    /// Files written to and not closed yet (`IN_CREATE`/`IN_MODIFY` without `IN_CLOSE_WRITE`), with
    /// the last write: never read until closed or moved in (or after [`WRITER_GONE`] without writes).
    writing: HashMap<(Option<String>, String), tokio::time::Instant>,
    /// What each file looked like at the last scan: a scan reads a file only once it is unchanged
    /// since the one before (a writer the watches cannot see may still be writing it).
    seen: HashMap<(Option<String>, String), FileLook>,
    /// Folders not watched at the last scan, and why.
    unwatched: Vec<(String, Unwatched)>,
    /// Where the last scan's look into unwatched folders stopped (they are looked into in turns).
    cursor: usize,
    /// Refused drop files that only time can lift (a full queue), waiting to be tried again.
    waiting: HashMap<(Option<String>, String), Waiting>,
}

/// A drop file refused for now: tried again at `next`, each wait twice the last.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// The file's identity when refused (dev, inode, size, mtime): a changed file is tried at once.
    key: (u64, u64, i64, i64),
    next: tokio::time::Instant,
    delay: std::time::Duration,
}

/// A refused drop file is first tried again after 30 s (a queue's jobs start in seconds to
/// minutes), each wait then doubles, up to 10 minutes: a file waiting all day is read about 150
/// times, not every 10 s rescan (8,640 times).
pub const WAIT_FIRST: std::time::Duration = std::time::Duration::from_secs(30);
pub const WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(600);

impl Waiting {
    /// The wait after `prev` (none yet: the first).
    fn after(prev: Option<&Waiting>, key: (u64, u64, i64, i64), now: tokio::time::Instant) -> Waiting {
        let delay = match prev {
            Some(p) if p.key == key => (p.delay * 2).min(WAIT_MAX),
            _ => WAIT_FIRST,
        };
        Waiting {
            key,
            next: now + delay,
            delay,
        }
    }
}

fn file_key(st: &FileStat) -> (u64, u64, i64, i64) {
    (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
    )
}

impl Watches {
    fn new(ib: &Inbox) -> Watches {
        let registered = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(std::io::Error::from)
            .and_then(|i| {
                // SAFETY: the descriptor is the `Inotify`'s own, which the `AsyncFd` owns (and closes) from here on.
                unsafe { AsyncFd::register_with_interest(InotifyFd(i), tokio::io::Interest::READABLE) }
                    .map_err(std::io::Error::from)
            });
        let fd = match registered {
            Ok(fd) => Some(fd),
            Err(e) => {
                warn!(
                    "drop folder {}: no inotify instance ({e}); it is scanned every {} s instead",
                    log_safe(&ib.path.display().to_string()),
                    INBOX_RESCAN.as_secs()
                );
                None
            }
        };
        let mut w = Watches {
            fd,
            folders: HashMap::new(),
            names: HashMap::new(),
            top: None,
            writing: HashMap::new(),
            seen: HashMap::new(),
            unwatched: vec![],
            cursor: 0,
            waiting: HashMap::new(),
        };
        w.watch_top(ib);
        w
    }

    /// Watch the drop folder itself (again, after the kernel refused).
    fn watch_top(&mut self, ib: &Inbox) -> bool {
        if self.top.is_some() {
            return true;
        }
        let Some(fd) = &self.fd else { return false };
        match fd.get_ref().0.add_watch(&ib.path, EVENTS) {
            Ok(wd) => {
                self.folders.insert(wd.as_raw(), None);
                self.top = Some(wd);
                true
            }
            Err(e) => {
                warn!(
                    "cannot watch the drop folder {}: {e}; it is scanned every {} s instead",
                    log_safe(&ib.path.display().to_string()),
                    INBOX_RESCAN.as_secs()
                );
                false
            }
        }
    }

    /// Watch folder `name` of the drop folder, within `max` watches (the drop folder's own counts).
    fn watch(&mut self, ib: &Inbox, name: &str, max: usize) -> Result<(), Unwatched> {
        if self.names.contains_key(name) {
            return Ok(());
        }
        let Some(fd) = &self.fd else {
            return Err(Unwatched::Kernel);
        };
        if self.names.len() + 1 >= max {
            return Err(Unwatched::Bound);
        }
        match fd.get_ref().0.add_watch(&ib.path.join(name), EVENTS) {
            Ok(wd) => {
                // The same folder under a new name (renamed within the drop folder): one watch.
                if let Some(Some(old)) = self.folders.insert(wd.as_raw(), Some(name.to_string())) {
                    self.names.remove(&old);
                }
                self.names.insert(name.to_string(), wd);
                Ok(())
            }
            Err(Errno::ENOSPC | Errno::ENOMEM) => Err(Unwatched::Kernel),
            Err(_) => Ok(()), // gone, or not a folder: the scan says what it is
        }
    }

    /// Stop watching folders that are no longer there (a watch on a folder moved away).
    fn forget_except(&mut self, present: &HashSet<String>) {
        let gone: Vec<String> = self.names.keys().filter(|n| !present.contains(*n)).cloned().collect();
        for n in gone {
            if let Some(wd) = self.names.remove(&n) {
                self.folders.remove(&wd.as_raw());
                if let Some(fd) = &self.fd {
                    let _ = fd.get_ref().0.rm_watch(wd);
                }
            }
        }
    }

    /// The next batch of events (never, without an inotify instance).
    async fn events(&self) -> Vec<InotifyEvent> {
        let Some(fd) = &self.fd else {
            return std::future::pending().await;
        };
        loop {
            let mut guard = match fd.readable().await {
                Ok(g) => g,
                Err(e) => {
                    warn!("drop folder watch error: {e}");
                    return std::future::pending().await;
                }
            };
            match guard.try_io(|f| f.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(Ok(evs)) => return evs,
                Ok(Err(e)) => {
                    warn!("drop folder watch error: {e}");
                    return vec![];
                }
                Err(_would_block) => continue,
            }
        }
    }

    /// What `gantry inbox` and the error file say about folders that are only scanned.
    fn note(&self, ib: &Inbox, engine: &Engine, max: usize) -> Option<String> {
        let every = INBOX_RESCAN.as_secs();
        if self.top.is_none() {
            return Some(format!(
                "the kernel refused an inotify watch for {} (its `fs.inotify.max_user_watches` or `max_user_instances` is used up on this machine), \
                 so Gantry scans it every {every} s instead: files are picked up within about {} s. An admin can raise the kernel's limit (`sysctl fs.inotify.max_user_watches`)",
                ib.path.display(),
                3 * every
            ));
        }
        let bound = self.unwatched.iter().filter(|(_, w)| *w == Unwatched::Bound).count();
        let kernel = self.unwatched.len() - bound;
        if kernel > 0 {
            return Some(format!(
                "the kernel refused inotify watches for {kernel} folders of {} (`fs.inotify.max_user_watches` is used up on this machine), \
                 so Gantry scans them every {every} s instead: files there are picked up within about {} s",
                ib.path.display(),
                3 * every
            ));
        }
        (bound > 0).then(|| {
            let set = match engine.lab_file() {
                Some(f) => format!("`[inbox] max_watches` in {}", f.display()),
                None => "the default; a lab config's `[inbox] max_watches` sets it".into(),
            };
            format!(
                "{} holds {} folders; Gantry watches at most {max} folders per user ({set}), so the other {bound} (e.g. {:?}) are only scanned, \
                 a few at a time: files dropped there are picked up late. Remove the folders you do not use as template folders \
                 (a template folder holds gantry.toml or gantry.yaml), or move them out of the drop folder",
                ib.path.display(),
                self.names.len() + bound,
                self.unwatched.iter().find(|(_, w)| *w == Unwatched::Bound).map(|(n, _)| n.as_str()).unwrap_or_default(),
            )
        })
    }
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

/// Pick up what is already in the drop folder, then watch it until the engine stops.
pub async fn run(engine: Arc<Engine>, ib: Inbox) -> Result<(), EngineError> {
    let mut w = Watches::new(&ib);
    info!(
        "watching drop folder {} (owned by {})",
        log_safe(&ib.path.display().to_string()),
        user_name(ib.owner.uid)
    );
    ib.rescan(&engine, &mut w);
    // A safety net for events the kernel drops (inotify queue overflow), for folders not watched,
    // and for files waiting to be tried again.
    let mut rescan = tokio::time::interval(INBOX_RESCAN);
    rescan.tick().await;
    loop {
        tokio::select! {
            evs = w.events() => {
                let mut overflow = false;
                for ev in evs {
                    overflow |= ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW);
                    ib.event(&engine, &mut w, ev);
                }
                if overflow {
                    ib.rescan(&engine, &mut w);
                }
            }
            _ = rescan.tick() => ib.rescan(&engine, &mut w),
            _ = engine.stopped() => break,
        }
    }
    Ok(())
}

/// Entries of a folder with their `lstat`, sorted by name; names that are not UTF-8 are skipped.
fn list(dir: &OwnedFd) -> nix::Result<Vec<(String, FileStat)>> {
    let mut d = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = vec![];
    for e in d.iter() {
        let e = e?;
        let Ok(name) = e.file_name().to_str() else { continue };
        if name == "." || name == ".." {
            continue;
        }
        if let Ok(st) = fstatat(dir, name, NOFOLLOW) {
            out.push((name.to_string(), st));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Open (with `create`, creating what is missing) the directory `path` without following a symbolic
/// link that a user could have made: a link is followed only if it, and the directory holding it,
/// belong to root and only root may write that directory (e.g. Fedora Silverblue's `/home -> var/home`).
fn open_dir_path(path: &Path, create: bool) -> std::io::Result<OwnedFd> {
    let abs = std::path::absolute(path)?;
    let parts = |p: &Path| -> Vec<OsString> {
        p.components()
            .rev()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_owned()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect()
    };
    let root = || nix::fcntl::open("/", DIR, Mode::empty());
    let mut todo = parts(&abs);
    let mut dir = root()?;
    let mut links = 0;
    while let Some(c) = todo.pop() {
        match openat(&dir, c.as_os_str(), DIR, Mode::empty()) {
            Ok(fd) => dir = fd,
            Err(Errno::ENOENT) if create => {
                match mkdirat(&dir, c.as_os_str(), Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                dir = openat(&dir, c.as_os_str(), DIR, Mode::empty())?;
            }
            Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                let st = fstatat(&dir, c.as_os_str(), NOFOLLOW)?;
                if kind(&st) != SFlag::S_IFLNK {
                    return Err(e.into());
                }
                let holder = fstat(&dir)?;
                if st.st_uid != 0 || holder.st_uid != 0 || holder.st_mode & 0o022 != 0 || links >= 40 {
                    return Err(std::io::Error::other(format!(
                        "the drop folder path {} goes through the symbolic link {:?}, which a user could change; \
                         Gantry never follows such links: give the real path of the drop folder",
                        abs.display(),
                        c
                    )));
                }
                links += 1;
                let target = PathBuf::from(readlinkat(&dir, c.as_os_str())?);
                if target.is_absolute() {
                    dir = root()?;
                }
                todo.extend(parts(&target));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(dir)
}

/// `accepted/` or `rejected/` in `dir`: a real folder owned by `owner`, made when missing.
fn subdir(dir: &OwnedFd, dir_path: &Path, name: &str, owner: Ids) -> Result<OwnedFd, Stop> {
    let shown = dir_path.join(name);
    let mut created = false;
    let mut opened = openat(dir, name, DIR, Mode::empty());
    if matches!(opened, Err(Errno::ENOENT)) {
        match mkdirat(dir, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) => created = true,
            Err(Errno::EEXIST) => {}
            Err(e) if transient(e) => return Err(Stop::Retry(format!("cannot create {}: {e}", shown.display()))),
            Err(e) => {
                return Err(Stop::Refuse(SpecError::new(
                    format!("cannot create {}: {}", shown.display(), e.desc()),
                    "check the folder's permissions",
                )))
            }
        }
        opened = openat(dir, name, DIR, Mode::empty());
    }
    let fd = match opened {
        Ok(fd) => fd,
        Err(e) if transient(e) => return Err(Stop::Retry(format!("cannot open {}: {e}", shown.display()))),
        Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
            let link = fstatat(dir, name, NOFOLLOW).is_ok_and(|st| kind(&st) == SFlag::S_IFLNK);
            return Err(Stop::Refuse(if link {
                SpecError::new(
                    format!(
                        "{name}/ in {} is a symbolic link; Gantry never follows symbolic links",
                        dir_path.display()
                    ),
                    format!(
                        "remove the link (`rm {}`); Gantry then makes a real folder",
                        shown.display()
                    ),
                )
            } else {
                SpecError::new(
                    format!("{name} in {} is not a folder ({})", dir_path.display(), e.desc()),
                    format!("rename or remove {}; Gantry then makes the folder", shown.display()),
                )
            }));
        }
        Err(e) => {
            return Err(Stop::Refuse(SpecError::new(
                format!("cannot open {}: {}", shown.display(), e.desc()),
                "check the folder's permissions",
            )))
        }
    };
    let st = fstat(&fd).map_err(|e| Stop::Retry(format!("cannot stat {}: {e}", shown.display())))?;
    if st.st_uid != owner.uid {
        // Only a folder the engine has just made (still its own and empty) is handed over: never
        // someone else's folder moved into place.
        if created && st.st_uid == nix::unistd::geteuid().as_raw() && st.st_nlink == 2 {
            fchown(&fd, Some(Uid::from_raw(owner.uid)), Some(Gid::from_raw(owner.gid))).map_err(|e| {
                Stop::Retry(format!(
                    "cannot hand {} to {}: {e}",
                    shown.display(),
                    user_name(owner.uid)
                ))
            })?;
        } else {
            return Err(Stop::Refuse(SpecError::new(
                format!(
                    "{name}/ in {} belongs to {}, not to {}, who owns {}",
                    dir_path.display(),
                    user_name(st.st_uid),
                    user_name(owner.uid),
                    dir_path.display()
                ),
                format!(
                    "rename or remove {}; Gantry then makes a folder owned by {}",
                    shown.display(),
                    user_name(owner.uid)
                ),
            )));
        }
    }
    Ok(fd)
}

/// Read a whole small file through `dir` without following links. `what` names it in errors.
fn read_at(dir: &OwnedFd, name: &str, what: &str) -> Result<(FileStat, String), Stop> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let fd = match openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Err(Stop::Ignore), // moved away meanwhile (duplicate event)
        Err(Errno::ELOOP) => return Err(Stop::Reject(link_error(what))),
        Err(e) if transient(e) => return Err(Stop::Retry(format!("cannot open {what}: {e}"))),
        Err(e) => {
            return Err(Stop::Reject(SpecError::new(
                format!("cannot read {what}: {}", e.desc()),
                "check its permissions: the engine must be able to read it",
            )))
        }
    };
    let st = fstat(&fd).map_err(|e| Stop::Retry(format!("cannot stat {what}: {e}")))?;
    if kind(&st) != SFlag::S_IFREG {
        return Err(Stop::Reject(SpecError::new(
            format!("{what} is not a regular file"),
            "drop a plain text file",
        )));
    }
    if st.st_nlink > 1 {
        return Err(Stop::Reject(SpecError::new(
            format!("{what} is a hard link to another file; Gantry only reads files dropped as copies"),
            "copy the file instead of linking it",
        )));
    }
    let too_big = |n: u64| {
        Stop::Reject(SpecError::new(
            format!("{what} is {n} bytes; job files are limited to {MAX_SPEC_BYTES} bytes"),
            "a job spec is a few lines of YAML or TOML: drop the spec, and put data in a mount",
        ))
    };
    if st.st_size as u64 > MAX_SPEC_BYTES {
        return Err(too_big(st.st_size as u64));
    }
    let mut buf = Vec::new();
    if let Err(e) = std::fs::File::from(fd).take(MAX_SPEC_BYTES + 1).read_to_end(&mut buf) {
        return Err(if transient(errno_of(&e)) {
            Stop::Retry(format!("cannot read {what}: {e}"))
        } else {
            Stop::Reject(SpecError::new(format!("cannot read {what}: {e}"), "check the file"))
        });
    }
    if buf.len() as u64 > MAX_SPEC_BYTES {
        return Err(too_big(buf.len() as u64));
    }
    let text = String::from_utf8(buf).map_err(|_| {
        Stop::Reject(SpecError::new(
            format!("{what} is not UTF-8 text"),
            "save it as UTF-8 text",
        ))
    })?;
    Ok((st, text))
}

fn link_error(what: &str) -> SpecError {
    SpecError::new(
        format!("{what} is a symbolic link; Gantry never follows links in the drop folder"),
        "copy the file itself into the folder (cp -L), not a link to it",
    )
}

/// A file refused earlier is not looked at again until it changes or is moved again: until then its
/// error file (which the engine gave to the file's owner) is newer than the file's last change.
fn explained(dir: &OwnedFd, name: &str, st: &FileStat) -> bool {
    let changed = (st.st_mtime, st.st_mtime_nsec).max((st.st_ctime, st.st_ctime_nsec));
    fstatat(dir, format!("{name}.error.txt").as_str(), NOFOLLOW)
        .is_ok_and(|e| kind(&e) == SFlag::S_IFREG && e.st_uid == st.st_uid && (e.st_mtime, e.st_mtime_nsec) >= changed)
}

/// Write `<name>.error.txt` in `dir`, owned by `owner`: a fresh file made `O_EXCL` under a hidden
/// name, then renamed into place (replacing an earlier report, never following a link).
fn write_error(dir: &OwnedFd, name: &str, owner: Ids, text: &str) -> nix::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmp = format!(
        ".gantry-error-{}-{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, tmp.as_str(), flags, Mode::from_bits_truncate(0o644))?;
    let done = fchown(&fd, Some(Uid::from_raw(owner.uid)), Some(Gid::from_raw(owner.gid)))
        .and_then(|()| {
            std::io::Write::write_all(&mut std::fs::File::from(fd), text.as_bytes()).map_err(|e| errno_of(&e))
        })
        .and_then(|()| {
            renameat2(
                dir,
                tmp.as_str(),
                dir,
                format!("{name}.error.txt").as_str(),
                RenameFlags::empty(),
            )
        });
    if done.is_err() {
        let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    done
}

/// renameat2 that never replaces an existing file: tries `name`, `name.1`, `name.2`, ...
fn move_noreplace(from: &OwnedFd, name: &str, to: &OwnedFd, to_name: &str) -> nix::Result<String> {
    for i in 0..1000 {
        let cand = if i == 0 {
            to_name.to_string()
        } else {
            format!("{to_name}.{i}")
        };
        match renameat2(from, name, to, cand.as_str(), RenameFlags::RENAME_NOREPLACE) {
            Ok(()) => return Ok(cand),
            Err(Errno::EEXIST) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::EEXIST)
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

    /// One inotify event.
    fn event(&self, engine: &Engine, w: &mut Watches, ev: InotifyEvent) {
        let wd = ev.wd.as_raw();
        if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
            // The folder went (deleted, unmounted): forget its watch, in O(1).
            match w.folders.remove(&wd) {
                Some(Some(name)) if w.names.get(&name) == Some(&ev.wd) => {
                    w.names.remove(&name);
                }
                Some(Some(_)) => {}
                Some(None) => {
                    w.top = None;
                    warn!(
                        "the drop folder {} is no longer watched (removed or unmounted)",
                        log_safe(&self.path.display().to_string())
                    );
                }
                None => {}
            }
            return;
        }
        let Some(folder) = w.folders.get(&wd).cloned() else {
            return;
        };
        let Some(name) = ev.name.as_ref().and_then(|n| n.to_str()).map(String::from) else {
            return;
        };
        let arrived = ev
            .mask
            .intersects(AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO);
        if ev.mask.contains(AddWatchFlags::IN_ISDIR) {
            // Folders count one level deep only: in the drop folder itself.
            if folder.is_none()
                && ev
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                && self.subfolder(&name)
            {
                // A new (template) folder: files may have landed before its watch was added. Past
                // the user's bound it is not watched; the next scan says so.
                let _ = w.watch(self, &name, engine.policy().inbox_watches_per_user);
                let files = openat(&self.fd, name.as_str(), DIR, Mode::empty()).and_then(|fd| list(&fd));
                for (f, _) in files
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(_, st)| kind(st) != SFlag::S_IFDIR)
                {
                    self.handle(engine, w, Some(&name), &f);
                }
            }
            return;
        }
        if ignorable(&name) {
            return; // our own error files and their temporary names, editors' temporary files
        }
        let key = (folder.clone(), name.clone());
        if arrived {
            w.writing.remove(&key);
            self.handle(engine, w, folder.as_deref(), &name);
        } else if ev.mask.contains(AddWatchFlags::IN_MODIFY) {
            // Being written: read only once it is closed (or moved in).
            w.writing.insert(key, tokio::time::Instant::now());
        } else if ev.mask.contains(AddWatchFlags::IN_CREATE) {
            let dir = match &folder {
                None => openat(&self.fd, ".", DIR, Mode::empty()),
                Some(d) => openat(&self.fd, d.as_str(), DIR, Mode::empty()),
            };
            let link = dir
                .ok()
                .and_then(|d| fstatat(&d, name.as_str(), NOFOLLOW).ok())
                .is_some_and(|st| kind(&st) == SFlag::S_IFLNK);
            if link {
                // A symbolic link is complete when made (it has no close-after-write).
                self.handle(engine, w, folder.as_deref(), &name);
            } else {
                // Being written: read only once it is closed (or moved in).
                w.writing.insert(key, tokio::time::Instant::now());
            }
        }
    }

    /// Watch every folder (within the user's bound) and handle every file that is settled: unchanged
    /// since the last scan, not written to in the last 5 seconds, and not open for writing as far as
    /// the watches know (a file written to and not closed yet comes with its close event).
    fn rescan(&self, engine: &Engine, w: &mut Watches) {
        let max = engine.policy().inbox_watches_per_user;
        w.watch_top(self);
        let top = match list(&self.fd) {
            Ok(t) => t,
            Err(e) => {
                return warn!(
                    "cannot list the drop folder {}: {e}; will retry",
                    log_safe(&self.path.display().to_string())
                )
            }
        };
        let now = tokio::time::Instant::now();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let mut seen = HashMap::new();
        let mut files = vec![];
        let mut look: Vec<String> = vec![];
        let mut unwatched = vec![];
        let mut present = HashSet::new();
        let mut ready = |w: &Watches, key: (Option<String>, String), st: &FileStat, seen: &mut HashMap<_, _>| {
            let id = (st.st_dev, st.st_ino, st.st_size as u64, st.st_mtime, st.st_mtime_nsec);
            let unchanged = w.seen.get(&key) == Some(&id);
            let writing = w
                .writing
                .get(&key)
                .is_some_and(|t| now.duration_since(*t) < WRITER_GONE);
            let waits = w
                .waiting
                .get(&key)
                .is_some_and(|x| x.key == file_key(st) && x.next > now);
            seen.insert(key.clone(), id);
            if unchanged && !writing && !waits && wall - st.st_mtime >= 5 {
                files.push(key);
            }
        };
        for (name, st) in top {
            if kind(&st) != SFlag::S_IFDIR {
                ready(w, (None, name), &st, &mut seen);
            } else if self.subfolder(&name) {
                present.insert(name.clone());
                match w.watch(self, &name, max) {
                    Ok(()) => look.push(name),
                    Err(why) => unwatched.push((name, why)),
                }
            }
        }
        w.forget_except(&present);
        // Folders not watched are looked into a bound's worth per scan, in turns: one user's tree of
        // folders costs a scan what a full set of watched folders does.
        let mut skipped = HashSet::new();
        if !unwatched.is_empty() {
            let n = unwatched.len();
            let from = w.cursor % n;
            for i in 0..n {
                let name = &unwatched[(from + i) % n].0;
                if i < max {
                    look.push(name.clone());
                } else {
                    skipped.insert(name.clone());
                }
            }
            w.cursor = (from + max.min(n)) % n;
        }
        for name in &look {
            match openat(&self.fd, name.as_str(), DIR, Mode::empty()).and_then(|fd| list(&fd)) {
                Ok(sub) => {
                    for (f, st) in sub.into_iter().filter(|(_, st)| kind(st) != SFlag::S_IFDIR) {
                        ready(w, (Some(name.clone()), f), &st, &mut seen);
                    }
                }
                Err(e) => warn!(
                    "cannot list {}: {e}; will retry",
                    log_safe(&self.path.join(name).display().to_string())
                ),
            }
        }
        // What the folders not looked into held is kept for their turn.
        let kept = |k: &(Option<String>, String)| k.0.as_ref().is_some_and(|d| skipped.contains(d));
        w.seen.retain(|k, _| kept(k));
        w.seen.extend(seen);
        let Watches {
            seen: known,
            writing,
            waiting,
            ..
        } = &mut *w;
        writing.retain(|k, t| known.contains_key(k) && now.duration_since(*t) < WRITER_GONE);
        waiting.retain(|k, _| known.contains_key(k));
        w.unwatched = unwatched;
        let note = w.note(self, engine, max);
        self.report(note);
        for (sub, name) in files {
            self.handle(engine, w, sub.as_deref(), &name);
        }
    }

    /// Say (once, in `gantry inbox` and in `gantry-folders.error.txt` in the drop folder) which
    /// folders are only scanned and why; remove the error file once all are watched again.
    fn report(&self, note: Option<String>) {
        let mut current = self.note.lock().unwrap_or_else(|p| p.into_inner());
        if *current == note {
            return;
        }
        let shown = log_safe(&self.path.display().to_string()).into_owned();
        match &note {
            Some(text) => {
                warn!("drop folder {shown}: {}", log_safe(text));
                let report = format!("Gantry does not watch every folder of this drop folder:\n\n{text}.\n\nThis file goes away once every folder is watched again.\n");
                if let Err(e) = write_error(&self.fd, WATCH_NOTE, self.owner, &report) {
                    warn!("cannot write {WATCH_NOTE}.error.txt in {shown}: {e}");
                }
            }
            None => {
                info!("drop folder {shown}: every folder is watched again");
                let _ = unlinkat(
                    &self.fd,
                    format!("{WATCH_NOTE}.error.txt").as_str(),
                    UnlinkatFlags::NoRemoveDir,
                );
            }
        }
        *current = note;
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

/// Leave the file where it is, to be tried again after a wait, with one `<name>.error.txt` saying why
/// (written when the wait starts, not at each try). The report is dated just before the file, so it
/// never marks the file as explained: after a restart the file is tried once more.
fn wait(f: &Folder, name: &str, st: &FileStat, reason: String, waited: Option<(u64, u64, i64, i64)>) -> Outcome {
    let key = file_key(st);
    if waited != Some(key) {
        let report = format!(
            "Gantry did not queue {name:?} yet:\n\n{reason}\n\nThe file was left where it is, unchanged. Gantry tries it again by itself, \
             first after {}, then less often (at most every {}); it is queued once this is no longer so. Changing the file tries it at once.\n",
            crate::units::duration_setting(WAIT_FIRST),
            crate::units::duration_setting(WAIT_MAX),
        );
        match write_error(&f.fd, name, Ids::of(st), &report) {
            Ok(()) => {
                let before = nix::sys::time::TimeSpec::new(st.st_mtime - 1, st.st_mtime_nsec);
                let _ = nix::sys::stat::utimensat(
                    &f.fd,
                    format!("{name}.error.txt").as_str(),
                    &before,
                    &before,
                    nix::sys::stat::UtimensatFlags::NoFollowSymlink,
                );
            }
            Err(err) => warn!(
                "cannot write {}.error.txt: {err}",
                log_safe(&f.path.join(name).display().to_string())
            ),
        }
    }
    Outcome::Waiting { reason, key }
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
mod tests {
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
}
