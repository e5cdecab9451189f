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
