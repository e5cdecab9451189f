//! Mounts pinned to the file the owner's check opened.
//!
//! [`crate::access`] opens each mount's host path as the job's owner and hands the opened file back.
//! Docker, though, takes a path, and runc follows it as root when the container starts: between the check
//! and that moment the owner could swap a component of their own path for a symlink to `/root/secret`.
//! So a root engine bind-mounts the checked file itself (`/proc/self/fd/N`) onto a staging path it owns,
//! `<state dir>/mnt/<container name>/<i>` (directories 0700 root), and gives Docker the staging path. No
//! user can change anything on the way to it, and it shows exactly the inode the owner's open reached.
//!
//! The bind is recursive, as Docker's own bind mounts are, so the job sees the same tree its owner sees
//! (nested mounts included); its propagation is private. `:ro` remounts it read-only (nested mounts keep
//! their own flags, as with Docker 20.10's read-only binds; the job still writes only what its owner may).
//! A pinned mount lives only while it is needed: from just before the container is created until Docker's
//! start has returned, when the container's own mount namespace holds its copy of the bind (Gantry starts a
//! container once, never again). It is then unmounted ([`Staging::unpin`]), so nothing under the state dir
//! leads into a user's files while jobs run, and a `rm -rf` of the state dir (the advice after removing
//! Gantry) never descends into a home or a data folder (issue 29, hole 0). An engine killed inside that
//! short window leaves pins behind: the next engine's start-up unpins every container that is no longer
//! waiting for its start (a start in flight is settled first, see `reconcile`), and releases those whose
//! container is gone.
//!
//! An engine that is not root cannot mount: it passes the resolved path on, and the race stays open
//! there (such an engine only serves its own user, whose paths it could read anyway).
//!
//! Files the engine generates for a container (its `/etc/passwd` and `/etc/group`) live in the same
//! place, `<state dir>/mnt/<container name>/<file>`: created by the engine (never through a link, never
//! over an existing file) in directories only it can write, and released with the pinned mounts.

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tracing::{info, warn};

use crate::access::{CheckedMount, ResolvedMount};

#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    #[error(
        "cannot pin the mount of {} at {}: {source}. A root engine mounts each checked host path itself so it \
         cannot be swapped before the container starts; run the engine as root in the host's mount namespace",
        host.display(), at.display()
    )]
    Mount { host: PathBuf, at: PathBuf, source: Errno },
    #[error("{} changed while it was being pinned; submit the job again", host.display())]
    Changed { host: PathBuf },
    #[error("staging mounts in {}: {source}", at.display())]
    Io { at: PathBuf, source: std::io::Error },
}

/// The staging area of one engine.
#[derive(Debug, Clone)]
pub struct Staging {
    root: PathBuf,
    enabled: bool,
}

impl Staging {
    /// `<state dir>/mnt`; pinning is on when the engine runs as root.
    pub fn in_state_dir(state_dir: &Path) -> Staging {
        Staging {
            root: state_dir.join("mnt"),
            enabled: nix::unistd::geteuid().is_root(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Pin each checked mount under `name` (the container's name) and return the mounts to hand Docker.
    /// On failure nothing stays mounted.
    /// Whatever an earlier try under this name left is released first.
    pub fn stage(&self, name: &str, checked: Vec<CheckedMount>) -> Result<Vec<ResolvedMount>, StagingError> {
        self.release(name)?; // leftovers of an earlier try under this name
        if !self.enabled || checked.is_empty() {
            return Ok(checked.into_iter().map(|c| c.mount).collect());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(io(&self.root))?;
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700)).map_err(io(&self.root))?;
        let dir = self.root.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(io(&dir))?;
        let staged: Result<Vec<_>, _> = checked
            .into_iter()
            .enumerate()
            .map(|(i, c)| pin(&dir.join(i.to_string()), c))
            .collect();
        if staged.is_err() {
            if let Err(e) = self.release(name) {
                warn!("{e}");
            }
        }
        staged
    }

    /// Write `content` as `<root>/<name>/<file>` (0644: the job's user reads it through its mount) and
    /// return its path, for Docker to mount read-only. The directories are created 0700 and must be
    /// real directories of the engine's own; the file is created new, without following a link.
    pub fn write_generated(&self, name: &str, file: &str, content: &[u8]) -> Result<PathBuf, StagingError> {
        use std::io::Write;
        let dir = self.root.join(name);
        for d in [&self.root, &dir] {
            match std::fs::DirBuilder::new().mode(0o700).create(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(d)(e)),
            }
            let m = std::fs::symlink_metadata(d).map_err(io(d))?;
            if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() {
                return Err(io(d)(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "not a directory of the engine's own",
                )));
            }
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).map_err(io(d))?;
        }
        let at = dir.join(file);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&at)
            .map_err(io(&at))?;
        f.write_all(content).map_err(io(&at))?;
        // Whatever the umask: the job's user must read it.
        f.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io(&at))?;
        Ok(at)
    }

    /// Unmount and remove the staging paths of `name`. Only empty directories and the engine's own empty
    /// files are removed, never anything reached through a mount.
    pub fn release(&self, name: &str) -> Result<(), StagingError> {
        // Until it is no longer a mount point (a crash could have stacked two). Only a root
        // engine mounts (the others hold generated files only).
        match self.remove_entries(name, self.enabled, |_| true)? {
            Some(dir) => std::fs::remove_dir(&dir).map_err(io(&dir)),
            None => Ok(()),
        }
    }

    /// Unmount and remove the pinned mounts of `name` (the numbered entries), keeping its generated files:
    /// once its container has started it holds its own copy of each bind and never starts again.
    pub fn unpin(&self, name: &str) -> Result<(), StagingError> {
        if !self.enabled {
            return Ok(());
        }
        // Pins are named by their index; generated files by what they are (`passwd`, `group`).
        self.remove_entries(name, true, |file| {
            file.to_string_lossy().bytes().all(|b| b.is_ascii_digit())
        })?;
        Ok(())
    }

    /// Remove each entry of `<root>/<name>` that `pick` chooses by its file name, unmounting it first
    /// (every mount stacked on it) when `unmount`: the directory, or `None` when it is not there.
    fn remove_entries(
        &self,
        name: &str,
        unmount: bool,
        pick: impl Fn(&std::ffi::OsStr) -> bool,
    ) -> Result<Option<PathBuf>, StagingError> {
        let dir = self.root.join(name);
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&dir))?;
            if !pick(&entry.file_name()) {
                continue;
            }
            let p = entry.path();
            if unmount {
                unmount_all(&p).map_err(io(&p))?;
            }
            let is_dir = std::fs::symlink_metadata(&p).map_err(io(&p))?.is_dir();
            if is_dir {
                std::fs::remove_dir(&p)
            } else {
                std::fs::remove_file(&p)
            }
            .map_err(io(&p))?;
        }
        Ok(Some(dir))
    }

    /// At engine start: release the staging of every container not in `existing` (removed while the
    /// engine was away, or whose release failed).
    pub fn sweep(&self, existing: &HashSet<String>) {
        let Ok(rd) = std::fs::read_dir(&self.root) else { return };
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if existing.contains(&name) {
                continue;
            }
            match self.release(&name) {
                Ok(()) => info!("released the pinned mounts of {name} (its container is gone)"),
                Err(e) => warn!("{e}"),
            }
        }
    }
}

/// Unmount `p` until it is no longer a mount point (a crash could have stacked two).
fn unmount_all(p: &Path) -> std::io::Result<()> {
    loop {
        match umount2(p, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => continue,
            Err(Errno::EINVAL) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Bind the checked file onto `at` (created here), private, read-only when asked.
fn pin(at: &Path, c: CheckedMount) -> Result<ResolvedMount, StagingError> {
    let host = c.mount.host.clone();
    let io = |source| StagingError::Io {
        at: at.to_path_buf(),
        source,
    };
    let failed = |source| StagingError::Mount {
        host: host.clone(),
        at: at.to_path_buf(),
        source,
    };
    let st = nix::sys::stat::fstat(&c.file).map_err(|e| io(e.into()))?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        std::fs::DirBuilder::new().mode(0o700).create(at).map_err(io)?;
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(at)
            .map_err(io)?;
    }
    // The fd's magic link leads to the very inode (and mount) the owner's open reached.
    let source = PathBuf::from(format!("/proc/self/fd/{}", c.file.as_raw_fd()));
    mount(
        Some(&source),
        at,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(failed)?;
    mount(
        None::<&str>,
        at,
        None::<&str>,
        MsFlags::MS_PRIVATE | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(failed)?;
    if c.mount.read_only {
        // A bind remount sets the flags it is given: keep nosuid, nodev, noexec and the atime policy.
        let kept = nix::sys::statvfs::statvfs(at).map_err(failed)?.flags();
        let kept = MsFlags::from_bits_truncate(kept.bits() as _)
            & (MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_NOATIME
                | MsFlags::MS_NODIRATIME
                | MsFlags::MS_RELATIME);
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | kept;
        mount(None::<&str>, at, None::<&str>, flags, None::<&str>).map_err(failed)?;
    }
    let now = std::fs::metadata(at).map_err(io)?;
    if (now.dev(), now.ino()) != (st.st_dev, st.st_ino) {
        return Err(StagingError::Changed { host });
    }
    Ok(ResolvedMount {
        host: at.to_path_buf(),
        ..c.mount
    })
}

/// An I/O error's map to [`StagingError::Io`] at `at`.
fn io(at: &Path) -> impl FnOnce(std::io::Error) -> StagingError {
    let at = at.to_path_buf();
    move |source| StagingError::Io { at, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{check_mounts, Cred, Forbidden};
    use crate::spec::Mount;

    fn me() -> Cred {
        Cred::of_user(nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw())
    }

    /// Mount points at or below `dir`, from this process's mountinfo.
    fn mounts_under(dir: &Path) -> Vec<String> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let dir = dir.to_string_lossy().into_owned();
        info.lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| *m == dir || m.starts_with(&format!("{dir}/")))
            .map(String::from)
            .collect()
    }

    fn checked(host: &Path, ro: bool) -> Vec<CheckedMount> {
        let m = Mount {
            host: host.to_string_lossy().into_owned(),
            container: "/d".into(),
            read_only: ro,
        };
        check_mounts(&me(), &[m], None, &Forbidden::default()).unwrap()
    }

    #[test]
    fn a_pinned_mount_keeps_the_checked_inode_after_a_swap_and_is_released_cleanly() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (data, secret) = (base.join("data"), base.join("secret"));
        std::fs::create_dir(&data).unwrap();
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(data.join("f"), "mine").unwrap();
        std::fs::write(secret.join("f"), "SECRET").unwrap();
        let staging = Staging::in_state_dir(&base.join("state"));
        let mut all = checked(&data, true);
        all.extend(checked(&data.join("f"), false));
        let staged = staging.stage("c1", all).unwrap();
        if !staging.enabled {
            assert_eq!(
                staged[0].host, data,
                "an engine that is not root passes the resolved path on"
            );
            return;
        }
        // The owner swaps the checked path for a symlink to somewhere else.
        std::fs::rename(&data, base.join("data.old")).unwrap();
        std::os::unix::fs::symlink(&secret, &data).unwrap();
        let (dir, file) = (&staged[0], &staged[1]);
        assert!(dir.host.starts_with(staging.root()) && dir.read_only, "{dir:?}");
        assert_eq!(std::fs::read_to_string(dir.host.join("f")).unwrap(), "mine");
        assert_eq!(std::fs::read_to_string(&file.host).unwrap(), "mine");
        let w = std::fs::write(dir.host.join("new"), "x").unwrap_err();
        assert_eq!(
            w.raw_os_error(),
            Some(libc::EROFS),
            "a :ro mount is read-only even for root: {w}"
        );
        std::fs::write(&file.host, "written").unwrap();
        assert_eq!(
            std::fs::read_to_string(base.join("data.old/f")).unwrap(),
            "written",
            "a rw mount writes the owner's file"
        );
        assert_eq!(
            std::fs::metadata(staging.root()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(mounts_under(staging.root()).len(), 2);

        staging.release("c1").unwrap();
        assert!(mounts_under(staging.root()).is_empty());
        assert!(!staging.root().join("c1").exists());
        assert_eq!(
            std::fs::read_to_string(base.join("data.old/f")).unwrap(),
            "written",
            "releasing never touches the owner's files"
        );
        staging.release("c1").unwrap(); // twice is fine
    }

    #[test]
    fn generated_files_are_new_files_of_the_engines_own_and_go_with_the_container() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let staging = Staging::in_state_dir(&base.join("state"));
        std::fs::create_dir_all(base.join("state")).unwrap();
        let p = staging
            .write_generated("c1", "passwd", b"root:x:0:0::/root:/bin/sh\n")
            .unwrap();
        assert_eq!(p, staging.root().join("c1/passwd"));
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o644);
        assert_eq!(
            std::fs::metadata(staging.root().join("c1"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        // Never over an existing file, never through a link planted where a file goes.
        assert!(staging.write_generated("c1", "passwd", b"x").is_err());
        std::os::unix::fs::symlink(base.join("elsewhere"), staging.root().join("c1/group")).unwrap();
        assert!(staging.write_generated("c1", "group", b"x").is_err());
        assert!(!base.join("elsewhere").exists(), "nothing written through the link");
        std::os::unix::fs::symlink(&base, staging.root().join("c2")).unwrap();
        assert!(
            staging.write_generated("c2", "passwd", b"x").is_err(),
            "a container's folder that is a link is refused"
        );
        assert!(!base.join("passwd").exists());
        std::fs::remove_file(staging.root().join("c2")).unwrap();
        staging.release("c1").unwrap();
        assert!(!staging.root().join("c1").exists());
    }

    #[test]
    fn unpinning_leaves_no_mount_under_the_state_dir_and_keeps_the_generated_files() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let data = base.join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("keep.txt"), "k").unwrap();
        let staging = Staging::in_state_dir(&base.join("state"));
        if !staging.enabled {
            return;
        }
        let mut all = checked(&data, false);
        all.extend(checked(&data.join("keep.txt"), true));
        staging.stage("c1", all).unwrap();
        staging
            .write_generated("c1", "passwd", b"x:x:1:1::/:/bin/sh\n")
            .unwrap();
        assert_eq!(mounts_under(staging.root()).len(), 2);
        staging.unpin("c1").unwrap();
        assert!(mounts_under(staging.root()).is_empty());
        let left: Vec<String> = std::fs::read_dir(staging.root().join("c1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["passwd"]);
        // A recursive delete of the state dir now reaches only the engine's own files.
        std::fs::remove_dir_all(base.join("state")).unwrap();
        assert_eq!(std::fs::read_to_string(data.join("keep.txt")).unwrap(), "k");
        staging.unpin("c1").unwrap(); // gone is fine
    }

    #[test]
    fn the_sweep_releases_only_containers_that_are_gone() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let data = base.join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("keep.txt"), "k").unwrap();
        let staging = Staging::in_state_dir(&base.join("state"));
        if !staging.enabled {
            return;
        }
        staging.stage("alive", checked(&data, true)).unwrap();
        staging.stage("gone", checked(&data, false)).unwrap();
        staging.sweep(&HashSet::from(["alive".to_string()]));
        let left = mounts_under(staging.root());
        assert_eq!(
            left,
            vec![staging.root().join("alive/0").to_string_lossy().into_owned()]
        );
        assert!(!staging.root().join("gone").exists());
        staging.release("alive").unwrap();
        assert_eq!(std::fs::read_to_string(data.join("keep.txt")).unwrap(), "k");
    }
}
