//! GPU bookings (issue 21 item 4) through the real CLI as real users against a root engine: a
//! booking is everyone's to see (owner and time) but its note is the owner's, only its owner or root
//! may cancel it, and the lab's limits refuse with the reason and the way out.

use crate::helpers::*;

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

#[test]
fn others_see_a_booking_but_not_its_note_and_only_its_owner_or_root_cancels_it() {
    let cfg = tempfile::tempdir().unwrap();
    let file = cfg.path().join("config.toml");
    std::fs::write(&file, "[bookings]\nmax_gpu_hours_per_week = 2\nslot = \"30m\"\n").unwrap();
    let e = Engine::start(&["--gpus", "sim:2x24GiB", "--config", file.to_str().unwrap()]);
    let (alice, bob) = (user("gantry-alice"), user("gantry-bob"));

    let b = e.json_as(
        &alice,
        &[
            "book",
            "--gpus",
            "1",
            "--at",
            "+3h",
            "--for",
            "2h",
            "--note",
            "secret demo",
        ],
    );
    let id = b["id"].as_i64().unwrap();
    assert_eq!(
        (b["owner"].as_str(), b["state"].as_str(), b["note"].as_str()),
        (Some("gantry-alice"), Some("booked"), Some("secret demo"))
    );
    assert_eq!(
        b["start_ms"].as_i64().unwrap() % 1_800_000,
        0,
        "+3h is rounded up to the lab's slot"
    );

    // bob sees the row (owner, time) but not the note, in JSON and in the table.
    let list = e.json_as(&bob, &["bookings"]);
    let row = list["bookings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"].as_i64() == Some(id))
        .expect("bob sees alice's booking")
        .clone();
    assert_eq!(
        (row["owner"].as_str(), row["mine"].as_bool(), row.get("note")),
        (Some("gantry-alice"), Some(false), None)
    );
    let table = ok(&e.gantry_user(&bob, &["bookings"]), "bookings as bob");
    assert!(
        table.contains("gantry-alice") && !table.contains("secret demo"),
        "{table}"
    );
    assert!(
        table.contains("Lab rules: 30m slots") && table.contains("2 GPU-hours per user per week"),
        "{table}"
    );
    let mine = ok(&e.gantry_user(&alice, &["bookings"]), "bookings as alice");
    assert!(mine.contains("secret demo"), "{mine}");

    // bob may not cancel it.
    let err = refused(
        &e.gantry_user(&bob, &["book", "cancel", &id.to_string()]),
        "bob cancelling alice's booking",
    );
    assert!(
        err.contains(&format!(
            "booking {id} belongs to gantry-alice; only its owner or root may cancel it"
        )),
        "{err}"
    );

    // The lab's weekly limit: alice has 2 GPU-hours booked; one more (same start, so the same week) is refused.
    let at = local_hhmm(b["start_ms"].as_i64().unwrap());
    let err = refused(
        &e.gantry_user(&alice, &["book", "--gpus", "1", "--at", &at, "--for", "1h"]),
        "a booking over the week's limit",
    );
    assert!(
        err.contains("this booking is 1 GPU-hours and you have 2 booked in the week")
            && err.contains("the lab allows 2 per user per week"),
        "{err}"
    );

    // A clash beyond the machine's GPUs names the booking it clashes with.
    let err = refused(
        &e.gantry_user(&bob, &["book", "--gpus", "2", "--at", &at, "--for", "1h"]),
        "a clash",
    );
    assert!(
        err.contains(&format!("booking {id} (gantry-alice, 1 GPU,")) && err.contains("1 left, you asked for 2"),
        "{err}"
    );

    // Off the slot grid: the error says the slot and the nearest starts.
    let err = refused(
        &e.gantry_user(&bob, &["book", "--at", "23:10", "--for", "1h"]),
        "a start off the slots",
    );
    assert!(
        err.contains("a booking starts on a 30m slot") && err.contains("23:10 is not on one; use 23:00 or 23:30"),
        "{err}"
    );
    let err = refused(
        &e.gantry_user(&bob, &["book", "--at", "teatime", "--for", "1h"]),
        "a bad --at",
    );
    assert!(err.contains("\"teatime\" is not a time"), "{err}");

    // root may cancel it; it stays in the history.
    ok(&e.gantry(&["book", "cancel", &id.to_string()]), "root cancelling");
    let all = e.json_as(&alice, &["bookings", "--all"]);
    let row = all["bookings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"].as_i64() == Some(id))
        .expect("a cancelled booking is kept")
        .clone();
    assert_eq!(
        (row["state"].as_str(), row["closed_why"].as_str()),
        (Some("cancelled"), Some("cancelled by root"))
    );
    // Cancelled, it no longer counts: bob's 2-GPU booking now fits.
    e.json_as(&bob, &["book", "--gpus", "2", "--at", &at, "--for", "1h"]);
}

/// `14:00` in this machine's local time (the CLI reads `--at` in it).
fn local_hhmm(ms: i64) -> String {
    gantry_core::units::local_hhmm(ms)
}
