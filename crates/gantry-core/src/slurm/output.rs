//! Job output Slurm writes into the shared log folder, read as root without following links.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::Refusal;

/// The directory a user's Slurm output goes to under the shared log dir: `<log_dir>/<uid>`, made by
/// the engine, owned by the user, mode 0700. An existing one must be a real directory (not a link)
/// owned by them.
pub fn user_log_dir(log_dir: &Path, uid: u32, gid: u32) -> Result<PathBuf, Refusal> {
    let d = log_dir.join(uid.to_string());
    match std::fs::symlink_metadata(&d) {
        Ok(m) if m.file_type().is_dir() && m.uid() == uid => Ok(d),
        Ok(_) => Err(Refusal(format!(
            "{} is not a folder owned by the job's owner; an admin must remove it",
            d.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(&d).map_err(|e| Refusal(format!("cannot make {}: {e}", d.display())))?;
            let undo = |e: std::io::Error| {
                let _ = std::fs::remove_dir(&d);
                Refusal(format!("cannot hand {} to the job's owner: {e}", d.display()))
            };
            std::os::unix::fs::chown(&d, Some(uid), Some(gid)).map_err(undo)?;
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(undo)?;
            Ok(d)
        }
        Err(e) => Err(Refusal(format!("cannot check {}: {e}", d.display()))),
    }
}

fn open_at(dir: Option<&OwnedFd>, path: &Path, flags: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let base = dir.map(|d| d.as_raw_fd()).unwrap_or(libc::AT_FDCWD);
    // SAFETY: a valid C string and directory fd; the returned fd is owned below.
    let fd = unsafe { libc::openat(base, c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The most [`read_output`] reads at once.
pub const OUTPUT_READ: u64 = 16 << 20;

/// Read a job's Slurm output from `offset` (at most [`OUTPUT_READ`] bytes), as root, without following anything the user controls:
/// the user's folder and the file are opened with `O_NOFOLLOW` and must be a directory and a regular
/// file owned by the job's owner. A user who swaps their log for a link to `/etc/shadow` (or a FIFO,
/// or a hard link to a file they do not own) gets an error in their log, never the file.
pub fn read_output(log_dir: &Path, uid: u32, file: &str, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Seek, SeekFrom};
    let top = open_at(None, log_dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let dir = open_at(
        Some(&top),
        Path::new(&uid.to_string()),
        libc::O_RDONLY | libc::O_DIRECTORY,
    )?;
    let mut f = std::fs::File::from(open_at(Some(&dir), Path::new(file), libc::O_RDONLY | libc::O_NONBLOCK)?);
    let dm = std::fs::File::from(dir).metadata()?;
    let fm = f.metadata()?;
    if dm.uid() != uid || !fm.file_type().is_file() || fm.uid() != uid {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            "the job's output is not a plain file owned by the job's owner; not read",
        ));
    }
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![];
    f.take(OUTPUT_READ).read_to_end(&mut buf)?;
    Ok(buf)
}
