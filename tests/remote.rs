//! Remote workstations: `gantry --host HOST` runs `ssh HOST gantry proxy` against a real sshd on
//! localhost, so the engine sees the ssh user, whoever runs the client on the "laptop" (root here).

use crate::helpers::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A private sshd (tests/sshd/start.sh) whose users reach `engine` with `gantry proxy`.
pub struct Workstation {
    pub dir: tempfile::TempDir,
}

impl Workstation {
    pub fn start(engine: &Engine, users: &[&User]) -> Workstation {
        let dir = tempfile::Builder::new().prefix("gantry-sshd-").tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sshd/start.sh");
        let out = Command::new(script)
            .arg(dir.path())
            .arg(bin())
            .arg(engine.system_socket())
            .args(users.iter().map(|u| &u.name))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sshd: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(dir.path().join("sshd.log")).unwrap_or_default()
        );
        Workstation { dir }
    }

    /// `gantry --host HOST ARGS` on alice's laptop, with the test's ssh config.
    pub fn gantry(&self, host: &str, args: &[&str]) -> Output {
        self.gantry_on("laptop", host, args)
    }

    /// [`Workstation::gantry`] on another laptop (its own shared ssh connections).
    pub fn gantry_on(&self, laptop: &str, host: &str, args: &[&str]) -> Output {
        Command::new(bin())
            .env(
                "GANTRY_SSH",
                format!("ssh -F {}", self.dir.path().join("ssh_config").display()),
            )
            .env("XDG_STATE_HOME", self.dir.path().join(laptop))
            .env_remove("GANTRY_STATE_DIR")
            .env("GANTRY_SYSTEM_SOCKET", "/nonexistent/gantry.sock")
            .args(["--host", host])
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    pub fn json(&self, host: &str, args: &[&str]) -> Value {
        let out = self.gantry(host, &[&["--json"], args].concat());
        assert!(
            out.status.success(),
            "gantry --host {host} {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.sshd_log()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn sshd_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Workstation {
    fn drop(&mut self) {
        let _ = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sshd/stop.sh"))
            .arg(self.dir.path())
            .status();
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn over_ssh_alice_acts_as_herself_on_the_workstation_and_bobs_key_cannot_act_as_her() {
    let e = Engine::system();
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let ws = Workstation::start(&e, &[&alice, &bob]);

    let status = ws.gantry("gantry-alice-ws", &["status"]);
    assert!(
        text(&status).starts_with("remote: gantry-alice-ws (system engine, through ssh)"),
        "{}\n{}",
        text(&status),
        ws.sshd_log()
    );

    // Root runs the client here; the engine sees alice, the ssh user, and her job runs as her.
    let run = ws.json(
        "gantry-alice-ws",
        &[
            "run",
            "--gpus",
            "0",
            "--image",
            IMAGE,
            "--",
            "sh",
            "-c",
            "echo hello from the workstation; id -u",
        ],
    );
    let id = run["job_id"].as_i64().unwrap();
    let done = e.wait_final(id);
    assert_eq!(done["job"]["state"], "succeeded", "{done}");
    assert_eq!(done["job"]["owner_uid"], alice.uid);
    let logs = ws.gantry("gantry-alice-ws", &["logs", &id.to_string()]);
    assert!(logs.status.success(), "{}", text(&logs));
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains(&format!("hello from the workstation\n{}\n", alice.uid)),
        "{}",
        text(&logs)
    );

    // A spec file from the laptop: its text is sent; a relative mount has no meaning there.
    let spec = ws.file("long.yaml", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\n"));
    let sub = ws.json("gantry-alice-ws", &["submit", spec.to_str().unwrap()]);
    let long = sub[0]["job_id"].as_i64().unwrap_or_else(|| panic!("{sub}"));
    e.wait_state(long, "running");
    let ls = ws.json("gantry-alice-ws", &["ls"]);
    assert!(
        ls.as_array()
            .unwrap()
            .iter()
            .any(|j| j["job"]["id"] == long || j["id"] == long),
        "alice's queue shows her job: {ls}"
    );
    let rel = ws.file(
        "rel.yaml",
        &format!("image: {IMAGE}\ncommand: ls /data\ngpus: 0\nmounts: [\"data:/data\"]\n"),
    );
    let out = ws.gantry("gantry-alice-ws", &["submit", rel.to_str().unwrap()]);
    assert!(
        !out.status.success() && text(&out).contains("relative paths are local-only"),
        "{}",
        text(&out)
    );

    // bob, over his own ssh login, is bob: he cannot cancel alice's job.
    let out = ws.gantry_on("bob-laptop", "gantry-bob-ws", &["cancel", &long.to_string()]);
    assert!(
        !out.status.success() && text(&out).contains("belongs to gantry-alice"),
        "bob cancelled alice's job: {}",
        text(&out)
    );
    // bob's key does not log in as alice: ssh refuses, and the CLI says so.
    let out = ws.gantry_on(
        "bob-laptop",
        "gantry-alice@gantry-bob-ws",
        &["cancel", &long.to_string()],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("cannot reach the Gantry engine on gantry-alice@gantry-bob-ws through ssh")
            && text(&out).contains("Permission denied"),
        "{}",
        text(&out)
    );
    assert_eq!(e.show(long)["job"]["state"], "running");

    let out = ws.gantry("gantry-alice-ws", &["cancel", &long.to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(e.wait_final(long)["job"]["state"], "cancelled");
}
