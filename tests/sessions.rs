//! Interactive sessions (`gantry shell`, `gantry attach`) through real pseudo-terminals, as real
//! users, against a real root engine and real Docker; and over the real sshd with `--host`.

use crate::helpers::*;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A busybox image with every applet (`tty`, `stty`, `httpd`), built once from the host's static busybox.
pub const SESSION_IMAGE: &str = "gantry-test/session-busybox:1";

pub fn ensure_session_image() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let have = Command::new("docker").args(["image", "inspect", SESSION_IMAGE]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if have.map(|s| s.success()).unwrap_or(false) {
            return;
        }
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -e; r=$(mktemp -d); mkdir -p $r/bin $r/tmp $r/www; chmod 1777 $r/tmp; cp /bin/busybox $r/bin/busybox; \
                 for c in $(/bin/busybox --list); do [ $c = busybox ] || ln -s busybox $r/bin/$c; done; \
                 echo served-by-busybox > $r/www/index.html; \
                 tar -C $r -c . | docker import - {SESSION_IMAGE} >/dev/null; rm -rf $r"
            ))
            .status()
            .expect("run sh");
        assert!(status.success(), "could not build {SESSION_IMAGE}");
    });
}

const WAIT: Duration = Duration::from_secs(120);

/// A program on a pseudo-terminal of its own (its controlling terminal, as in a real terminal
/// window): what it writes is collected; keys and window sizes are sent through the master side.
pub struct Pty {
    master: std::fs::File,
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    pub fn spawn(mut cmd: Command, cols: u16, rows: u16) -> Pty {
        use std::os::unix::process::CommandExt;
        let ws = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&ws), None).expect("openpty");
        let slave = std::fs::File::from(pty.slave);
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn on a pty");
        let master = std::fs::File::from(pty.master);
        let out = Arc::new(Mutex::new(vec![]));
        let (mut reader, sink) = (master.try_clone().unwrap(), out.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the program (and everything holding the slave) is gone.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty { master, child, out }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    pub fn send(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).unwrap();
    }

    /// Wait until the output after byte `from` contains `needle`; returns the end of the match.
    pub fn wait_for(&self, needle: &str, from: usize) -> usize {
        let t = Instant::now();
        loop {
            let text = self.text();
            if let Some(at) = text.get(from..).and_then(|t| t.find(needle)) {
                return from + at + needle.len();
            }
            assert!(
                t.elapsed() < WAIT,
                "waited for {needle:?} on the terminal; it shows:\n{}",
                text.get(from..).unwrap_or(&text)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Make the window this size (the kernel sends SIGWINCH to the program).
    pub fn resize(&self, cols: u16, rows: u16) {
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from the struct given.
        assert_eq!(
            unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ as _, &ws) },
            0
        );
    }

    /// The program's exit status, once it ends.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                t.elapsed() < WAIT,
                "the program did not end; its terminal shows:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gantry ARGS` as `u` against the system engine `e`, on a terminal of its own.
fn gantry_pty(e: &Engine, u: &User, args: &[&str]) -> Pty {
    let mut c = u.command(bin());
    c.env("GANTRY_SYSTEM_SOCKET", e.system_socket())
        .env_remove("GANTRY_STATE_DIR")
        .env("TERM", "xterm")
        .args(args)
        .current_dir("/");
    Pty::spawn(c, 80, 24)
}

/// `gantry ARGS` as `u` against the system engine `e`, without a terminal.
fn gantry_as(e: &Engine, u: &User, args: &[&str]) -> std::process::Output {
    u.command(bin())
        .env("GANTRY_SYSTEM_SOCKET", e.system_socket())
        .env_remove("GANTRY_STATE_DIR")
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
}

pub fn session_id(p: &Pty) -> i64 {
    p.wait_for(" queued; waiting", 0);
    let t = p.text();
    let at = t.find("gantry: session ").unwrap() + "gantry: session ".len();
    t[at..].split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_shell_session_runs_as_its_owner_on_its_gpu_resizes_detaches_and_is_attached_again_only_by_her() {
    ensure_session_image();
    let e = Engine::system();
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));

    let mut p = gantry_pty(
        &e,
        &alice,
        &["shell", "--gpus", "1", "--image", SESSION_IMAGE, "--for", "1h"],
    );
    let id = session_id(&p);
    let mut at = p.wait_for(&format!("attached to session {id}; it ends in 60 min"), 0);
    assert!(p.text().contains("detach with Ctrl-P Ctrl-Q"), "{}", p.text());
    p.send("echo CVD=$CUDA_VISIBLE_DEVICES; id -u; tty\r");
    at = p.wait_for("CVD=0\r\n", at);
    at = p.wait_for(&format!("{}\r\n", alice.uid), at);
    at = p.wait_for("/dev/pts/", at);
    let j = e.show(id);
    assert_eq!(
        (j["job"]["state"].as_str(), j["job"]["owner_uid"].as_u64()),
        (Some("running"), Some(alice.uid as u64)),
        "{j}"
    );
    assert_eq!(j["attempts"][0]["gpus"].as_array().unwrap().len(), 1, "{j}");

    // The window's size reaches the shell's terminal, then a new size.
    p.send("stty size\r");
    at = p.wait_for("24 80\r\n", at);
    p.resize(132, 43);
    // SIGWINCH is asynchronous: ask until the shell sees the new size.
    let t = Instant::now();
    loop {
        p.send("stty size\r");
        std::thread::sleep(Duration::from_millis(300));
        if p.text()[at..].contains("43 132\r\n") {
            break;
        }
        assert!(
            t.elapsed() < WAIT,
            "the resize never reached the shell:\n{}",
            &p.text()[at..]
        );
    }
    at = p.text().len();

    // Ctrl-C goes to the shell (it interrupts the sleep), not to gantry.
    p.send("sleep 600\r");
    std::thread::sleep(Duration::from_millis(500));
    p.send("\x03");
    p.send("echo after-ctrl-c\r");
    at = p.wait_for("after-ctrl-c\r\n", at);
    let _ = at;

    // Detach: gantry exits 0, the session keeps running.
    p.send("\x10\x11");
    assert!(p.wait_exit().success(), "{}", p.text());
    assert!(
        p.text()
            .contains(&format!("detached from session {id}; it keeps running")),
        "{}",
        p.text()
    );
    assert_eq!(e.show(id)["job"]["state"], "running");

    // bob cannot attach to alice's session (his own terminal, his own uid).
    let mut b = gantry_pty(&e, &bob, &["attach", &id.to_string()]);
    assert!(!b.wait_exit().success());
    assert!(
        b.text().contains(&format!(
            "session {id} belongs to gantry-alice; only its owner can attach to it"
        )),
        "{}",
        b.text()
    );
    // Nor root's engine calls for another uid: peer credentials are the identity.
    let out = e.gantry(&["attach", &id.to_string()]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("only its owner"),
        "{out:?}"
    );

    // alice, from another terminal, comes back to the same shell (what she typed before is still there).
    let mut p2 = gantry_pty(&e, &alice, &["attach", &id.to_string()]);
    let at2 = p2.wait_for(&format!("attached to session {id}"), 0);
    p2.send("echo still-$((40+2))\r");
    p2.wait_for("still-42\r\n", at2);
    p2.send("exit 3\r");
    let status = p2.wait_exit();
    assert_eq!(
        status.code(),
        Some(3),
        "gantry attach exits with the shell's status: {}",
        p2.text()
    );
    assert!(
        p2.text()
            .contains(&format!("session {id} ended: its shell exited with status 3")),
        "{}",
        p2.text()
    );
    let j = e.wait_final(id);
    assert_eq!(
        (j["job"]["state"].as_str(), j["job"]["exit_code"].as_i64()),
        (Some("failed"), Some(3)),
        "{j}"
    );
    assert_eq!(
        j["attempts"].as_array().unwrap().len(),
        1,
        "a session is never run again: {j}"
    );

    // An ended session cannot be attached to.
    let out = gantry_as(&e, &alice, &["attach", &id.to_string()]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("start another with `gantry shell`"),
        "{out:?}"
    );
}

#[test]
fn sessions_go_before_batch_jobs_within_the_labs_bounds_and_end_at_their_length() {
    ensure_session_image();
    let cfg = tempfile::tempdir().unwrap();
    let file = cfg.path().join("config.toml");
    std::fs::write(
        &file,
        "[sessions]\nmax_gpus = 1\ndefault_length = \"1h\"\nmax_length = \"2h\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--gpus", "sim:1x24GiB", "--config", file.to_str().unwrap()]);
    let alice = user("gantry-alice");
    let blocker = e.submit_yaml("blocker", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\n"));
    e.wait_state(blocker, "running");
    let batch = e.submit_yaml(
        "batch",
        &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\npriority: 10\n"),
    );
    let spec = alice.write(
        &alice.private_dir("session").join("s.yaml"),
        &format!("image: {SESSION_IMAGE}\ngpus: 1\ninteractive: true\nports: [8080]\n"),
    );
    let v = e.json_as(&alice, &["submit", spec.to_str().unwrap()]);
    let session = v[0]["job_id"].as_i64().unwrap();
    assert_eq!(
        e.show(session)["job"]["timeout_ms"],
        3_600_000,
        "the lab's default length"
    );
    // The queue says which rows are sessions (the app's Queue view): queued, no end yet.
    let row = |id: i64| {
        e.json(&["ls"])
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["job"]["id"] == id)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        row(session)["job"]["session"],
        serde_json::json!({"ends_at": null, "ports": []}),
        "{}",
        row(session)
    );
    assert!(row(batch)["job"].get("session").is_none(), "{}", row(batch));

    // Her sessions hold at most 1 GPU together; a session is at most 2 h.
    let out = e.gantry_user(&alice, &["submit", spec.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("your sessions already ask for 1 GPU; this one's 1 would pass the lab's limit of 1 GPUs in sessions per user (sessions.max_gpus in"), "{err}");
    let long = alice.write(
        &spec.with_file_name("long.yaml"),
        &format!("image: {SESSION_IMAGE}\ngpus: 0\ninteractive: true\ntimeout: 3h\n"),
    );
    let out = e.gantry_user(&alice, &["submit", long.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("the session would last 3h; the lab allows sessions of at most 2h"),
        "{err}"
    );
    let retried = alice.write(
        &spec.with_file_name("retried.yaml"),
        &format!("image: {SESSION_IMAGE}\ngpus: 0\ninteractive: true\nretries: 2\n"),
    );
    let out = e.gantry_user(&alice, &["submit", retried.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("an `interactive` session has `retries`"),
        "{out:?}"
    );

    // The GPU frees: the session goes first, though the batch job has a higher priority and came first.
    assert!(e.gantry(&["cancel", &blocker.to_string()]).status.success());
    let started = e.wait_state(session, "running")["attempts"][0]["started_at"]
        .as_i64()
        .unwrap();
    assert_eq!(e.show(batch)["job"]["state"], "queued");
    // Running: it ends at its attempt's start plus its length, and serves its ports.
    assert_eq!(
        row(session)["job"]["session"],
        serde_json::json!({"ends_at": started + 3_600_000, "ports": [8080]}),
        "{}",
        row(session)
    );
    assert!(row(batch)["job"].get("session").is_none(), "{}", row(batch));
    assert!(e
        .gantry_user(&alice, &["cancel", &session.to_string()])
        .status
        .success());
    assert_eq!(e.wait_final(batch)["job"]["state"], "succeeded");

    // A session ends at its length, and the attached terminal says so.
    let mut c = alice.command(bin());
    c.arg("--state-dir")
        .arg(&e.state)
        .env("TERM", "xterm")
        .args(["shell", "--gpus", "0", "--image", SESSION_IMAGE, "--for", "4s"])
        .current_dir("/");
    let mut p = Pty::spawn(c, 80, 24);
    let id = session_id(&p);
    p.wait_for(&format!("attached to session {id}; it ends in 1 min"), 0);
    p.wait_for(&format!("session {id} ended: its time ran out"), 0);
    assert!(!p.wait_exit().success());
    let j = e.wait_final(id);
    assert_eq!(
        (j["job"]["state"].as_str(), j["attempts"][0]["reason"].as_str()),
        (Some("timed_out"), Some("timeout")),
        "{j}"
    );
}

#[test]
fn over_ssh_a_session_is_attached_detached_and_attached_again_with_host() {
    ensure_session_image();
    let e = Engine::system();
    let alice = user("gantry-alice");
    let ws = crate::remote::Workstation::start(&e, &[&alice]);
    let laptop = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.env(
            "GANTRY_SSH",
            format!("ssh -F {}", ws.dir.path().join("ssh_config").display()),
        )
        .env("XDG_STATE_HOME", ws.dir.path().join("laptop"))
        .env_remove("GANTRY_STATE_DIR")
        .env("GANTRY_SYSTEM_SOCKET", "/nonexistent/gantry.sock")
        .env("TERM", "xterm")
        .args(["--host", "gantry-alice-ws"])
        .args(args)
        .current_dir(ws.dir.path());
        Pty::spawn(c, 100, 30)
    };
    let mut p = laptop(&["shell", "--gpus", "1", "--image", SESSION_IMAGE, "--for", "30m"]);
    let id = session_id(&p);
    let at = p.wait_for(&format!("attached to session {id}"), 0);
    assert!(
        p.text()
            .contains(&format!("`gantry --host gantry-alice-ws attach {id}` comes back")),
        "{}{}",
        p.text(),
        ws.sshd_log()
    );
    p.send("id -u; stty size\r");
    let at = p.wait_for(&format!("{}\r\n", alice.uid), at);
    p.wait_for("30 100\r\n", at);
    p.send("\x10\x11");
    assert!(p.wait_exit().success(), "{}", p.text());
    assert_eq!(e.show(id)["job"]["state"], "running");

    let mut p = laptop(&["attach", &id.to_string()]);
    let at = p.wait_for(&format!("attached to session {id}"), 0);
    p.send("echo over-$((6*7))-ssh; exit\r");
    p.wait_for("over-42-ssh\r\n", at);
    assert!(p.wait_exit().success(), "{}", p.text());
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded");
}

/// The session image plus a stand-in for `jupyter lab`: it serves a page with the token it was
/// given (`JUPYTER_TOKEN`) on the address and port it was asked for.
const NOTEBOOK_IMAGE: &str = "gantry-test/fake-jupyter:1";

fn ensure_notebook_image() {
    ensure_session_image();
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let have = Command::new("docker").args(["image", "inspect", NOTEBOOK_IMAGE]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if have.map(|s| s.success()).unwrap_or(false) {
            return;
        }
        let script = "#!/bin/sh\nfor a; do case $a in --port=*) port=${a#--port=};; --ip=*) ip=${a#--ip=};; esac; done\n\
                      mkdir -p /tmp/www/lab; echo \"token=$JUPYTER_TOKEN ip=$ip\" > /tmp/www/lab/index.html\nexec httpd -f -p $ip:$port -h /tmp/www\n";
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("jupyter"), script).unwrap();
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -e; r=$(mktemp -d); mkdir -p $r/bin $r/tmp; chmod 1777 $r/tmp; cp /bin/busybox $r/bin/busybox; \
                 for c in $(/bin/busybox --list); do [ $c = busybox ] || ln -s busybox $r/bin/$c; done; \
                 install -m 755 {}/jupyter $r/bin/jupyter; tar -C $r -c . | docker import - {NOTEBOOK_IMAGE} >/dev/null; rm -rf $r",
                dir.path().display()
            ))
            .status()
            .unwrap();
        assert!(status.success(), "could not build {NOTEBOOK_IMAGE}");
    });
}

/// `curl URL` as `u` (empty when the connection is refused or closed before an answer).
fn fetch_as(u: &User, url: &str) -> String {
    let out = u
        .command("curl")
        .args(["-sL", "--max-time", "10", url])
        .current_dir("/")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_served(e: &Engine, u: &User, url: &str, want: &str) -> String {
    let mut got = String::new();
    e.wait_until(&format!("{url} to answer {u:?}"), || {
        got = fetch_as(u, url);
        got.contains(want)
    });
    got
}

#[test]
fn a_served_port_opens_on_loopback_for_its_owner_only_and_a_notebook_url_carries_its_token() {
    ensure_notebook_image();
    let e = Engine::system();
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let run = gantry_as(
        &e,
        &alice,
        &[
            "run",
            "--json",
            "--gpus",
            "0",
            "--image",
            SESSION_IMAGE,
            "--port",
            "8080",
            "--",
            "httpd",
            "-f",
            "-p",
            "127.0.0.1:8080",
            "-h",
            "/www",
        ],
    );
    assert!(run.status.success(), "{run:?}");
    let id = serde_json::from_slice::<serde_json::Value>(&run.stdout).unwrap()["job_id"]
        .as_i64()
        .unwrap();
    e.wait_state(id, "running");
    let out = gantry_as(&e, &alice, &["open", &id.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Port 1021 (below 1024: only root binds it) on an address of the job's own in 127.0.0.0/8.
    assert!(
        url.starts_with("http://127.") && url.ends_with(":1021/") && !url.starts_with("http://127.0."),
        "{url}"
    );
    wait_served(&e, &alice, &url, "served-by-busybox");
    // The same forward every time.
    assert_eq!(
        String::from_utf8_lossy(&gantry_as(&e, &alice, &["open", &id.to_string(), "8080"]).stdout).trim(),
        url
    );

    // bob (and root, not the owner) get nothing through it, and cannot open one of their own.
    assert_eq!(fetch_as(&bob, &url), "", "bob reached alice's port");
    let root = Command::new("curl")
        .args(["-sL", "--max-time", "10", &url])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&root.stdout).contains("served-by-busybox"),
        "root reached alice's port"
    );
    for out in [
        gantry_as(&e, &bob, &["open", &id.to_string()]),
        e.gantry(&["open", &id.to_string()]),
    ] {
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("only its owner can open its ports"),
            "{out:?}"
        );
    }
    let out = gantry_as(&e, &alice, &["open", &id.to_string(), "9999"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("job {id} serves port 8080, not port 9999")),
        "{out:?}"
    );

    // Nothing listens on another address: the forward is on its loopback address only, the container
    // publishes nothing, and its server is not reachable at the container's address.
    let at = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let port = at.rsplit(':').next().unwrap().to_string();
    let ss = String::from_utf8_lossy(&Command::new("ss").args(["-ltnH"]).output().unwrap().stdout).into_owned();
    let listening: Vec<&str> = ss
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|a| a.ends_with(&format!(":{port}")))
        .collect();
    assert!(
        listening.contains(&at.as_str())
            && listening
                .iter()
                .all(|a| a.starts_with("127.") && *a != "127.0.0.1:1021"),
        "{listening:?}"
    );
    let cid = e.show(id)["attempts"][0]["container_id"].as_str().unwrap().to_string();
    let published = Command::new("docker").args(["port", &cid]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&published.stdout).trim().is_empty(),
        "{published:?}"
    );
    let ip = String::from_utf8_lossy(
        &Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                &cid,
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();
    if !ip.is_empty() {
        assert_eq!(
            fetch_as(&alice, &format!("http://{ip}:8080/")),
            "",
            "the server is reachable at the container's address {ip}"
        );
    }
    assert!(gantry_as(&e, &alice, &["cancel", &id.to_string()]).status.success());
    e.wait_final(id);
    e.wait_until("the forward to close with the job", || {
        fetch_as(&alice, &url).is_empty()
    });

    // `gantry notebook`: a session running `jupyter lab` on 127.0.0.1 with a token of its own; the URL carries it.
    let out = gantry_as(
        &e,
        &alice,
        &["notebook", "--gpus", "0", "--image", NOTEBOOK_IMAGE, "--for", "30m"],
    );
    assert!(out.status.success(), "{out:?}");
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let token = url
        .split_once("/lab?token=")
        .map(|(_, t)| t.to_string())
        .unwrap_or_else(|| panic!("no token in {url}"));
    assert_eq!(token.len(), 32, "{url}");
    let page = wait_served(&e, &alice, &url, "token=");
    assert_eq!(page.trim(), format!("token={token} ip=127.0.0.1"));
    assert_eq!(fetch_as(&bob, &url), "");
    let nb = e
        .json(&["ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"]["name"] == "notebook")
        .map(|j| j["job"]["id"].as_i64().unwrap())
        .unwrap();
    assert_eq!(e.show(nb)["job"]["job"]["spec"]["interactive"], true);
    assert!(gantry_as(&e, &alice, &["cancel", &nb.to_string()]).status.success());
    e.wait_final(nb);
}

#[test]
fn over_ssh_gantry_open_forwards_a_served_port_to_the_laptop_through_the_shared_connection() {
    ensure_session_image();
    let e = Engine::system();
    let alice = user("gantry-alice");
    let ws = crate::remote::Workstation::start(&e, &[&alice]);
    let run = ws.json(
        "gantry-alice-ws",
        &[
            "run",
            "--gpus",
            "0",
            "--image",
            SESSION_IMAGE,
            "--port",
            "8080",
            "--",
            "httpd",
            "-f",
            "-p",
            "127.0.0.1:8080",
            "-h",
            "/www",
        ],
    );
    let id = run["job_id"].as_i64().unwrap();
    e.wait_state(id, "running");
    let mut open = Command::new(bin())
        .env(
            "GANTRY_SSH",
            format!("ssh -F {}", ws.dir.path().join("ssh_config").display()),
        )
        .env("XDG_STATE_HOME", ws.dir.path().join("laptop"))
        .env_remove("GANTRY_STATE_DIR")
        .env("GANTRY_SYSTEM_SOCKET", "/nonexistent/gantry.sock")
        .args(["--host", "gantry-alice-ws", "open", &id.to_string()])
        .current_dir(ws.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(open.stdout.take().unwrap()), &mut line).unwrap();
    let url = line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}: {}", ws.sshd_log());
    // The laptop's user (root here) opens it; on the workstation the connection is alice's (ssh's).
    let mut got = String::new();
    let t = Instant::now();
    while !got.contains("served-by-busybox") {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", &url])
            .output()
            .unwrap();
        got = String::from_utf8_lossy(&out.stdout).into_owned();
        if t.elapsed() > WAIT {
            let _ = open.kill();
            let mut err = String::new();
            let _ = open.stderr.take().unwrap().read_to_string(&mut err);
            panic!(
                "the forwarded port never answered on the laptop: curl: {}\ngantry open: {err}\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                ws.sshd_log(),
                e.daemon_log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(open.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert!(open.wait().unwrap().success());
    let t = Instant::now();
    while !String::from_utf8_lossy(
        &Command::new("curl")
            .args(["-s", "--max-time", "5", &url])
            .output()
            .unwrap()
            .stdout,
    )
    .is_empty()
    {
        assert!(t.elapsed() < WAIT, "the laptop's forward outlived `gantry open`");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(ws
        .gantry("gantry-alice-ws", &["cancel", &id.to_string()])
        .status
        .success());
}

#[test]
fn a_session_outlives_an_engine_restart_and_is_attached_again() {
    ensure_session_image();
    let mut e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let spec = alice.write(
        &alice.private_dir("restart").join("s.yaml"),
        &format!("image: {SESSION_IMAGE}\ngpus: 1\ninteractive: true\ntimeout: 1h\n"),
    );
    let id = e.json_as(&alice, &["submit", spec.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    e.wait_state(id, "running");
    e.kill9();
    e.restart();
    e.wait_state(id, "running");
    let mut c = alice.command(bin());
    c.arg("--state-dir")
        .arg(&e.state)
        .env("TERM", "xterm")
        .args(["attach", &id.to_string()])
        .current_dir("/");
    let mut p = Pty::spawn(c, 80, 24);
    let at = p.wait_for(&format!("attached to session {id}"), 0);
    p.send("echo back-$((1+1)); exit 0\r");
    p.wait_for("back-2\r\n", at);
    assert!(p.wait_exit().success(), "{}", p.text());
    let j = e.wait_final(id);
    assert_eq!(
        (j["job"]["state"].as_str(), j["attempts"].as_array().unwrap().len()),
        (Some("succeeded"), 1),
        "{j}"
    );
}

/// Whether job `id`'s history has an event whose message contains `text`.
fn has_event(e: &Engine, id: i64, text: &str) -> bool {
    e.show(id)["events"].as_array().is_some_and(|ev| {
        ev.iter()
            .any(|v| v["message"].as_str().is_some_and(|m| m.contains(text)))
    })
}

#[test]
fn a_session_whose_gpus_sit_idle_is_warned_then_ended_and_a_busy_one_or_a_batch_job_is_not() {
    ensure_session_image();
    let gpus = FakeGpus::new();
    let h100 = "NVIDIA H100 80GB HBM3";
    gpus.set(serde_json::json!([
        fake_gpu(&gpus.uuid(0), h100, 80, 0, &[]),
        fake_gpu(&gpus.uuid(1), h100, 80, 0, &[])
    ]));
    let cfg = tempfile::tempdir().unwrap();
    let file = cfg.path().join("config.toml");
    std::fs::write(&file, "[sessions]\nidle_after = \"4s\"\n").unwrap();
    let e = Engine::start_nvml(&gpus, &["--config", file.to_str().unwrap()]);
    let batch = e.submit_yaml("idle-batch", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\n"));
    e.wait_state(batch, "running");
    let session = e.submit_yaml(
        "idle-session",
        &format!("image: {SESSION_IMAGE}\ngpus: 1\ninteractive: true\n"),
    );
    e.wait_state(session, "running");
    let mut c = Command::new(bin());
    c.arg("--state-dir")
        .arg(&e.state)
        .env("TERM", "xterm")
        .args(["attach", &session.to_string()])
        .current_dir("/");
    let p = Pty::spawn(c, 80, 24);
    p.wait_for(&format!("attached to session {session}"), 0);

    // Both GPUs read 0 %: the session is warned (history, log, a session_idle notification), then ended.
    e.wait_until("the idle warning", || {
        has_event(
            &e,
            session,
            "its GPUs have been idle for 4s; it ends in 1s unless they are used",
        )
    });
    let j = e.wait_final(session);
    assert_eq!(j["job"]["state"], "cancelled", "{j}");
    // The attached terminal was told.
    p.wait_for(&format!("session {session}: its GPUs have been idle for 4s"), 0);
    assert!(
        has_event(&e, session, "ended: its GPUs were idle for 4s ([sessions] idle_after)"),
        "{j}"
    );
    let logs = e.gantry(&["logs", &session.to_string()]);
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("ended: its GPUs were idle for 4s"),
        "{logs:?}"
    );
    let shown = String::from_utf8_lossy(&e.gantry(&["show", &session.to_string()]).stdout).into_owned();
    assert!(shown.contains("ended: its GPUs were idle for 4s"), "{shown}");
    // A batch job is not given back unless the lab says `idle_batch = true`.
    assert_eq!(e.show(batch)["job"]["state"], "running");
    assert!(!has_event(&e, batch, "idle_after"), "{}", e.show(batch));

    // A session whose GPUs work is left alone, well past idle_after and its quarter.
    let mut busy = [
        fake_gpu(&gpus.uuid(0), h100, 80, 10, &[]),
        fake_gpu(&gpus.uuid(1), h100, 80, 10, &[]),
    ];
    for g in &mut busy {
        g["utilization"] = 97.into();
    }
    gpus.set(serde_json::json!(busy));
    e.wait_until("the busy reading", || e.json(&["gpus"])["gpus"][0]["utilization"] == 97);
    let working = e.submit_yaml(
        "busy-session",
        &format!("image: {SESSION_IMAGE}\ngpus: 1\ninteractive: true\n"),
    );
    e.wait_state(working, "running");
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(12) {
        assert_eq!(e.show(working)["job"]["state"], "running");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(!has_event(&e, working, "idle_after"), "{}", e.show(working));
    assert!(e.gantry(&["cancel", &working.to_string()]).status.success());
    assert!(e.gantry(&["cancel", &batch.to_string()]).status.success());
    e.wait_final(working);
    e.wait_final(batch);
}

#[test]
fn keep_free_holds_the_last_gpu_back_from_batch_jobs_while_a_session_takes_it_at_once() {
    ensure_session_image();
    let cfg = tempfile::tempdir().unwrap();
    let file = cfg.path().join("config.toml");
    std::fs::write(&file, "[sessions]\nkeep_free = 1\n").unwrap();
    let e = Engine::start(&["--gpus", "sim:2x24GiB", "--config", file.to_str().unwrap()]);
    let first = e.submit_yaml("kf-first", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\n"));
    e.wait_state(first, "running");
    let second = e.submit_yaml("kf-second", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 1\n"));
    let want = "kept free for interactive sessions ([sessions] keep_free)";
    e.wait_until("the keep_free reason", || {
        e.show(second)["reason"].as_str() == Some(want)
    });
    assert_eq!(e.show(second)["job"]["state"], "queued");
    let session = e.submit_yaml(
        "kf-session",
        &format!("image: {SESSION_IMAGE}\ngpus: 1\ninteractive: true\n"),
    );
    e.wait_state(session, "running");
    assert_eq!(e.show(second)["job"]["state"], "queued");
    // The session ends: its GPU is the last free one again, still kept from the batch job.
    assert!(e.gantry(&["cancel", &session.to_string()]).status.success());
    e.wait_final(session);
    e.wait_until("the keep_free reason again", || {
        e.show(second)["reason"].as_str() == Some(want)
    });
    // The first batch job ends: two are free, the second takes one.
    assert!(e.gantry(&["cancel", &first.to_string()]).status.success());
    e.wait_state(second, "running");
    assert!(e.gantry(&["cancel", &second.to_string()]).status.success());
    e.wait_final(second);
}
