//! Issue 18, item 5: slow readers of a big log cannot pin the engine's memory or slow the API for
//! everyone else. One root engine, real users, a raw Unix-socket client reading 1 KiB a second.

use crate::helpers::*;
use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Opens N log streams of job ID (every other one with `follow`), prints the status code of each
/// (`200=N`), then reads 1 KiB a second from each until killed.
const SLOW_READERS: &str = r#"
use strict; use IO::Socket::UNIX;
$SIG{PIPE} = 'IGNORE'; $| = 1;
my ($path, $id, $n) = @ARGV;
my @socks;
for my $i (1..$n) {
    my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $path) or die "connect: $!";
    my $q = $i % 2 ? "?follow=true" : "";
    print $s "GET /v1/jobs/$id/logs$q HTTP/1.1\r\nHost: gantry\r\n\r\n";
    push @socks, $s;
}
my %status;
for my $s (@socks) {
    sysread($s, my $buf, 1024);
    my ($st) = $buf =~ m{^HTTP/1.1 (\d+)};
    $status{$st // 'none'}++;
}
print join(" ", map { "$_=$status{$_}" } sort keys %status), "\n";
while (1) { for my $s (@socks) { sysread($s, my $buf, 1024) } sleep 1 }
"#;

fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// The job's log file in the engine's state dir.
fn log_file(e: &Engine, id: i64) -> Option<std::path::PathBuf> {
    std::fs::read_dir(e.state.join("logs"))
        .ok()?
        .flatten()
        .map(|f| f.path())
        .find(|p| p.to_string_lossy().ends_with(&format!("-{id}.log")))
}

#[test]
fn slow_readers_of_a_big_log_pin_neither_memory_nor_the_api() {
    const READERS: usize = 32;
    const LOG: u64 = 32 << 20;
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let dir = bob.private_dir("slow-readers");
    let lab = dir.join("config.toml");
    // The quiet job runs beside the chatty one: CPU-only jobs' CPU/RAM is not counted here (by
    // default they together hold one share, issue 33).
    std::fs::write(
        &lab,
        format!("[logs]\nstreams_per_user = {READERS}\n[containers]\ncpu_only_cpus = \"none\"\ncpu_only_memory = \"none\"\n"),
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap()]);
    let spec = bob.write(
        &dir.join("chatty.yaml"),
        // Long lines (8,000 bytes): Docker's log copy is per line, and fewer lines fill the log sooner.
        &format!("name: chatty\nimage: {IMAGE}\ngpus: 0\ncommand: \"busybox yes $(busybox head -c 8000 /dev/zero | busybox tr '\\\\0' x) | busybox head -c {}; exec sleep 600\"\n", LOG + (1 << 20)),
    );
    let id = e.json_as(&bob, &["submit", spec.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    // Docker copies a fast writer's output at a few MB/s on a loaded machine: minutes, not the
    // helpers' usual wait.
    let t = Instant::now();
    while log_file(&e, id)
        .and_then(|p| std::fs::metadata(p).ok())
        .is_none_or(|m| m.len() < LOG)
    {
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "the job's log did not reach 32 MiB: {:?}\n{}",
            log_file(&e, id)
                .and_then(|p| std::fs::metadata(p).ok())
                .map(|m| m.len()),
            e.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("the log reached 32 MiB in {:?}", t.elapsed());
    let before = rss(e.pid());

    // Killed however the test ends (they would read on forever).
    struct Readers(std::process::Child);
    impl Drop for Readers {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut readers = Readers(
        bob.command("perl")
            .args([
                "-e",
                SLOW_READERS,
                e.state.join("gantry.sock").to_str().unwrap(),
                &id.to_string(),
                &READERS.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = std::io::BufReader::new(readers.0.stdout.take().unwrap())
        .lines()
        .next()
        .expect("the readers report")
        .unwrap();
    assert_eq!(status, format!("200={READERS}"), "every stream within the cap opens");

    // While bob's 32 streams are open and drained at 1 KiB/s, alice's `gantry ls` answers and the
    // engine's memory does not follow the log's size times the readers.
    let mut times = vec![];
    let mut peak = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let q = e.json_as(&alice, &["ls"]);
        times.push(t.elapsed());
        assert!(q.is_array(), "{q}");
        peak = peak.max(rss(e.pid()));
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("gantry ls as another user with {READERS} slow readers of a 32 MiB log: {times:?}; engine RSS {} MiB before, {} MiB at most while they read", before >> 20, peak >> 20);
    assert!(
        times.iter().all(|t| *t < Duration::from_secs(3)),
        "alice's `gantry ls` took {times:?}"
    );
    assert!(
        peak < 300 << 20,
        "the engine's memory grew from {} MiB to {} MiB with {READERS} slow readers",
        before >> 20,
        peak >> 20
    );

    // One stream more than the lab allows is refused, saying how many are open and what to do.
    let out = e.gantry_user(&bob, &["logs", &id.to_string()]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the 33rd stream was served");
    assert!(
        err.contains(&format!("gantry-bob has {READERS} log streams open"))
            && err.contains("streams_per_user")
            && err.contains("close one"),
        "{err}"
    );
    // Another user's streams are their own.
    let own = alice.write(
        &alice.private_dir("slow-readers").join("quiet.yaml"),
        &format!("name: quiet\nimage: {IMAGE}\ngpus: 0\ncommand: [echo, quiet]\n"),
    );
    let quiet = e.json_as(&alice, &["submit", own.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    e.wait_final(quiet);
    let out = e.gantry_user(&alice, &["logs", &quiet.to_string()]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("quiet"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    drop(readers);
    // Closed streams give their places back.
    e.wait_until("bob's streams to be given back", || {
        e.gantry_user(&bob, &["logs", &id.to_string()]).status.success()
    });
}
