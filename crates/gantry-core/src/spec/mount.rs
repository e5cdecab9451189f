//! Mount strings (`host:container[:ro]`) parsed and the obvious forbidden paths refused (the authority is `access`).

#[allow(unused_imports)]
use super::*;

/// Host paths refused on sight (with what lies under them). This is only a cheap first filter: the
/// authority is [`crate::access::check_mounts`], which resolves each path as the submitter and refuses
/// whatever contains or lies inside the container engine's sockets or Gantry's state.
pub(super) const FORBIDDEN_MOUNTS: &[&str] = &[
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd",
    "/var/run/containerd",
    "/run/docker",
    "/var/run/docker",
];

pub(super) fn parse_mount(m: &str, origin: &Origin) -> Result<Mount, SpecError> {
    let parts: Vec<&str> = m.split(':').collect();
    let (host, container, read_only) = match parts.as_slice() {
        [h, c] => (*h, *c, false),
        [h, c, "ro"] => (*h, *c, true),
        [h, c, "rw"] => (*h, *c, false),
        _ => {
            return Err(SpecError::new(
                format!("mount {m:?} is not `host:container` or `host:container:ro`"),
                "write e.g. `/data/imagenet:/data:ro`",
            ))
        }
    };
    if host.is_empty() || container.is_empty() || host.contains('\0') {
        return Err(SpecError::new(
            format!("mount {m:?} has an empty path"),
            "write e.g. `/data/imagenet:/data:ro`",
        ));
    }
    if !container.starts_with('/') {
        return Err(SpecError::new(
            format!("mount {m:?}: container path {container:?} is not absolute"),
            "container paths start with `/`",
        ));
    }
    let host_path = if host.starts_with('/') {
        std::path::PathBuf::from(host)
    } else {
        match &origin.base_dir {
            Some(b) => b.join(host),
            None => {
                return Err(SpecError::new(
                    format!("mount {m:?}: host path {host:?} is relative"),
                    // No base folder: the spec came from another computer (`--host`, the app's remote mode).
                    "use an absolute host path on the workstation: relative paths are local-only, and the spec was sent from another computer",
                ));
            }
        }
    };
    let host_norm = normalize(&host_path);
    if host_norm == "/" {
        return Err(SpecError::new(
            format!("mount {m:?} would hand the job the whole host file system"),
            "mount only the directories the job needs, e.g. `/data/imagenet:/data:ro`",
        ));
    }
    if FORBIDDEN_MOUNTS
        .iter()
        .any(|f| std::path::Path::new(&host_norm).starts_with(f))
        || host_norm.ends_with("gantry.sock")
    {
        return Err(SpecError::new(
            format!("mount {m:?} would hand the job control of the container engine"),
            "remove this mount: jobs may not mount the Docker, containerd or Gantry sockets",
        ));
    }
    Ok(Mount {
        host: host_norm,
        container: container.to_string(),
        read_only,
    })
}

/// Lexically resolve `.` and `..` (no filesystem access, no symlink following).
pub(crate) fn normalize(p: &std::path::Path) -> String {
    use std::path::Component;
    let mut out: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(s) => out.push(s.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    format!("/{}", out.join("/"))
}
