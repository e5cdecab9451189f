//! Queueing jobs: `gantry submit` (spec files), `gantry run` (a spec from flags), `gantry rerun`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use gantry_core::client::ClientError;
use gantry_core::protocol::{SpecOrigin, SubmitPreview, SubmitRequest};

use super::Ctx;
use crate::cli::RunArgs;
use crate::print::print_json;
use crate::term::{esc, escape, outln};

pub async fn submit(ctx: &Ctx, files: &[PathBuf], begin: Option<&str>) -> Result<ExitCode> {
    let mut failed = false;
    let mut ids = vec![];
    for f in files {
        let queued = match ctx.client.spec_request(f) {
            Ok(req) => {
                let req = SubmitRequest {
                    begin: begin.map(String::from),
                    ..req
                };
                ctx.client.submit(&req).await.map(|s| s.job_ids)
            }
            Err(e) => Err(e),
        };
        match queued.map_err(anyhow::Error::from) {
            Ok(new) => {
                ids.push(serde_json::json!({"file": f, "job_id": new[0], "job_ids": new}));
                if !ctx.json {
                    match new.as_slice() {
                        [one] => outln!("{}: queued as job {one}", esc(&f.display().to_string())),
                        many => outln!(
                            "{}: queued {} jobs: {}",
                            esc(&f.display().to_string()),
                            many.len(),
                            many.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
                        ),
                    }
                }
            }
            Err(e) => {
                failed = true;
                if let Some(ClientError::NoEngine(_)) = e.downcast_ref::<ClientError>() {
                    return Err(e);
                }
                ids.push(serde_json::json!({"file": f, "error": format!("{e:#}")}));
                if !ctx.json {
                    eprintln!("{}: {}", esc(&f.display().to_string()), escape(&format!("{e:#}"), "\n"));
                }
            }
        }
    }
    if ctx.json {
        print_json(&ids)?;
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// `gantry submit --dry-run`: each file checked as a submit would check it, and where and when its
/// jobs would start; nothing queued. Fails (exit 1) when a file would be refused.
pub async fn dry_run(ctx: &Ctx, files: &[PathBuf], begin: Option<&str>) -> Result<ExitCode> {
    let mut failed = false;
    let mut out = vec![];
    for f in files {
        let name = f.display().to_string();
        let got = match ctx.client.spec_request(f) {
            Ok(req) => {
                let req = SubmitRequest {
                    begin: begin.map(String::from),
                    ..req
                };
                ctx.client.preview(&req).await
            }
            Err(e) => Err(e),
        };
        match got {
            Ok(p) => {
                if !ctx.json {
                    print_preview(&name, &p);
                }
                out.push(serde_json::json!({"file": f, "preview": p}));
            }
            Err(ClientError::NoEngine(m)) => return Err(ClientError::NoEngine(m).into()),
            Err(e) => {
                failed = true;
                if !ctx.json {
                    eprintln!("{}: {}", esc(&name), escape(&format!("{e:#}"), "\n"));
                }
                out.push(serde_json::json!({"file": f, "error": e.to_string()}));
            }
        }
    }
    if ctx.json {
        print_json(&out)?;
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// A dry run, for people: each job, where or why, and the limits met.
pub fn print_preview(what: &str, p: &SubmitPreview) {
    let n = p.jobs.len();
    outln!(
        "{}: would queue {} (dry run: nothing queued)",
        esc(what),
        if n == 1 {
            "1 job".to_string()
        } else {
            format!("{n} jobs")
        }
    );
    for j in &p.jobs {
        let gpus = match (j.job.gpus, j.job.gpu_memory) {
            (0, _) => "no GPU".to_string(),
            (g, Some(m)) => format!("{g} GPU(s) with {} each", gantry_core::units::format_bytes(m)),
            (1, None) => "1 GPU".to_string(),
            (g, None) => format!("{g} GPUs"),
        };
        outln!("  {} ({gpus})", esc(&j.job.name));
        if j.starts_now {
            match j.gpus.as_slice() {
                [] => outln!("    would start now"),
                g => outln!(
                    "    would start now on GPU {}",
                    g.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
                ),
            }
        } else {
            outln!("    would wait: {}", esc(j.reason.as_deref().unwrap_or("for GPUs")));
            if let Some(t) = j.estimated_start {
                outln!("    estimated start: {}", gantry_core::units::local_datetime(t));
            }
        }
    }
    for c in &p.checks {
        outln!("  ok: {}", esc(c));
    }
}

pub async fn run(ctx: &Ctx, args: &RunArgs) -> Result<()> {
    // Remote: this computer's folder means nothing on the workstation (relative mounts are refused there).
    let base_dir = match ctx.remote {
        Some(_) => None,
        None => {
            Some(std::env::current_dir().context("cannot read the current directory (relative mounts start from it)")?)
        }
    };
    let (text, file_name) = args.spec_text(base_dir.as_deref())?;
    let req = SubmitRequest {
        text,
        file_name,
        base_dir,
        idempotency_key: None,
        origin: SpecOrigin::RunFlags,
        begin: None,
    };
    if args.dry_run {
        let p = ctx.client.preview(&req).await.map_err(run_error)?;
        if ctx.json {
            print_json(&p)?;
        } else {
            print_preview("gantry run", &p);
        }
        return Ok(());
    }
    let s = ctx.client.submit(&req).await.map_err(run_error)?;
    if ctx.json {
        print_json(&s)?;
    } else {
        outln!("queued as job {}", s.job_id);
    }
    Ok(())
}

/// An error about `gantry run`'s spec: the line numbers point into text the user never saw, so
/// only the field is named.
fn run_error(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Api {
            spec_error: Some(se), ..
        } => anyhow::anyhow!(
            "{}",
            gantry_core::spec::SpecError {
                line: None,
                column: None,
                ..se
            }
        ),
        e => e.into(),
    }
}

pub async fn rerun(ctx: &Ctx, id: i64) -> Result<()> {
    let s = ctx.client.rerun(id).await?;
    if ctx.json {
        print_json(&s)?;
    } else {
        outln!("job {id} queued again as job {}", s.job_id);
    }
    Ok(())
}

/// What `gantry run` without `--image` carries over from your shell: the programs it finds and
/// the conda env or venv it has active.
const CARRIED_ENV: [&str; 5] = ["PATH", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV", "PYTHONPATH"];

impl RunArgs {
    /// The spec a user would have written, as YAML text (serialized, so any value quotes right).
    /// `here`: the current directory, when the engine is on this machine: a job without `--image`
    /// starts there, with PATH and an active conda env or venv (what this shell runs).
    pub fn spec_text(&self, here: Option<&std::path::Path>) -> Result<(String, String)> {
        use gantry_core::spec::{Command, JobSpec, HOST_IMAGE};
        let mut env = std::collections::BTreeMap::new();
        for kv in &self.env {
            let Some((k, v)) = kv.split_once('=') else {
                bail!("--env {kv:?} is not K=V: write e.g. --env CUDA_LAUNCH_BLOCKING=1")
            };
            env.insert(k.to_string(), v.to_string());
        }
        let image = self.image.clone().unwrap_or_else(|| HOST_IMAGE.into());
        let mut workdir = self.workdir.clone();
        let mut mounts = self.mounts.clone();
        if let (HOST_IMAGE, Some(here)) = (image.as_str(), here) {
            for k in CARRIED_ENV {
                if let Some(v) = std::env::var_os(k).and_then(|v| v.into_string().ok()) {
                    env.entry(k.to_string()).or_insert(v);
                }
            }
            if workdir.is_none() {
                let dir = here.to_string_lossy().into_owned();
                workdir = Some(dir.clone());
                // The home is there already; a folder elsewhere is mounted (checked as you, like any mount).
                let home = std::env::var("HOME").unwrap_or_default();
                let in_home = !home.is_empty()
                    && home != "/"
                    && (dir == home || dir.starts_with(&format!("{}/", home.trim_end_matches('/'))));
                if !in_home
                    && !gantry_core::spec::HOST_SYSTEM_FOLDERS
                        .iter()
                        .any(|d| dir == *d || dir.starts_with(&format!("{d}/")))
                    && dir != "/"
                {
                    mounts.push(format!("{dir}:{dir}"));
                }
            }
        }
        let command = match (&self.shell, self.command.is_empty()) {
            (Some(s), _) => Some(Command::Shell(s.clone())),
            (None, false) => Some(Command::Exec(self.command.clone())),
            (None, true) => None,
        };
        let name = self.name.clone().unwrap_or_else(|| match self.command.first() {
            Some(prog) => prog.rsplit('/').next().unwrap_or(prog).to_string(),
            None => image
                .rsplit('/')
                .next()
                .unwrap_or(&image)
                .split(':')
                .next()
                .unwrap_or("run")
                .to_string(),
        });
        let spec = JobSpec {
            name: Some(name.clone()),
            image,
            command,
            workdir,
            env,
            mounts,
            tensorboard: None,
            gpus: self.gpus,
            gpu_memory: self.mem.clone(),
            gpu_type: self.gpu_type.clone(),
            min_gpu_memory: self.min_gpu_memory.clone(),
            priority: self.priority,
            timeout: self.timeout.clone(),
            retries: 0,
            expected_runtime: None,
            after: vec![],
            begin: self.begin.clone(),
            matrix: Default::default(),
            cpus: self.cpus,
            memory: self.memory.clone(),
            shm_size: self.shm_size.clone(),
            ipc: None,
            home: None,
            ulimits: None,
            pids_limit: None,
            interactive: false,
            ports: self.ports.clone(),
            notify: None,
            preemptible: None,
            checkpoint: None,
        };
        Ok((serde_yaml_ng::to_string(&spec)?, format!("{name}.yaml")))
    }
}
