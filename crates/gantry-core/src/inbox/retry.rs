//! A drop file refused for now by what only time lifts (a full queue): tried again after a wait that
//! doubles, with one error file saying why.

use super::*;

/// A drop file refused for now: tried again at `next`, each wait twice the last.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiting {
    /// The file's identity when refused (dev, inode, size, mtime): a changed file is tried at once.
    pub(super) key: (u64, u64, i64, i64),
    pub(super) next: tokio::time::Instant,
    pub(super) delay: std::time::Duration,
}

/// A refused drop file is first tried again after 30 s (a queue's jobs start in seconds to
/// minutes), each wait then doubles, up to 10 minutes: a file waiting all day is read about 150
/// times, not every 10 s rescan (8,640 times).
pub const WAIT_FIRST: std::time::Duration = std::time::Duration::from_secs(30);
pub const WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(600);

impl Waiting {
    /// The wait after `prev` (none yet: the first).
    pub(super) fn after(prev: Option<&Waiting>, key: (u64, u64, i64, i64), now: tokio::time::Instant) -> Waiting {
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

pub(super) fn file_key(st: &FileStat) -> (u64, u64, i64, i64) {
    (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
    )
}

/// Leave the file where it is, to be tried again after a wait, with one `<name>.error.txt` saying why
/// (written when the wait starts, not at each try). The report is dated just before the file, so it
/// never marks the file as explained: after a restart the file is tried once more.
pub(super) fn wait(
    f: &Folder,
    name: &str,
    st: &FileStat,
    reason: String,
    waited: Option<(u64, u64, i64, i64)>,
) -> Outcome {
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
