//! `[images]`: which registries root's dockerd may be made to pull from, and for how long a pull
//! may take. Pure: the allow-list is matched on the image reference as written, in Docker's
//! normalized and familiar forms (`pytorch/pytorch:2.1` is `docker.io/pytorch/pytorch:2.1`).

use std::net::IpAddr;
use std::time::Duration;

use crate::spec::SpecError;

/// The lab's image rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Images {
    /// Patterns an image must match (`*` is any run of characters, `/` included); `None`: any
    /// registry except one on loopback or link-local addresses.
    pub allow: Option<Vec<String>>,
    /// A pull that has not finished by then is stopped and its jobs fail with the reason.
    pub pull_timeout: Duration,
}

impl Default for Images {
    fn default() -> Self {
        Images {
            allow: None,
            pull_timeout: crate::defaults::PULL_TIMEOUT,
        }
    }
}

/// The registry host of a reference (`None`: Docker Hub): the first component when it has a `.` or
/// a `:` or is `localhost`, as Docker decides.
pub fn registry_of(image: &str) -> Option<&str> {
    let (first, rest) = image.split_once('/')?;
    let _ = rest;
    (first.contains('.') || first.contains(':') || first == "localhost").then_some(first)
}

/// The host part of a registry (`[::1]:5000` → `::1`, `127.0.0.1:5000` → `127.0.0.1`).
fn host_of(registry: &str) -> &str {
    if let Some(r) = registry.strip_prefix('[') {
        return r.split(']').next().unwrap_or(r);
    }
    registry.rsplit_once(':').map(|(h, _)| h).unwrap_or(registry)
}

/// A registry on this machine or the link: `localhost`, loopback, link-local (the cloud metadata
/// address among them) or unspecified addresses. Root's dockerd reaching one of these serves an
/// image whoever listens there chose (or probes a local service for a user).
pub fn is_local_registry(registry: &str) -> bool {
    let host = host_of(registry).to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => a.is_loopback() || a.is_link_local() || a.is_unspecified(),
        Ok(IpAddr::V6(a)) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.is_link_local())
        }
        Err(_) => false,
    }
}

/// The forms a reference is matched in: as written, fully qualified (`docker.io/library/ubuntu`)
/// and familiar (`ubuntu`).
fn forms(image: &str) -> Vec<String> {
    let mut out = vec![image.to_string()];
    let full = match registry_of(image) {
        Some(_) => image.to_string(),
        None if image.contains('/') => format!("docker.io/{image}"),
        None => format!("docker.io/library/{image}"),
    };
    let familiar = full
        .strip_prefix("docker.io/")
        .map(|f| f.strip_prefix("library/").unwrap_or(f).to_string());
    out.push(full);
    out.extend(familiar);
    out.dedup();
    out
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first) || s.len() < first.len() + last.len() || !s.ends_with(last) {
        return false;
    }
    let mut at = first.len();
    let end = s.len() - last.len();
    for p in &parts[1..parts.len() - 1] {
        match s[at..end].find(p) {
            Some(i) => at += i + p.len(),
            None => return false,
        }
    }
    true
}

impl Images {
    /// Whether `image` may be pulled or run here; the refusal says which rule and how to go on.
    pub fn check(&self, image: &str, set_in: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
        let local = registry_of(image).filter(|r| is_local_registry(r));
        let matching = |allow: &[String]| {
            allow
                .iter()
                .find(|p| forms(image).iter().any(|f| forms(p).iter().any(|pf| glob(pf, f))))
                .cloned()
        };
        match (&self.allow, local) {
            (None, None) => Ok(()),
            (None, Some(r)) => Err(SpecError::new(
                format!("image {image:?} is on a registry on this machine or its link ({r}); the engine pulls as root, so such registries need the lab's allow-list{}", set_in("images.allow")),
                format!("use an image from a registry on the network, load it locally (`docker load`), or ask an admin to add \"{r}/*\" to `[images] allow`"),
            )),
            (Some(allow), _) => match matching(allow) {
                // A local registry only through a pattern that names its host (not a `*` in the host).
                Some(p) if local.is_none() || registry_of(&p).is_some_and(|pr| host_of(pr) == host_of(local.unwrap())) => Ok(()),
                _ => Err(SpecError::new(
                    format!("image {image:?} is not in the lab's allowed images{}", set_in("images.allow")),
                    format!("use an image matching one of {}, or ask an admin to allow it", allow.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(", ")),
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_allowed_by_pattern_and_local_registries_only_by_name() {
        let none = |_: &str| String::new();
        let any = Images::default();
        let lab = Images {
            allow: Some(vec![
                "registry.lab.example/*".into(),
                "pytorch/*".into(),
                "ubuntu:22.04".into(),
                "127.0.0.1:5000/*".into(),
            ]),
            ..Default::default()
        };
        let star_host = Images {
            allow: Some(vec!["*".into()]),
            ..Default::default()
        };
        // (rules, image, allowed)
        let rows: &[(&Images, &str, bool)] = &[
            (&any, "pytorch/pytorch:2.1", true),
            (&any, "nvcr.io/nvidia/pytorch:24.01-py3", true),
            (&any, "gantry-test/busybox:1", true),
            (&any, "127.0.0.1:5000/x:1", false),
            (&any, "localhost:5000/x", false),
            (&any, "localhost/x", false),
            (&any, "[::1]:5000/x", false),
            (&any, "169.254.169.254/x", false),
            (&any, "0.0.0.0:80/x", false),
            (&any, "[fe80::1]:5000/x", false),
            (&any, "localhost", true), // Docker Hub's library/localhost, not a registry
            (&lab, "registry.lab.example/team/model:3", true),
            (&lab, "registry.lab.example.evil.com/x", false),
            (&lab, "pytorch/pytorch:2.1", true),
            (&lab, "docker.io/pytorch/pytorch:2.1", true),
            (&lab, "ubuntu:22.04", true),
            (&lab, "docker.io/library/ubuntu:22.04", true),
            (&lab, "ubuntu:24.04", false),
            (&lab, "evil/pytorch", false),
            (&lab, "127.0.0.1:5000/x:1", true),
            (&lab, "127.0.0.1:5001/x:1", false),
            (
                &Images {
                    allow: Some(vec!["127.0.0.1:*/*".into()]),
                    ..Default::default()
                },
                "127.0.0.1:5001/x",
                true,
            ),
            (&star_host, "nvcr.io/x", true),
            (&star_host, "127.0.0.1:5000/x", false), // a wildcard never opens a local registry
        ];
        for (rules, image, ok) in rows {
            assert_eq!(rules.check(image, &none).is_ok(), *ok, "{image} with {:?}", rules.allow);
        }
        let e = lab
            .check("evil/x", &|k| format!(" ({k} in /etc/gantry/config.toml)"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not in the lab's allowed images (images.allow in /etc/gantry/config.toml)")
                && e.contains("\"pytorch/*\""),
            "{e}"
        );
        let e = any.check("127.0.0.1:5000/x", &none).unwrap_err().to_string();
        assert!(
            e.contains("127.0.0.1:5000") && e.contains("add \"127.0.0.1:5000/*\""),
            "{e}"
        );
    }

    #[test]
    fn globs() {
        for (p, s, ok) in [
            ("a*", "abc", true),
            ("*c", "abc", true),
            ("a*c", "ac", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("abc", "abc", true),
            ("ab", "abc", false),
            ("a*a", "a", false),
        ] {
            assert_eq!(glob(p, s), ok, "{p} {s}");
        }
    }
}
