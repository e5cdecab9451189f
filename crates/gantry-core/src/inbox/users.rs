//! The drop folders one engine serves, one watcher ([`super::run`]) each.
//!
//! Every engine watches its own drop folder (`paths.inbox`). The system engine also watches
//! `~/<inbox_path>` of every user who has one: members of `inbox_group` (the engine makes the folder
//! for them, as them) and users who ran `gantry inbox init` (recorded in the database). It looks again
//! every [`USER_INBOX_RESCAN`] for new members and for folders that went away or changed.
//!
//! A home belongs to its user, so the engine (root) never makes or opens anything there by a path the
//! user could redirect: folders are made by a helper process with the user's own ids
//! ([`access::make_dirs_as`]), and the engine opens the folder from the home down one component at a
//! time with `O_NOFOLLOW`, requiring each to belong to the user or root, and the drop folder itself to
//! belong to the user. Everything after that goes through the folder's descriptor.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::fcntl::openat;
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::{errno_of, kind, open_dir_path, transient, user_name, Inbox, DIR, NOFOLLOW};
use crate::access::{self, Cred};
use crate::config::USER_INBOX_RESCAN;
use crate::engine::Engine;
pub use crate::protocol::InboxInfo;
use crate::spec::{SpecError, TEMPLATE_NAMES};

struct Watched {
    path: PathBuf,
    dev: u64,
    ino: u64,
    task: JoinHandle<()>,
    /// What of the folder is only scanned, and why (see [`Inbox::note`]).
    note: Arc<Mutex<Option<String>>>,
}

/// The watchers of users' drop folders: made by the daemon, shared by the watchers and the API (the
/// engine never holds it: the inbox submits through the engine, not the other way round).
#[derive(Default)]
pub struct Registry {
    watched: Mutex<HashMap<u32, Watched>>,
    /// The last problem logged per user: a re-scan logs only what changed.
    problems: Mutex<HashMap<u32, String>>,
    /// The engine's own drop folder's watcher.
    main: Mutex<Option<JoinHandle<()>>>,
    main_note: Arc<Mutex<Option<String>>>,
}

/// Why a user's drop folder is not watched.
#[derive(Debug)]
enum Problem {
    Missing(PathBuf),
    Refused(SpecError),
}

fn refused(message: String, hint: impl Into<String>) -> Problem {
    Problem::Refused(SpecError::new(message, hint))
}

/// `inbox_path` must stay inside the home: plain names only.
pub fn check_inbox_path(p: &Path) -> Result<(), String> {
    if p.as_os_str().is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!(
            "the drop folder path {:?} must be relative to the home, without `..` (e.g. Gantry/inbox)",
            p.display().to_string()
        ));
    }
    Ok(())
}

/// Serve every drop folder until the engine stops.
pub async fn run(engine: Arc<Engine>, inboxes: Arc<Registry>) {
    let main = {
        let (e, dir) = (engine.clone(), engine.cfg.paths.inbox.clone());
        let note = inboxes.main_note.clone();
        tokio::spawn(async move {
            let opened = match Inbox::open(dir.clone()) {
                Ok(mut ib) => {
                    ib.note = note;
                    super::run(e, ib).await
                }
                Err(err) => Err(err.into()),
            };
            if let Err(err) = opened {
                error!("drop folder {} disabled: {err}", dir.display());
            }
        })
    };
    *lock(&inboxes.main) = Some(main);
    if engine.cfg.paths.system_root.is_some() {
        if let Err(e) = check_inbox_path(&engine.cfg.inbox_path) {
            error!("users' drop folders are not served: {e}");
        } else if !nix::unistd::geteuid().is_root() {
            warn!("users' drop folders are not served: the system engine does not run as root");
        } else {
            loop {
                let e = engine.clone();
                let reg = inboxes.clone();
                let _ = tokio::task::spawn_blocking(move || reg.scan(&e)).await;
                tokio::select! {
                    _ = tokio::time::sleep(USER_INBOX_RESCAN) => {}
                    _ = engine.stopped() => break,
                }
            }
        }
    }
    engine.stopped().await;
    for (_, w) in lock(&inboxes.watched).drain() {
        w.task.abort();
    }
    if let Some(m) = lock(&inboxes.main).take() {
        m.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    /// Watch the drop folder of every group member and registered user; stop watching the others.
    fn scan(&self, engine: &Arc<Engine>) {
        let mut wanted: BTreeMap<u32, bool> = BTreeMap::new(); // uid -> make the folder if missing
        match engine.registered_inboxes() {
            Ok(uids) => wanted.extend(uids.into_iter().map(|u| (u, false))),
            Err(e) => warn!("cannot read the users who set up a drop folder: {e}"),
        }
        if let Some(g) = &engine.cfg.inbox_group {
            match group_members(g) {
                Ok(uids) => wanted.extend(uids.into_iter().map(|u| (u, true))),
                Err(e) => warn!("drop folders for group {g} are not made: {e}"),
            }
        }
        wanted.remove(&0); // root's drop folder is the engine's own
        let gone: Vec<u32> = lock(&self.watched)
            .keys()
            .filter(|u| !wanted.contains_key(u))
            .copied()
            .collect();
        for uid in gone {
            if let Some(w) = lock(&self.watched).remove(&uid) {
                w.task.abort();
                info!(
                    "stopped watching {} ({} is no longer in the drop-folder group)",
                    w.path.display(),
                    user_name(uid)
                );
            }
        }
        for (uid, create) in wanted {
            let _ = self.ensure(engine, uid, create);
        }
    }

    /// Watch `uid`'s drop folder (making it first, as the user, when `create`), unless it already is.
    fn ensure(&self, engine: &Arc<Engine>, uid: u32, create: bool) -> Result<PathBuf, SpecError> {
        let result = self
            .open(engine, uid, create)
            .and_then(|(path, fd)| self.watch(engine, uid, path, fd));
        let problem = match &result {
            Ok(_) => None,
            Err(Problem::Missing(p)) => Some(format!(
                "{} does not exist (run `gantry inbox init` as {})",
                p.display(),
                user_name(uid)
            )),
            Err(Problem::Refused(e)) => Some(e.to_string()),
        };
        let mut problems = lock(&self.problems);
        match &problem {
            Some(p) if problems.get(&uid) != Some(p) => {
                if let Some(w) = lock(&self.watched).remove(&uid) {
                    w.task.abort();
                }
                warn!("drop folder of {} skipped: {p}", user_name(uid));
                problems.insert(uid, p.clone());
            }
            Some(_) => {}
            None => {
                if problems.remove(&uid).is_some() {
                    info!("drop folder of {} is usable again", user_name(uid));
                }
            }
        }
        result.map_err(|p| match p {
            Problem::Refused(e) => e,
            Problem::Missing(p) => SpecError::new(
                format!("{} does not exist", p.display()),
                "run `gantry inbox init`: it creates the folder as you",
            ),
        })
    }

    fn open(&self, engine: &Engine, uid: u32, create: bool) -> Result<(PathBuf, OwnedFd), Problem> {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .ok_or_else(|| refused(format!("uid {uid} has no entry in the user database"), "ask an admin"))?;
        let path = user.dir.join(&engine.cfg.inbox_path);
        let mut opened = open_user_dir(&user.dir, &engine.cfg.inbox_path, uid);
        if create && matches!(opened, Err(Problem::Missing(_))) {
            let cred = Cred::of_user(uid, user.gid.as_raw());
            if let Err(e) = access::make_dirs_as(&cred, &path) {
                return Err(refused(
                    format!("cannot make the drop folder {}: {e}", path.display()),
                    format!("{} can make it (`mkdir -p {}`)", user.name, path.display()),
                ));
            }
            opened = open_user_dir(&user.dir, &engine.cfg.inbox_path, uid);
        }
        Ok((path, opened?))
    }

    fn watch(&self, engine: &Arc<Engine>, uid: u32, path: PathBuf, fd: OwnedFd) -> Result<PathBuf, Problem> {
        let st = fstat(&fd).map_err(|e| refused(format!("cannot stat {}: {e}", path.display()), "try again"))?;
        let mut watched = lock(&self.watched);
        if let Some(w) = watched.get(&uid) {
            if (w.dev, w.ino) == (st.st_dev, st.st_ino) && w.path == path && !w.task.is_finished() {
                return Ok(path);
            }
            w.task.abort();
        }
        let ib = Inbox::at(path.clone(), fd)
            .map_err(|e| refused(format!("cannot set up {}: {e}", path.display()), "try again"))?;
        let (e, shown, note) = (engine.clone(), path.clone(), ib.note.clone());
        let task = tokio::spawn(async move {
            if let Err(err) = super::run(e, ib).await {
                error!("drop folder {} disabled: {err}", shown.display());
            }
        });
        watched.insert(
            uid,
            Watched {
                path: path.clone(),
                dev: st.st_dev,
                ino: st.st_ino,
                task,
                note,
            },
        );
        Ok(path)
    }

    /// `uid`'s drop folder and whether it is watched.
    pub fn info(&self, engine: &Engine, uid: u32) -> InboxInfo {
        let lab_templates = lab_templates(engine);
        if engine.cfg.paths.system_root.is_none() || uid == 0 {
            let watched = lock(&self.main).as_ref().is_some_and(|t| !t.is_finished());
            let problem = match watched {
                false => Some("the engine's drop folder is disabled (see the engine's log)".to_string()),
                true => lock(&self.main_note).clone(),
            };
            return InboxInfo {
                path: engine.cfg.paths.inbox.clone(),
                watched,
                problem,
                per_user: false,
                lab_templates,
            };
        }
        let home = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.dir);
        let path = home
            .map(|h| h.join(&engine.cfg.inbox_path))
            .unwrap_or_else(|| engine.cfg.inbox_path.clone());
        let (watched, note) = match lock(&self.watched).get(&uid) {
            Some(w) if !w.task.is_finished() && w.path == path => (true, lock(&w.note).clone()),
            _ => (false, None),
        };
        let problem = match lock(&self.problems).get(&uid) {
            Some(p) => Some(p.clone()),
            None if !watched => Some("not set up yet: run `gantry inbox init`".into()),
            None => note,
        };
        InboxInfo {
            path,
            watched,
            problem,
            per_user: true,
            lab_templates,
        }
    }

    /// `gantry inbox init`: the caller made their drop folder; watch it, and keep watching it after
    /// restarts. Blocking (opens folders, may wait on a slow home).
    pub fn register(&self, engine: &Arc<Engine>, uid: u32) -> Result<InboxInfo, crate::engine::EngineError> {
        if engine.cfg.paths.system_root.is_some() && uid != 0 {
            self.ensure(engine, uid, false)?;
            engine.register_inbox(uid)?;
            info!("{} set up their drop folder", user_name(uid));
        }
        Ok(self.info(engine, uid))
    }
}

/// Open `home/rel` without following a link the user controls: each component below the home must
/// be a real folder of the user or root, and the last one the user's. Links are followed only on the
/// way to the home, and only where root alone controls them.
fn open_user_dir(home: &Path, rel: &Path, uid: u32) -> Result<OwnedFd, Problem> {
    let who = user_name(uid);
    let mut dir = open_dir_path(home, false).map_err(|e| match errno_of(&e) {
        Errno::ENOENT => refused(
            format!("the home folder {} of {who} does not exist", home.display()),
            "ask an admin to create it",
        ),
        _ => refused(
            format!("the home folder {} of {who} cannot be used: {e}", home.display()),
            "ask an admin",
        ),
    })?;
    let owner = |fd: &OwnedFd, at: &Path| {
        fstat(fd)
            .map(|st| st.st_uid)
            .map_err(|e| refused(format!("cannot stat {}: {e}", at.display()), "try again"))
    };
    let o = owner(&dir, home)?;
    if o != uid && o != 0 {
        return Err(refused(
            format!(
                "the home folder {} belongs to {}, not to {who}",
                home.display(),
                user_name(o)
            ),
            "ask an admin",
        ));
    }
    let mut at = home.to_path_buf();
    let mut last = o;
    for c in rel.components() {
        at.push(c);
        let name = c.as_os_str();
        dir = match openat(&dir, name, DIR, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Err(Problem::Missing(at)),
            Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                let link = fstatat(&dir, name, NOFOLLOW).is_ok_and(|st| kind(&st) == SFlag::S_IFLNK);
                return Err(if link {
                    refused(
                        format!(
                            "{} is a symbolic link; Gantry never follows links in a home to find a drop folder",
                            at.display()
                        ),
                        format!(
                            "replace the link with a real folder (`rm {0} && mkdir {0}`), then run `gantry inbox init`",
                            at.display()
                        ),
                    )
                } else {
                    refused(
                        format!("{} is not a folder ({})", at.display(), e.desc()),
                        format!("rename or remove {}, then run `gantry inbox init`", at.display()),
                    )
                });
            }
            Err(e) if transient(e) => return Err(refused(format!("cannot open {}: {e}", at.display()), "try again")),
            Err(e) => {
                return Err(refused(
                    format!("cannot open {}: {}", at.display(), e.desc()),
                    "check its permissions",
                ))
            }
        };
        last = owner(&dir, &at)?;
        if last != uid && last != 0 {
            return Err(refused(
                format!("{} belongs to {}, not to {who}; a drop folder path may only go through folders of its user or root", at.display(), user_name(last)),
                format!("{who} can move it away and run `gantry inbox init` again"),
            ));
        }
    }
    if last != uid {
        // Files in a drop folder count as its owner's: a folder of root's would run jobs as root.
        return Err(refused(
            format!(
                "the drop folder {} belongs to {}, not to {who}",
                at.display(),
                user_name(last)
            ),
            format!("{who} can remove it (or an admin can `chown {who}` it), then run `gantry inbox init`"),
        ));
    }
    Ok(dir)
}

/// Members of `group`: by its member list and by primary group.
fn group_members(group: &str) -> Result<Vec<u32>, String> {
    let g = nix::unistd::Group::from_name(group)
        .map_err(|e| format!("cannot look up the group: {e}"))?
        .ok_or_else(|| format!("there is no group {group}"))?;
    let mut uids: Vec<u32> = g
        .mem
        .iter()
        .filter_map(|n| nix::unistd::User::from_name(n).ok().flatten())
        .map(|u| u.uid.as_raw())
        .collect();
    uids.extend(primary_members(g.gid.as_raw()));
    uids.sort_unstable();
    uids.dedup();
    Ok(uids)
}

/// Users whose primary group is `gid` (the user database, NSS included).
fn primary_members(gid: u32) -> Vec<u32> {
    // The passwd enumeration has one cursor per process.
    static PWENT: Mutex<()> = Mutex::new(());
    let _g = lock(&PWENT);
    let mut out = vec![];
    let mut buf = vec![0 as libc::c_char; 1 << 16];
    // SAFETY: the enumeration is serialized above; each entry is read into our own buffer.
    unsafe {
        libc::setpwent();
        loop {
            let mut pw: libc::passwd = std::mem::zeroed();
            let mut res: *mut libc::passwd = std::ptr::null_mut();
            if libc::getpwent_r(&mut pw, buf.as_mut_ptr(), buf.len(), &mut res) != 0 || res.is_null() {
                break;
            }
            if pw.pw_gid == gid {
                out.push(pw.pw_uid);
            }
        }
        libc::endpwent();
    }
    out
}

/// Names of the usable lab templates: real folders of root's holding a template file.
fn lab_templates(engine: &Engine) -> Vec<String> {
    let Some(dir) = &engine.cfg.templates_dir else {
        return vec![];
    };
    let Ok(fd) = open_dir_path(dir, false) else {
        return vec![];
    };
    super::list(&fd)
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, st)| kind(st) == SFlag::S_IFDIR && st.st_uid == 0 && !name.starts_with('.'))
        .filter(|(name, _)| {
            openat(&fd, name.as_str(), DIR, Mode::empty())
                .is_ok_and(|t| TEMPLATE_NAMES.iter().any(|n| fstatat(&t, *n, NOFOLLOW).is_ok()))
        })
        .map(|(name, _)| name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_path_stays_in_the_home() {
        assert!(check_inbox_path(Path::new("Gantry/inbox")).is_ok());
        for bad in ["", "/etc", "../x", "Gantry/../../x", "./x"] {
            assert!(check_inbox_path(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_user_folder_is_reached_only_through_real_folders_of_the_user_or_root() {
        let d = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(d.path()).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        assert!(
            matches!(open_user_dir(&home, Path::new("G/inbox"), me), Err(Problem::Missing(p)) if p == home.join("G"))
        );
        std::fs::create_dir_all(home.join("G/inbox")).unwrap();
        assert!(open_user_dir(&home, Path::new("G/inbox"), me).is_ok());
        std::fs::create_dir(home.join("real")).unwrap();
        std::os::unix::fs::symlink(home.join("real"), home.join("L")).unwrap();
        std::fs::create_dir(home.join("real/inbox")).unwrap();
        match open_user_dir(&home, Path::new("L/inbox"), me) {
            Err(Problem::Refused(e)) => assert!(e.message.contains("symbolic link"), "{e}"),
            r => panic!("{:?}", r.map(|_| ())),
        }
        if me == 0 {
            std::os::unix::fs::lchown(home.join("G"), Some(4242), None).unwrap();
            match open_user_dir(&home, Path::new("G/inbox"), 0) {
                Err(Problem::Refused(e)) => assert!(e.message.contains("belongs to 4242"), "{e}"),
                r => panic!("{:?}", r.map(|_| ())),
            }
        }
    }
}
