//! Real Linux users for the multi-user tests. Tests run as root; they create plain users (never in
//! the docker group) with `useradd` and act as them through `setpriv --init-groups`, so the engine
//! sees their real uid, gid and supplementary groups through the socket's peer credentials.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// Held around useradd/usermod (they lock /etc/passwd and fail when run at the same moment).
pub static USERADD: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

fn id_of(name: &str, flag: &str) -> Option<u32> {
    let out = Command::new("id").arg(flag).arg(name).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// A plain user named `name` (created once, with a private home), not in the docker group.
/// Names are shared between tests: put per-test files in [`User::private_dir`].
pub fn user(name: &str) -> User {
    let _g = USERADD.lock().unwrap_or_else(|p| p.into_inner());
    if id_of(name, "-u").is_none() {
        let out = Command::new("useradd")
            .args(["-m", "-U", "-s", "/bin/sh", name])
            .output()
            .expect("run useradd");
        assert!(
            out.status.success() || id_of(name, "-u").is_some(),
            "useradd {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let home = PathBuf::from(format!("/home/{name}"));
    std::fs::create_dir_all(&home).unwrap();
    let u = User {
        name: name.into(),
        uid: id_of(name, "-u").unwrap(),
        gid: id_of(name, "-g").unwrap(),
        home,
    };
    chown(&u.home, u.uid, u.gid);
    chmod(&u.home, 0o700);
    let groups = Command::new("id").args(["-nG", name]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&groups.stdout)
            .split_whitespace()
            .any(|g| g == "docker"),
        "{name} must not be in the docker group"
    );
    u
}

/// Add `user` to group `group` (created if missing).
pub fn add_to_group(user: &User, group: &str) {
    let _g = USERADD.lock().unwrap_or_else(|p| p.into_inner());
    let _ = Command::new("groupadd").arg("-f").arg(group).output();
    let out = Command::new("usermod")
        .args(["-a", "-G", group, &user.name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "usermod: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

pub fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

impl User {
    /// `program` run as this user (real uid, gid and supplementary groups).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
            "--init-groups".into(),
        ])
        .arg(program)
        .env("HOME", &self.home)
        .env("USER", &self.name)
        .env_remove("XDG_STATE_HOME");
        c
    }

    /// `sh -c script` as this user.
    pub fn sh(&self, script: &str) -> Output {
        self.command("sh")
            .arg("-c")
            .arg(script)
            .current_dir("/")
            .output()
            .expect("run setpriv")
    }

    /// A fresh directory `~/<tag>-<random>` owned by the user (mode 700), for one test's files.
    pub fn private_dir(&self, tag: &str) -> PathBuf {
        let d = tempfile::Builder::new()
            .prefix(&format!("{tag}-"))
            .tempdir_in(&self.home)
            .unwrap()
            .keep();
        chown(&d, self.uid, self.gid);
        chmod(&d, 0o700);
        d
    }

    /// Write a file as root, then hand it to the user.
    pub fn write(&self, path: &Path, text: &str) -> PathBuf {
        std::fs::write(path, text).unwrap();
        chown(path, self.uid, self.gid);
        chmod(path, 0o644);
        path.to_path_buf()
    }
}
