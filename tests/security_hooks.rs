//! Issue 29, weak point: a webhook host on the lab's list that resolves to an address of this
//! machine other than loopback (here docker0's gateway) reaches every service listening on 0.0.0.0,
//! as loopback would. The root engine treats every address of this machine as "this machine": bob
//! cannot subscribe such a URL, and nothing reaches the service.

use std::io::Read;
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::helpers::*;

/// The name the test gives docker0's address in /etc/hosts (a lab's DNS could do the same).
const NAME: &str = "gantry-hook-docker0.test";

/// docker0's IPv4 address, named [`NAME`] in /etc/hosts.
fn docker0_named() -> String {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "docker0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let ip = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .unwrap_or_else(|| panic!("docker0 has no IPv4 address: {text}"))
        .to_string();
    let _g = USERADD.lock().unwrap_or_else(|p| p.into_inner());
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    let line = format!("{ip} {NAME}");
    if !hosts.lines().any(|l| l.trim() == line) {
        let kept: Vec<&str> = hosts.lines().filter(|l| !l.contains(NAME)).collect();
        std::fs::write("/etc/hosts", format!("{}\n{line}\n", kept.join("\n"))).unwrap();
    }
    ip
}

#[test]
fn a_listed_webhook_host_that_resolves_to_an_address_of_this_machine_is_refused() {
    let ip = docker0_named();
    // A service of this machine, listening on every address.
    let service = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = service.local_addr().unwrap().port();
    let reached = Arc::new(AtomicUsize::new(0));
    let r = reached.clone();
    std::thread::spawn(move || {
        for mut c in service.incoming().flatten() {
            r.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 512];
            let _ = c.read(&mut buf);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, format!("[notify]\nwebhook_hosts = [\"{NAME}:{port}\"]\n")).unwrap();
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let bob = user("gantry-bob");
    let url = format!("http://{NAME}:{port}/internal-admin");
    let out = e.gantry_user(&bob, &["notify", "add", "webhook", &url]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{url} ({ip}) was accepted: {said}");
    assert!(
        said.contains(&format!("resolves to {ip}, an address of this machine")),
        "{said}"
    );
    let _ = e.gantry_user(&bob, &["notify", "test"]);
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the engine reached the service at {ip}:{port}"
    );
}
