//! A job's output as its owner reads it (issue 22 item 1, issue 18 items 3 and 4): a progress bar's
//! line is its last `\r` state, shown live while the line is still being written; Docker's 16 KiB
//! messages never put a timestamp inside a line; an endless line is cut with a note; Docker's own copy
//! of the output is bounded like Gantry's.

use std::io::Read;
use std::process::{Command, Stdio};

use crate::helpers::*;

/// The job's output without Gantry's own timestamped lines (its notes about the output stay).
fn output(e: &Engine, id: i64) -> String {
    e.logs(id)
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("[gantry "))
        .collect()
}

/// A folder the job mounts at /t (its script, and the file that lets it go on).
fn job_dir(script: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    chmod(d.path(), 0o755);
    std::fs::write(d.path().join("run.sh"), script).unwrap();
    chmod(&d.path().join("run.sh"), 0o644);
    d
}

const PROGRESS: &str = r#"cr=$(printf '\r')
bar=""
i=0
while [ $i -le 20 ]; do bar="$bar$cr$(printf '%3d%%|step%d|' $((i * 5)) $i)"; i=$((i + 1)); done
# The same progress line written in chunks of every size.
for k in 1 2 3 4 5 6 7 8 9 10 11 13 16 17 31 64 100 4096; do
  printf '%s\n' "$bar" | busybox dd bs=$k 2>/dev/null
  echo "after $k"
done
# Docker cuts these at 16 KiB: a plain line of 20,000 bytes, and one of 200 progress states.
busybox head -c 20000 /dev/zero | busybox tr '\0' y; echo
long=""
j=0
while [ $j -lt 200 ]; do long="$long${cr}state $j of 200 ................................................................................"; j=$((j + 1)); done
printf '%s\n' "$long"
printf '\r 42%%|live|'
until [ -e /t/go ]; do sleep 0.1; done
printf '\r 99%%|live|\n'
echo end
"#;

#[test]
fn progress_bars_show_their_current_state_live_and_their_last_state_as_the_line() {
    let e = Engine::start(&[]);
    let dir = job_dir(PROGRESS);
    let id = e.submit_yaml(
        "bars",
        &format!(
            "image: {IMAGE}\ngpus: 0\nmounts: ['{}:/t']\ncommand: [sh, /t/run.sh]\n",
            dir.path().display()
        ),
    );
    e.wait_state(id, "running");
    let mut follow = Command::new(bin())
        .arg("--state-dir")
        .arg(&e.state)
        .args(["logs", "-f", &id.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = follow.stdout.take().unwrap();
    // What `logs -f` printed so far (read as it comes, so the test can wait for it under load).
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let followed = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.lock().unwrap().extend_from_slice(&buf[..n]),
                }
            }
            String::from_utf8_lossy(&seen.lock().unwrap()).into_owned()
        })
    };
    // Docker holds a line without `\n` back until 16 KiB of it have come; its state shows anyway.
    let mut shown = String::new();
    e.wait_until("the progress bar's current state in `gantry logs`", || {
        shown = output(&e, id);
        shown.ends_with(" 42%|live|\n")
    });
    // Followed, the state ends in `\r` (issue 28): the next state or the line is drawn over it.
    e.wait_until("the progress bar's current state in `gantry logs -f`", || {
        String::from_utf8_lossy(&seen.lock().unwrap()).contains(" 42%|live|\r")
    });
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let mut want = String::new();
    for k in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 16, 17, 31, 64, 100, 4096] {
        want += &format!("100%|step20|\nafter {k}\n");
    }
    want += &"y".repeat(20_000);
    want += "\nstate 199 of 200 ................................................................................\n 99%|live|\nend\n";
    let got = output(&e, id);
    assert!(
        got == want,
        "each line is its last state, whole, with no timestamp inside:\n{}",
        first_difference(&got, &want)
    );
    assert!(
        shown.starts_with(&want[..want.find("\n 99%").unwrap() + 1]),
        "while it ran: the lines so far, then the bar's state"
    );
    let followed: String = followed
        .join()
        .unwrap()
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("[gantry "))
        .collect();
    assert!(follow.wait().unwrap().success());
    assert!(
        followed.contains("\n 42%|live|\r")
            && !followed.contains(" 42%|live|\n")
            && followed.ends_with(" 99%|live|\nend\n"),
        "`logs -f` showed the state as it came: {}",
        &followed[followed.len().saturating_sub(300)..]
    );
}

/// Where two texts first differ, with some context.
fn first_difference(got: &str, want: &str) -> String {
    let at = got
        .bytes()
        .zip(want.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let from = at.saturating_sub(80);
    format!(
        "at byte {at} (got {} bytes, want {}):\n got: {:?}\nwant: {:?}",
        got.len(),
        want.len(),
        &got[from..(at + 80).min(got.len())],
        &want[from..(at + 80).min(want.len())]
    )
}

/// Peak resident memory of a process so far, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn a_40_mb_line_without_newline_keeps_its_first_64_kib_with_a_note_in_bounded_memory() {
    let e = Engine::start(&[]);
    let before = peak_rss(e.pid());
    let id = e.submit_yaml(
        "endless",
        &format!("image: {IMAGE}\ngpus: 0\ncommand: \"busybox head -c 40000000 /dev/zero | busybox tr '\\\\0' x\"\n"),
    );
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let grew = peak_rss(e.pid()).saturating_sub(before);
    let got = output(&e, id);
    let want = format!(
        "{}\n[gantry] the line above was cut at 64.0 KiB: {} more bytes of it (without a newline) are left out\n",
        "x".repeat(64 << 10),
        40_000_000 - (64 << 10)
    );
    assert!(got == want, "{}", first_difference(&got, &want));
    // The engine's memory does not follow the line's length (it held the whole line before).
    assert!(grew < 24 << 20, "the engine's peak memory grew by {} MiB", grew >> 20);
    assert!(e.gantry(&["status"]).status.success());
}

#[test]
fn dockers_own_log_of_a_job_is_bounded_like_gantrys() {
    let dir = job_dir("busybox yes 'a job that prints fast, line after line, for a long time' | busybox head -c 8000000\n: > /t/done\nexec sleep 300\n");
    let lab = dir.path().join("config.toml");
    std::fs::write(&lab, "[logs]\ncap = \"1MiB\"\n").unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap()]);
    let id = e.submit_yaml(
        "chatty",
        &format!(
            "image: {IMAGE}\ngpus: 0\nmounts: ['{}:/t']\ncommand: [sh, /t/run.sh]\n",
            dir.path().display()
        ),
    );
    let c = crate::dl_defaults::docker_inspect(&crate::dl_defaults::container_of(&e, id));
    // Two files' worth of the cap in all: the cap's worth of output and json-file's overhead per line.
    let want = serde_json::json!({"Type": "json-file", "Config": {"max-size": "524288", "max-file": "4"}});
    assert_eq!(c["HostConfig"]["LogConfig"], want, "{}", c["HostConfig"]);
    e.wait_until("the job to have written 8 MB", || dir.path().join("done").exists());
    let log = std::path::PathBuf::from(c["LogPath"].as_str().unwrap());
    let stored: u64 = std::fs::read_dir(log.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|f| {
            f.file_name()
                .to_string_lossy()
                .starts_with(&*log.file_name().unwrap().to_string_lossy())
        })
        .map(|f| f.metadata().unwrap().len())
        .sum();
    // A file is rotated once a write takes it past max-size: each may hold one more message.
    assert!(
        stored <= 4 * (512 << 10) + 4 * (16 << 10),
        "Docker's log of the job holds {stored} bytes"
    );
    e.wait_until("Gantry's own copy to stop at its cap", || {
        e.logs(id)
            .contains("[gantry] log truncated: the job wrote more than 1048576 bytes")
    });
    assert!(e.gantry(&["cancel", &id.to_string()]).status.success());
}

/// Docker stores a job's stdout and stderr in the order its two copiers reach its log, not in the
/// order of their timestamps (a stdout line can be stored after stderr lines stamped later): every
/// line of both streams is in the job's log once, each stream's lines in their order.
#[test]
fn every_line_of_a_job_writing_to_both_streams_is_in_its_log_once() {
    let e = Engine::start(&[]);
    let n = 3000;
    let id = e.submit_yaml(
        "both",
        &format!(
            "image: {IMAGE}\ngpus: 0\ncommand: 'i=0; while [ $i -lt {n} ]; do echo out$i; echo err$i >&2; i=$((i + 1)); done'\n"
        ),
    );
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let log = output(&e, id);
    for stream in ["out", "err"] {
        let got: Vec<&str> = log.lines().filter(|l| l.starts_with(stream)).collect();
        let want: Vec<String> = (0..n).map(|i| format!("{stream}{i}")).collect();
        let first_wrong = want.iter().zip(&got).position(|(w, g)| w != g);
        assert!(
            got.len() == want.len() && first_wrong.is_none(),
            "{} of {n} {stream} lines; first wrong: {:?}",
            got.len(),
            first_wrong.map(|i| (&want[i], got[i]))
        );
    }
}
