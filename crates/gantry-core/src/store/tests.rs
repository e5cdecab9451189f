use super::*;
use crate::spec::{validate_text, Format, Origin, ValidJob};

fn vj(t: &str) -> ValidJob {
    validate_text(t, Format::Yaml, &Origin::default()).unwrap()
}
fn owner() -> Owner {
    Owner {
        uid: 1000,
        gid: 1000,
        name: "ada".into(),
    }
}

#[test]
fn fair_share_weighs_each_attempt_by_its_gpus_worth() {
    let h = 3_600_000;
    let now = 10 * h;
    // (owner, worth, start, end): an hour of a CPU-only job worth half a GPU, two hours of 1 GPU.
    let rows = vec![
        ("ada".to_string(), 0.5, now - h, Some(now)),
        ("bob".to_string(), 1.0, now - 2 * h, None),
    ];
    let u = super::decayed_worth(&rows, now, 1000 * h);
    assert!((u["ada"] - 0.5).abs() < 0.01 && (u["bob"] - 2.0).abs() < 0.01, "{u:?}");
    assert!(
        super::decayed_worth(&[("ada".to_string(), 1.0, 0, Some(h))], now, h)["ada"] < 0.01,
        "decayed over 9 half-lives"
    );
}

#[test]
fn job_lifecycle_is_recorded_with_events() {
    let mut s = Store::open_in_memory().unwrap();
    let id = s
        .insert_job(&vj("image: a\ngpus: 1\n"), &owner(), "cli", None, |_, _| None)
        .unwrap();
    let a = s.begin_attempt(id, &[0], &["GPU-x".into()]).unwrap().unwrap();
    assert!(
        s.begin_attempt(id, &[1], &[]).unwrap().is_none(),
        "a job must never start twice"
    );
    assert!(s.set_running(id).unwrap());
    let end = Ending {
        exit_code: Some(0),
        reason: EndReason::Exited,
        message: None,
        next: JobState::Succeeded,
        not_before: None,
    };
    s.end_attempt(id, a.id, &end).unwrap();
    s.end_attempt(
        id,
        a.id,
        &Ending {
            exit_code: Some(3),
            ..end
        },
    )
    .unwrap();
    let j = s.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.exit_code, j.attempts), (JobState::Succeeded, Some(0), 1));
    let ev: Vec<String> = s.events(id).unwrap().into_iter().map(|e| e.to).collect();
    assert_eq!(ev, ["queued", "starting", "running", "succeeded"]);
    let h = s.history(&HistoryFilter::default()).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].gpu_uuids, vec!["GPU-x"]);
}

/// A run handle is written into the attempt's columns and read back as it was, for both backends;
/// a row that holds the older text form `slurm:ID_TASK` in `container_id` reads as a Slurm run.
#[test]
fn run_refs_round_trip_through_the_attempts_columns() {
    let mut s = Store::open_in_memory().unwrap();
    let rows = [
        RunRef::Container("3f2a9c0d1e".into()),
        RunRef::Slurm { id: 42, task: None },
        RunRef::Slurm { id: 56, task: Some(3) },
    ];
    for run in rows {
        let id = s
            .insert_job(&vj("image: a\ngpus: 0\n"), &owner(), "cli", None, |_, _| None)
            .unwrap();
        let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
        assert_eq!(a.run_ref(), None, "nothing recorded yet");
        s.set_run(a.id, &run).unwrap();
        let back = s.open_attempt(id).unwrap().unwrap();
        assert_eq!(back.run_ref(), Some(run.clone()), "{run:?}");
        // The wire form (Attempt's JSON) keeps its fields: a container id, or Slurm's id and task.
        match &run {
            RunRef::Container(c) => assert_eq!(
                (back.container_id.as_deref(), back.slurm_job_id),
                (Some(c.as_str()), None)
            ),
            RunRef::Slurm { id, task } => assert_eq!(
                (back.container_id.as_deref(), back.slurm_job_id, back.slurm_array_task),
                (None, Some(*id), *task)
            ),
        }
    }
    let id = s
        .insert_job(&vj("image: a\ngpus: 0\n"), &owner(), "cli", None, |_, _| None)
        .unwrap();
    let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
    s.conn
        .execute("UPDATE attempts SET container_id = 'slurm:77_1' WHERE id = ?1", [a.id])
        .unwrap();
    assert_eq!(
        s.open_attempt(id).unwrap().unwrap().run_ref(),
        Some(RunRef::Slurm { id: 77, task: Some(1) })
    );
    assert_eq!(RunRef::Slurm { id: 77, task: Some(1) }.to_string(), "77_1");
    assert_eq!(RunRef::Slurm { id: 77, task: None }.to_string(), "77");
}

#[test]
fn cancel_queued_is_immediate_and_blocks_start() {
    let mut s = Store::open_in_memory().unwrap();
    let id = s
        .insert_job(&vj("image: a\n"), &owner(), "cli", None, |_, _| None)
        .unwrap();
    assert_eq!(s.request_cancel(id).unwrap(), Some(JobState::Queued));
    assert_eq!(s.job(id).unwrap().unwrap().state, JobState::Cancelled);
    assert!(s.begin_attempt(id, &[0], &[]).unwrap().is_none());
    assert_eq!(s.request_cancel(999).unwrap(), None);
}

#[test]
fn survives_reopen_and_filters_history() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    {
        let mut s = Store::open(&p).unwrap();
        for (i, name) in ["alpha", "beta", "gamma"].iter().enumerate() {
            let id = s
                .insert_job(
                    &vj(&format!("name: {name}\nimage: img{i}\n")),
                    &Owner {
                        name: if i == 0 { "bob".into() } else { "ada".into() },
                        ..owner()
                    },
                    "cli",
                    None,
                    |_, _| None,
                )
                .unwrap();
            let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
            let next = if i == 2 { JobState::Failed } else { JobState::Succeeded };
            s.end_attempt(
                id,
                a.id,
                &Ending {
                    exit_code: Some(i as i64),
                    reason: EndReason::Exited,
                    message: None,
                    next,
                    not_before: None,
                },
            )
            .unwrap();
        }
        s.insert_job(&vj("image: q\n"), &owner(), "cli", None, |_, _| None)
            .unwrap();
    }
    let mut s = Store::open(&p).unwrap();
    assert_eq!(s.active_jobs().unwrap().len(), 1);
    let mut f = |f: HistoryFilter| s.history(&f).unwrap().into_iter().map(|r| r.name).collect::<Vec<_>>();
    assert_eq!(f(HistoryFilter::default()), ["gamma", "beta", "alpha"]);
    assert_eq!(
        f(HistoryFilter {
            user: Some("bob".into()),
            ..Default::default()
        }),
        ["alpha"]
    );
    assert_eq!(
        f(HistoryFilter {
            status: Some(JobState::Failed),
            ..Default::default()
        }),
        ["gamma"]
    );
    assert_eq!(
        f(HistoryFilter {
            text: Some("img1".into()),
            ..Default::default()
        }),
        ["beta"]
    );
    assert_eq!(
        f(HistoryFilter {
            limit: Some(1),
            offset: Some(1),
            ..Default::default()
        }),
        ["beta"]
    );
}

#[test]
fn held_jobs_stay_queued_until_released() {
    let mut s = Store::open_in_memory().unwrap();
    let id = s
        .insert_job(&vj("image: a\n"), &owner(), "cli", None, |_, _| None)
        .unwrap();
    assert!(s.set_held(id, true, "ada").unwrap());
    assert!(!s.set_held(id, true, "ada").unwrap(), "holding twice changes nothing");
    assert!(s.queued_rows().unwrap()[0].held);
    assert!(
        s.begin_attempt(id, &[0], &[]).unwrap().is_none(),
        "a held job must not start"
    );
    assert!(s.set_held(id, false, "root").unwrap());
    assert!(!s.queued_rows().unwrap()[0].held);
    let ev: Vec<Option<String>> = s.events(id).unwrap().into_iter().map(|e| e.message).collect();
    assert_eq!(ev[1..], [Some("held by ada".into()), Some("released by root".into())]);
    let a = s.begin_attempt(id, &[0], &[]).unwrap().unwrap();
    s.end_attempt(
        id,
        a.id,
        &Ending {
            exit_code: Some(0),
            reason: EndReason::Exited,
            message: None,
            next: JobState::Succeeded,
            not_before: None,
        },
    )
    .unwrap();
    assert!(!s.set_held(id, true, "ada").unwrap(), "only queued jobs can be held");
    assert!(!s.set_held(999, true, "ada").unwrap());
}

#[test]
fn retry_requeues_with_backoff() {
    let mut s = Store::open_in_memory().unwrap();
    let id = s
        .insert_job(&vj("image: a\nretries: 1\n"), &owner(), "cli", None, |_, _| None)
        .unwrap();
    let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
    s.end_attempt(
        id,
        a.id,
        &Ending {
            exit_code: Some(1),
            reason: EndReason::Exited,
            message: None,
            next: JobState::Queued,
            not_before: Some(123),
        },
    )
    .unwrap();
    let j = s.job(id).unwrap().unwrap();
    assert_eq!(
        (j.state, j.not_before, j.finished_at),
        (JobState::Queued, Some(123), None)
    );
    let a2 = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
    assert_eq!(a2.n, 2);
}

#[test]
fn retention_deletes_only_jobs_that_ended_before_the_cutoff() {
    let mut s = Store::open_in_memory().unwrap();
    let end = |s: &mut Store, id: i64, next: JobState| {
        let a = s.begin_attempt(id, &[0], &[]).unwrap().unwrap();
        s.end_attempt(
            id,
            a.id,
            &Ending {
                exit_code: Some(0),
                reason: EndReason::Exited,
                message: None,
                next,
                not_before: None,
            },
        )
        .unwrap();
    };
    let job = |s: &mut Store| {
        s.insert_job(&vj("image: a\n"), &owner(), "cli", None, |_, _| None)
            .unwrap()
    };
    let (ok, failed, cancelled, queued, held, running, retrying) = (
        job(&mut s),
        job(&mut s),
        job(&mut s),
        job(&mut s),
        job(&mut s),
        job(&mut s),
        job(&mut s),
    );
    end(&mut s, ok, JobState::Succeeded);
    end(&mut s, failed, JobState::Failed);
    s.request_cancel(cancelled).unwrap();
    s.set_held(held, true, "ada").unwrap();
    s.begin_attempt(running, &[1], &[]).unwrap().unwrap();
    end(&mut s, retrying, JobState::Queued);
    // Table: cutoff -> jobs listed as ended before it.
    let later = now_ms() + 60_000;
    for (cutoff, want) in [(0, vec![]), (later, vec![ok, failed, cancelled])] {
        assert_eq!(s.ended_before(cutoff).unwrap(), want, "cutoff {cutoff}");
    }
    // Even when asked to, jobs that have not ended stay.
    let all = vec![ok, failed, cancelled, queued, held, running, retrying, 999];
    assert_eq!(s.delete_ended(&all).unwrap(), vec![ok, failed, cancelled]);
    for id in [queued, held, running, retrying] {
        assert!(s.job(id).unwrap().is_some(), "job {id} must stay");
    }
    assert!(s.job(ok).unwrap().is_none() && s.attempts(ok).unwrap().is_empty() && s.events(ok).unwrap().is_empty());
    assert_eq!(s.active_jobs().unwrap().len(), 4);
}

#[test]
fn usage_sums_match_history_and_clip_to_the_window() {
    let mut s = Store::open_in_memory().unwrap();
    let mut ids = vec![];
    for (who, gpus) in [("ada", "2"), ("ada", "1"), ("bob", "0"), ("bob", "1")] {
        let id = s
            .insert_job(
                &vj(&format!("image: a\ngpus: {gpus}\n")),
                &Owner {
                    name: who.into(),
                    ..owner()
                },
                "cli",
                None,
                |_, _| None,
            )
            .unwrap();
        let g: Vec<u32> = (0..gpus.parse().unwrap()).collect();
        let a = s.begin_attempt(id, &g, &[]).unwrap().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3));
        s.end_attempt(
            id,
            a.id,
            &Ending {
                exit_code: Some(0),
                reason: EndReason::Exited,
                message: None,
                next: JobState::Succeeded,
                not_before: None,
            },
        )
        .unwrap();
        ids.push(id);
    }
    let now = now_ms() + 1;
    let r = usage_report(
        0,
        now,
        86_400_000,
        &s.usage_since(0).unwrap(),
        &s.finished_since(0).unwrap(),
        &s.waits_since(0).unwrap(),
    );
    let hist = s.history(&HistoryFilter::default()).unwrap();
    for u in &r.users {
        let rows: Vec<&HistoryRow> = hist.iter().filter(|h| h.owner == u.user).collect();
        let hours: f64 = rows
            .iter()
            .map(|h| (h.finished_at.unwrap() - h.started_at.unwrap()) as f64 / 3_600_000.0 * h.gpus.len() as f64)
            .sum();
        // Summed in another order than the store's: equal up to rounding, relative to the size.
        assert!(
            (u.gpu_hours - hours).abs() <= 1e-9 * hours.abs().max(1.0),
            "{}: {} vs history {hours}",
            u.user,
            u.gpu_hours
        );
        assert_eq!(u.jobs_finished, rows.len() as u64);
        assert!(u.mean_wait_ms.is_some() && u.fair_share_usage > 0.0 || u.user == "bob");
    }
    assert_eq!(
        r.users.iter().map(|u| u.user.as_str()).collect::<Vec<_>>(),
        ["ada", "bob"],
        "most GPU-hours first"
    );
    // Clipping: an attempt 0..10h with 2 GPUs, window from 6h to 8h (still running at 8h) -> 4 GPU-hours.
    let h = 3_600_000;
    let r = usage_report(
        6 * h,
        8 * h,
        h,
        &[("cy".into(), 2, 0, None), ("cy".into(), 1, 0, Some(5 * h))],
        &[],
        &[("cy".into(), 10), ("cy".into(), 20)],
    );
    assert_eq!((r.users[0].gpu_hours, r.users[0].mean_wait_ms), (4.0, Some(15)));
    // Fair share: the finished attempt (5 GPU-hours, ended 3 half-lives ago) counts 1/8; the running one in full.
    assert!(
        (r.users[0].fair_share_usage - (16.0 + 5.0 / 8.0)).abs() < 1e-9,
        "{}",
        r.users[0].fair_share_usage
    );
}

fn finish(s: &mut Store, id: i64, next: JobState) {
    let a = s.begin_attempt(id, &[0], &[]).unwrap().unwrap();
    s.end_attempt(
        id,
        a.id,
        &Ending {
            exit_code: Some(0),
            reason: EndReason::Exited,
            message: None,
            next,
            not_before: None,
        },
    )
    .unwrap();
}

#[test]
fn every_page_of_every_sort_and_filter_matches_the_full_ordering() {
    let mut s = Store::open_in_memory().unwrap();
    // More than BROAD_FILTER runs: broad filters walk the sort key's index, narrow ones do not.
    s.seed_completed_runs(2600).unwrap();
    let all = s
        .history(&HistoryFilter {
            limit: Some(10_000),
            sort: Some("id".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(all.len(), 2600);
    type Pred = Box<dyn Fn(&HistoryRow) -> bool>;
    let text = |t: &'static str| -> Pred {
        Box::new(move |r: &HistoryRow| r.name.to_lowercase().contains(t) || r.image.to_lowercase().contains(t))
    };
    let filters: Vec<(HistoryFilter, Pred)> = vec![
        (HistoryFilter::default(), Box::new(|_| true)),
        (
            HistoryFilter {
                status: Some(JobState::Succeeded),
                ..Default::default()
            },
            Box::new(|r| r.status == JobState::Succeeded),
        ),
        (
            HistoryFilter {
                status: Some(JobState::Failed),
                ..Default::default()
            },
            Box::new(|r| r.status == JobState::Failed),
        ),
        (
            HistoryFilter {
                user: Some("ada".into()),
                ..Default::default()
            },
            Box::new(|r| r.owner == "ada"),
        ),
        (
            HistoryFilter {
                text: Some("XP-1".into()),
                ..Default::default()
            },
            text("xp-1"),
        ),
        (
            HistoryFilter {
                text: Some("g3".into()),
                ..Default::default()
            },
            text("g3"),
        ),
    ];
    for (f, keep) in &filters {
        let rows: Vec<&HistoryRow> = all.iter().filter(|r| keep(r)).collect();
        let total = rows.len();
        assert_eq!(s.history_count(f).unwrap(), total as i64, "{f:?}");
        for sort in ["id", "name", "owner", "finished", "started", "exit_code"] {
            let mut want = rows.clone();
            want.sort_by(|a, b| {
                let k = match sort {
                    "name" => a.name.cmp(&b.name),
                    "owner" => a.owner.cmp(&b.owner),
                    "finished" => a.finished_at.cmp(&b.finished_at),
                    "started" => a.started_at.cmp(&b.started_at),
                    "exit_code" => a.exit_code.cmp(&b.exit_code),
                    _ => std::cmp::Ordering::Equal,
                };
                k.then(a.id.cmp(&b.id))
            });
            for asc in [true, false] {
                let want: Vec<i64> = if asc {
                    want.iter().map(|r| r.id).collect()
                } else {
                    want.iter().rev().map(|r| r.id).collect()
                };
                for offset in [
                    0,
                    150,
                    total / 2 - 10,
                    total / 2 + 1,
                    total.saturating_sub(90),
                    total - 10,
                    total,
                    total + 5,
                ] {
                    let page = HistoryFilter {
                        sort: Some(sort.into()),
                        asc: Some(asc),
                        offset: Some(offset as u32),
                        limit: Some(100),
                        ..f.clone()
                    };
                    let got: Vec<i64> = s.history(&page).unwrap().into_iter().map(|r| r.id).collect();
                    assert_eq!(got, want[offset.min(total)..(offset + 100).min(total)], "{page:?}");
                }
            }
        }
    }
}

#[test]
fn text_search_is_a_literal_case_insensitive_substring_of_name_or_image() {
    let mut s = Store::open_in_memory().unwrap();
    let mut ids = vec![];
    for (name, image) in [
        ("a_b%c-train", "pytorch:2"),
        ("axbyc-train", "jax:1"),
        ("eval", "Py_Torch:3"),
        ("draft", "x:1"),
    ] {
        let id = s
            .insert_job(
                &vj(&format!("name: {name}\nimage: {image}\n")),
                &owner(),
                "cli",
                None,
                |_, _| None,
            )
            .unwrap();
        finish(&mut s, id, JobState::Succeeded);
        ids.push(id);
    }
    // Renamed once its id is known (templates): found by its new name only.
    let renamed = s
        .insert_job(&vj("name: old-name\nimage: x:1\n"), &owner(), "cli", None, |_, j| {
            Some(ValidJob {
                name: "fresh-name".into(),
                ..j.clone()
            })
        })
        .unwrap();
    finish(&mut s, renamed, JobState::Succeeded);
    // Table: text -> the jobs it finds.
    for (text, want) in [
        ("_b%", vec![ids[0]]),
        ("TRAIN", vec![ids[0], ids[1]]),
        ("py_torch", vec![ids[2]]),
        ("pytorch", vec![ids[0]]),
        ("b%", vec![ids[0]]),
        ("%", vec![ids[0]]),
        ("old-name", vec![]),
        ("fresh", vec![renamed]),
        ("", vec![ids[0], ids[1], ids[2], ids[3], renamed]),
    ] {
        let f = HistoryFilter {
            text: Some(text.into()),
            sort: Some("id".into()),
            asc: Some(true),
            ..Default::default()
        };
        let got: Vec<i64> = s.history(&f).unwrap().into_iter().map(|r| r.id).collect();
        assert_eq!(got, want, "text {text:?}");
        assert_eq!(s.history_count(&f).unwrap(), want.len() as i64, "count for {text:?}");
    }
}

#[test]
fn cached_history_counts_equal_a_fresh_count_through_changes() {
    let mut s = Store::open_in_memory().unwrap();
    s.seed_completed_runs(300).unwrap();
    let mid = s
        .history(&HistoryFilter {
            sort: Some("id".into()),
            asc: Some(true),
            offset: Some(150),
            limit: Some(1),
            ..Default::default()
        })
        .unwrap()[0]
        .finished_at;
    let later = now_ms() + 3_600_000;
    let filters = [
        HistoryFilter::default(),
        HistoryFilter {
            status: Some(JobState::Succeeded),
            ..Default::default()
        },
        HistoryFilter {
            status: Some(JobState::Cancelled),
            ..Default::default()
        },
        HistoryFilter {
            user: Some("ada".into()),
            ..Default::default()
        },
        HistoryFilter {
            text: Some("exp-1".into()),
            ..Default::default()
        },
        HistoryFilter {
            text: Some("NEW".into()),
            ..Default::default()
        },
        HistoryFilter {
            image: Some("img2:1".into()),
            ..Default::default()
        },
        HistoryFilter {
            since: mid,
            until: Some(later),
            ..Default::default()
        },
        HistoryFilter {
            user: Some("ada".into()),
            status: Some(JobState::Failed),
            text: Some("exp".into()),
            ..Default::default()
        },
    ];
    let check = |s: &mut Store, step: &str| {
        for f in &filters {
            let fresh = Store::count_matches(&s.conn, f).unwrap();
            assert_eq!(s.history_count(f).unwrap(), fresh, "after {step}: {f:?}");
        }
        let cached: i64 = s
            .conn
            .query_row("SELECT COUNT(*) FROM history_counts", [], |r| r.get(0))
            .unwrap();
        assert_eq!(cached, filters.len() as i64, "every filter's count is cached");
    };
    check(&mut s, "seeding");
    let ada = Owner {
        name: "ada".into(),
        ..owner()
    };
    let q: Vec<i64> = (0..6)
        .map(|i| {
            s.insert_job(
                &vj(&format!("name: new-{i}\nimage: img2:1\nretries: 1\n")),
                &ada,
                "cli",
                None,
                |_, _| None,
            )
            .unwrap()
        })
        .collect();
    check(&mut s, "queueing");
    finish(&mut s, q[0], JobState::Succeeded);
    finish(&mut s, q[1], JobState::Failed);
    check(&mut s, "finishing");
    s.request_cancel(q[2]).unwrap();
    s.fail_queued(q[3], "dependency failed").unwrap();
    finish(&mut s, q[4], JobState::Queued);
    check(&mut s, "cancel, fail and retry");
    let old = s.ended_before(mid.unwrap() + 1).unwrap();
    s.delete_ended(&old[..old.len() / 2]).unwrap();
    s.delete_ended(&[q[0]]).unwrap();
    check(&mut s, "retention");
}

#[test]
fn queue_in_memory_equals_the_database_through_every_transition() {
    enum Op {
        Submit(u32),
        Start(usize),
        Retry(usize),
        Finish(usize),
        Cancel(usize),
        Hold(usize, bool),
        Priority(usize, i32),
        FailQueued(usize),
        Reopen,
    }
    use Op::*;
    let ops = [
        Submit(1000),
        Submit(1001),
        Submit(1000),
        Submit(1002),
        Submit(1001),
        Start(0),
        Hold(1, true),
        Priority(2, 5),
        Cancel(3),
        Retry(0),
        Hold(1, false),
        Priority(1, -3),
        Start(0),
        Finish(0),
        Start(2),
        Cancel(2),
        FailQueued(4),
        Submit(1000),
        Reopen,
        Hold(5, true),
        Cancel(5),
        Submit(1001),
        Start(6),
        Retry(6),
        Reopen,
        Priority(6, 2),
        Start(1),
        Finish(1),
    ];
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    let mut s = Store::open(&p).unwrap();
    let mut q = s.track_queue().unwrap();
    let (mut ids, mut attempts) = (vec![], std::collections::HashMap::new());
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Submit(uid) => {
                let o = Owner {
                    uid,
                    gid: uid,
                    name: format!("u{uid}"),
                };
                ids.push(
                    s.insert_job(&vj("image: a\ngpus: 1\nretries: 3\n"), &o, "cli", None, |_, _| None)
                        .unwrap(),
                );
            }
            Start(i) => {
                attempts.insert(i, s.begin_attempt(ids[i], &[0], &[]).unwrap().unwrap().id);
            }
            Retry(i) | Finish(i) => {
                let next = if matches!(op, Retry(_)) {
                    JobState::Queued
                } else {
                    JobState::Succeeded
                };
                let end = Ending {
                    exit_code: Some(1),
                    reason: EndReason::Exited,
                    message: None,
                    next,
                    not_before: Some(now_ms() + 60_000),
                };
                s.end_attempt(ids[i], attempts[&i], &end).unwrap();
            }
            Cancel(i) => drop(s.request_cancel(ids[i]).unwrap()),
            Hold(i, h) => drop(s.set_held(ids[i], h, "ada").unwrap()),
            Priority(i, p) => drop(s.set_priority(ids[i], p).unwrap()),
            FailQueued(i) => drop(s.fail_queued(ids[i], "dependency failed").unwrap()),
            Reopen => {
                drop(s);
                s = Store::open(&p).unwrap();
                q = s.track_queue().unwrap();
            }
        }
        let db: Vec<String> = s
            .queued_rows()
            .unwrap()
            .into_iter()
            .map(|r| format!("{r:?}"))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mem: Vec<String> = q
            .lock()
            .unwrap()
            .rows()
            .iter()
            .map(|r| format!("{r:?}"))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(mem, db, "step {step}");
        for uid in [1000, 1001, 1002] {
            let n: i64 = s
                .conn
                .query_row(
                    "SELECT COUNT(*) FROM jobs WHERE owner_uid = ?1 AND state = 'queued'",
                    [uid],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(
                s.queued_count(uid).unwrap(),
                n as usize,
                "step {step}: queued jobs of {uid}"
            );
        }
    }
    assert!(!q.lock().unwrap().is_stale());
}
