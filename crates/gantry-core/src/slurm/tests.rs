use std::collections::HashMap;

use super::*;
use crate::outcome::How;
use crate::spec::{validate_text, Format, Origin, ValidJob};

fn job(yaml: &str) -> ValidJob {
    validate_text(yaml, Format::Yaml, &Origin::default()).unwrap()
}

fn sub(j: &ValidJob) -> Submission<'_> {
    Submission {
        job: j,
        marker: "gantry:db:7:1".into(),
        uid: 1001,
        gid: 1001,
        home: "/home/ann".into(),
        output: "/logs/1001/db-7-a1.out".into(),
        priority_range: (-10, 10),
        after: vec![],
        mounts: vec![],
        metrics: None,
        preempt: None,
        restarts: 0,
    }
}

#[test]
fn spec_to_sbatch_table() {
    let base = [
        "--parsable",
        "--comment=gantry:db:7:1",
        "--export=NONE",
        "--chdir=/home/ann",
        "--output=/logs/1001/db-7-a1.out",
    ];
    let set = Settings {
        partition: Some("gpu".into()),
        account: Some("lab".into()),
        qos: Some("normal".into()),
        ..Default::default()
    };
    let def = Settings::default();
    let shard = Settings {
        shard_memory: Some(10 << 30),
        ..Default::default()
    };
    // (spec, settings, after, expected extra arguments, or the refusal's text)
    #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
    let rows: Vec<(&str, &Settings, Vec<&str>, Result<Vec<&str>, &str>)> = vec![
        (
            "name: t\nimage: a\ngpus: 2\n",
            &def,
            vec![],
            Ok(vec!["--job-name=t", "--gres=gpu:2", "--nice=1000"]),
        ),
        (
            "name: t\nimage: a\ngpus: 0\n",
            &def,
            vec![],
            Ok(vec!["--job-name=t", "--nice=1000"]),
        ),
        (
            "name: my run\nimage: a\ngpus: 1\ngpu_type: A100\n",
            &def,
            vec![],
            Ok(vec!["--job-name=my_run", "--gres=gpu:a100:1", "--nice=1000"]),
        ),
        (
            "name: t\nimage: a\ngpus: 1\ncpus: 2.5\nmemory: 3GiB\ntimeout: 90s\n",
            &set,
            vec![],
            Ok(vec![
                "--job-name=t",
                "--partition=gpu",
                "--account=lab",
                "--qos=normal",
                "--gres=gpu:1",
                "--cpus-per-task=3",
                "--mem=3072M",
                "--time=2",
                "--nice=1000",
            ]),
        ),
        (
            "name: t\nimage: a\ngpus: 1\npriority: -10\n",
            &def,
            vec![],
            Ok(vec!["--job-name=t", "--gres=gpu:1", "--nice=2000"]),
        ),
        (
            "name: t\nimage: a\ngpus: 1\npriority: 0\n",
            &def,
            vec![],
            Ok(vec!["--job-name=t", "--gres=gpu:1", "--nice=1000"]),
        ),
        (
            "name: t\nimage: a\ngpus: 1\npriority: 10\n",
            &def,
            vec![],
            Ok(vec!["--job-name=t", "--gres=gpu:1"]),
        ),
        (
            "name: t\nimage: a\ngpus: 1\n",
            &def,
            vec!["11", "12_3"],
            Ok(vec![
                "--job-name=t",
                "--gres=gpu:1",
                "--nice=1000",
                "--dependency=afterok:11:12_3",
                "--kill-on-invalid-dep=yes",
            ]),
        ),
        (
            "name: t\nimage: a\ngpu_memory: 15GiB\n",
            &shard,
            vec![],
            Ok(vec!["--job-name=t", "--gres=shard:2", "--nice=1000"]),
        ),
        (
            "name: t\nimage: a\ngpu_memory: 15GiB\n",
            &def,
            vec![],
            Err("needs Slurm's `shard` GRES"),
        ),
        (
            "name: t\nimage: a\ngpus: 1\nmin_gpu_memory: 40GiB\n",
            &def,
            vec![],
            Err("no Slurm equivalent"),
        ),
        (
            "name: t\nimage: --privileged\ncommand: [alpine, sh]\n",
            &def,
            vec![],
            Err("starts with '-'"),
        ),
    ];
    for (spec, set, after, want) in rows {
        let j = job(spec);
        let s = Submission {
            after: after.into_iter().map(String::from).collect(),
            ..sub(&j)
        };
        match (sbatch_args(&s, set), want) {
            (Ok(got), Ok(extra)) => {
                let mut want: Vec<String> = base.iter().map(|s| s.to_string()).collect();
                want.splice(1..1, [extra[0].to_string()]);
                want.extend(extra[1..].iter().map(|s| s.to_string()));
                assert_eq!(got, want, "{spec}");
            }
            (Err(e), Err(text)) => assert!(e.0.contains(text), "{spec}: {e}"),
            (got, want) => panic!("{spec}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn sessions_ports_and_image_less_jobs_are_refused_for_slurm() {
    for (yaml, want) in [
        ("image: a\ninteractive: true\n", "interactive sessions"),
        ("image: a\nports: [8888]\n", "`ports`"),
        ("command: 'true'\n", "without an image"),
    ] {
        let j = job(yaml);
        let e = sbatch_args(&sub(&j), &Settings::default()).unwrap_err();
        assert!(e.0.contains(want), "{yaml:?}: {}", e.0);
    }
}

#[test]
fn priority_maps_linearly_onto_non_negative_nice() {
    let rows = [(10, 0), (5, 500), (0, 1000), (-10, 2000), (1000, 0), (-1000, 2000)];
    for (p, nice) in rows {
        assert_eq!(nice_for(p, (-10, 10), 2000), nice, "priority {p}");
    }
    assert_eq!(nice_for(3, (0, 0), 2000), 0);
}

#[test]
fn batch_script_runs_the_container_as_the_owner_with_slurms_gpus() {
    let j = job("name: t\nimage: reg/img:1\ncommand: [python, train.py, \"it's\"]\ngpus: 2\nmemory: 1GiB\nenv: {A: b, CUDA_VISIBLE_DEVICES: '5'}\n");
    let mut s = sub(&j);
    s.mounts = vec![crate::access::ResolvedMount {
        host: "/data/x y".into(),
        container: "/data".into(),
        read_only: true,
    }];
    let d = batch_script(&s, 7, 1, Runtime::Docker);
    for want in [
        "docker run --name \"$name\" --init",
        "--user 1001:1001",
        "--cap-drop ALL",
        "set -- --gpus \"\\\"device=$gpus\\\"\"",
        "-e CUDA_VISIBLE_DEVICES=\"$visible\"",
        "--memory 1073741824",
        "--mount 'type=bind,source=/data/x y,target=/data,readonly'",
        "-e 'A=b'",
        "-e 'GANTRY_JOB_ID=7'",
        "'reg/img:1' \\\n  'python' \\\n  'train.py' \\\n  'it'\\''s'",
        "trap 'docker stop",
        "docker rm -f \"$name\"",
    ] {
        assert!(d.contains(want), "docker script lacks {want:?}:\n{d}");
    }
    assert!(
        !d.contains("CUDA_VISIBLE_DEVICES=5"),
        "the spec must not pick the GPUs:\n{d}"
    );
    let a = batch_script(&s, 7, 1, Runtime::Apptainer);
    assert!(
        a.contains("apptainer exec --nv")
            && a.contains("'docker://reg/img:1'")
            && a.contains("--bind '/data/x y:/data:ro'"),
        "{a}"
    );
}

#[test]
fn slurm_states_to_gantry_table() {
    use How::*;
    // (state, reason, exit, started, stopped by gantry, expected)
    #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
    let rows: Vec<(&str, &str, Option<i64>, bool, Option<Stop>, Seen)> = vec![
        (
            "PENDING",
            "Resources",
            None,
            false,
            None,
            Seen::Pending("waiting for GPUs, CPUs or memory to free up in Slurm (Resources)".into()),
        ),
        (
            "PENDING",
            "Priority",
            None,
            false,
            None,
            Seen::Pending("other jobs come first in Slurm's order (Priority)".into()),
        ),
        (
            "PENDING",
            "QOSMaxGRESPerUser",
            None,
            false,
            None,
            Seen::Pending("you already hold the most GPUs your QOS allows per user (QOSMaxGRESPerUser)".into()),
        ),
        (
            "PENDING",
            "Licenses",
            None,
            false,
            None,
            Seen::Pending("waiting in Slurm (Licenses)".into()),
        ),
        ("RUNNING", "None", None, true, None, Seen::Running),
        ("COMPLETING", "None", None, true, None, Seen::Running),
        (
            "COMPLETED",
            "None",
            Some(0),
            true,
            None,
            Seen::Ended(Exited { code: 0, oom: false }),
        ),
        (
            "FAILED",
            "NonZeroExitCode",
            Some(3),
            true,
            None,
            Seen::Ended(Exited { code: 3, oom: false }),
        ),
        (
            "OUT_OF_MEMORY",
            "OutOfMemory",
            Some(137),
            true,
            None,
            Seen::Ended(Exited { code: 137, oom: true }),
        ),
        (
            "TIMEOUT",
            "TimeLimit",
            Some(143),
            true,
            None,
            Seen::Ended(TimedOut {
                code: Some(143),
                timeout_ms: 60_000,
            }),
        ),
        (
            "CANCELLED",
            "None",
            Some(143),
            true,
            Some(Stop::Timeout),
            Seen::Ended(TimedOut {
                code: Some(143),
                timeout_ms: 60_000,
            }),
        ),
        (
            "CANCELLED",
            "None",
            Some(143),
            true,
            Some(Stop::Cancel),
            Seen::Ended(Cancelled { code: Some(143) }),
        ),
        (
            "CANCELLED",
            "None",
            None,
            false,
            Some(Stop::Cancel),
            Seen::Ended(CancelledBeforeStart),
        ),
        (
            "CANCELLED",
            "DependencyNeverSatisfied",
            None,
            false,
            None,
            Seen::Ended(Refused(
                "a job it runs after did not succeed, so Slurm cancelled it".into(),
            )),
        ),
        (
            "NODE_FAIL",
            "None",
            None,
            true,
            None,
            Seen::Ended(Lost("Slurm ended it: NODE_FAIL".into())),
        ),
        // Slurm's own preemption: recorded as a preemption (queued again, retries untouched).
        (
            "PREEMPTED",
            "None",
            Some(0),
            true,
            None,
            Seen::Ended(Preempted {
                code: Some(0),
                by: "Slurm (the cluster's own preemption)".into(),
            }),
        ),
    ];
    for (state, reason, exit, started, stop, want) in rows {
        assert_eq!(
            seen(state, reason, exit, started, stop, Some(60_000)),
            want,
            "{state} {reason}"
        );
    }
}

#[test]
fn an_oom_kill_is_told_by_the_scripts_last_line() {
    let oom = format!("out\n{OOM_LINE}\n");
    assert_eq!(
        oom_from_output(How::Exited { code: 137, oom: false }, oom.as_bytes()),
        How::Exited { code: 137, oom: true }
    );
    assert_eq!(
        oom_from_output(How::Exited { code: 137, oom: false }, b"killed\n"),
        How::Exited { code: 137, oom: false }
    );
    assert_eq!(
        oom_from_output(How::Exited { code: 1, oom: false }, oom.as_bytes()),
        How::Exited { code: 1, oom: false }
    );
}

#[test]
fn a_matrix_is_one_array_whose_tasks_are_found_by_task_id() {
    let (a, b) = (
        job("name: s[lr=1]\nimage: a\ncommand: echo 1\n"),
        job("name: s[lr=2]\nimage: a\ncommand: echo 2\n"),
    );
    let script = array_script(
        &[(0, sub(&a), 7), (1, sub(&b), 8)],
        "gantry:db:array:g",
        Runtime::Docker,
    );
    assert!(
        script.contains("case \"${SLURM_ARRAY_TASK_ID:-}\" in\n0)\n")
            && script.contains("'GANTRY_JOB_ID=8'")
            && script.contains("'echo 2'"),
        "{script}"
    );
    assert_eq!(array_arg(&[0, 2, 5]), "--array=0,2,5");
    assert_eq!(task_list("2,5"), vec![2, 5]);
    assert_eq!(task_list("1-3%2"), vec![1, 2, 3]);
    assert_eq!(task_list("0-6:3"), vec![0, 3, 6]);
    let sq = br#"{"jobs":[{"job_id":57,"job_state":"RUNNING","array_job_id":56,"array_task_id":0,"array_task_string":""},
        {"job_id":56,"job_state":"PENDING","state_reason":"Resources","array_job_id":56,"array_task_id":null,"array_task_string":"2,5"}]}"#;
    let jobs: HashMap<u64, SqJob> = parse_squeue(sq).unwrap().into_iter().map(|j| (j.job_id, j)).collect();
    assert_eq!(find_job(&jobs, 56, Some(0)).map(|j| j.job_id), Some(57));
    assert_eq!(find_job(&jobs, 56, Some(5)).map(|j| j.state()), Some("PENDING".into()));
    assert_eq!(find_job(&jobs, 56, Some(3)), None);
    assert_eq!(find_job(&jobs, 57, None).map(|j| j.job_id), Some(57));
    let log = "JobId=58 UserId=t(1) Name=wrap JobState=FAILED StartTime=2026-11-30T16:14:11 ArrayJobId=56 ArrayTaskId=2 DerivedExitCode=0:0 ExitCode=4:0 \n";
    assert_eq!(
        parse_jobcomp_of(log, 56, Some(2), 1).map(|c| (c.state, c.exit)),
        Some(("FAILED".into(), Some(4)))
    );
    assert_eq!(parse_jobcomp_of(log, 56, Some(0), 1), None);
}

#[test]
fn restart_reconciliation_table() {
    // (recorded id, jobs found by marker, action)
    let rows = [
        (Some(5), vec![], Resume::Follow(5)),
        (Some(5), vec![5], Resume::Follow(5)),
        (None, vec![9], Resume::Adopt(9)),
        (None, vec![], Resume::NeverSubmitted),
    ];
    for (rec, found, want) in rows {
        assert_eq!(resume(rec, &found), want, "{rec:?} {found:?}");
    }
}

#[test]
fn squeue_json_of_slurm_22_05_and_later() {
    let j = br#"{"meta":{},"jobs":[{"job_id":12,"job_state":"FAILED","state_reason":"NonZeroExitCode","exit_code":768,"comment":"gantry:db:7:1","name":"t","user_name":"ann","start_time":1700000000,"gres_detail":["gpu:2(IDX:0-1)"],"extra":1},
        {"job_id":13,"job_state":["CANCELLED"],"exit_code":{"status":["SIGNALED"],"return_code":{"set":true,"number":0},"signal":{"id":{"set":true,"number":15}}},"start_time":{"set":true,"number":0}}]}"#;
    let jobs = parse_squeue(j).unwrap();
    assert_eq!(
        (
            jobs[0].state(),
            jobs[0].exit(),
            jobs[0].gpu_indexes(),
            jobs[0].started_at_s()
        ),
        ("FAILED".into(), Some(3), vec![0, 1], Some(1700000000))
    );
    assert_eq!(
        (jobs[1].state(), jobs[1].exit(), jobs[1].started_at_s()),
        ("CANCELLED".into(), Some(143), None)
    );
    assert_eq!(decode_wait_status(9), 137);
    assert_eq!(gpu_indexes("gpu:a100:3(IDX:0,2-3)"), vec![0, 2, 3]);
}

#[test]
fn jobcomp_and_node_records_are_read_by_key() {
    let log = "JobId=1 UserId=ann(1001) GroupId=ann(1001) Name=my job JobState=FAILED Partition=gpu TimeLimit=1 StartTime=2026-11-30T15:28:47 ExitCode=3:0 \n\
               JobId=2 UserId=ann(1001) Name=x JobState=CANCELLED StartTime=Unknown ExitCode=0:15 \n";
    assert_eq!(
        parse_jobcomp(log, 1, 1001),
        Some(Completed {
            job_id: 1,
            state: "FAILED".into(),
            exit: Some(3),
            started: true
        })
    );
    assert_eq!(
        parse_jobcomp(log, 2, 1001),
        Some(Completed {
            job_id: 2,
            state: "CANCELLED".into(),
            exit: Some(143),
            started: false
        })
    );
    assert_eq!(parse_jobcomp(log, 3, 1001), None);
    let nodes = parse_nodes("NodeName=vm Arch=x86_64 CoresPerSocket=8 Gres=gpu:4 GresUsed=gpu:2(IDX:0-1) State=MIXED ThreadsPerCore=1\nNodeName=n2 Gres=gpu:h100:8(S:0-1) GresUsed=gpu:h100:0(IDX:N/A) State=IDLE\n");
    assert_eq!(
        nodes[0],
        Node {
            name: "vm".into(),
            state: "MIXED".into(),
            gpus: 4,
            gpu_type: None,
            gpus_used: vec![0, 1]
        }
    );
    assert_eq!(
        (nodes[1].gpus, nodes[1].gpu_type.as_deref(), nodes[1].gpus_used.len()),
        (8, Some("h100"), 0)
    );
}

#[test]
fn a_hostile_job_name_in_squeue_does_not_break_tracking() {
    // Slurm passes a name's bytes through unescaped: `sbatch --job-name=$'a\xffb'` by any user.
    let mut j = br#"{"jobs":[{"job_id":1,"job_state":"RUNNING","name":"a"#.to_vec();
    j.push(0xff);
    j.extend_from_slice(br#"b","comment":"x","user_id":1007},{"job_id":2,"job_state":"PENDING","comment":"gantry:db:7:1","user_id":1001}]}"#);
    let jobs = parse_squeue(&j).expect("one user's job name must not stop Gantry reading squeue");
    assert_eq!(jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(), vec![1, 2]);
}

#[test]
fn only_the_owners_slurm_jobs_carry_a_marker() {
    // (jobs in squeue, marker, owner uid, ids found): another user may put Gantry's marker in the
    // comment of their own Slurm job; it is never adopted as the owner's attempt.
    let sq = br#"{"jobs":[{"job_id":30,"job_state":"PENDING","comment":"gantry:db:7:1","user_id":1002},
        {"job_id":31,"job_state":"PENDING","comment":"gantry:db:7:1","user_id":1001},
        {"job_id":40,"job_state":"PENDING","comment":"gantry:db:array:g","user_id":1002,"array_job_id":40,"array_task_id":null},
        {"job_id":41,"job_state":"PENDING","comment":"gantry:db:7:2","user_id":1002}]}"#;
    let jobs = parse_squeue(sq).unwrap();
    let rows: Vec<(&str, u32, Vec<u64>)> = vec![
        ("gantry:db:7:1", 1001, vec![31]),
        ("gantry:db:7:2", 1001, vec![]),
        ("gantry:db:array:g", 1001, vec![]),
        ("gantry:db:array:g", 1002, vec![40]),
    ];
    for (m, uid, want) in rows {
        assert_eq!(marked(&jobs, m, uid), want, "{m} for {uid}");
    }
}

#[test]
fn another_users_jobcomp_record_is_never_taken_for_the_owners() {
    // A name may hold spaces and newlines: user b (1002) forges `JobId=7 ...` lines and array fields.
    let real = "JobId=7 UserId=ann(1001) GroupId=ann(1001) Name=t JobState=FAILED StartTime=2026-11-30T16:39:45 ExitCode=3:0 \n";
    let forged_line = "JobId=9 UserId=b(1002) GroupId=b(1002) Name=x\nJobId=7 UserId=ann(1001) Name=t JobState=COMPLETED StartTime=2026-11-30T16:39:45 ExitCode=0:0 \nJobState=CANCELLED ExitCode=0:0 \n";
    let forged_fields = "JobId=9 UserId=b(1002) GroupId=b(1002) Name=x ArrayJobId=56 ArrayTaskId=2 JobState=COMPLETED StartTime=2026-11-30T16:39:45 ExitCode=0:0 \n";
    let task = "JobId=58 UserId=ann(1001) Name=s JobState=FAILED StartTime=2026-11-30T16:14:11 ArrayJobId=56 ArrayTaskId=2 DerivedExitCode=0:0 ExitCode=4:0 \n";
    // (log, job, task, owner uid, state found)
    #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
    let rows: Vec<(String, u64, Option<u32>, u32, Option<&str>)> = vec![
        (real.into(), 7, None, 1001, Some("FAILED")),
        (real.into(), 7, None, 1002, None),
        (format!("{real}{forged_line}"), 7, None, 1001, None),
        (forged_fields.into(), 56, Some(2), 1001, None),
        (format!("{task}{forged_fields}"), 56, Some(2), 1001, Some("FAILED")),
    ];
    for (log, id, t, uid, want) in rows {
        assert_eq!(
            parse_jobcomp_of(&log, id, t, uid).map(|c| c.state),
            want.map(String::from),
            "{log:?} {id} {t:?} {uid}"
        );
    }
}

#[test]
fn output_is_read_only_from_a_plain_file_the_owner_owns() {
    let d = tempfile::tempdir().unwrap();
    let me = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let u = user_log_dir(d.path(), me, gid).unwrap();
    std::fs::write(u.join("a.out"), "hello\nworld\n").unwrap();
    assert_eq!(read_output(d.path(), me, "a.out", 6).unwrap(), b"world\n");
    std::fs::write(d.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), u.join("b.out")).unwrap();
    assert!(
        read_output(d.path(), me, "b.out", 0).is_err(),
        "a symlink is never followed"
    );
}

/// A preemptible job: `--requeue`, its checkpoint signal to the batch shell `grace` seconds (rounded
/// up, at most 65535) before the time limit, and a time limit past Gantry's own timeout by the grace
/// and a minute (so Slurm's early signal never comes before Gantry's timeout).
#[test]
fn a_preemptible_job_is_submitted_with_requeue_and_its_checkpoint_signal() {
    let ck = |signal: &str, grace_ms: u64| {
        Some(Checkpoint {
            signal: signal.into(),
            grace: std::time::Duration::from_millis(grace_ms),
        })
    };
    // (spec, checkpoint, wanted arguments after the base ones, the script's lines)
    #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
    let rows: Vec<(&str, Option<Checkpoint>, Vec<&str>, Vec<&str>)> = vec![
        (
            "name: t\nimage: a\ngpus: 1\n",
            ck("SIGUSR1", 120_000),
            vec!["--requeue", "--open-mode=append", "--signal=B:USR1@120"],
            vec![
                "trap 'docker kill -s USR1 \"$name\" >/dev/null 2>&1' USR1",
                "trap 'docker stop -t 10 \"$name\" >/dev/null 2>&1' TERM INT",
            ],
        ),
        (
            "name: t\nimage: a\ngpus: 1\n",
            ck("SIGTERM", 1_500),
            vec!["--requeue", "--open-mode=append", "--signal=B:TERM@2"],
            vec!["trap 'docker stop -t 10 \"$name\" >/dev/null 2>&1' TERM INT"],
        ),
        (
            "name: t\nimage: a\ngpus: 1\n",
            ck("SIGTERM", 300_000),
            vec!["--requeue", "--open-mode=append", "--signal=B:TERM@300"],
            vec!["trap 'docker stop -t 300 \"$name\" >/dev/null 2>&1' TERM INT"],
        ),
        (
            "name: t\nimage: a\ngpus: 1\n",
            ck("SIGUSR2", 100_000_000),
            vec!["--requeue", "--open-mode=append", "--signal=B:USR2@65535"],
            vec!["trap 'docker kill -s USR2 \"$name\" >/dev/null 2>&1' USR2"],
        ),
        // The timeout (90 s) plus the grace (120 s) and a minute: 270 s, 5 minutes.
        (
            "name: t\nimage: a\ngpus: 1\ntimeout: 90s\n",
            ck("SIGUSR1", 120_000),
            vec!["--time=5", "--requeue", "--open-mode=append", "--signal=B:USR1@120"],
            vec![],
        ),
        (
            "name: t\nimage: a\ngpus: 1\ntimeout: 90s\n",
            None,
            vec!["--time=2"],
            vec![],
        ),
    ];
    for (spec, c, want, lines) in rows {
        let j = job(spec);
        let s = Submission {
            preempt: c.clone(),
            restarts: 2,
            ..sub(&j)
        };
        let got = sbatch_args(&s, &Settings::default()).unwrap();
        let tail: Vec<&str> = got
            .iter()
            .map(String::as_str)
            .filter(|a| {
                a.starts_with("--time")
                    || a.starts_with("--requeue")
                    || a.starts_with("--open-mode")
                    || a.starts_with("--signal")
            })
            .collect();
        assert_eq!(tail, want, "{spec} {c:?}");
        let script = batch_script(&s, 7, 3, Runtime::Docker);
        for l in lines {
            assert!(
                script.lines().any(|x| x == l),
                "{spec} {c:?}: no line {l:?} in\n{script}"
            );
        }
        // Each run of the Slurm job is an attempt: Slurm's restart count on top of Gantry's.
        assert!(
            script
                .contains("restarts=$((2 + ${SLURM_RESTART_COUNT:-0}))\nattempt=$((3 + ${SLURM_RESTART_COUNT:-0}))\n"),
            "{script}"
        );
        assert!(
            script.contains("-e GANTRY_ATTEMPT=\"$attempt\" -e GANTRY_RESTART_COUNT=\"$restarts\""),
            "{script}"
        );
        assert_eq!(script.contains("'GANTRY_PREEMPTIBLE=1'"), c.is_some(), "{script}");
        assert!(
            script.contains("[ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ] && docker rm -f \"$name\""),
            "the run before a requeue never runs beside it: {script}"
        );
        let app = batch_script(&s, 7, 3, Runtime::Apptainer);
        assert!(
            app.contains("--env GANTRY_ATTEMPT=\"$attempt\" --env GANTRY_RESTART_COUNT=\"$restarts\""),
            "{app}"
        );
        if let Some(c) = c.filter(|c| c.signal != "SIGTERM") {
            let sig = slurm_signal(&c.signal);
            assert!(
                app.contains(&format!("trap 'kill -{sig} \"$pid\" 2>/dev/null' {sig}\n")),
                "{app}"
            );
        }
    }
}

/// When an attempt's Slurm job was requeued, and when the next attempt takes it over.
#[test]
fn requeue_and_adoption_table() {
    // (state, restart count, the attempt's base, it saw it run) -> requeued
    let rows = [
        ("RUNNING", Some(0), 0, true, false),
        ("RUNNING", Some(1), 0, true, true), // requeued and started again between two polls
        ("PENDING", Some(1), 0, false, true),
        ("PENDING", Some(0), 0, true, false),
        ("PENDING", None, 0, true, true), // back in the queue after it ran (no restart count shown)
        ("REQUEUED", None, 0, true, true),
        ("PENDING", None, 0, false, false),
        ("PENDING", Some(1), 1, false, false), // the attempt that took it over, waiting for its BeginTime
        ("PENDING", Some(1), 1, true, false),  // it saw the last run finishing (COMPLETING), then the queue
        ("RUNNING", Some(1), 1, true, false),
        ("COMPLETED", Some(0), 0, true, false),
    ];
    for (state, n, base, ran, want) in rows {
        assert_eq!(
            requeued(state, n, base, ran),
            want,
            "{state} restarts {n:?} base {base} ran {ran}"
        );
    }
    // (state, restart count, attempts that followed it before) -> the next attempt takes it over
    let rows = [
        ("PENDING", Some(1), 1, true),
        ("RUNNING", Some(1), 1, true),
        ("COMPLETING", Some(1), 1, true),
        ("REQUEUED", None, 1, true),
        ("PENDING", Some(0), 1, false),
        ("COMPLETED", Some(1), 1, false),
        ("CANCELLED", Some(1), 1, false),
        ("PENDING", Some(0), 0, false),
    ];
    for (state, n, base, want) in rows {
        assert_eq!(adoptable(state, n, base), want, "{state} restarts {n:?} base {base}");
    }
    assert_eq!((slurm_signal("SIGUSR1"), slurm_signal("USR2")), ("USR1", "USR2"));
}

#[test]
fn the_metrics_file_is_made_beside_the_output_per_requeue_and_mounted_as_gantry_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let j = job("name: t\nimage: reg/img:1\ncommand: 'true'\n");
    let mut s = sub(&j);
    s.metrics = Some(dir.path().join("db-7-a1"));
    for rt in [Runtime::Docker, Runtime::Apptainer] {
        let script = batch_script(&s, 7, 1, rt);
        assert!(
            script.contains("GANTRY_METRICS=/gantry/results/metrics.jsonl"),
            "{script}"
        );
        // The lines that make it, run as the script runs them (after a second Slurm requeue).
        let make: String = script
            .lines()
            .skip_while(|l| !l.starts_with("metrics="))
            .take(2)
            .map(|l| format!("{l}\n"))
            .collect();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{make}echo \"$metrics\""))
            .env("SLURM_RESTART_COUNT", "2")
            .output()
            .unwrap();
        let made = dir.path().join("db-7-a1-r2.metrics.jsonl");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            made.display().to_string(),
            "{make}"
        );
        assert!(made.is_file());
    }
    // Without a shared log dir the engine could not read it: no GANTRY_METRICS at all.
    s.metrics = None;
    assert!(!batch_script(&s, 7, 1, Runtime::Docker).contains("GANTRY_METRICS"));
}
