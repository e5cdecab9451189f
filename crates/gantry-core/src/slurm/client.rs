//! Running Slurm's commands (`sbatch`, `squeue --json`, `scancel`, `scontrol`) behind [`SlurmClient`].

use std::path::PathBuf;

use super::{parse_nodes, parse_squeue, Node, SqJob};

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("Slurm is not reachable: {0}")]
    Unavailable(String),
    #[error("Slurm refused the job: {0}")]
    Rejected(String),
    #[error("cannot read Slurm's answer: {0}")]
    Parse(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl SlurmError {
    /// Errors that say nothing about the job: submit again later.
    pub fn is_transient(&self) -> bool {
        matches!(self, SlurmError::Unavailable(_) | SlurmError::Io(_))
    }
}

/// Who a Slurm command runs as.
#[derive(Debug, Clone)]
pub struct As {
    pub name: String,
    pub uid: u32,
}

/// What the engine asks of Slurm. [`Slurm`] runs the real commands; `slurm::fake::FakeSlurm` is an
/// in-process cluster for the engine's tests under `tokio::time::pause`.
#[async_trait::async_trait]
pub trait SlurmClient: Send + Sync + 'static {
    /// `sbatch` as the job's owner, the script on stdin; returns the Slurm job id.
    async fn submit(&self, who: &As, args: &[String], script: &str) -> Result<u64, SlurmError>;
    /// Every job Slurm knows (pending, running, and those that ended within `MinJobAge`).
    async fn queue(&self) -> Result<Vec<SqJob>, SlurmError>;
    /// `scancel ID` (or `ID_TASK`) as the job's owner.
    async fn cancel(&self, who: &As, target: &str) -> Result<(), SlurmError>;
    /// `scancel --signal=SIG --batch ID` as the job's owner: the checkpoint signal to the batch shell,
    /// whose trap hands it to the container (`SIG` without its `SIG` prefix: `USR1`).
    async fn signal(&self, who: &As, target: &str, signal: &str) -> Result<(), SlurmError>;
    /// `scontrol requeue ID` as the job's owner: back to Slurm's queue (its processes stopped), the
    /// same Slurm job started again later with `SLURM_RESTART_COUNT` one higher.
    async fn requeue(&self, who: &As, target: &str) -> Result<(), SlurmError>;
    /// The cluster's nodes and their GPUs.
    async fn nodes(&self) -> Result<Vec<Node>, SlurmError>;
    /// Where `jobcomp/filetxt` writes (`JobCompLoc`), when that is the plugin.
    async fn jobcomp_log(&self) -> Option<PathBuf>;
}

/// Runs Slurm's commands.
#[derive(Debug, Clone, Default)]
pub struct Slurm;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Slurm {
    /// `program args` as `who`: through `runuser` when the engine is root and `who` is not (the job's
    /// owner submits and cancels, never root), else directly. The environment is cleared.
    fn command(who: Option<&As>, program: &str, args: &[String]) -> tokio::process::Command {
        let root = nix::unistd::geteuid().is_root();
        let mut c = match who {
            Some(u) if root && u.uid != 0 => {
                let mut c = tokio::process::Command::new("runuser");
                c.args(["-u", &u.name, "--", program]);
                c
            }
            _ => tokio::process::Command::new(program),
        };
        c.args(args)
            .env_clear()
            .env("PATH", PATH)
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        c
    }

    async fn output(mut c: tokio::process::Command, what: &str) -> Result<Vec<u8>, SlurmError> {
        let out = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .await?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if err.contains("Unable to contact slurm controller")
            || err.contains("Socket timed out")
            || err.contains("Connection refused")
            || err.contains("munge")
        {
            Err(SlurmError::Unavailable(format!("{what}: {err}")))
        } else {
            Err(SlurmError::Rejected(if err.is_empty() {
                format!("{what} exited with {}", out.status)
            } else {
                err
            }))
        }
    }
}

#[async_trait::async_trait]
impl SlurmClient for Slurm {
    /// `sbatch` as the job's owner, the script on stdin; returns the Slurm job id.
    async fn submit(&self, who: &As, args: &[String], script: &str) -> Result<u64, SlurmError> {
        use tokio::io::AsyncWriteExt;
        let mut c = Self::command(Some(who), "sbatch", args);
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).await?;
        }
        let out = child.wait_with_output().await?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(
                if err.contains("Unable to contact slurm controller") || err.contains("Socket timed out") {
                    SlurmError::Unavailable(err)
                } else {
                    SlurmError::Rejected(err)
                },
            );
        }
        // `--parsable`: `ID` or `ID;CLUSTER`.
        text.split(';')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| SlurmError::Parse(format!("sbatch printed {text:?}")))
    }

    /// Every job Slurm knows (pending, running, and those that ended within `MinJobAge`).
    async fn queue(&self) -> Result<Vec<SqJob>, SlurmError> {
        let out = Self::output(Self::command(None, "squeue", &["--json".into()]), "squeue --json").await?;
        parse_squeue(&out)
    }

    /// `scancel ID` (or `ID_TASK`) as the job's owner.
    async fn cancel(&self, who: &As, target: &str) -> Result<(), SlurmError> {
        Self::output(Self::command(Some(who), "scancel", &[target.to_string()]), "scancel")
            .await
            .map(|_| ())
    }

    async fn signal(&self, who: &As, target: &str, signal: &str) -> Result<(), SlurmError> {
        let args = [format!("--signal={signal}"), "--batch".into(), target.to_string()];
        Self::output(Self::command(Some(who), "scancel", &args), "scancel --signal")
            .await
            .map(|_| ())
    }

    async fn requeue(&self, who: &As, target: &str) -> Result<(), SlurmError> {
        Self::output(
            Self::command(Some(who), "scontrol", &["requeue".into(), target.to_string()]),
            "scontrol requeue",
        )
        .await
        .map(|_| ())
    }

    async fn nodes(&self) -> Result<Vec<Node>, SlurmError> {
        let out = Self::output(
            Self::command(None, "scontrol", &["show".into(), "node".into(), "-o".into()]),
            "scontrol show node",
        )
        .await?;
        Ok(parse_nodes(&String::from_utf8_lossy(&out)))
    }

    /// Where `jobcomp/filetxt` writes (`JobCompLoc`), when that is the plugin.
    async fn jobcomp_log(&self) -> Option<PathBuf> {
        let out = Self::output(
            Self::command(None, "scontrol", &["show".into(), "config".into()]),
            "scontrol show config",
        )
        .await
        .ok()?;
        let text = String::from_utf8_lossy(&out);
        let get = |key: &str| {
            text.lines().find_map(|l| {
                l.split_once('=')
                    .filter(|(k, _)| k.trim() == key)
                    .map(|(_, v)| v.trim().to_string())
            })
        };
        (get("JobCompType").as_deref() == Some("jobcomp/filetxt"))
            .then(|| get("JobCompLoc"))
            .flatten()
            .map(PathBuf::from)
    }
}
