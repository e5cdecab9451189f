//! Issue 29 holes 2-5 and its weak points, as real local users through the real CLI against a root
//! engine: bookings are bounded on a fresh machine (length, weekly GPU-hours, arithmetic that
//! cannot overflow), a booking's start preempts only past the guard rails, a cancel during a
//! preemption's grace stops the job, and an engine killed mid-preemption signals a job once.

use crate::helpers::*;
use serde_json::Value;

fn ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &std::process::Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should be refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn submit_as(e: &Engine, u: &User, name: &str, yaml: &str) -> i64 {
    let dir = u.private_dir("rules");
    let f = u.write(&dir.join(format!("{name}.yaml")), yaml);
    let v = e.json_as(u, &["submit", f.to_str().unwrap()]);
    v[0]["job_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("submit as {}: {v}", u.name))
}

/// `2026-12-07 01:00` (local time, as `--at` reads it).
fn local(ms: i64) -> String {
    gantry_core::units::local_datetime(ms)
}

const H: i64 = 3_600_000;
const DAY: i64 = 24 * H;

/// Monday 00:00 UTC of the week after the one `ms` falls in (1970-01-01 was a Thursday).
fn next_monday(ms: i64) -> i64 {
    let days = ms.div_euclid(DAY);
    (days - (days + 3).rem_euclid(7) + 7) * DAY
}

/// Hole 2 (a year of every GPU), hole 4 (the year-148305323 booking overflowing the weekly sum),
/// hole 3's cancelled-after-start booking counting for nothing, and issue 28 item 4's duplicate.
#[test]
fn bookings_are_bounded_by_default_and_their_weekly_sum_cannot_overflow() {
    // No lab config: what a freshly installed machine does.
    let e = Engine::start(&["--gpus", "sim:4x24GiB"]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));

    // A year of every GPU is refused: a booking lasts at most a day.
    let err = refused(
        &e.gantry_user(&bob, &["book", "--gpus", "4", "--at", "+20m", "--for", "8760h"]),
        "a year of every GPU",
    );
    assert!(
        err.contains("the booking would last") && err.contains("the lab allows bookings of at most 1d"),
        "{err}"
    );
    // The booking ending in the year 148305323: refused, and nothing overflows on the way.
    let err = refused(
        &e.gantry_user(
            &bob,
            &["book", "--gpus", "4", "--at", "+20m", "--for", "1299229000000h"],
        ),
        "the year-148305323 booking",
    );
    assert!(err.contains("the lab allows bookings of at most 1d"), "{err}");
    // The week is bounded by default (48 GPU-hours per user): two bookings of next week within it,
    // a third over it refused with the sums right.
    let monday = next_monday(gantry_core::store::now_ms());
    e.json_as(
        &bob,
        &["book", "--gpus", "2", "--at", &local(monday + H), "--for", "12h"],
    );
    e.json_as(
        &bob,
        &["book", "--gpus", "1", "--at", &local(monday + DAY), "--for", "20h"],
    );
    let err = refused(
        &e.gantry_user(
            &bob,
            &["book", "--gpus", "1", "--at", &local(monday + 2 * DAY), "--for", "5h"],
        ),
        "a booking over the default weekly limit",
    );
    assert!(
        err.contains("this booking is 5 GPU-hours and you have 44 booked in the week")
            && err.contains("the lab allows 48 per user per week"),
        "{err}"
    );
    // The table states the bounds.
    let table = ok(&e.gantry_user(&bob, &["bookings"]), "bookings");
    assert!(
        table.contains("up to 14d ahead, at most 1d long") && table.contains("48 GPU-hours per user per week"),
        "{table}"
    );

    // The same slot booked twice by the same user: refused, naming the first.
    let first = e.json_as(
        &alice,
        &["book", "--gpus", "1", "--at", &local(monday + 3 * DAY), "--for", "2h"],
    );
    let err = refused(
        &e.gantry_user(
            &alice,
            &["book", "--gpus", "1", "--at", &local(monday + 3 * DAY), "--for", "2h"],
        ),
        "a duplicate booking",
    );
    assert!(
        err.contains(&format!("you already have booking {} (1 GPU,", first["id"])),
        "{err}"
    );

    // A booking cancelled right after its start (its start preempts) still counts: at least a slot.
    // alice books this slot (started already) for 4 GPUs x 12 h = 48 GPU-hours, the week's limit,
    // and cancels it.
    let now = gantry_core::store::now_ms();
    let slot = 30 * 60_000;
    let this_slot = local(now - now.rem_euclid(slot));
    let b = e.json_as(&alice, &["book", "--gpus", "4", "--at", &this_slot, "--for", "12h"]);
    assert_eq!(b["state"], "active", "{b}");
    ok(
        &e.gantry_user(&alice, &["book", "cancel", &b["id"].to_string()]),
        "cancelling after the start",
    );
    // Booking the same 48 GPU-hours again in the same week passes the limit by the slot used.
    let err = refused(
        &e.gantry_user(&alice, &["book", "--gpus", "4", "--at", &this_slot, "--for", "12h"]),
        "the same hours again after a cancel past the start",
    );
    assert!(
        err.contains("this booking is 48 GPU-hours and you have ")
            && !err.contains("you have 0 booked")
            && err.contains("a booking cancelled after its start counts until then"),
        "{err}"
    );
}

/// Hole 3: a booking's start preempts a preemptible job only once it has run the lab's `min_run`
/// (10 minutes here, the default): a booking made for the current slot waits for it, and says so.
#[test]
fn a_bookings_start_preempts_only_past_min_run() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[preemption]\nenabled = true\ndefault_preemptible = true\n[bookings]\nslot = \"1m\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap(), "--gpus", "sim:1x24GiB"]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));
    let job = submit_as(
        &e,
        &alice,
        "long",
        &format!("image: {IMAGE}\ngpus: 1\ncommand: sleep 600\n"),
    );
    e.wait_state(job, "running");
    // bob books the GPU from the current minute: it is active at once.
    let now = gantry_core::store::now_ms();
    let b = e.json_as(
        &bob,
        &[
            "book",
            "--gpus",
            "1",
            "--at",
            &local(now - now.rem_euclid(60_000)),
            "--for",
            "5m",
        ],
    );
    assert_eq!(b["state"], "active", "{b}");
    let id = b["id"].as_i64().unwrap();
    let mut row = Value::Null;
    e.wait_until("bob's booking to wait for alice's job", || {
        let list = e.json_as(&bob, &["bookings"]);
        row = list["bookings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"].as_i64() == Some(id))
            .cloned()
            .unwrap_or(Value::Null);
        row["waiting_for"].as_array().is_some_and(|w| w.contains(&job.into()))
    });
    // A few passes later the job still runs its first attempt: not preempted before `min_run`.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let j = e.show(job);
    assert_eq!(j["job"]["state"], "running", "{j}");
    assert_eq!(j["attempts"].as_array().unwrap().len(), 1, "{j}");
    ok(&e.gantry_user(&alice, &["cancel", &job.to_string()]), "cancel");
}

/// Hole 5: a preemptible job whose checkpoint grace is an hour and that ignores its signal is
/// cancelled by its owner during that grace: it stops within the lab's stop grace, ends
/// `cancelled` (not queued again), and the job it was preempted for starts.
#[test]
fn a_cancel_during_a_preemptions_grace_stops_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"1s\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap(), "--gpus", "sim:1x24GiB"]);
    let alice = user("gantry-alice");
    let stubborn = submit_as(
        &e,
        &alice,
        "stubborn",
        &format!(
            "image: {IMAGE}\ngpus: 1\npreemptible: true\ncheckpoint: {{signal: SIGUSR1, grace: 1h}}\ncommand: [sh, -c, \"trap '' USR1 TERM; while true; do sleep 1; done\"]\n"
        ),
    );
    e.wait_state(stubborn, "running");
    std::thread::sleep(std::time::Duration::from_secs(2)); // past min_run
    let urgent = e.submit_yaml(
        "urgent",
        &format!("image: {IMAGE}\ngpus: 1\npriority: 10\ncommand: echo urgent ran\n"),
    );
    e.wait_until("the preemption to start", || {
        e.show(urgent)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("preempted for it"))
    });
    let t = std::time::Instant::now();
    ok(
        &e.gantry_user(&alice, &["cancel", &stubborn.to_string()]),
        "alice's cancel",
    );
    let done = e.wait_final(stubborn);
    assert_eq!(done["job"]["state"], "cancelled", "{done}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "the cancel waited for the preemption's grace: {:?}",
        t.elapsed()
    );
    assert_eq!(e.wait_final(urgent)["job"]["state"], "succeeded");
}

/// Weak point: an engine killed -9 after a preempted job got its checkpoint signal does not send
/// it again on restart; it waits out the rest of the grace, then stops the job.
#[test]
fn an_engine_killed_mid_preemption_signals_the_job_once() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"1s\"\n",
    )
    .unwrap();
    let alice = user("gantry-alice");
    let work = alice.private_dir("signals");
    let mut e = Engine::start(&["--config", lab.to_str().unwrap(), "--gpus", "sim:1x24GiB"]);
    let job = submit_as(
        &e,
        &alice,
        "saver",
        &format!(
            "image: {IMAGE}\ngpus: 1\npreemptible: true\ncheckpoint: {{signal: SIGUSR1, grace: 15s}}\nmounts: ['{}:/work']\ncommand: |\n  if [ \"$GANTRY_RESTART_COUNT\" != 0 ]; then echo resumed; exit 0; fi\n  trap 'echo got >> /work/signals' USR1\n  while true; do sleep 0.2; done\n",
            work.display()
        ),
    );
    e.wait_state(job, "running");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let urgent = e.submit_yaml(
        "urgent",
        &format!("image: {IMAGE}\ngpus: 1\npriority: 10\ncommand: echo urgent ran\n"),
    );
    let signals = work.join("signals");
    e.wait_until("the checkpoint signal", || {
        std::fs::read_to_string(&signals).is_ok_and(|s| s.lines().count() >= 1)
    });
    e.kill9();
    e.restart();
    assert_eq!(e.wait_final(urgent)["job"]["state"], "succeeded");
    let done = e.wait_final(job);
    assert_eq!(done["job"]["state"], "succeeded", "{done}");
    assert!(e.logs(job).contains("resumed"), "{}", e.logs(job));
    assert_eq!(
        std::fs::read_to_string(&signals).unwrap().lines().count(),
        1,
        "the checkpoint signal went to the same attempt twice"
    );
}
