//! Preemption against real Docker (issue 19): a preemptible job that counts steps into a file in its
//! own mount and saves a checkpoint when it gets SIGUSR1 is preempted by a higher-priority 2-GPU job,
//! queued again at its place, and resumes from its checkpoint with `GANTRY_RESTART_COUNT=1`; the
//! file ends with every step exactly once.

use crate::helpers::*;

#[test]
fn a_preempted_job_checkpoints_on_its_signal_and_resumes_with_every_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    // The priority rule only; min_run short enough for a test (the default is 10 minutes).
    std::fs::write(
        &lab,
        "[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"1s\"\n",
    )
    .unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap(), "--gpus", "sim:2x24GiB"]);
    let train = e.submit_yaml(
        "train",
        &format!(
            "image: {IMAGE}\ngpus: 1\npreemptible: true\ncheckpoint: {{signal: SIGUSR1, grace: 30s}}\nmounts: ['{}:/work']\ncommand: |\n  n=$(cat /work/ckpt 2>/dev/null || echo 0)\n  echo \"restart=$GANTRY_RESTART_COUNT preemptible=$GANTRY_PREEMPTIBLE from=$n\"\n  stop=0\n  trap 'stop=1' USR1\n  while [ $n -lt 40 ]; do\n    if [ $stop = 1 ]; then echo $n > /work/ckpt; echo \"checkpoint at $n\"; exit 0; fi\n    n=$((n+1)); echo $n >> /work/steps; sleep 0.2\n  done\n  echo $n > /work/ckpt; echo finished\n",
            work.display()
        ),
    );
    e.wait_until("a few steps", || {
        std::fs::read_to_string(work.join("steps"))
            .map(|s| s.lines().count() >= 5)
            .unwrap_or(false)
    });
    let urgent = e.submit_yaml(
        "urgent",
        &format!("image: {IMAGE}\ngpus: 2\npriority: 10\ncommand: echo urgent ran\n"),
    );
    assert_eq!(e.wait_final(urgent)["job"]["state"], "succeeded");
    let done = e.wait_final(train);
    assert_eq!(done["job"]["state"], "succeeded", "{done}");
    // Attempts whose container ran (another test's engine may remove root's shared network just
    // before a start: that attempt never ran and is retried at once, an `engine_error`).
    let attempts: Vec<&serde_json::Value> = done["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reason"] != "engine_error")
        .collect();
    assert_eq!(attempts.len(), 2, "one preempted attempt, one that finished: {done}");
    assert_eq!(attempts[0]["reason"], "preempted", "{done}");
    // The urgent job started only once the preempted one had stopped, and the preempted one came
    // back only after it: the free GPU the urgent job needed was kept for it.
    let u = e.json(&["show", &urgent.to_string()]);
    let (urgent_started, urgent_ended) = (
        u["attempts"][0]["started_at"].as_i64().unwrap(),
        u["attempts"][0]["ended_at"].as_i64().unwrap(),
    );
    assert!(
        urgent_started >= attempts[0]["ended_at"].as_i64().unwrap(),
        "the 2-GPU job ran beside the job it preempted"
    );
    assert!(
        attempts[1]["started_at"].as_i64().unwrap() >= urgent_ended,
        "the preempted job came back before the job it was preempted for ran: {done}"
    );
    let log = e.logs(train);
    assert!(log.contains("restart=0 preemptible=1 from=0"), "{log}");
    assert!(
        log.contains("checkpoint at "),
        "the job got its checkpoint signal: {log}"
    );
    assert!(
        log.contains("restart=1 preemptible=1 from="),
        "resumed with GANTRY_RESTART_COUNT=1: {log}"
    );
    assert!(log.contains("finished"), "{log}");
    let steps: Vec<u32> = std::fs::read_to_string(work.join("steps"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(
        steps,
        (1..=40).collect::<Vec<u32>>(),
        "every step exactly once, in order"
    );
}

/// The protocol a framework's own handler speaks, as a real Python script with a real signal
/// handler, in the user's usual environment (the machine's python3, no image) and written as the
/// README's recipes write it: a *string* `command:`. `python3 train.py` is one command (the shell is
/// replaced by python); `cd DIR && python3 train.py` is not (the signal goes to its whole process
/// group and the shell waits for python). Both are preempted by one 3-GPU job, save, resume, and
/// count every step exactly once. A third job that does not handle its checkpoint signal is told so
/// in its log. Issue 28 items 1 and 2: before, the signal killed `/bin/sh` (dash does not exec the
/// last command) and python with it: nothing saved, every step since the start done again.
#[test]
fn string_commands_of_real_python_scripts_checkpoint_on_their_signal_and_resume_with_every_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"1s\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap(), "--gpus", "sim:3x24GiB"]);
    let alice = user("gantry-alice");
    let proj = alice.private_dir("recipe");
    let train = "import os, signal, sys, time\n\
        here = os.path.dirname(os.path.abspath(__file__))\n\
        ckpt, steps = os.path.join(here, 'ckpt'), os.path.join(here, 'steps')\n\
        stop = False\n\
        def on_signal(signum, frame):\n    global stop\n    stop = True\n\
        signal.signal(signal.SIGUSR1, on_signal)\n\
        start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0\n\
        print(f\"restart={os.environ['GANTRY_RESTART_COUNT']} from={start}\", flush=True)\n\
        for step in range(start, 40):\n\
        \x20   if stop:\n\
        \x20       open(ckpt, 'w').write(str(step))\n\
        \x20       print(f'checkpoint at {step}', flush=True)\n\
        \x20       sys.exit(0)\n\
        \x20   with open(steps, 'a') as f:\n\
        \x20       f.write(f'{step + 1}\\n')\n\
        \x20   time.sleep(0.2)\n\
        open(ckpt, 'w').write('40')\n\
        print('finished', flush=True)\n";
    let mut jobs = vec![];
    for (name, command) in [("single", "python3 train.py".to_string()), ("compound", String::new())] {
        let d = proj.join(name);
        std::fs::create_dir(&d).unwrap();
        chown(&d, alice.uid, alice.gid);
        alice.write(&d.join("train.py"), train);
        let command = if command.is_empty() {
            format!("cd {} && python3 train.py", d.display())
        } else {
            command
        };
        let spec = alice.write(
            &d.join("job.yaml"),
            &format!(
                "name: {name}\ngpus: 1\nworkdir: {}\npreemptible: true\ncheckpoint: {{signal: SIGUSR1, grace: 30s}}\ncommand: {command}\n",
                d.display()
            ),
        );
        let id = e.json_as(&alice, &["submit", spec.to_str().unwrap()])[0]["job_id"]
            .as_i64()
            .unwrap();
        jobs.push((id, d));
    }
    // Does not handle SIGUSR1: killed by it, and its log says so.
    let deaf = alice.write(
        &proj.join("deaf.yaml"),
        "name: deaf\ngpus: 1\npreemptible: true\ncheckpoint: {signal: SIGUSR1, grace: 30s}\ncommand: python3 -c 'import time; [time.sleep(0.2) for _ in range(50)]'\n",
    );
    let deaf = e.json_as(&alice, &["submit", deaf.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    e.wait_until("a few steps of each", || {
        jobs.iter().all(|(_, d)| {
            std::fs::read_to_string(d.join("steps"))
                .map(|s| s.lines().count() >= 5)
                .unwrap_or(false)
        }) && e.show(deaf)["job"]["state"] == "running"
    });
    let urgent = e.submit_yaml(
        "urgent",
        &format!("image: {IMAGE}\ngpus: 3\npriority: 10\ncommand: echo urgent ran\n"),
    );
    assert_eq!(e.wait_final(urgent)["job"]["state"], "succeeded");
    for (id, d) in &jobs {
        let done = e.wait_final(*id);
        assert_eq!(done["job"]["state"], "succeeded", "{done}");
        let log = e.logs(*id);
        assert!(log.contains("restart=0 from=0"), "{log}");
        assert!(
            log.contains("checkpoint at "),
            "python got its checkpoint signal: {log}"
        );
        assert!(
            log.contains("restart=1 from="),
            "resumed with GANTRY_RESTART_COUNT=1: {log}"
        );
        assert!(log.contains("finished"), "{log}");
        assert!(!log.contains("does not handle"), "{log}");
        let steps: Vec<u32> = std::fs::read_to_string(d.join("steps"))
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(
            steps,
            (1..=40).collect::<Vec<u32>>(),
            "every step exactly once, in order: {log}"
        );
    }
    assert_eq!(e.wait_final(deaf)["job"]["state"], "succeeded");
    let log = e.logs(deaf);
    assert!(
        log.contains("the job ended by its checkpoint signal SIGUSR1 (exit 138), which its program does not handle"),
        "{log}"
    );
}

/// Issue 28: a job that will preempt once its victim has run the lab's `min_run` says so while it
/// waits (it once said only that no GPU was free), and does so when the time comes.
#[test]
fn a_waiting_job_says_which_job_it_will_preempt_and_when() {
    let dir = tempfile::tempdir().unwrap();
    let lab = dir.path().join("config.toml");
    std::fs::write(
        &lab,
        "[preemption]\nenabled = true\nreserve_after = false\npriority_gap = 10\nmin_run = \"15s\"\n",
    )
    .unwrap();
    let e = Engine::start(&["--config", lab.to_str().unwrap(), "--gpus", "sim:1x24GiB"]);
    let long = e.submit_yaml(
        "long",
        &format!("image: {IMAGE}\ngpus: 1\npreemptible: true\ncommand: sleep 600\n"),
    );
    e.wait_state(long, "running");
    let urgent = e.submit_yaml(
        "urgent",
        &format!("image: {IMAGE}\ngpus: 1\npriority: 10\ncommand: sleep 600\n"),
    );
    let mut reason = String::new();
    e.wait_until("the urgent job's reason, or its start", || {
        let d = e.show(urgent);
        reason = d["reason"].as_str().unwrap_or_default().to_string();
        reason.contains("will start by preempting") || d["job"]["state"] != "queued"
    });
    assert!(
        reason.contains(&format!(
            "will start by preempting job {long} (preemptible; root's 1-GPU job has priority 10, this one 0) in under a minute, "
        )) && reason.ends_with("once it has run the lab's minimum of 15s (`[preemption] min_run`)"),
        "{reason}"
    );
    e.wait_state(urgent, "running");
    assert_eq!(e.show(long)["attempts"][0]["reason"], "preempted");
    for id in [urgent, long] {
        assert!(e.gantry(&["cancel", &id.to_string()]).status.success());
        e.wait_final(id);
    }
}
