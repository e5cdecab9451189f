//! The drop folder's watcher: inotify watches (bounded per user), their events, and the periodic
//! scan behind them.

use super::*;

/// Events a drop folder's watches report: complete files (closed after writing, renamed in), new
/// entries (folders, links), and writes (a file written to and not closed yet is never read).
pub(super) const EVENTS: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
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
pub(super) const WRITER_GONE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The name of the error file that says why some folders of a drop folder are scanned, not watched.
pub const WATCH_NOTE: &str = "gantry-folders";

pub(super) struct InotifyFd(Inotify);

impl std::os::fd::AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsFd::as_fd(&self.0).as_raw_fd()
    }
}

/// Why a folder is not watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unwatched {
    /// The user's bound (`inbox.max_watches`) is reached.
    Bound,
    /// The kernel refused (no inotify instance, `fs.inotify.max_user_watches` used up).
    Kernel,
}

/// One drop folder's inotify watches: the folder itself and at most the lab's bound of its folders
/// (`[inbox] max_watches`, the folder included), each on its own, one level deep. A watch goes in
/// O(1) when its folder goes (`IN_IGNORED`), so deleting many folders costs one event each.
/// A file as the last scan saw it: (device, inode, size, mtime s, mtime ns).
pub(super) type FileLook = (u64, u64, u64, i64, i64);

pub(super) struct Watches {
    pub(super) fd: Option<AsyncFd<InotifyFd>>,
    /// Watch -> `None` (the drop folder) or the folder's name.
    pub(super) folders: HashMap<i32, Option<String>>,
    pub(super) names: HashMap<String, WatchDescriptor>,
    pub(super) top: Option<WatchDescriptor>,
    /// Files written to and not closed yet (`IN_CREATE`/`IN_MODIFY` without `IN_CLOSE_WRITE`), with
    /// the last write: never read until closed or moved in (or after [`WRITER_GONE`] without writes).
    pub(super) writing: HashMap<(Option<String>, String), tokio::time::Instant>,
    /// What each file looked like at the last scan: a scan reads a file only once it is unchanged
    /// since the one before (a writer the watches cannot see may still be writing it).
    pub(super) seen: HashMap<(Option<String>, String), FileLook>,
    /// Folders not watched at the last scan, and why.
    pub(super) unwatched: Vec<(String, Unwatched)>,
    /// Where the last scan's look into unwatched folders stopped (they are looked into in turns).
    pub(super) cursor: usize,
    /// Refused drop files that only time can lift (a full queue), waiting to be tried again.
    pub(super) waiting: HashMap<(Option<String>, String), Waiting>,
}

impl Watches {
    pub(super) fn new(ib: &Inbox) -> Watches {
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
    pub(super) fn watch_top(&mut self, ib: &Inbox) -> bool {
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
    pub(super) fn watch(&mut self, ib: &Inbox, name: &str, max: usize) -> Result<(), Unwatched> {
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
    pub(super) fn forget_except(&mut self, present: &HashSet<String>) {
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
    pub(super) async fn events(&self) -> Vec<InotifyEvent> {
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
    pub(super) fn note(&self, ib: &Inbox, engine: &Engine, max: usize) -> Option<String> {
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

impl Inbox {
    /// One inotify event.
    pub(super) fn event(&self, engine: &Engine, w: &mut Watches, ev: InotifyEvent) {
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
    pub(super) fn rescan(&self, engine: &Engine, w: &mut Watches) {
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
    pub(super) fn report(&self, note: Option<String>) {
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
}
