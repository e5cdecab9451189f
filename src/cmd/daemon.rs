//! `gantry daemon`: the engine (or, on a Slurm node, the node agent).

use std::path::PathBuf;

use anyhow::{Context, Result};
use gantry_core::config::Overrides;
use gantry_core::daemon::EngineSetup;

use crate::cli::DaemonArgs;

/// Resolves on SIGINT or SIGTERM.
async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
}

/// `state_dir`: the global `--state-dir` (`GANTRY_STATE_DIR`).
pub async fn daemon(state_dir: Option<PathBuf>, a: &DaemonArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(dir) = &a.node_agent {
        return gantry_core::node_agent::run(
            dir.clone(),
            a.gpus.clone(),
            gantry_core::config::SAMPLE_EVERY,
            terminated(),
        )
        .await
        .context("the node agent stopped");
    }
    let setup = EngineSetup {
        system_root: a.system.then(|| a.system_root.clone()),
        state_dir,
        inbox: a.inbox.clone(),
        gpus: a.gpus.clone(),
        config: a.config.clone(),
        // The flags win over the lab config, also after a reload.
        overrides: Overrides {
            reserve_after: a.reserve_after,
            stop_grace: a.stop_grace,
            retry_backoff: a.retry_backoff,
        },
        header_timeout: a.header_timeout,
        inbox_group: a.inbox_group.clone(),
        inbox_path: a.inbox_path.clone(),
        sample_every: None,
    };
    let cfg = setup.config()?;
    let _lock = EngineSetup::lock(&cfg).await?;
    gantry_core::daemon::run(cfg, terminated())
        .await
        .context("the engine stopped")
}
