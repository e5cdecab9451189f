//! What an attempt's container is given besides its image: the argv of a session, the job's
//! environment (GPU binding, Gantry's variables, thread and GPU-memory hints) and the HostConfig
//! part of its [`ContainerSettings`](crate::resources::ContainerSettings).

use std::collections::HashMap;

use bollard::models::{HostConfig, HostConfigLogConfig, ResourcesUlimits};

use super::Launch;

/// The argv of a session without a command: `shell` (the owner's login shell on this machine) where
/// the image has it, else the image's `/bin/sh`; a login shell, or (`login` false: a session that
/// carries its owner's PATH and active env, whose /etc/profile would reset PATH) an interactive one.
pub fn session_argv(shell: Option<&str>, login: bool) -> Vec<String> {
    let shell = shell
        .filter(|s| s.starts_with('/') && !s.ends_with("/nologin") && !s.ends_with("/false"))
        .unwrap_or("/bin/sh");
    let script = if login {
        r#"if [ -x "$0" ]; then exec "$0" -l; fi; exec /bin/sh -l"#
    } else {
        r#"if [ -x "$0" ]; then exec "$0" -i; fi; exec /bin/sh -i"#
    };
    vec!["/bin/sh".into(), "-c".into(), script.into(), shell.into()]
}

/// The environment a job sees: the spec's own, then Gantry's (Gantry's wins).
pub fn job_env(l: &Launch) -> Vec<String> {
    let mut env: Vec<(String, String)> = l.job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut set = |k: &str, v: String| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v));
    };
    // A HOME the job can write (many tools cache there); one the spec sets itself is kept.
    if let Some(h) = l
        .container
        .home
        .as_ref()
        .filter(|_| !l.job.spec.env.contains_key("HOME"))
    {
        set("HOME", h.clone());
    }
    set("GANTRY_JOB_ID", l.job_id.to_string());
    set("GANTRY_ATTEMPT", l.attempt_n.to_string());
    // Attempts that ended by preemption (as Slurm's SLURM_RESTART_COUNT): resume from the checkpoint.
    set("GANTRY_RESTART_COUNT", l.restart_count.to_string());
    if l.preemptible {
        set("GANTRY_PREEMPTIBLE", "1".into());
    }
    // A string of several commands: Docker's init signals its whole process group, so a checkpoint
    // signal, timeout or cancel reaches the program behind the shell (`shell::for_signals`).
    if l.command.is_none() && l.job.spec.command.as_ref().is_some_and(|c| c.signals_group()) {
        set("TINI_KILL_PROCESS_GROUP", "1".into());
    }
    set("GANTRY_GPU_UUIDS", l.gpu_uuids.join(","));
    for (k, v) in &l.results_env {
        // A script that logs to its own MLflow server keeps it.
        if k != "MLFLOW_TRACKING_URI" || !l.job.spec.env.contains_key(k) {
            set(k, v.clone());
        }
    }
    if l.gpu_uuids.is_empty() {
        // Images such as nvidia/cuda set NVIDIA_VISIBLE_DEVICES=all: make a CPU job see no GPU.
        set("NVIDIA_VISIBLE_DEVICES", "void".into());
        set("CUDA_VISIBLE_DEVICES", String::new());
    } else {
        set("NVIDIA_VISIBLE_DEVICES", l.gpu_uuids.join(","));
        set(
            "CUDA_VISIBLE_DEVICES",
            (0..l.gpu_uuids.len())
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    // Who the job runs as, by name (its passwd entry is in the container too), unless the spec says.
    if let Some(u) = l.container.user.as_ref() {
        for k in ["USER", "LOGNAME"] {
            if !l.job.spec.env.contains_key(k) {
                set(k, u.clone());
            }
        }
    }
    // Frameworks size their thread pools by the CPUs they see: tell them the job's share.
    if let Some(n) = l.container.threads {
        for k in ["OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
            if !l.job.spec.env.contains_key(k) {
                set(k, n.to_string());
            }
        }
    }
    if let (Some(m), Some(total)) = (l.job.gpu_memory, l.gpu_total_memory) {
        let frac = (m as f64 / total as f64).clamp(0.01, 1.0);
        let f = format!("{frac:.3}");
        set("FLAGS_fraction_of_gpu_memory_to_use", f.clone());
        set("XLA_PYTHON_CLIENT_MEM_FRACTION", f);
        set("TF_FORCE_GPU_ALLOW_GROWTH", "true".into());
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The HostConfig part of [`ContainerSettings`](crate::resources::ContainerSettings): CPU/RAM limits
/// (no swap on top), pinned CPUs, shm, ulimits, the process limit, IPC, HOME's tmpfs and Docker's own
/// bounded log.
pub(super) fn container_host_config(l: &Launch) -> HostConfig {
    let c = &l.container;
    let ulimit = |name: &str, v: Option<i64>| {
        v.map(|v| ResourcesUlimits {
            name: Some(name.into()),
            soft: Some(v),
            hard: Some(v),
        })
    };
    let ulimits: Vec<ResourcesUlimits> = [ulimit("memlock", c.memlock), ulimit("stack", c.stack)]
        .into_iter()
        .flatten()
        .collect();
    let tmpfs = c.home.as_ref().filter(|_| c.home_tmpfs).map(|h| {
        HashMap::from([(
            h.clone(),
            format!("rw,nosuid,nodev,mode=0700,uid={},gid={}", l.uid, l.gid),
        )])
    });
    let log_config = c.log_file_size.map(|size| HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_string(), size.to_string()),
            ("max-file".to_string(), crate::defaults::DOCKER_LOG_FILES.to_string()),
        ])),
    });
    HostConfig {
        // With pinned CPUs the quota equals their number, so it never throttles the job.
        nano_cpus: c.nano_cpus,
        cpuset_cpus: c.cpuset.clone(),
        pids_limit: c.pids_limit,
        log_config,
        memory: c.memory,
        memory_swap: c.memory,
        shm_size: c.shm_size,
        ulimits: (!ulimits.is_empty()).then_some(ulimits),
        ipc_mode: Some(if c.ipc_host { "host" } else { "private" }.into()),
        tmpfs,
        storage_opt: c
            .layer_size
            .map(|b| HashMap::from([("size".to_string(), b.to_string())])),
        ..Default::default()
    }
}
