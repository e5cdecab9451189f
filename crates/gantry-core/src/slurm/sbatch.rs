//! A job -> `sbatch` arguments and batch script (pure; tested by tables).

use std::path::PathBuf;
use std::time::Duration;

use super::{Runtime, Settings};
use crate::spec::ValidJob;

/// Something Slurm cannot do for this job, said so the user can act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

/// One attempt to submit: the job and everything decided around it.
#[derive(Debug, Clone)]
pub struct Submission<'a> {
    pub job: &'a ValidJob,
    /// Unique per database, job and attempt: `gantry:<db>:<job>:<attempt>` (in `--comment`).
    pub marker: String,
    pub uid: u32,
    pub gid: u32,
    /// The owner's home (working directory on the node).
    pub home: PathBuf,
    /// Where Slurm writes the output.
    pub output: PathBuf,
    /// The user priority range of the lab (priority → nice).
    pub priority_range: (i32, i32),
    /// Slurm ids (`ID` or an array's `ID_TASK`) of the jobs this one runs after (`--dependency=afterok:`).
    pub after: Vec<String>,
    /// Mounts as checked with the owner's permissions (host paths).
    pub mounts: Vec<crate::access::ResolvedMount>,
    /// Its `GANTRY_METRICS` file beside its output, without `-r<SLURM_RESTART_COUNT>.metrics.jsonl`
    /// (`None`: no shared log folder, so the engine could not read it).
    pub metrics: Option<PathBuf>,
    /// Gantry may preempt it: its checkpoint signal and grace (`--requeue`, `--signal`).
    pub preempt: Option<Checkpoint>,
    /// Its attempts that ended by preemption before this Slurm job (`GANTRY_RESTART_COUNT` adds
    /// Slurm's own `SLURM_RESTART_COUNT` to it).
    pub restarts: u32,
}

/// A preemptible job's checkpoint signal (`SIGUSR1`) and grace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub signal: String,
    pub grace: Duration,
}

/// The most `--signal=…@TIME` takes (seconds).
pub const MAX_SIGNAL_TIME: u64 = 65535;

impl Checkpoint {
    /// The grace in whole seconds, rounded up, as `--signal` takes it (at most [`MAX_SIGNAL_TIME`]).
    pub fn grace_s(&self) -> u64 {
        let ms = self.grace.as_millis() as u64;
        ms.div_ceil(1000).min(MAX_SIGNAL_TIME)
    }
}

/// The marker that finds a submitted attempt again: in `--comment`.
pub fn marker(db_uid: &str, job_id: i64, attempt_n: u32) -> String {
    format!("gantry:{db_uid}:{job_id}:{attempt_n}")
}

/// Gantry's priority onto Slurm's `--nice`: users may only lower their jobs (nice ≥ 0), so the top of
/// the lab's user range gets 0 and the bottom `max_nice`, linearly between; admin priorities above the
/// range also get 0.
pub fn nice_for(priority: i32, (lo, hi): (i32, i32), max_nice: u32) -> u32 {
    if hi <= lo {
        return 0;
    }
    let p = priority.clamp(lo, hi);
    ((hi - p) as f64 / (hi - lo) as f64 * max_nice as f64).round() as u32
}

/// Slurm's `--time` in whole minutes, rounded up: Slurm counts minutes (Gantry also stops the job at
/// its exact timeout).
fn minutes(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

/// A name as `--job-name` takes it: printable, no spaces (they would split `jobcomp` records).
fn job_name(name: &str) -> String {
    let n: String = name
        .chars()
        .map(|c| if c.is_whitespace() || c.is_control() { '_' } else { c })
        .take(100)
        .collect();
    if n.is_empty() {
        "gantry-job".into()
    } else {
        n
    }
}

/// The `sbatch` arguments of a job (the script comes on stdin).
pub fn sbatch_args(s: &Submission, set: &Settings) -> Result<Vec<String>, Refusal> {
    let job = s.job;
    let mut a = vec![
        "--parsable".to_string(),
        format!("--job-name={}", job_name(&job.name)),
        format!("--comment={}", s.marker),
        // The job gets the user's environment on the node, not the engine's (root's).
        "--export=NONE".into(),
        format!("--chdir={}", s.home.display()),
        format!("--output={}", s.output.display()),
    ];
    for (k, v) in [
        ("partition", &set.partition),
        ("account", &set.account),
        ("qos", &set.qos),
    ] {
        if let Some(v) = v {
            a.push(format!("--{k}={v}"));
        }
    }
    // The batch script passes the image to `docker run` after its options: `--privileged` as an
    // image would be read as one.
    if job.spec.image.starts_with('-') {
        return Err(Refusal(format!(
            "`image` {:?} starts with '-': an image name is `repo/name:tag`",
            job.spec.image
        )));
    }
    // What needs this machine's Docker: a terminal to attach to, a port forwarded on its loopback,
    // and this machine's own folders as the job's root.
    if job.spec.interactive {
        return Err(Refusal("interactive sessions (`gantry shell`, `interactive: true`) run on the workstation's own GPUs, not through Slurm: use `salloc`/`srun --pty` on the cluster".into()));
    }
    if !job.spec.ports.is_empty() {
        return Err(Refusal("`ports` (`gantry open`) needs the workstation's Docker backend: remove `ports`, or reach the server on its Slurm node yourself".into()));
    }
    if job.spec.is_host_image() {
        return Err(Refusal("a job without an image (`image: host`, this machine's own folders) cannot go to Slurm nodes: name a Docker image in `image`".into()));
    }
    if job.spec.min_gpu_memory.is_some() {
        return Err(Refusal("`min_gpu_memory` has no Slurm equivalent on this cluster: choose GPUs by `gpu_type` (a GRES type such as a100) instead".into()));
    }
    match (job.gpu_memory, set.shard_memory) {
        (Some(_), None) => {
            return Err(Refusal(
                "`gpu_memory` (sharing a GPU with other jobs) needs Slurm's `shard` GRES, which this cluster's Gantry config does not name: \
                 remove `gpu_memory` to get whole GPUs, or ask an admin to configure `shard` in Slurm and `shard_memory` in [slurm]"
                    .into(),
            ))
        }
        (Some(m), Some(per)) => {
            if job.spec.gpu_type.is_some() {
                return Err(Refusal("`gpu_type` cannot be combined with `gpu_memory` on Slurm (shards have no type): remove one of them".into()));
            }
            let shards = m.div_ceil(per.max(1)).max(1) * job.gpus.max(1) as u64;
            a.push(format!("--gres=shard:{shards}"));
        }
        (None, _) if job.gpus > 0 => match &job.spec.gpu_type {
            Some(t) => a.push(format!("--gres=gpu:{}:{}", t.trim().to_ascii_lowercase(), job.gpus)),
            None => a.push(format!("--gres=gpu:{}", job.gpus)),
        },
        (None, _) => {}
    }
    if let Some(c) = job.limits.cpus_milli {
        a.push(format!("--cpus-per-task={}", c.div_ceil(1000).max(1)));
    }
    if let Some(m) = job.limits.memory {
        a.push(format!("--mem={}M", m.div_ceil(1 << 20).max(1)));
    }
    match (job.timeout, &s.preempt) {
        // Slurm sends `--signal` GRACE seconds (up to a minute more) before the time limit: for a
        // preemptible job the limit is the timeout + its grace + a minute, so that signal never comes
        // before Gantry's own timeout (which stops it, and is never retried).
        (Some(t), Some(c)) => a.push(format!("--time={}", minutes(t + Duration::from_secs(c.grace_s() + 60)))),
        (Some(t), None) => a.push(format!("--time={}", minutes(t))),
        (None, _) => {}
    }
    if let Some(c) = &s.preempt {
        // Requeued (Gantry's `scontrol requeue`, or Slurm's own preemption) rather than ended; the
        // checkpoint signal to the batch shell, whose trap hands it to the container.
        a.push("--requeue".into());
        // Slurm truncates the output file when it starts a requeued job again: keep what ran before
        // (Gantry copies the file on from where it was).
        a.push("--open-mode=append".into());
        a.push(format!("--signal=B:{}@{}", super::slurm_signal(&c.signal), c.grace_s()));
    }
    let nice = nice_for(job.spec.priority, s.priority_range, set.max_nice);
    if nice > 0 {
        a.push(format!("--nice={nice}"));
    }
    if !s.after.is_empty() {
        a.push(format!("--dependency=afterok:{}", s.after.join(":")));
        // A dependency that fails ends this job at once instead of leaving it pending for good.
        a.push("--kill-on-invalid-dep=yes".into());
    }
    Ok(a)
}

/// The line the batch script writes when Docker killed the job at its memory limit (Slurm itself only
/// sees a failed job); Gantry records the attempt as out of memory when the output ends with it.
pub const OOM_LINE: &str = "gantry: the job was killed at its memory limit (out of memory)";

/// `'…'` for sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The batch script: runs the job's image on the node Slurm chose, as the owner, with the GPUs Slurm
/// allocated (`SLURM_JOB_GPUS`, the node's GPU indexes). Slurm's SIGTERM (cancel, time limit) stops
/// the container too.
/// Where a Slurm job's `GANTRY_METRICS` file is inside its container.
const METRICS_IN: &str = "/gantry/results/metrics.jsonl";

pub fn batch_script(s: &Submission, job_id: i64, attempt_n: u32, runtime: Runtime) -> String {
    let mut out = format!("#!/bin/sh\n# Gantry job {job_id}, attempt {attempt_n} ({}): written by the Gantry engine, run by Slurm as the job's owner.\n", s.marker);
    out.push_str(&script_body(s, job_id, attempt_n, runtime));
    out
}

/// The batch script of a `matrix` submitted as one job array: each task runs its own job (`parts`:
/// task id, submission, Gantry job id), chosen by `SLURM_ARRAY_TASK_ID`.
pub fn array_script(parts: &[(u32, Submission, i64)], marker: &str, runtime: Runtime) -> String {
    let mut out = format!("#!/bin/sh\n# Gantry jobs {} as one Slurm job array ({marker}): written by the Gantry engine, run by Slurm as their owner.\n", parts.iter().map(|p| p.2.to_string()).collect::<Vec<_>>().join(", "));
    out.push_str("case \"${SLURM_ARRAY_TASK_ID:-}\" in\n");
    for (task, s, job_id) in parts {
        out.push_str(&format!("{task})\n"));
        out.push_str(&script_body(s, *job_id, 1, runtime));
        out.push_str(";;\n");
    }
    out.push_str("esac\necho \"gantry: no job for array task ${SLURM_ARRAY_TASK_ID:-}\" >&2\nexit 1\n");
    out
}

/// `--array=` of the given task ids.
pub fn array_arg(tasks: &[u32]) -> String {
    format!(
        "--array={}",
        tasks.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")
    )
}

/// The marker of a `matrix` submitted as one array (in `--comment` of every task).
pub fn array_marker(db_uid: &str, group: &str) -> String {
    format!("gantry:{db_uid}:array:{group}")
}

fn script_body(s: &Submission, job_id: i64, attempt_n: u32, runtime: Runtime) -> String {
    let job = s.job;
    let q = |v: &str| sh_quote(v);
    let mut env: Vec<(String, String)> = job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.retain(|(k, _)| {
        ![
            "GANTRY_JOB_ID",
            "GANTRY_ATTEMPT",
            "GANTRY_RESTART_COUNT",
            "GANTRY_PREEMPTIBLE",
            "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES",
        ]
        .contains(&k.as_str())
    });
    env.push(("GANTRY_JOB_ID".into(), job_id.to_string()));
    if s.preempt.is_some() {
        env.push(("GANTRY_PREEMPTIBLE".into(), "1".into()));
    }
    let cmd: Vec<String> = job.spec.command.as_ref().map(|c| c.argv()).unwrap_or_default();
    let mut out = String::new();
    out.push_str("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
    out.push_str("# Requeued (a preemption), Slurm runs this script again with SLURM_RESTART_COUNT: each run is a Gantry attempt.\n");
    out.push_str(&format!(
        "restarts=$(({} + ${{SLURM_RESTART_COUNT:-0}}))\nattempt=$(({attempt_n} + ${{SLURM_RESTART_COUNT:-0}}))\n",
        s.restarts
    ));
    // The checkpoint signal reaches this shell (`--signal=B:`, `scancel --batch`): hand it on.
    let ckpt = s
        .preempt
        .as_ref()
        .map(|c| (super::slurm_signal(&c.signal).to_string(), c.grace_s()));
    if let Some(m) = &s.metrics {
        // Made by its owner (this script) beside its output; the engine reads it as them.
        out.push_str(&format!(
            "metrics={}-r\"${{SLURM_RESTART_COUNT:-0}}\".metrics.jsonl\n: >> \"$metrics\" || metrics=\n",
            q(&m.display().to_string())
        ));
    }
    out.push_str("# The GPUs Slurm allocated, as the node numbers them; inside, the job sees them as 0..N-1.\n");
    out.push_str("gpus=\"${SLURM_JOB_GPUS:-}\"\n");
    out.push_str("visible=$(echo \"$gpus\" | awk -F, 'NF{for(i=0;i<NF;i++) printf \"%s%d\", (i?\",\":\"\"), i}')\n");
    match runtime {
        Runtime::Docker => {
            out.push_str("name=\"gantry-slurm-$SLURM_JOB_ID\"\n");
            out.push_str("# A run of this Slurm job before its requeue must not run beside this one.\n");
            out.push_str("[ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ] && docker rm -f \"$name\" >/dev/null 2>&1\n");
            out.push_str("if [ -n \"$gpus\" ]; then set -- --gpus \"\\\"device=$gpus\\\"\"; else set -- -e NVIDIA_VISIBLE_DEVICES=void; fi\n");
            if s.metrics.is_some() {
                out.push_str(&format!("[ -n \"$metrics\" ] && set -- \"$@\" --mount \"type=bind,source=$metrics,target={METRICS_IN}\" -e GANTRY_METRICS={METRICS_IN}\n"));
            }
            let mut run = vec![
                "docker run --name \"$name\" --init".to_string(),
                format!("--user {}:{}", s.uid, s.gid),
                "--security-opt no-new-privileges --cap-drop ALL".into(),
                "-e CUDA_VISIBLE_DEVICES=\"$visible\" -e GANTRY_SLURM_GPUS=\"$gpus\"".into(),
                "-e GANTRY_ATTEMPT=\"$attempt\" -e GANTRY_RESTART_COUNT=\"$restarts\"".into(),
            ];
            if let Some(c) = job.limits.cpus_milli {
                run.push(format!("--cpus {}", c as f64 / 1000.0));
            }
            if let Some(m) = job.limits.memory {
                run.push(format!("--memory {m} --memory-swap {m}"));
            }
            for m in &s.mounts {
                run.push(format!(
                    "--mount {}",
                    q(&format!(
                        "type=bind,source={},target={}{}",
                        m.host.display(),
                        m.container,
                        if m.read_only { ",readonly" } else { "" }
                    ))
                ));
            }
            if let Some(w) = &job.spec.workdir {
                run.push(format!("-w {}", q(w)));
            }
            for (k, v) in &env {
                run.push(format!("-e {}", q(&format!("{k}={v}"))));
            }
            // A string of several commands: its signals go to its whole process group (as on Docker).
            if job.spec.command.as_ref().is_some_and(|c| c.signals_group()) {
                run.push("-e TINI_KILL_PROCESS_GROUP=1".into());
            }
            run.push("\"$@\"".into());
            run.push(q(&job.spec.image));
            run.extend(cmd.iter().map(|c| q(c)));
            out.push_str(&run.join(" \\\n  "));
            out.push_str(" &\npid=$!\n");
            out.push_str(
                "# Cancel and time limit: Slurm signals this script; stop the container, not just its client.\n",
            );
            match &ckpt {
                // SIGTERM is the checkpoint signal: the container gets its grace before the kill.
                Some((sig, g)) if sig == "TERM" => out.push_str(&format!(
                    "trap 'docker stop -t {} \"$name\" >/dev/null 2>&1' TERM INT\n",
                    (*g).max(10)
                )),
                Some((sig, _)) => {
                    out.push_str("trap 'docker stop -t 10 \"$name\" >/dev/null 2>&1' TERM INT\n");
                    out.push_str(&format!(
                        "trap 'docker kill -s {sig} \"$name\" >/dev/null 2>&1' {sig}\n"
                    ));
                }
                None => out.push_str("trap 'docker stop -t 10 \"$name\" >/dev/null 2>&1' TERM INT\n"),
            }
            out.push_str("wait \"$pid\"; code=$?\n");
            out.push_str("while kill -0 \"$pid\" 2>/dev/null; do wait \"$pid\"; code=$?; done\n");
            out.push_str("# Killed at its memory limit: say so (Gantry records it as out of memory), then remove the container.\n");
            out.push_str("[ \"$(docker inspect -f '{{.State.OOMKilled}}' \"$name\" 2>/dev/null)\" = true ] && echo \"");
            out.push_str(OOM_LINE);
            out.push_str("\" >&2\n");
            out.push_str("docker rm -f \"$name\" >/dev/null 2>&1\n");
            out.push_str("exit \"$code\"\n");
            return out;
        }
        Runtime::Apptainer => {
            let mut run = vec![
                "apptainer exec --nv --containall --no-home".to_string(),
                "--env CUDA_VISIBLE_DEVICES=\"$visible\" --env GANTRY_SLURM_GPUS=\"$gpus\"".into(),
                "--env GANTRY_ATTEMPT=\"$attempt\" --env GANTRY_RESTART_COUNT=\"$restarts\"".into(),
            ];
            for m in &s.mounts {
                run.push(format!(
                    "--bind {}",
                    q(&format!(
                        "{}:{}{}",
                        m.host.display(),
                        m.container,
                        if m.read_only { ":ro" } else { "" }
                    ))
                ));
            }
            if let Some(w) = &job.spec.workdir {
                run.push(format!("--pwd {}", q(w)));
            }
            if s.metrics.is_some() {
                out.push_str(&format!("set --\n[ -n \"$metrics\" ] && set -- --bind \"$metrics:{METRICS_IN}\" --env GANTRY_METRICS={METRICS_IN}\n"));
                run.push("\"$@\"".into());
            }
            for (k, v) in &env {
                run.push(format!("--env {}", q(&format!("{k}={v}"))));
            }
            run.push(q(&format!("docker://{}", job.spec.image)));
            run.extend(cmd.iter().map(|c| q(c)));
            out.push_str(&run.join(" \\\n  "));
            out.push_str(" &\npid=$!\n");
            out.push_str("trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT\n");
            if let Some((sig, _)) = ckpt.as_ref().filter(|(sig, _)| sig != "TERM") {
                out.push_str(&format!("trap 'kill -{sig} \"$pid\" 2>/dev/null' {sig}\n"));
            }
        }
    }
    out.push_str("wait \"$pid\"; code=$?\n");
    out.push_str("while kill -0 \"$pid\" 2>/dev/null; do wait \"$pid\"; code=$?; done\n");
    out.push_str("exit \"$code\"\n");
    out
}
