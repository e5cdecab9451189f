//! The drop folder. Files dropped into the inbox become jobs; each one ends in `accepted/` (named
//! `<job id>-<file name>`) or in `rejected/` next to `<file>.error.txt`. A user's file is never
//! deleted or overwritten and symlinks are never followed.
//!
//! Only complete files are read: the watcher acts on "closed after write" and "renamed in" events,
//! never on a file still being written. Files dropped while the engine was down are picked up on start.
//!
//! A subfolder holding `gantry.toml` (or `.yaml`) is a template folder: any other file dropped there
//! becomes a job from the template with that file mounted read-only at `/gantry/config/<name>`.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::{EventKind, RecursiveMode, Watcher};
use tracing::{info, warn};

use crate::engine::{Engine, EngineError};
use crate::spec::{self, Format, Origin, SpecError, MAX_SPEC_BYTES, TEMPLATE_NAMES};
use crate::store::Owner;

pub const ACCEPTED: &str = "accepted";
pub const REJECTED: &str = "rejected";

/// What happened to one dropped file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Accepted { job_id: i64, moved_to: PathBuf },
    Rejected { moved_to: PathBuf, error: String },
    /// Not a job file (template itself, hidden/temporary file, our own folders): left alone.
    Ignored,
}

/// Look up a user name for a uid, falling back to the number.
pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten().map(|u| u.name).unwrap_or_else(|| uid.to_string())
}

fn ignorable(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with(".error.txt")
        || name.ends_with('~')
        || [".tmp", ".part", ".swp", ".crdownload"].iter().any(|s| name.ends_with(s))
}

/// Set up folders, pick up what is already there, then watch until the engine stops.
pub async fn run(engine: Arc<Engine>, inbox: PathBuf) -> Result<(), EngineError> {
    std::fs::create_dir_all(inbox.join(ACCEPTED))?;
    std::fs::create_dir_all(inbox.join(REJECTED))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PathBuf>();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
        Ok(ev) => {
            let complete = matches!(
                ev.kind,
                EventKind::Access(notify::event::AccessKind::Close(notify::event::AccessMode::Write))
                    | EventKind::Modify(notify::event::ModifyKind::Name(notify::event::RenameMode::To))
                    | EventKind::Modify(notify::event::ModifyKind::Name(notify::event::RenameMode::Both))
            ) || matches!(ev.kind, EventKind::Create(notify::event::CreateKind::Folder))
                || (matches!(ev.kind, EventKind::Create(_))
                // A symlink is complete when created (it has no close-after-write); regular files
                // being written also fire Create, and must wait for their close.
                && ev.paths.last().and_then(|p| std::fs::symlink_metadata(p).ok()).is_some_and(|m| m.file_type().is_symlink()));
            if complete {
                // For a rename pair the destination is last.
                if let Some(p) = ev.paths.last() {
                    let _ = tx.send(p.clone());
                }
            }
        }
        Err(e) => warn!("drop folder watch error: {e}"),
    })
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    watcher.watch(&inbox, RecursiveMode::Recursive).map_err(|e| std::io::Error::other(e.to_string()))?;
    info!("watching drop folder {}", inbox.display());
    for p in scan(&inbox) {
        handle(&engine, &inbox, &p);
    }
    // A safety net for events the kernel drops (inotify queue overflow): rescan now and then.
    let mut rescan = tokio::time::interval(std::time::Duration::from_secs(10));
    rescan.tick().await;
    loop {
        tokio::select! {
            p = rx.recv() => {
                let Some(p) = p else { break };
                if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                    // A new (template) folder: files may have landed before its watch was added.
                    if let Ok(rd) = std::fs::read_dir(&p) {
                        let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|f| !f.is_dir()).collect();
                        files.sort();
                        for f in files {
                            handle(&engine, &inbox, &f);
                        }
                    }
                } else {
                    handle(&engine, &inbox, &p);
                }
            }
            _ = rescan.tick() => {
                for p in scan(&inbox) {
                    handle(&engine, &inbox, &p);
                }
            }
        }
    }
    Ok(())
}

/// Candidate files now in the inbox (root and template folders), sorted by name. Files modified in
/// the last 5 seconds are skipped: they may still be being written, and their close event will come.
pub fn scan(inbox: &Path) -> Vec<PathBuf> {
    let settled = |p: &PathBuf| {
        std::fs::symlink_metadata(p).and_then(|m| m.modified()).map(|t| t.elapsed().map(|e| e.as_secs() >= 5).unwrap_or(true)).unwrap_or(false)
    };
    scan_all(inbox).into_iter().filter(settled).collect()
}

fn scan_all(inbox: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(rd) = std::fs::read_dir(inbox) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        match e.file_type() {
            Ok(t) if t.is_dir() && name != ACCEPTED && name != REJECTED && !name.starts_with('.') => {
                if let Ok(sub) = std::fs::read_dir(&p) {
                    out.extend(sub.flatten().filter(|f| f.file_type().map(|t| !t.is_dir()).unwrap_or(false)).map(|f| f.path()));
                }
            }
            Ok(t) if !t.is_dir() => out.push(p),
            _ => {}
        }
    }
    out.sort();
    out
}

fn handle(engine: &Engine, inbox: &Path, path: &Path) {
    match process(engine, inbox, path) {
        Outcome::Accepted { job_id, moved_to } => info!(job = job_id, "accepted {} -> {}", path.display(), moved_to.display()),
        Outcome::Rejected { moved_to, error } => warn!("rejected {}: {error} (see {}.error.txt)", path.display(), moved_to.display()),
        Outcome::Ignored => {}
    }
}

/// Turn one dropped file into a job, or reject it with an explanation.
pub fn process(engine: &Engine, inbox: &Path, path: &Path) -> Outcome {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { return Outcome::Ignored };
    let Some(dir) = path.parent() else { return Outcome::Ignored };
    if ignorable(&name) {
        return Outcome::Ignored;
    }
    let template_dir = if dir == inbox {
        None
    } else if dir.parent() == Some(inbox) {
        let d = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if d == ACCEPTED || d == REJECTED || d.starts_with('.') || TEMPLATE_NAMES.contains(&name.as_str()) {
            return Outcome::Ignored;
        }
        if !TEMPLATE_NAMES.iter().any(|t| dir.join(t).is_file()) {
            return Outcome::Ignored; // a plain subfolder, not a template folder
        }
        Some(d)
    } else {
        return Outcome::Ignored;
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(_) => return Outcome::Ignored, // already moved (duplicate event)
    };
    if meta.file_type().is_symlink() {
        return reject(dir, &name, &meta, SpecError::new(
            "the dropped file is a symbolic link; Gantry never follows links in the drop folder",
            "copy the spec file itself into the inbox (cp -L), not a link to it",
        ));
    }
    if !meta.is_file() {
        return Outcome::Ignored;
    }
    if meta.nlink() > 1 {
        return reject(dir, &name, &meta, SpecError::new(
            "the dropped file is a hard link to another file; Gantry only reads files dropped as copies",
            "copy the spec file into the inbox instead of linking it",
        ));
    }
    if meta.len() > MAX_SPEC_BYTES {
        return reject(dir, &name, &meta, SpecError::new(
            format!("the file is {} bytes; job files are limited to {} bytes", meta.len(), MAX_SPEC_BYTES),
            "a job spec is a few lines of YAML or TOML: drop the spec, and put data in a mount",
        ));
    }
    let text = match read_capped(path) {
        Ok(t) => t,
        Err(e) => return reject(dir, &name, &meta, e),
    };
    let owner = Owner { uid: meta.uid(), gid: meta.gid(), name: user_name(meta.uid()) };
    let key = format!("{}:{}:{}:{}", meta.dev(), meta.ino(), meta.len(), meta.mtime_nsec() + meta.mtime() * 1_000_000_000);
    let accepted_dir = dir.join(ACCEPTED);
    if let Some(id) = engine.source_known(&key) {
        // Queued before a crash, not yet moved: finish the move, do not queue it twice.
        return accept(&accepted_dir, path, &name, id);
    }
    let source = format!("inbox:{}", path.display());
    let result = match &template_dir {
        None => {
            let Some(format) = Format::from_name(&name) else {
                return reject(dir, &name, &meta, SpecError::new(
                    format!("{name:?} is not a job file: Gantry reads .yaml, .yml and .toml"),
                    "rename it to .yaml or .toml if it is a job spec, or drop it into a template folder",
                ));
            };
            spec::validate_text(&text, format, &Origin { file_name: Some(name.clone()), base_dir: Some(dir.to_path_buf()) })
                .map_err(EngineError::from)
                .and_then(|job| engine.submit(&job, &owner, &source, Some(&key), |_, _| None))
                .map(|ids| ids[0])
        }
        Some(tdir) => submit_from_template(engine, dir, tdir, &name, &owner, &source, &key),
    };
    match result {
        Ok(id) => accept(&accepted_dir, path, &name, id),
        Err(EngineError::Spec(e)) => reject(dir, &name, &meta, e),
        Err(e) => {
            // Not the file's fault (database trouble): leave it in place to retry later.
            warn!("could not queue {}: {e}", path.display());
            Outcome::Ignored
        }
    }
}

fn submit_from_template(engine: &Engine, dir: &Path, tdir: &str, name: &str, owner: &Owner, source: &str, key: &str) -> Result<i64, EngineError> {
    let (tpath, ttext) = TEMPLATE_NAMES
        .iter()
        .find_map(|t| {
            let p = dir.join(t);
            read_capped(&p).ok().map(|s| (p, s))
        })
        .ok_or_else(|| SpecError::new("the template folder's gantry.toml could not be read", "check the template file"))?;
    let tformat = Format::from_name(&tpath.to_string_lossy()).unwrap_or(Format::Toml);
    let template = spec::parse_template(&ttext, tformat).map_err(|e| {
        SpecError::new(format!("the template {} is invalid: {e}", tpath.display()), "fix the template; this file was not the problem and can be dropped again")
    })?;
    let accepted = dir.join(ACCEPTED);
    let origin = Origin { file_name: Some(name.into()), base_dir: Some(dir.to_path_buf()) };
    // The config is mounted from where it will lie once accepted: `accepted/<first job id>-<name>`.
    let placeholder = accepted.join(format!("0-{name}")).to_string_lossy().into_owned();
    let s = spec::instantiate_template(&template, tdir, &placeholder, name);
    let probe = spec::validate(s, &origin).map_err(|(e, _)| e)?;
    let first = std::cell::Cell::new(None::<i64>);
    let ids = engine.submit(&probe, owner, source, Some(key), |id, job| {
        let first = match first.get() {
            Some(f) => f,
            None => {
                first.set(Some(id));
                id
            }
        };
        let real = accepted.join(format!("{first}-{name}")).to_string_lossy().into_owned();
        let mut j = job.clone();
        for m in j.mounts.iter_mut().filter(|m| m.host == placeholder) {
            m.host = real.clone();
        }
        for m in j.spec.mounts.iter_mut() {
            *m = m.replace(&placeholder, &real);
        }
        Some(j)
    })?;
    Ok(ids[0])
}

fn read_capped(path: &Path) -> Result<String, SpecError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| SpecError::new(format!("cannot read the file: {e}"), "check its permissions: the engine must be able to read it"))?;
    let mut buf = Vec::new();
    f.take(MAX_SPEC_BYTES + 1).read_to_end(&mut buf).map_err(|e| SpecError::new(format!("cannot read the file: {e}"), "check the file"))?;
    if buf.len() as u64 > MAX_SPEC_BYTES {
        return Err(SpecError::new(format!("the file is larger than {MAX_SPEC_BYTES} bytes"), "job specs are small text files"));
    }
    String::from_utf8(buf).map_err(|_| SpecError::new("the file is not UTF-8 text", "save the spec as UTF-8 YAML or TOML"))
}

/// rename(2) that never replaces an existing file: tries `name`, `name.1`, `name.2`, ...
fn move_noreplace(from: &Path, to_dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    std::fs::create_dir_all(to_dir)?;
    let src = CString::new(from.as_os_str().as_bytes())?;
    for i in 0..1000 {
        let cand = if i == 0 { to_dir.join(name) } else { to_dir.join(format!("{name}.{i}")) };
        let dst = CString::new(cand.as_os_str().as_bytes())?;
        // SAFETY: valid NUL-terminated paths.
        let rc = unsafe { libc::renameat2(libc::AT_FDCWD, src.as_ptr(), libc::AT_FDCWD, dst.as_ptr(), libc::RENAME_NOREPLACE) };
        if rc == 0 {
            return Ok(cand);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EEXIST) {
            return Err(err);
        }
    }
    Err(std::io::Error::other("too many files with the same name"))
}

fn accept(accepted_dir: &Path, path: &Path, name: &str, id: i64) -> Outcome {
    match move_noreplace(path, accepted_dir, &format!("{id}-{name}")) {
        Ok(moved_to) => Outcome::Accepted { job_id: id, moved_to },
        Err(e) => {
            warn!("job {id} queued but {} could not be moved to accepted/: {e}", path.display());
            Outcome::Accepted { job_id: id, moved_to: path.to_path_buf() }
        }
    }
}

fn reject(dir: &Path, name: &str, meta: &std::fs::Metadata, e: SpecError) -> Outcome {
    let src = dir.join(name);
    let rejected = dir.join(REJECTED);
    let moved_to = match move_noreplace(&src, &rejected, name) {
        Ok(p) => p,
        Err(err) => {
            warn!("could not move {} to rejected/: {err}", src.display());
            return Outcome::Ignored;
        }
    };
    let report = format!(
        "Gantry could not queue {name:?}:\n\n{e}\n\nThe file was moved here unchanged. Fix it and drop it into the inbox again.\n\
         `gantry schema` prints every field a job spec may have.\n"
    );
    let err_path = PathBuf::from(format!("{}.error.txt", moved_to.display()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&err_path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, report.as_bytes()));
    if written.is_ok() {
        let _ = std::os::unix::fs::lchown(&err_path, Some(meta.uid()), Some(meta.gid()));
    }
    Outcome::Rejected { moved_to, error: e.to_string() }
}
