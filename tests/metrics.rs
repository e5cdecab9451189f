//! `/metrics` (issue 20): scraped from a real engine while a real job holds a GPU. Its GPU labels
//! match `gantry gpus`, `promtool check metrics` (Debian's `prometheus` package) finds nothing to
//! say, and the packaged Grafana dashboard names only metrics the engine serves.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::helpers::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    Some(body.to_string())
}

/// `name{labels} value` lines of one family, as (labels, value).
fn samples(body: &str, name: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, labels) = series
                .split_once('{')
                .map(|(n, l)| (n, l.trim_end_matches('}')))
                .unwrap_or((series, ""));
            (n == name).then(|| (labels.to_string(), v.parse().unwrap_or(f64::NAN)))
        })
        .collect()
}

fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
        .map(|v| v.trim_end_matches('"'))
        .unwrap_or("")
}

#[test]
fn metrics_scraped_during_a_job_match_gantry_gpus_and_pass_promtool() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")).unwrap();
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let alice = user("gantry-alice");
    let job_dir = alice.private_dir("metrics");
    let f = alice.write(
        &job_dir.join("hold.yaml"),
        &format!("name: hold\nimage: {IMAGE}\ncommand: 'sleep 60'\ngpus: 1\n"),
    );
    let id = e.json_as(&alice, &["submit", f.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    let quick = alice.write(
        &job_dir.join("quick.yaml"),
        &format!("name: quick\nimage: {IMAGE}\ncommand: 'true'\ngpus: 0\n"),
    );
    let q = e.json_as(&alice, &["submit", quick.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    e.wait_final(q);
    e.wait_state(id, "running");
    let mut gpus = Value::Null;
    e.wait_until("gantry gpus to show the job on its GPU", || {
        gpus = e.json(&["gpus"]);
        gpus["users"]
            .as_array()
            .is_some_and(|u| u.iter().any(|u| u["job_id"] == id))
    });
    let held = gpus["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["job_id"] == id)
        .unwrap()
        .clone();
    let gpu = held["gpu"].as_u64().unwrap().to_string();
    let mut body = String::new();
    e.wait_until("/metrics to show the job on its GPU and the quick job's end", || {
        body = scrape(port).unwrap_or_default();
        samples(&body, "gantry_gpu_utilization_ratio")
            .iter()
            .any(|(l, _)| label(l, "job") == id.to_string())
            && samples(&body, "gantry_jobs_ended_total")
                .iter()
                .any(|(l, v)| label(l, "outcome") == "succeeded" && *v >= 1.0)
    });

    // Every GPU `gantry gpus` lists, with the same holder labels.
    let util = samples(&body, "gantry_gpu_utilization_ratio");
    assert_eq!(util.len(), gpus["gpus"].as_array().unwrap().len(), "{body}");
    for g in gpus["gpus"].as_array().unwrap() {
        let idx = g["index"].as_u64().unwrap().to_string();
        let (l, v) = util
            .iter()
            .find(|(l, _)| label(l, "gpu") == idx)
            .unwrap_or_else(|| panic!("GPU {idx} missing:\n{body}"));
        assert_eq!(label(l, "uuid"), g["uuid"].as_str().unwrap());
        assert!((0.0..=1.0).contains(v), "{l} {v}");
        let (want_job, want_user) = if idx == gpu {
            (id.to_string(), alice.name.clone())
        } else {
            (String::new(), String::new())
        };
        assert_eq!(
            (label(l, "job"), label(l, "user")),
            (want_job.as_str(), want_user.as_str()),
            "GPU {idx}: {l}\n{gpus}"
        );
        let mem = samples(&body, "gantry_gpu_memory_total_bytes");
        assert!(
            mem.iter()
                .any(|(l, v)| label(l, "gpu") == idx && *v == g["memory_total"].as_f64().unwrap()),
            "{body}"
        );
    }
    let running = samples(&body, "gantry_running_jobs");
    assert_eq!(running, [(format!("user=\"{}\"", alice.name), 1.0)], "{body}");
    assert_eq!(
        samples(&body, "gantry_running_gpus"),
        [(format!("user=\"{}\"", alice.name), 1.0)]
    );
    assert_eq!(samples(&body, "gantry_store_problem"), [(String::new(), 0.0)]);
    assert!(
        samples(&body, "gantry_job_wait_seconds_count")
            .iter()
            .any(|(_, v)| *v >= 2.0),
        "both jobs started: {body}"
    );
    assert!(
        samples(&body, "gantry_job_run_seconds_count")
            .iter()
            .any(|(_, v)| *v >= 1.0),
        "{body}"
    );

    // promtool's own checks (format, naming conventions, help text).
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`; scripts/test.sh installs it)");
    p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics:\n{said}\n{body}"
    );

    // The Grafana dashboard uses only these metrics.
    let families: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let dash: Value = serde_json::from_str(include_str!("../packaging/grafana-dashboard.json")).unwrap();
    let mut exprs = vec![];
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if (k == "expr" || k == "query") && x.is_string() {
                        out.push(x.as_str().unwrap().to_string());
                    }
                    walk(x, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&dash, &mut exprs);
    let mut named = 0;
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(i) = rest.find("gantry_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(f)))
                .unwrap_or(&name);
            assert!(
                families.contains(&family),
                "the dashboard names {name}, which the engine does not serve ({families:?})"
            );
            named += 1;
        }
    }
    assert!(named >= 14, "the dashboard names only {named} metrics: {exprs:?}");
}

/// A non-loopback `listen` is refused at start unless the lab allows it.
#[test]
fn metrics_on_a_public_address_are_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "[metrics]\nlisten = \"0.0.0.0:9464\"\n").unwrap();
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .arg("--state-dir")
        .arg(state.path())
        .args([
            "daemon",
            "--gpus",
            "sim:1x24GiB@metrics-remote",
            "--config",
            cfg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("config.toml:2:10: metrics `listen` = \"0.0.0.0:9464\" is not a loopback address")
            && text.contains("allow_remote = true"),
        "{text}"
    );
}

/// `gantry usage --csv`: a header, then GPU-hours per user per day, from real runs.
#[test]
fn usage_csv_lists_gpu_hours_per_user_per_day() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("usage-csv");
    let f = alice.write(
        &dir.join("two.yaml"),
        &format!("name: two\nimage: {IMAGE}\ncommand: 'sleep 2'\ngpus: 2\n"),
    );
    let id = e.json_as(&alice, &["submit", f.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    e.wait_final(id);
    let out = e.gantry(&["usage", "--csv", "--since", "2d"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("day,user,gpu_hours"));
    let row: Vec<&str> = lines
        .find(|l| l.contains(&alice.name))
        .unwrap_or_else(|| panic!("no row for {}: {text}", alice.name))
        .split(',')
        .collect();
    assert_eq!(row[0].len(), 10, "a YYYY-MM-DD day: {text}");
    let hours: f64 = row[2].parse().unwrap();
    assert!(hours > 0.0 && hours < 0.1, "2 GPUs for a few seconds: {text}");
}

/// Issue 29, hole 7: bob floods `/metrics` with idle connections. With the packaged defaults the
/// engine keeps at most `[metrics] max_connections` (64) of them, closes idle ones after
/// `idle_timeout` (10 s), and alice's `gantry ls` answers throughout, even with the engine's file
/// descriptors limited to 300 (a flood of 24,900 took a 20,000-fd engine down before).
#[test]
fn a_flood_of_idle_metrics_connections_is_capped_and_closed_and_alice_still_gets_her_queue() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")).unwrap();
    let e = Engine::start(&["--config", cfg.to_str().unwrap()]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let pid = e.pid().to_string();
    let limited = Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=300:300"])
        .output()
        .unwrap();
    assert!(limited.status.success(), "{limited:?}");
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    assert!(scrape(port).is_some());
    let before = fds();

    // bob opens 600 connections and holds them, sending nothing.
    let mut flood = bob
        .command("/usr/bin/python3")
        .args([
            "-c",
            &format!(
                "import socket, time\nsocks = []\ntry:\n    for _ in range(600):\n        \
                 socks.append(socket.create_connection(('127.0.0.1', {port}), timeout=2))\nexcept OSError:\n    pass\n\
                 print('OPEN', len(socks), flush=True)\ntime.sleep(120)\n"
            ),
        ])
        .current_dir("/")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 4];
    flood.stdout.as_mut().unwrap().read_exact(&mut line).unwrap();
    assert_eq!(&line, b"OPEN");
    let held = fds();
    let ls = Command::new("timeout")
        .args(["20", "setpriv"])
        .args([
            format!("--reuid={}", alice.uid),
            format!("--regid={}", alice.gid),
            "--init-groups".into(),
        ])
        .arg(bin())
        .arg("--state-dir")
        .arg(&e.state)
        .arg("ls")
        .output()
        .unwrap();
    assert!(ls.status.success(), "alice's `gantry ls` during the flood: {ls:?}");
    assert!(
        held <= before + 64 + 4,
        "the engine holds {held} descriptors during the flood ({before} before): more than max_connections"
    );
    // Idle ones are closed: a scrape is answered again while bob still holds his sockets.
    e.wait_until("bob's idle connections to be closed", || scrape(port).is_some());
    assert!(
        flood.try_wait().unwrap().is_none(),
        "bob's flood still holds its sockets"
    );
    assert!(
        fds() <= before + 4,
        "{} descriptors after the idle timeout ({before} before)",
        fds()
    );
    let _ = flood.kill();
    let _ = flood.wait();
}
