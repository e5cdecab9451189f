//! The API on a shared machine: what other users may see, connection floods, stuck engines and
//! hostile job names (issue 7, items 5, 6 and 8). One root engine, real users acting through the CLI.

use crate::helpers::*;
use serde_json::Value;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `gantry submit` as `u` of a spec written into `dir`; returns the job id.
fn submit_as(e: &Engine, u: &User, dir: &Path, file: &str, text: &str) -> i64 {
    let f = u.write(&dir.join(file), text);
    let v = e.json_as(u, &["submit", f.to_str().unwrap()]);
    v[0]["job_id"].as_i64().unwrap_or_else(|| panic!("submit failed: {v}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run `cmd`; kill it if it is still running after `limit` (a hang must fail the test, not stall it).
fn output_within(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            return Err(format!("still running after {limit:?}: {}", text(&out)));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child.wait_with_output().unwrap())
}

#[test]
fn other_users_see_a_jobs_row_but_not_its_spec_or_output() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = alice.private_dir("api-secret");
    let dir_name = dir.file_name().unwrap().to_str().unwrap().to_string();
    let secret = format!("token-{dir_name}");
    let id = submit_as(&e, &alice, &dir, "train.yaml", &format!(
        "name: train\nimage: {IMAGE}\ncommand: 'echo $TOKEN; echo command-marker; sleep 60'\nenv: {{TOKEN: {secret}}}\nworkdir: /tmp\nmounts: ['{}:/data:ro']\ngpus: 0\n",
        dir.display()
    ));
    e.wait_state(id, "running");
    e.wait_until("the job's output", || e.logs(id).contains(&secret));
    let private = [secret.as_str(), "command-marker", dir_name.as_str()];
    let assert_private = |what: &str, out: &str| {
        for p in private {
            assert!(!out.contains(p), "bob's `{what}` shows alice's {p:?}: {out}");
        }
    };

    // Bob sees the row, not the spec.
    let d = e.json_as(&bob, &["show", &id.to_string()]);
    assert_private("show --json", &d.to_string());
    assert_eq!(
        (
            d["job"]["name"].as_str(),
            d["job"]["owner"].as_str(),
            d["job"]["state"].as_str()
        ),
        (Some("train"), Some("gantry-alice"), Some("running")),
        "{d}"
    );
    assert_eq!(d["job"]["spec_hidden"], true, "{d}");
    assert!(d["job"]["job"].is_null(), "{d}");
    let q = e.json_as(&bob, &["ls"]);
    assert_private("ls --json", &q.to_string());
    let row = q
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["job"]["id"] == id)
        .unwrap_or_else(|| panic!("bob's ls lacks job {id}: {q}"));
    assert_eq!(
        (row["job"]["name"].as_str(), row["job"]["owner"].as_str()),
        (Some("train"), Some("gantry-alice"))
    );
    // The same row for everyone, public fields only: a field added to it is shown to every user,
    // so it must be chosen here on purpose (the spec, env, messages and source stay in `show`).
    let keys: std::collections::BTreeSet<&str> = row["job"].as_object().unwrap().keys().map(String::as_str).collect();
    // (`gpu_memory` and `started_at` are left out when there is none.)
    let public = [
        "gpu_memory",
        "gpus",
        "id",
        "image",
        "name",
        "owner",
        "owner_uid",
        "priority",
        "started_at",
        "state",
        "submitted_at",
    ];
    assert!(
        keys.iter().all(|k| public.contains(k)) && keys.len() >= public.len() - 2,
        "bob's ls row of alice's job holds more than its public row: {row}"
    );
    let entry: std::collections::BTreeSet<&str> = row.as_object().unwrap().keys().map(String::as_str).collect();
    let verdict = [
        "estimated_start",
        "eta_confidence",
        "gpus_assigned",
        "job",
        "position",
        "reason",
    ];
    assert!(
        entry.iter().all(|k| verdict.contains(k)),
        "bob's ls entry of alice's job: {row}"
    );
    assert_eq!(
        row,
        e.json_as(&alice, &["ls"])
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["job"]["id"] == id)
            .unwrap(),
        "alice's own row is the same"
    );
    let show = e.gantry_user(&bob, &["show", &id.to_string()]);
    assert!(show.status.success(), "{}", text(&show));
    assert_private("show", &text(&show));
    assert!(
        String::from_utf8_lossy(&show.stdout).contains("hidden: only gantry-alice and root"),
        "{}",
        text(&show)
    );

    // Nor her output, with a clear reason.
    for args in [vec!["logs", "ID"], vec!["logs", "-f", "ID"]] {
        let args: Vec<String> = args.iter().map(|a| a.replace("ID", &id.to_string())).collect();
        let out = e.gantry_user(&bob, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!out.status.success(), "bob's {args:?} succeeded: {}", text(&out));
        assert_private("logs", &text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&format!(
                "job {id} belongs to gantry-alice; only its owner or an admin can read its output"
            )),
            "{}",
            text(&out)
        );
    }

    // Alice and root see everything.
    let mine = e.json_as(&alice, &["show", &id.to_string()]);
    assert_eq!(mine["job"]["job"]["spec"]["env"]["TOKEN"], secret.as_str(), "{mine}");
    assert_eq!(mine["job"]["spec_hidden"], false);
    let mine = e.gantry_user(&alice, &["show", &id.to_string()]);
    assert!(
        String::from_utf8_lossy(&mine.stdout).contains(&format!("TOKEN={secret}")),
        "{}",
        text(&mine)
    );
    assert!(String::from_utf8_lossy(&e.gantry_user(&alice, &["logs", &id.to_string()]).stdout).contains(&secret));
    assert_eq!(
        e.show(id)["job"]["job"]["spec"]["env"]["TOKEN"],
        secret.as_str(),
        "root sees the spec"
    );

    assert!(e.gantry_user(&alice, &["cancel", &id.to_string()]).status.success());
    e.wait_final(id);
    let h = e.json_as(&bob, &["history"]);
    assert_private("history --json", &h.to_string());
    assert!(
        h.as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == id && r["owner"] == "gantry-alice" && r["name"] == "train"),
        "{h}"
    );
}

#[test]
fn only_the_owner_or_root_can_run_a_job_again() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = alice.private_dir("api-rerun");
    let id = submit_as(
        &e,
        &alice,
        &dir,
        "once.yaml",
        &format!("image: {IMAGE}\ncommand: 'true'\nenv: {{TOKEN: alice-only}}\ngpus: 0\n"),
    );

    let out = e.gantry_user(&bob, &["rerun", &id.to_string()]);
    assert!(!out.status.success(), "bob reran alice's job: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!(
            "job {id} belongs to gantry-alice; only its owner or an admin can run it again"
        )),
        "{}",
        text(&out)
    );
    let next = e.gantry(&["show", &(id + 1).to_string()]);
    assert!(
        !next.status.success() && String::from_utf8_lossy(&next.stderr).contains("no job"),
        "bob's rerun created a job: {}",
        text(&next)
    );

    let again = e.json_as(&alice, &["rerun", &id.to_string()]);
    let new = again["job_id"].as_i64().unwrap();
    let j = e.show(new);
    assert_eq!(
        (
            j["job"]["owner"].as_str(),
            j["job"]["job"]["spec"]["env"]["TOKEN"].as_str()
        ),
        (Some("gantry-alice"), Some("alice-only")),
        "{j}"
    );
}

/// Opens N connections to the socket as the user running it, sends half a request head on each and
/// holds them; prints `opened N`, then, once the engine has closed them all (or after 60 s), how
/// many got a 503, how many were closed without an answer, how many are still open, and one 503.
const FLOOD: &str = r#"
use strict; use IO::Socket::UNIX; use IO::Select;
$SIG{PIPE} = 'IGNORE'; $| = 1;
my ($path, $n) = @ARGV;
my @socks;
for (1..$n) {
    my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $path) or die "connect: $!";
    print $s "GET /v1/jobs HTTP/1.1\r\nHost: gantry\r\n";
    push @socks, $s;
}
print "opened $n\n";
my $sel = IO::Select->new(@socks);
my (%got, $refused, $closed, $reply) = ((), 0, 0, '');
my $deadline = time + 60;
while ($sel->count && time < $deadline) {
    for my $s ($sel->can_read(1)) {
        my $r = sysread($s, my $buf, 4096);
        if ($r) { $got{$s} .= $buf; next }
        my $g = $got{$s} // '';
        if ($g =~ m{^HTTP/1.1 503}) { $refused++; $reply = $g } else { $closed++ }
        $sel->remove($s);
        close $s;
    }
}
$reply =~ s/\r?\n/ /g;
print "refused $refused closed $closed open ", $sel->count, "\nreply $reply\n";
"#;

#[test]
fn a_connection_flood_from_one_user_does_not_lock_out_the_others() {
    let e = Engine::start(&["--header-timeout", "2s"]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let n = 300;
    let mut flood = bob
        .command("perl")
        .args([
            "-e",
            FLOOD,
            e.state.join("gantry.sock").to_str().unwrap(),
            &n.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(flood.stdout.take().unwrap()).lines();
    let opened = lines.next().expect("the flood reports").unwrap();
    assert_eq!(opened, format!("opened {n}"));

    // While bob holds his connections, alice is served.
    let q = e.json_as(&alice, &["ls"]);
    assert!(q.is_array(), "{q}");

    let report: Vec<String> = lines.map(Result::unwrap).collect();
    let status = flood.wait().unwrap();
    assert!(status.success(), "flood failed: {report:?}");
    let counts: Vec<usize> = report[0].split(' ').filter_map(|w| w.parse().ok()).collect();
    let [refused, closed, open] = counts[..] else {
        panic!("{report:?}")
    };
    assert_eq!(
        open, 0,
        "half-sent requests must be closed after the header timeout: {report:?}"
    );
    assert_eq!(refused + closed, n, "{report:?}");
    assert!(
        refused > 0 && closed > 0,
        "connections over bob's cap are refused, the rest time out: {report:?}"
    );
    assert!(
        report[1].contains(&format!("too many connections from uid {}", bob.uid)),
        "{report:?}"
    );
}

#[test]
fn the_cli_gives_up_on_an_engine_that_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    // Connections queue up in the backlog and are never answered.
    let _listener = std::os::unix::net::UnixListener::bind(dir.path().join("gantry.sock")).unwrap();
    let mut cmd = Command::new(bin());
    cmd.arg("--state-dir")
        .arg(dir.path())
        .arg("ls")
        .env("GANTRY_CLIENT_TIMEOUT", "2s");
    let out = output_within(cmd, Duration::from_secs(60)).unwrap_or_else(|e| panic!("the CLI hangs: {e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "the engine at {} did not answer within 2s: it may be overloaded",
            dir.path().join("gantry.sock").display()
        )),
        "{err}"
    );
}

#[test]
fn terminal_escapes_in_job_names_print_as_visible_text() {
    let e = Engine::start(&[]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = alice.private_dir("api-escape");
    // A name is shown to everyone: control characters are refused when it is made.
    let f = alice.write(
        &dir.join("evil.yaml"),
        &format!("name: \"\\x1b[2J\\x1b]0;pwned\\x07evil\"\nimage: {IMAGE}\ngpus: 0\n"),
    );
    let out = e.gantry_user(&alice, &["submit", f.to_str().unwrap()]);
    assert!(
        !out.status.success() && text(&out).contains("control characters"),
        "{}",
        text(&out)
    );
    // Other public text (here the image name, which Docker then refuses) is escaped in human output.
    let id = submit_as(
        &e,
        &alice,
        &dir,
        "img.yaml",
        "name: img\nimage: \"evil\\x1b[2J\\x1b]0;pwned\\x07:1\"\ngpus: 0\n",
    );
    e.wait_final(id);
    let seen_by_bob = |args: &[&str]| {
        let out = e.gantry_user(&bob, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        assert!(
            !out.stdout.iter().any(|b| *b == 0x1b || *b == 0x07),
            "raw control characters reach bob's terminal in {args:?}: {:?}",
            text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("\\u{1b}[2J"),
            "{args:?} shows the escape as text: {}",
            text(&out)
        );
    };
    seen_by_bob(&["show", &id.to_string()]);

    // A reader that stops early (`| head -1`) ends the CLI quietly.
    for args in [vec!["show".to_string(), id.to_string()], vec!["history".to_string()]] {
        let mut child = bob
            .command(bin())
            .arg("--state-dir")
            .arg(&e.state)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the pipe's only reader is gone before the CLI writes
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && err.is_empty(),
            "{args:?} into a closed pipe: {err}"
        );
    }
    let h: Value = e.json_as(&bob, &["history"]);
    assert_eq!(
        h[0]["image"], "evil\u{1b}[2J\u{1b}]0;pwned\u{7}:1",
        "--json keeps the text as it is"
    );
}
