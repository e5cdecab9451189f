//! Notifications (issue 20) against the real engine, as real users: an SMTP sink and an HTTP sink
//! run by the test (tiny listeners on loopback, which the lab config lists), jobs that succeed,
//! fail, time out and are cancelled, an engine killed -9 mid-delivery, a target that keeps failing,
//! and what a user may not do (another user's job, a host not on the lab's list).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::helpers::*;

/// One request the HTTP sink read, and what it answered (0: nothing, the connection was held).
#[derive(Debug, Clone)]
struct Hit {
    path: String,
    headers: HashMap<String, String>,
    body: Value,
    answered: u16,
}

/// An HTTP server on 127.0.0.1 that records every request. `status` is what it answers: 200,
/// an error, or 0 to read the request and never answer (the connection stays open).
struct HttpSink {
    port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
    status: Arc<AtomicU16>,
}

impl HttpSink {
    fn start() -> HttpSink {
        HttpSink::start_with(None)
    }
    /// With `tls`, an https server presenting that certificate (see [`TestCa`]).
    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> HttpSink {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
        let status = Arc::new(AtomicU16::new(200));
        let (h, s) = (hits.clone(), status.clone());
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let (h, s, tls) = (h.clone(), s.clone(), tls.clone());
                std::thread::spawn(move || match tls {
                    None => serve_http(conn, &h, &s),
                    Some(cfg) => {
                        let tls = rustls::ServerConnection::new(cfg).unwrap();
                        serve_http(rustls::StreamOwned::new(tls, conn), &h, &s)
                    }
                });
            }
        });
        HttpSink { port, hits, status }
    }
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
    fn hits(&self, path: &str) -> Vec<Hit> {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.path == path)
            .cloned()
            .collect()
    }
}

fn serve_http<S: Read + Write>(conn: S, hits: &Mutex<Vec<Hit>>, status: &AtomicU16) {
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
            break;
        }
        if let Some((k, v)) = l.trim_end().split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let n: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; n];
    let _ = r.read_exact(&mut body);
    let answer = status.load(Ordering::SeqCst);
    hits.lock().unwrap().push(Hit {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        answered: answer,
    });
    let w = r.get_mut();
    if answer == 0 {
        // Hold the connection (the engine is mid-send) until the test is done with it.
        std::thread::sleep(std::time::Duration::from_secs(600));
        return;
    }
    let location = if (300..400).contains(&answer) {
        "location: http://169.254.169.254/latest/meta-data\r\n"
    } else {
        ""
    };
    let _ = write!(
        w,
        "HTTP/1.1 {answer} X\r\n{location}content-length: 2\r\nconnection: close\r\n\r\nok"
    );
}

/// One message the SMTP sink accepted.
#[derive(Debug, Clone)]
struct Mail {
    to: Vec<String>,
    data: String,
    /// Whether it came after STARTTLS, over TLS.
    tls: bool,
}

/// An SMTP server on 127.0.0.1 (no auth) that keeps every message; with a certificate it offers
/// STARTTLS.
struct SmtpSink {
    port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
}

impl SmtpSink {
    fn start() -> SmtpSink {
        SmtpSink::start_with(None)
    }
    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> SmtpSink {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mails: Arc<Mutex<Vec<Mail>>> = Arc::default();
        let m = mails.clone();
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let (m, tls) = (m.clone(), tls.clone());
                std::thread::spawn(move || {
                    let _ = (&conn).write_all(b"220 sink ESMTP\r\n");
                    if let (Some(plain), Some(cfg)) = (serve_smtp(conn, &m, tls.is_some(), false), tls) {
                        let tls = rustls::ServerConnection::new(cfg).unwrap();
                        serve_smtp(rustls::StreamOwned::new(tls, plain), &m, false, true);
                    }
                });
            }
        });
        SmtpSink { port, mails }
    }
    fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}

/// One SMTP dialog after the greeting. With `starttls` it offers STARTTLS, and hands the connection
/// back when the client asks for it (the caller goes on over TLS, `tls`).
fn serve_smtp<S: Read + Write>(conn: S, mails: &Mutex<Vec<Mail>>, starttls: bool, tls: bool) -> Option<S> {
    let mut r = BufReader::new(conn);
    let mut to = vec![];
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 {
            return None;
        }
        let up = l.to_ascii_uppercase();
        let reply: &[u8] = if up.starts_with("EHLO") && starttls {
            b"250-sink\r\n250-STARTTLS\r\n250 8BITMIME\r\n"
        } else if up.starts_with("EHLO") {
            b"250-sink\r\n250 8BITMIME\r\n"
        } else if up.starts_with("STARTTLS") && starttls {
            let _ = r.get_mut().write_all(b"220 go ahead\r\n");
            return Some(r.into_inner());
        } else if up.starts_with("RCPT TO:") {
            to.push(l[8..].trim().trim_matches(|c| c == '<' || c == '>').to_string());
            b"250 OK\r\n"
        } else if up.starts_with("DATA") {
            let _ = r.get_mut().write_all(b"354 go on\r\n");
            let mut data = String::new();
            loop {
                let mut d = String::new();
                if r.read_line(&mut d).unwrap_or(0) == 0 {
                    return None;
                }
                if d == ".\r\n" {
                    break;
                }
                data.push_str(&d);
            }
            mails.lock().unwrap().push(Mail {
                to: std::mem::take(&mut to),
                data,
                tls,
            });
            b"250 queued\r\n"
        } else if up.starts_with("QUIT") {
            let _ = r.get_mut().write_all(b"221 bye\r\n");
            return None;
        } else {
            b"250 OK\r\n"
        };
        let _ = r.get_mut().write_all(reply);
    }
}

/// A certificate authority made for one test with the `openssl` tool, and a server certificate it
/// signed for 127.0.0.1. `ca` is its certificate, for the engine's trust store (`SSL_CERT_FILE`).
struct TestCa {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    server: Arc<rustls::ServerConfig>,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let dir = tempfile::tempdir().unwrap();
        let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
        let ext = p("server.ext");
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        let (ca, ca_key, key, csr, cert) = (
            p("ca.pem"),
            p("ca.key"),
            p("server.key"),
            p("server.csr"),
            p("server.pem"),
        );
        for args in [
            format!("req -x509 {ec} -keyout {ca_key} -out {ca} -days 2 -subj /CN={name}"),
            format!("req {ec} -keyout {key} -out {csr} -subj /CN=127.0.0.1"),
            format!("x509 -req -in {csr} -CA {ca} -CAkey {ca_key} -CAcreateserial -out {cert} -days 2 -extfile {ext}"),
        ] {
            let out = Command::new("openssl")
                .args(args.split(' '))
                .output()
                .expect("run openssl");
            assert!(out.status.success(), "openssl {args}: {}", out_text(&out));
        }
        let certs = CertificateDer::pem_file_iter(p("server.pem"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(p("server.key")).unwrap();
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        TestCa {
            ca: PathBuf::from(p("ca.pem")),
            _dir: dir,
            server: Arc::new(server),
        }
    }
}

/// A lab config naming the sinks: the relay, loopback on the HTTP sink's port (and nothing else),
/// a lab webhook for failures, quick retries.
fn lab(http: &HttpSink, smtp: Option<&SmtpSink>, extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    let relay = smtp
        .map(|s| {
            format!(
                "smtp_host = \"127.0.0.1\"\nsmtp_port = {}\nsmtp_starttls = false\nsmtp_from = \"gantry@lab.test\"\n",
                s.port
            )
        })
        .unwrap_or_default();
    std::fs::write(
        &path,
        format!(
            "[notify]\n{relay}webhook_hosts = [\"127.0.0.1:{port}\"]\nwebhooks = [{{ url = \"{lab}\", on = [\"failed\"] }}]\nretry_backoff = \"1s\"\nmax_tries = 3\n{extra}",
            port = http.port,
            lab = http.url("/lab")
        ),
    )
    .unwrap();
    (dir, path)
}

fn out_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn submit_as(e: &Engine, u: &User, name: &str, yaml: &str) -> i64 {
    let dir = u.private_dir("notify");
    let f = u.write(&dir.join(format!("{name}.yaml")), yaml);
    let v = e.json_as(u, &["submit", f.to_str().unwrap()]);
    v[0]["job_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("submit as {}: {v}", u.name))
}

/// The events the sink got on `path` for `job`, in order.
fn events_of(sink: &HttpSink, path: &str, job: i64) -> Vec<String> {
    sink.hits(path)
        .iter()
        .filter(|h| h.body["job"]["id"] == job)
        .map(|h| h.body["event"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Each event type the engine produces arrives once, to its owner's targets only, with the right
/// recipient and body; the lab's webhook gets the failure without the job's private message; bob's
/// target hears nothing of alice's jobs, and bob cannot subscribe to one.
#[test]
fn each_event_reaches_its_owners_targets_once_with_the_right_body() {
    let (http, smtp) = (HttpSink::start(), SmtpSink::start());
    let (_d, cfg) = lab(&http, Some(&smtp), "");
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let all = "started,finished,failed,timed_out,cancelled";
    let add = e.json_as(&alice, &["notify", "add", "webhook", &http.url("/alice"), "--on", all]);
    assert_eq!(add["owner"], alice.name.as_str(), "{add}");
    e.json_as(
        &alice,
        &[
            "notify",
            "add",
            "email",
            &format!("{}@lab.test", alice.name),
            "--on",
            "failed,timed_out",
        ],
    );
    e.json_as(&bob, &["notify", "add", "webhook", &http.url("/bob"), "--on", all]);

    let ok = submit_as(
        &e,
        &alice,
        "ok",
        &format!("name: ok\nimage: {IMAGE}\ncommand: 'true'\ngpus: 0\n"),
    );
    let bad = submit_as(
        &e,
        &alice,
        "bad",
        &format!("name: bad\nimage: {IMAGE}\ncommand: 'echo private-detail; exit 3'\ngpus: 0\n"),
    );
    let slow = submit_as(
        &e,
        &alice,
        "slow",
        &format!("name: slow\nimage: {IMAGE}\ncommand: 'sleep 60'\ngpus: 0\ntimeout: 2s\n"),
    );
    let gone = submit_as(
        &e,
        &alice,
        "gone",
        &format!("name: gone\nimage: {IMAGE}\ncommand: 'sleep 60'\ngpus: 0\n"),
    );
    // The job's own list wins over the target's: this one tells only of its start.
    let quiet = submit_as(
        &e,
        &alice,
        "quiet",
        &format!("name: quiet\nimage: {IMAGE}\ncommand: 'true'\ngpus: 0\nnotify: [started]\n"),
    );
    e.wait_state(gone, "running");
    assert!(e.gantry_user(&alice, &["cancel", &gone.to_string()]).status.success());

    let refused = e.gantry_user(
        &bob,
        &["notify", "add", "webhook", &http.url("/bob"), "--job", &ok.to_string()],
    );
    assert!(
        !refused.status.success(),
        "bob subscribed to alice's job: {}",
        out_text(&refused)
    );
    assert!(
        out_text(&refused).contains(&format!("job {ok} belongs to {}", alice.name)),
        "{}",
        out_text(&refused)
    );
    let alices = e.json_as(&alice, &["notify", "ls"]);
    let alice_hook = alices
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["target"]["url"] == http.url("/alice"))
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    assert!(
        !e.gantry_user(&bob, &["notify", "rm", &alice_hook.to_string()])
            .status
            .success(),
        "bob removed alice's target"
    );

    for id in [ok, bad, slow, gone, quiet] {
        e.wait_final(id);
    }
    let want: &[(i64, &[&str])] = &[
        (ok, &["started", "finished"]),
        (bad, &["started", "failed"]),
        (slow, &["started", "timed_out"]),
        (gone, &["started", "cancelled"]),
        (quiet, &["started"]),
    ];
    let mut delivered = 0;
    for (id, events) in want {
        e.wait_until(&format!("job {id}'s notifications on alice's webhook"), || {
            events_of(&http, "/alice", *id).len() >= events.len()
        });
        delivered += events.len();
    }
    e.wait_until("alice's three emails", || smtp.mails().len() >= 3);
    e.wait_until("the lab's webhook", || !http.hits("/lab").is_empty());
    // Everything due has been sent: check counts, bodies and recipients.
    e.wait_until("every delivery recorded", || {
        let log = e.json_as(&alice, &["notify", "log"]);
        log.as_array()
            .unwrap()
            .iter()
            .filter(|d| d["state"] == "delivered")
            .count()
            >= delivered + 3
    });
    for (id, events) in want {
        assert_eq!(
            events_of(&http, "/alice", *id),
            *events,
            "job {id}: each event once, in order"
        );
    }
    let hits = http.hits("/alice");
    let failed = hits
        .iter()
        .find(|h| h.body["job"]["id"] == bad && h.body["event"] == "failed")
        .unwrap();
    let b = &failed.body;
    assert_eq!(
        (
            b["schema"].as_str(),
            b["job"]["owner"].as_str(),
            b["job"]["state"].as_str(),
            b["job"]["exit_code"].as_i64()
        ),
        (
            Some("gantry.notification/1"),
            Some(alice.name.as_str()),
            Some("failed"),
            Some(3)
        ),
        "{b}"
    );
    assert!(
        b["text"]
            .as_str()
            .unwrap()
            .contains(&format!("job {bad} (bad) of {} failed", alice.name)),
        "Slack/Mattermost text: {b}"
    );
    assert_eq!(
        failed.headers.get("gantry-event-id").map(String::as_str),
        b["id"].as_str(),
        "the id is in the header too"
    );
    assert_eq!(
        failed.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    let ids: Vec<&str> = hits.iter().map(|h| h.body["id"].as_str().unwrap()).collect();
    let mut uniq = ids.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(ids.len(), uniq.len(), "no notification twice: {ids:?}");

    let mails = smtp.mails();
    assert_eq!(
        mails.len(),
        3,
        "failed and timed_out (the target's `--on`), and quiet's start (its own `notify:`): {mails:?}"
    );
    for (id, what) in [(bad, "failed"), (slow, "timed out"), (quiet, "started")] {
        let m = mails
            .iter()
            .find(|m| m.data.contains(&format!("job {id} (")))
            .unwrap_or_else(|| panic!("no email about job {id}: {mails:?}"));
        assert_eq!(m.to, [format!("{}@lab.test", alice.name)], "{m:?}");
        assert!(m.data.contains(what), "{}", m.data);
        assert!(
            m.data.contains("gantry@lab.test") && m.data.to_ascii_lowercase().contains("message-id: <"),
            "{}",
            m.data
        );
    }
    let lab = http.hits("/lab");
    assert_eq!(lab.len(), 1, "the lab's webhook lists `failed` only: {lab:?}");
    assert_eq!(lab[0].body["job"]["id"], bad);
    assert!(
        lab[0].body["job"].get("message").is_none(),
        "the lab's channel gets public fields only: {}",
        lab[0].body
    );
    assert!(
        http.hits("/bob").is_empty(),
        "bob's target heard of alice's jobs: {:?}",
        http.hits("/bob")
    );
    assert!(e.json_as(&bob, &["notify", "log"]).as_array().unwrap().is_empty());
}

/// The engine is killed -9 while it sends (the sink holds the request: the event is committed and
/// not yet marked sent). After the restart it is sent again, with the same id, and answered once;
/// a second restart sends nothing more (a test notification after it arrives alone).
#[test]
fn an_engine_killed_between_commit_and_delivery_delivers_exactly_once_after_restart() {
    let http = HttpSink::start();
    let (_d, cfg) = lab(&http, None, "");
    let mut e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let alice = user("gantry-alice");
    e.json_as(
        &alice,
        &["notify", "add", "webhook", &http.url("/once"), "--on", "finished"],
    );
    http.status.store(0, Ordering::SeqCst);
    let id = submit_as(
        &e,
        &alice,
        "once",
        &format!("name: once\nimage: {IMAGE}\ncommand: 'true'\ngpus: 0\n"),
    );
    e.wait_until("the engine to be sending (the sink holds it)", || {
        !http.hits("/once").is_empty()
    });
    e.kill9();
    http.status.store(200, Ordering::SeqCst);
    e.restart();
    e.wait_until("the notification to be delivered after the restart", || {
        http.hits("/once").iter().any(|h| h.answered == 200)
    });
    e.wait_until("its delivery recorded", || {
        e.json_as(&alice, &["notify", "log"])
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["state"] == "delivered" && d["job_id"] == id)
    });
    e.kill9();
    e.restart();
    e.json_as(&alice, &["notify", "test"]);
    e.wait_until("the test notification", || {
        http.hits("/once").iter().any(|h| h.body["event"] == "test")
    });
    let hits = http.hits("/once");
    let job: Vec<&Hit> = hits.iter().filter(|h| h.body["job"]["id"] == id).collect();
    assert_eq!(
        job.iter().filter(|h| h.answered == 200).count(),
        1,
        "delivered once: {hits:?}"
    );
    assert_eq!(
        job.len(),
        2,
        "the held try and the one after the restart, nothing after: {hits:?}"
    );
    assert_eq!(
        job[0].body["id"], job[1].body["id"],
        "the resend carries the same id, so a receiver can drop a copy"
    );
    let log = e.json_as(&alice, &["notify", "log"]);
    let rows: Vec<&Value> = log.as_array().unwrap().iter().filter(|d| d["job_id"] == id).collect();
    assert_eq!(rows.len(), 1, "{log}");
    assert_eq!(rows[0]["state"], "delivered");
}

/// A target that keeps failing is tried `max_tries` times with backoff, then given up: the engine
/// logs it, and `gantry notify log` shows it failed with the last error.
#[test]
fn a_failing_target_is_retried_then_given_up_with_a_log_entry() {
    let http = HttpSink::start();
    http.status.store(503, Ordering::SeqCst);
    let (_d, cfg) = lab(&http, None, "");
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let alice = user("gantry-alice");
    e.json_as(&alice, &["notify", "add", "webhook", &http.url("/down")]);
    let sent = e.json_as(&alice, &["notify", "test"]);
    let id = sent[0]["id"].as_str().unwrap().to_string();
    let mut row = Value::Null;
    e.wait_until("the test notification to be given up", || {
        row = e
            .json_as(&alice, &["notify", "log"])
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["id"] == id.as_str())
            .cloned()
            .unwrap_or(Value::Null);
        row["state"] == "failed"
    });
    assert_eq!(row["tries"], 3, "`max_tries = 3`: {row}");
    assert!(row["last_error"].as_str().unwrap().contains("503"), "{row}");
    assert_eq!(http.hits("/down").len(), 3, "three tries reached the sink");
    assert!(
        e.daemon_log().contains(&format!("notification {id} (test to"))
            && e.daemon_log().contains("given up after 3 tries"),
        "{}",
        e.daemon_log()
    );
    let human = out_text(&e.gantry_user(&alice, &["notify", "log"]));
    assert!(human.contains("failed") && human.contains("503"), "{human}");
}

/// The root engine only sends where the lab allows: a host not on `webhook_hosts`, another port of
/// a listed address, loopback or link-local by a name the lab did not list: all refused at `add`.
/// Email without a relay is refused too, and nothing is subscribed.
#[test]
fn a_webhook_to_a_host_not_on_the_labs_list_is_refused_at_notify_add() {
    let http = HttpSink::start();
    let (_d, cfg) = lab(&http, None, "");
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let bob = user("gantry-bob");
    for (url, why) in [
        ("https://example.org/hook".to_string(), "not allowed on this machine"),
        ("http://127.0.0.1:22/".to_string(), "not allowed on this machine"),
        (
            "http://169.254.169.254/latest/meta-data".to_string(),
            "not allowed on this machine",
        ),
        (
            format!("http://localhost:{}/x", http.port),
            "not allowed on this machine",
        ),
        ("file:///etc/shadow".to_string(), "URL"),
    ] {
        let out = e.gantry_user(&bob, &["notify", "add", "webhook", &url]);
        assert!(!out.status.success(), "{url} was accepted: {}", out_text(&out));
        assert!(out_text(&out).contains(why), "{url}: {}", out_text(&out));
    }
    let out = e.gantry_user(&bob, &["notify", "add", "email", "bob@lab.test"]);
    assert!(out_text(&out).contains("no email relay"), "{}", out_text(&out));
    assert!(
        e.json_as(&bob, &["notify", "ls"])
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["owner"].is_null()),
        "only the lab's webhook is listed"
    );
    assert!(http.hits("/").is_empty() && http.hits("/x").is_empty());
}

/// The relay's password file must be the engine's alone: one that others may read stops the
/// engine at start, saying how to fix it.
#[test]
fn smtp_credentials_readable_by_others_stop_the_engine() {
    let http = HttpSink::start();
    let smtp = SmtpSink::start();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("smtp-credentials");
    std::fs::write(&creds, "relay:secret\n").unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (_d, cfg) = lab(
        &http,
        Some(&smtp),
        &format!("smtp_credentials = \"{}\"\n", creds.display()),
    );
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .arg("--state-dir")
        .arg(state.path())
        .args([
            "daemon",
            "--gpus",
            "sim:1x24GiB@notify-creds",
            "--config",
            cfg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the engine started: {}", out_text(&out));
    assert!(out_text(&out).contains("chmod 600"), "{}", out_text(&out));
}

/// The state disk fills up while a job runs: the lab's webhook that lists `store_problem` is told
/// (from memory: the outbox is what cannot be written), once for the problem.
#[test]
fn a_store_problem_reaches_the_labs_webhook() {
    let http = HttpSink::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[notify]\nwebhooks = [{{ url = \"{}\", on = [\"store_problem\"] }}]\nretry_backoff = \"1s\"\n",
            http.url("/store")
        ),
    )
    .unwrap();
    let disk = Tmpfs::mount("3m");
    let mut e = Engine::stopped(&["--gpus", "sim:1x24GiB", "--config", cfg.to_str().unwrap()]);
    e.state = disk.path().to_path_buf();
    e.restart();
    let a = e.submit_yaml("a", &format!("image: {IMAGE}\ncommand: 'sleep 3'\ngpus: 0\n"));
    e.wait_state(a, "running");
    let filler = disk.fill();
    e.wait_until("the lab's webhook to hear of the store problem", || {
        !http.hits("/store").is_empty()
    });
    let hit = &http.hits("/store")[0];
    assert_eq!(hit.body["event"], "store_problem", "{:?}", hit.body);
    assert!(
        hit.body["text"]
            .as_str()
            .unwrap()
            .contains("cannot write its state database"),
        "{:?}",
        hit.body
    );
    assert!(hit.body.get("job").is_none());
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(e.wait_final(a)["job"]["state"], "succeeded");
    assert_eq!(
        http.hits("/store").len(),
        1,
        "once for the problem: {:?}",
        http.hits("/store")
    );
}

/// A listed webhook that answers with a redirect (here to the cloud metadata address) is not
/// followed: the try fails, saying why, and nothing else is requested.
#[test]
fn a_redirect_is_not_followed() {
    let http = HttpSink::start();
    http.status.store(302, Ordering::SeqCst);
    let (_d, cfg) = lab(&http, None, "");
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let alice = user("gantry-alice");
    e.json_as(&alice, &["notify", "add", "webhook", &http.url("/moved")]);
    let id = e.json_as(&alice, &["notify", "test"])[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut row = Value::Null;
    e.wait_until("the redirected notification to fail", || {
        row = e
            .json_as(&alice, &["notify", "log"])
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["id"] == id.as_str())
            .cloned()
            .unwrap_or(Value::Null);
        row["state"] == "failed"
    });
    assert!(
        row["last_error"]
            .as_str()
            .unwrap()
            .contains("does not follow redirects"),
        "{row}"
    );
    let hits = http.hits.lock().unwrap().clone();
    assert_eq!(hits.len(), 3, "`max_tries = 3` requests: {hits:?}");
    assert!(
        hits.iter().all(|h| h.path == "/moved"),
        "only the listed URL was requested: {hits:?}"
    );
}

/// TLS is rustls with the machine's trust store (here `SSL_CERT_FILE`, which it reads as OpenSSL
/// did): an https webhook whose certificate the lab's CA signed is delivered, an email goes through a
/// relay's STARTTLS, and a webhook whose certificate no trusted CA signed is refused, saying why,
/// without a byte of the notification sent.
#[test]
fn https_webhooks_and_starttls_email_trust_the_machines_store_and_nothing_else() {
    let (lab_ca, stranger) = (TestCa::new("gantry-test-lab-ca"), TestCa::new("gantry-test-stranger"));
    let good = HttpSink::start_with(Some(lab_ca.server.clone()));
    let bad = HttpSink::start_with(Some(stranger.server.clone()));
    let smtp = SmtpSink::start_with(Some(lab_ca.server.clone()));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[notify]\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {}\nsmtp_from = \"gantry@lab.test\"\n\
             webhook_hosts = [\"127.0.0.1:{}\", \"127.0.0.1:{}\"]\nretry_backoff = \"1s\"\nmax_tries = 2\n",
            smtp.port, good.port, bad.port
        ),
    )
    .unwrap();
    let mut e = Engine::stopped(&["--config", cfg.to_str().unwrap()]);
    e.env.push(("SSL_CERT_FILE".into(), lab_ca.ca.display().to_string()));
    e.restart();
    let alice = user("gantry-alice");
    let https = |sink: &HttpSink, path: &str| format!("https://127.0.0.1:{}{path}", sink.port);
    e.json_as(&alice, &["notify", "add", "webhook", &https(&good, "/secure")]);
    e.json_as(&alice, &["notify", "add", "webhook", &https(&bad, "/stranger")]);
    // The lab sends email only to a user's own address at its domain (that of `smtp_from`).
    let address = format!("{}@lab.test", alice.name);
    e.json_as(&alice, &["notify", "add", "email", &address]);
    e.json_as(&alice, &["notify", "test"]);
    let mut log = Value::Null;
    e.wait_until("every test notification to be delivered or given up", || {
        log = e.json_as(&alice, &["notify", "log"]);
        log.as_array().unwrap().len() == 3
            && log
                .as_array()
                .unwrap()
                .iter()
                .all(|d| d["state"] == "delivered" || d["state"] == "failed")
    });
    let row = |needle: &str| {
        log.as_array()
            .unwrap()
            .iter()
            .find(|d| d.to_string().contains(needle))
            .cloned()
            .unwrap_or_else(|| panic!("no delivery to {needle}: {log}"))
    };
    assert_eq!(row("/secure")["state"], "delivered", "{log}");
    assert_eq!(good.hits("/secure").len(), 1, "one POST over TLS");
    assert_eq!(good.hits("/secure")[0].body["event"], "test");
    assert_eq!(row(&address)["state"], "delivered", "{log}");
    let mails = smtp.mails();
    assert!(
        mails.len() == 1 && mails[0].tls && mails[0].to == [address.clone()],
        "one email, after STARTTLS: {mails:?}"
    );
    let refused = row("/stranger");
    assert_eq!(refused["state"], "failed", "{log}");
    let why = refused["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("TLS with 127.0.0.1") && why.contains("certificate"),
        "{refused}"
    );
    assert!(
        bad.hits.lock().unwrap().is_empty(),
        "nothing reached the untrusted host"
    );
}

/// The binaries link no OpenSSL (rustls instead), so the package installs where only another
/// OpenSSL (or none) is: `ldd` of `gantry` lists no libssl or libcrypto.
#[test]
fn the_gantry_binary_links_no_openssl() {
    let out = Command::new("ldd").arg(bin()).output().expect("run ldd");
    let libs = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && libs.contains("libc.so"),
        "ldd {}: {libs}",
        bin()
    );
    assert!(
        !libs.contains("libssl") && !libs.contains("libcrypto"),
        "{} links OpenSSL:\n{libs}",
        bin()
    );
}

/// Issue 29 hole 6: the lab's relay is not a spam cannon. `notify test` is limited per user per hour
/// (the default, 6), an email target is the user's own address at the lab's domain (that of
/// `smtp_from` by default), and a job's name reaches the subject cleaned and bounded.
#[test]
fn the_labs_mail_relay_sends_only_a_users_own_mail_and_tests_are_bounded() {
    let (http, smtp) = (HttpSink::start(), SmtpSink::start());
    let (_d, cfg) = lab(&http, Some(&smtp), "");
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    // bob may not send the lab's mail to alice, nor outside the lab.
    let out = e.gantry_user(&bob, &["notify", "add", "email", &format!("{}@lab.test", alice.name)]);
    assert!(
        !out.status.success()
            && out_text(&out).contains(&format!("you may add only your own address, {}@lab.test", bob.name)),
        "{}",
        out_text(&out)
    );
    let out = e.gantry_user(&bob, &["notify", "add", "email", "victim@example.org"]);
    assert!(
        !out.status.success() && out_text(&out).contains("the lab sends email only to addresses at lab.test"),
        "{}",
        out_text(&out)
    );
    // His own address: yes.
    e.json_as(&bob, &["notify", "add", "email", &format!("{}@lab.test", bob.name)]);
    for i in 0..6 {
        let out = e.gantry_user(&bob, &["notify", "test"]);
        assert!(out.status.success(), "test {i}: {}", out_text(&out));
    }
    let out = e.gantry_user(&bob, &["notify", "test"]);
    assert!(
        !out.status.success()
            && out_text(&out).contains(
                "you sent 6 test notifications in the last hour, the lab's limit (`[notify] max_tests_per_hour`)"
            ),
        "{}",
        out_text(&out)
    );
    e.wait_until("bob's six test mails", || smtp.mails().len() >= 6);
    // A job named like the lab's notice: the subject has its id, owner and at most 40 characters of it.
    e.json_as(
        &alice,
        &[
            "notify",
            "add",
            "email",
            &format!("{}@lab.test", alice.name),
            "--on",
            "failed",
        ],
    );
    let sly = "ACTION REQUIRED: your lab account expires today, log in at https://evil.example/ to keep it";
    let id = submit_as(
        &e,
        &alice,
        "sly",
        &format!("name: \"{sly}\"\nimage: {IMAGE}\ncommand: 'false'\ngpus: 0\n"),
    );
    e.wait_until("alice's mail", || {
        smtp.mails().iter().any(|m| m.data.contains(&format!("job {id} (")))
    });
    let mail = smtp
        .mails()
        .into_iter()
        .find(|m| m.data.contains(&format!("job {id} (")))
        .unwrap();
    // Headers unfolded (a long subject is folded onto more lines).
    let unfolded = mail.data.replace("\r\n ", " ").replace("\r\n\t", " ");
    let subject = unfolded
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("subject:"))
        .unwrap()
        .to_string();
    assert!(
        subject.contains(&format!(
            "[gantry] job {id} (ACTION REQUIRED: your lab account exp...) of {}",
            alice.name
        )),
        "{subject}"
    );
    assert!(!subject.contains("evil.example"), "{subject}");
}
