//! Root's dockerd pulls only what the lab allows, and never while a job holds GPUs (issue 18 item 8):
//! the `[images] allow` list is checked at submit (a registry on loopback only when the list names
//! it); a missing image is pulled before the job is placed (it waits as "pulling IMAGE", holding no
//! GPU); a pull that fails ends its jobs with Docker's reason; one that hangs stops when its jobs are
//! cancelled and at the lab's `pull_timeout`. No registry is reachable here: a closed port fails
//! fast, and a local listener that answers the registry ping and then never answers plays the hung
//! registry.

use std::io::{Read, Write};
use std::net::TcpListener;

use crate::helpers::*;

/// A registry that answers Docker's `GET /v2/` ping (plain HTTP: TLS is refused by closing, so
/// dockerd falls back as it does for a loopback registry) and then never answers a manifest request.
/// Returns its port.
fn hung_registry() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || buf[0] == 0x16 {
                        return; // closed, or a TLS hello: refuse TLS
                    }
                    if buf[..n].starts_with(b"GET /v2/ ") {
                        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nDocker-Distribution-API-Version: registry/2.0\r\nContent-Length: 2\r\n\r\n{}");
                    }
                    // Anything else: no answer, ever (the connection is held open).
                }
            });
        }
    });
    port
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn submit_err(e: &Engine, name: &str, yaml: &str) -> String {
    let f = e.write_spec(name, yaml);
    let out = e.gantry(&["submit", f.to_str().unwrap()]);
    assert!(!out.status.success(), "{name} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_registry_on_loopback_is_refused_at_submit_unless_the_lab_allows_it() {
    let e = Engine::start(&[]);
    let err = submit_err(&e, "local.yaml", "image: 127.0.0.1:5000/x:1\ngpus: 0\n");
    assert!(
        err.contains("is on a registry on this machine or its link (127.0.0.1:5000)") && err.contains("[images] allow"),
        "{err}"
    );
    let err = submit_err(&e, "meta.yaml", "image: 169.254.169.254/x:1\ngpus: 0\n");
    assert!(err.contains("(169.254.169.254)"), "{err}");
}

#[test]
fn images_are_pulled_before_placing_within_the_labs_rules() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[images]\nallow = [\"gantry-test/*\", \"127.0.0.1:*/*\"]\npull_timeout = \"20s\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap()]);

    // The allow-list, at submit, with the key and the file named.
    let err = submit_err(&e, "other.yaml", "image: registry.lab.example/team/x:1\ngpus: 1\n");
    assert!(
        err.contains("image \"registry.lab.example/team/x:1\" is not in the lab's allowed images (images.allow in")
            && err.contains("\"gantry-test/*\""),
        "{err}"
    );

    // A pull that fails fast (nothing listens): the job fails with Docker's reason, never placed.
    let gone = e.submit_yaml(
        "gone",
        &format!(
            "image: 127.0.0.1:{}/gone:1\ngpus: 1\ncommand: echo never\n",
            closed_port()
        ),
    );
    let d = e.wait_final(gone);
    assert_eq!(d["job"]["state"], "failed", "{d}");
    let msg = d["job"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("is not on this machine and could not be pulled"), "{d}");
    assert_eq!(
        d["attempts"].as_array().unwrap().len(),
        0,
        "a job whose image is missing is never placed: {d}"
    );

    // A pull that hangs: the job waits as pulling, holding no GPU (a 2-GPU job runs meanwhile on
    // this 2-GPU machine), and its cancel stops the pull.
    let port = hung_registry();
    let hung = e.submit_yaml(
        "hung",
        &format!("image: 127.0.0.1:{port}/hang:1\ngpus: 2\ncommand: echo never\n"),
    );
    let image = format!("127.0.0.1:{port}/hang:1");
    e.wait_until("the hung job to wait for its pull", || {
        e.show(hung)["reason"]
            .as_str()
            .is_some_and(|r| r == format!("pulling {image}; the job holds no GPU meanwhile"))
    });
    let both = e.submit_yaml(
        "both",
        &format!("image: {IMAGE}\ngpus: 2\ncommand: echo both GPUs free\n"),
    );
    assert_eq!(e.wait_final(both)["job"]["state"], "succeeded", "{}", e.logs(both));
    assert_eq!(e.show(hung)["job"]["state"], "queued");
    assert!(e.gantry(&["cancel", &hung.to_string()]).status.success());
    let d = e.wait_final(hung);
    assert_eq!(d["job"]["state"], "cancelled", "{d}");
    assert_eq!(d["attempts"].as_array().unwrap().len(), 0, "{d}");
    e.wait_until("the pull to stop", || {
        e.daemon_log()
            .contains(&format!("pull of {image} stopped: no queued job needs it any more"))
    });

    // The lab's timeout stops a hung pull and fails its job with the reason.
    let slow = e.submit_yaml(
        "slow",
        &format!("image: 127.0.0.1:{port}/slow:1\ngpus: 1\ncommand: echo never\n"),
    );
    let d = e.wait_final(slow);
    assert_eq!(d["job"]["state"], "failed", "{d}");
    let msg = d["job"]["message"].as_str().unwrap_or("");
    assert!(msg.contains(&format!("image \"127.0.0.1:{port}/slow:1\" was not pulled within 20s, the lab's pull timeout (images.pull_timeout in")), "{d}");
    assert_eq!(d["attempts"].as_array().unwrap().len(), 0, "{d}");
}
