//! Folder operations on descriptors that never follow a link a user made: listing, opening,
//! reading, error files, moves without replacing.

use super::*;

/// Entries of a folder with their `lstat`, sorted by name; names that are not UTF-8 are skipped.
pub(super) fn list(dir: &OwnedFd) -> nix::Result<Vec<(String, FileStat)>> {
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
pub(super) fn open_dir_path(path: &Path, create: bool) -> std::io::Result<OwnedFd> {
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
pub(super) fn subdir(dir: &OwnedFd, dir_path: &Path, name: &str, owner: Ids) -> Result<OwnedFd, Stop> {
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
pub(super) fn read_at(dir: &OwnedFd, name: &str, what: &str) -> Result<(FileStat, String), Stop> {
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

pub(super) fn link_error(what: &str) -> SpecError {
    SpecError::new(
        format!("{what} is a symbolic link; Gantry never follows links in the drop folder"),
        "copy the file itself into the folder (cp -L), not a link to it",
    )
}

/// A file refused earlier is not looked at again until it changes or is moved again: until then its
/// error file (which the engine gave to the file's owner) is newer than the file's last change.
pub(super) fn explained(dir: &OwnedFd, name: &str, st: &FileStat) -> bool {
    let changed = (st.st_mtime, st.st_mtime_nsec).max((st.st_ctime, st.st_ctime_nsec));
    fstatat(dir, format!("{name}.error.txt").as_str(), NOFOLLOW)
        .is_ok_and(|e| kind(&e) == SFlag::S_IFREG && e.st_uid == st.st_uid && (e.st_mtime, e.st_mtime_nsec) >= changed)
}

/// Write `<name>.error.txt` in `dir`, owned by `owner`: a fresh file made `O_EXCL` under a hidden
/// name, then renamed into place (replacing an earlier report, never following a link).
pub(super) fn write_error(dir: &OwnedFd, name: &str, owner: Ids, text: &str) -> nix::Result<()> {
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
pub(super) fn move_noreplace(from: &OwnedFd, name: &str, to: &OwnedFd, to_name: &str) -> nix::Result<String> {
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
