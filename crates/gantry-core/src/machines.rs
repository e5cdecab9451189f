//! The workstations a client can switch to (the app's machine switcher): the ones saved by the user,
//! and the `Host` names of their `~/.ssh/config`.

use std::path::{Path, PathBuf};

pub use crate::protocol::Machines;

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Saved {
    hosts: Vec<String>,
}

/// The saved hosts in `file` (none if it is missing or unreadable: a fresh list is harmless).
pub fn load_saved(file: &Path) -> Vec<String> {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice::<Saved>(&b).ok())
        .map(|s| s.hosts)
        .unwrap_or_default()
}

/// `host` first in the saved list (`keep: false` removes it), written whole (temp file + rename).
pub fn remember(file: &Path, host: &str, keep: bool) -> std::io::Result<Vec<String>> {
    let mut hosts = load_saved(file);
    hosts.retain(|h| h != host);
    if keep {
        hosts.insert(0, host.to_string());
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&Saved { hosts: hosts.clone() })?)?;
    std::fs::rename(&tmp, file)?;
    Ok(hosts)
}

/// The concrete `Host` names in an ssh config (patterns such as `*` or `!x` are not machines).
pub fn ssh_config_hosts(text: &str) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(key) = words.next() else { continue };
        // `Host a b` and `Host=a`.
        let (key, first) = match key.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (key, None),
        };
        if !key.eq_ignore_ascii_case("host") {
            continue;
        }
        for h in first.into_iter().chain(words).map(|w| w.trim_matches('"')) {
            if !h.is_empty() && !h.contains(['*', '?', '!']) && !out.iter().any(|o| o == h) {
                out.push(h.to_string());
            }
        }
    }
    out
}

/// `~/.ssh/config`.
pub fn user_ssh_config() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".ssh/config"))
}

/// The switcher's list: saved hosts, then the ssh config's others.
pub fn list(saved_file: &Path, current: Option<String>) -> Machines {
    let saved = load_saved(saved_file);
    let text = user_ssh_config()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default();
    let ssh_config = ssh_config_hosts(&text)
        .into_iter()
        .filter(|h| !saved.contains(h))
        .collect();
    Machines {
        current,
        saved,
        ssh_config,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_config_hosts_are_the_concrete_names() {
        let text = "Host *\n  ServerAliveInterval 30\nHost ws1 gpu-box\n  HostName 10.0.0.5\nhost=lab \"quoted\"\nHost !bad *.corp ws1\nMatch host x\n";
        assert_eq!(ssh_config_hosts(text), ["ws1", "gpu-box", "lab", "quoted"]);
    }

    #[test]
    fn the_last_host_used_comes_first_and_forgetting_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("gantry/machines.json");
        assert!(load_saved(&f).is_empty());
        remember(&f, "alice@ws1", true).unwrap();
        remember(&f, "lab", true).unwrap();
        assert_eq!(remember(&f, "alice@ws1", true).unwrap(), ["alice@ws1", "lab"]);
        assert_eq!(remember(&f, "lab", false).unwrap(), ["alice@ws1"]);
        assert_eq!(load_saved(&f), ["alice@ws1"]);
    }
}
