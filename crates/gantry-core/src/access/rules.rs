//! What no job may mount (the container engine's sockets, Gantry's state), and the mount checks built on
//! the helper: each mount resolved as the submitter, nested mounts and the workdir checked.

#[allow(unused_imports)]
use super::*;
use crate::spec::{Mount, SpecError};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Host paths whose ancestors, themselves and contents no job may mount: the container engine's
/// sockets and the engine's own state. Compared after symlinks are resolved on both sides.
#[derive(Debug, Clone, Default)]
pub struct Forbidden {
    pub(super) entries: Vec<(PathBuf, &'static str)>,
    /// Subtrees that may be mounted although they lie inside an entry: the drop folder, which may sit in
    /// the state dir, holds the config files template jobs mount.
    pub(super) exempt: Vec<PathBuf>,
}

impl Forbidden {
    /// For an engine with this state dir, socket and drop folder (the Docker socket from `DOCKER_HOST` too).
    pub fn for_engine(state_dir: &Path, socket: &Path, inbox: &Path) -> Forbidden {
        let mut f = Forbidden::default();
        if let Some(p) = std::env::var("DOCKER_HOST")
            .ok()
            .as_deref()
            .and_then(|h| h.strip_prefix("unix://"))
        {
            f.add(Path::new(p), "the Docker socket");
        }
        for p in ["/var/run/docker.sock", "/run/docker.sock"] {
            f.add(Path::new(p), "the Docker socket");
        }
        f.add(Path::new("/run/containerd/containerd.sock"), "the containerd socket");
        f.add(Path::new("/run/containerd"), "containerd's runtime directory");
        f.add(Path::new("/var/run/docker"), "Docker's runtime directory");
        f.add(state_dir, "the Gantry state directory");
        f.add(socket, "the Gantry socket");
        // The system socket lives outside the state dir (`/run/gantry`): its folder is as private.
        if let Some(dir) = socket.parent() {
            f.add(dir, "the Gantry socket's folder");
        }
        f.exempt = [Some(inbox.to_path_buf()), std::fs::canonicalize(inbox).ok()]
            .into_iter()
            .flatten()
            .collect();
        f
    }

    /// Both the path as given and as it resolves now (a missing last component is kept as is).
    pub(super) fn add(&mut self, p: &Path, what: &'static str) {
        let canon = std::fs::canonicalize(p).ok().or_else(|| {
            let parent = std::fs::canonicalize(p.parent()?).ok()?;
            Some(parent.join(p.file_name()?))
        });
        for q in [Some(p.to_path_buf()), canon].into_iter().flatten() {
            if !self.entries.iter().any(|(e, _)| *e == q) {
                self.entries.push((q, what));
            }
        }
    }

    /// Why `p` may not be mounted, if it may not.
    pub fn refusal(&self, p: &Path) -> Option<String> {
        if p.parent().is_none() {
            return Some("is the root of the host file system".into());
        }
        self.entries.iter().find_map(|(f, what)| {
            if f == p {
                Some(format!("is {what}"))
            } else if f.starts_with(p) {
                Some(format!("contains {what} ({})", f.display()))
            } else if p.starts_with(f) && !self.exempt.iter().any(|x| p.starts_with(x)) {
                Some(format!("lies inside {what} ({})", f.display()))
            } else {
                None
            }
        })
    }
}

// ---- Mounts ----

/// A mount as handed to Docker: `host` is the resolved path, or the staging path that pins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedMount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// A mount that passed the check, with the file the owner's own open reached.
#[derive(Debug)]
pub struct CheckedMount {
    /// `host` is the resolved path.
    pub mount: ResolvedMount,
    /// Kept open so the engine can mount exactly this file ([`crate::staging`]).
    pub file: OwnedFd,
}

/// Check every mount as `cred` and resolve it, and what the job's `workdir` needs of them; the first
/// refusal says which mount, why, and how to fix it.
pub fn check_mounts(
    cred: &Cred,
    mounts: &[Mount],
    workdir: Option<&str>,
    forbidden: &Forbidden,
) -> Result<Vec<CheckedMount>, SpecError> {
    let checked = mounts
        .iter()
        .map(|m| check_mount(cred, m, forbidden))
        .collect::<Result<Vec<_>, _>>()?;
    let resolved: Vec<ResolvedMount> = checked.iter().map(|c| c.mount.clone()).collect();
    check_nested(cred, &resolved, workdir)?;
    Ok(checked)
}

/// [`check_mounts`] off the async runtime (the helper may wait up to [`CHECK_TIMEOUT`] per path).
pub async fn check_mounts_async(
    cred: Cred,
    mounts: Vec<Mount>,
    workdir: Option<String>,
    forbidden: Forbidden,
) -> Result<Vec<CheckedMount>, SpecError> {
    tokio::task::spawn_blocking(move || check_mounts(&cred, &mounts, workdir.as_deref(), &forbidden))
        .await
        .unwrap_or_else(|e| {
            Err(SpecError::new(
                format!("checking the mounts failed: {e}"),
                "submit the job again",
            ))
        })
}

pub(super) fn check_mount(cred: &Cred, m: &Mount, forbidden: &Forbidden) -> Result<CheckedMount, SpecError> {
    let shown = format!("{}:{}{}", m.host, m.container, if m.read_only { ":ro" } else { "" });
    let who = &cred.name;
    let refuse = |what: String, hint: String| SpecError::new(format!("mount {shown:?}: {what}"), hint);
    // The spec's path, and where it led when that differs (a symlink).
    let named = |p: &Path| {
        if p == Path::new(&m.host) {
            m.host.clone()
        } else {
            format!("{} (which leads to {})", m.host, p.display())
        }
    };
    let not_allowed = |p: &Path, why: String| {
        refuse(
            format!("{} {why}; jobs may not mount it", named(p)),
            "mount only the folders the job needs, e.g. a data or output folder of yours".into(),
        )
    };
    const AS_USER: &str = "Gantry checks host paths with the submitter's own permissions";
    let r = match resolve_as(cred, Path::new(&m.host), !m.read_only) {
        Ok(r) => r,
        Err(e) => {
            if let Some((p, why)) = e.resolved().and_then(|p| forbidden.refusal(p).map(|w| (p, w))) {
                return Err(not_allowed(p, why));
            }
            return Err(match e {
                AccessError::Missing { .. } => refuse(
                    format!("{} does not exist", m.host),
                    "create it first, as yourself (Gantry never creates host paths), or fix the path".into(),
                ),
                AccessError::Unreachable { blocked, .. } => refuse(
                    format!("{who} cannot reach {}: permission denied{}. {AS_USER}", m.host, blocked.map(|b| format!(" {b}")).unwrap_or_default()),
                    "mount only paths you can open yourself: ask the owner for access, or copy the data to a folder of yours".into(),
                ),
                AccessError::NoRead { ref path } => refuse(
                    format!("{who} cannot read {}. {AS_USER}", named(path)),
                    "mount only files and folders you can read yourself: ask the owner for read access".into(),
                ),
                AccessError::NoWrite { ref path, read_only_fs } => refuse(
                    format!(
                        "{who} cannot write {}{}, and the mount is read-write. {AS_USER}",
                        named(path),
                        if read_only_fs { " (a read-only file system)" } else { "" }
                    ),
                    format!("add `:ro` (`{}:{}:ro`) if the job only reads it, or mount a folder you can write", m.host, m.container),
                ),
                AccessError::CannotActAs { engine_uid, .. } => refuse(
                    format!("cannot check {} as {who}: {e}", m.host),
                    format!("a Gantry engine serving several users runs as root; this one only takes mounts from uid {engine_uid}"),
                ),
                AccessError::Timeout { .. } | AccessError::Changed { .. } | AccessError::Io { .. } => {
                    refuse(format!("cannot check {} as {who}: {e}", m.host), "make sure the path is reachable, then submit again".into())
                }
            });
        }
    };
    if let Some(why) = forbidden.refusal(&r.path) {
        return Err(not_allowed(&r.path, why));
    }
    if let FileKind::Other(kind) = r.kind {
        return Err(refuse(
            format!("{} is a {kind}; only files and folders can be mounted", named(&r.path)),
            "mount a file or a folder".into(),
        ));
    }
    Ok(CheckedMount {
        mount: ResolvedMount {
            host: r.path,
            container: m.container.clone(),
            read_only: m.read_only,
        },
        file: r.file,
    })
}

/// Docker (runc) makes a missing mount point or working directory as root, and inside another mount
/// that is a host folder: a job could leave root-owned entries in any folder its owner may write. So
/// what lies inside a mount must already exist there, reached without symbolic links (runc follows
/// those inside the container, to somewhere else than the check saw).
pub(super) fn check_nested(cred: &Cred, mounts: &[ResolvedMount], workdir: Option<&str>) -> Result<(), SpecError> {
    let targets: Vec<String> = mounts
        .iter()
        .map(|m| crate::spec::normalize(Path::new(&m.container)))
        .collect();
    let workdir = workdir
        .map(|w| crate::spec::normalize(Path::new(w)))
        .filter(|w| !targets.contains(w));
    let wanted = targets
        .iter()
        .map(|t| (t, "mount point"))
        .chain(workdir.as_ref().map(|w| (w, "`workdir`")));
    for (t, what) in wanted {
        let inside = |p: &&String| *p != t && p.as_str() != "/" && Path::new(t).starts_with(p.as_str());
        let Some((i, outer)) = targets
            .iter()
            .enumerate()
            .filter(|(_, p)| inside(p))
            .max_by_key(|(_, p)| p.len())
        else {
            continue;
        };
        let host = mounts[i]
            .host
            .join(Path::new(t).strip_prefix(outer).unwrap_or(Path::new("")));
        let refuse = |why: String, hint: String| {
            SpecError::new(
                format!(
                    "{what} {t} lies inside the mount of {} at {outer}, and {why}",
                    mounts[i].host.display()
                ),
                hint,
            )
        };
        match resolve_as(cred, &host, false) {
            Ok(r) if r.path == host => {}
            Ok(r) => {
                return Err(refuse(
                    format!(
                        "{} goes through a symbolic link (to {}), which Docker would follow inside the container",
                        host.display(),
                        r.path.display()
                    ),
                    "mount the link's target itself, or use the real path".into(),
                ))
            }
            Err(AccessError::Missing { .. }) => {
                return Err(refuse(
                    format!("{} does not exist: Docker would create it as root", host.display()),
                    format!(
                        "create {} first, as yourself (a folder, or an empty file for a file mount)",
                        host.display()
                    ),
                ))
            }
            Err(e) => {
                return Err(refuse(
                    format!("{} cannot be checked as {}: {e}", host.display(), cred.name),
                    "make sure you can reach it yourself".into(),
                ))
            }
        }
    }
    Ok(())
}
