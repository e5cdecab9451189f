//! One file per group of commands; [`run`] finds the engine and hands each command its client.

mod book;
mod config;
mod daemon;
mod generate;
mod gpus;
mod history;
mod inbox;
mod jobs;
mod mcp;
mod notify;
mod reference;
mod results;
mod session;
mod sim;
mod status;
mod submit;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use gantry_core::client::{Client, FoundBy, Target};

use crate::cli::{Cli, Cmd, ConfigCmd};

/// What every command that talks to an engine gets.
pub struct Ctx {
    pub client: Client,
    /// `--host`: the workstation reached through ssh.
    pub remote: Option<Target>,
    /// `--json`.
    pub json: bool,
    /// The local engine's socket, and how it was found (`--host` unset).
    pub socket: PathBuf,
    pub found_by: FoundBy,
}

pub async fn run(cli: Cli) -> Result<ExitCode> {
    let (socket, found_by) = gantry_core::client::locate(cli.state_dir.clone());
    let remote = match (&cli.host, &cli.cmd) {
        (Some(_), Cmd::Daemon(_) | Cmd::Proxy) => bail!("--host (or GANTRY_HOST) is for commands that talk to an engine; `daemon` and `proxy` run on the workstation itself"),
        (Some(h), _) => Some(Target::ssh(h)?),
        (None, _) => None,
    };
    let mut client = Client::to(remote.clone().unwrap_or_else(|| Target::Socket(socket.clone())));
    if let Some(t) = cli.client_timeout {
        client = client.with_timeout(t);
    }
    let ctx = Ctx {
        client,
        remote,
        json: cli.json,
        socket,
        found_by,
    };
    match &cli.cmd {
        // These decide their exit status.
        Cmd::Submit {
            files,
            dry_run: true,
            begin,
        } => return submit::dry_run(&ctx, files, begin.as_deref()).await,
        Cmd::Submit {
            files,
            dry_run: false,
            begin,
        } => return submit::submit(&ctx, files, begin.as_deref()).await,
        Cmd::Mcp => return mcp::serve(ctx).await,
        Cmd::Config {
            cmd: ConfigCmd::Check { file },
        } => return config::check(file.clone(), ctx.json),
        Cmd::Inbox { action } => return inbox::inbox(&ctx, action.as_ref()).await,
        Cmd::Shell(args) => return session::shell(&ctx, args).await,
        Cmd::Attach { id } => return session::attach(&ctx, *id).await,
        Cmd::Notebook(args) => return session::notebook(&ctx, args).await,
        Cmd::Open { id, port } => return session::open(&ctx, *id, *port).await,
        Cmd::Daemon(args) => daemon::daemon(cli.state_dir.clone(), args).await?,
        Cmd::Proxy => gantry_core::client::proxy(&ctx.socket).await?,
        Cmd::Generate { dir, reference: false } => generate::generate(dir)?,
        Cmd::Generate { dir, reference: true } => reference::write(dir)?,
        Cmd::Schema => generate::schema()?,
        Cmd::Run(args) => submit::run(&ctx, args).await?,
        Cmd::Rerun { id } => submit::rerun(&ctx, *id).await?,
        Cmd::Ls { limit, all } => jobs::ls(&ctx, (!*all).then_some(*limit)).await?,
        Cmd::Show { id } => jobs::show(&ctx, *id).await?,
        Cmd::Logs { id, follow } => jobs::logs(&ctx, *id, *follow).await?,
        Cmd::Cancel { id } => jobs::cancel(&ctx, *id).await?,
        Cmd::Priority { id, priority } => jobs::priority(&ctx, *id, *priority).await?,
        Cmd::Hold { id } => jobs::hold(&ctx, *id, true).await?,
        Cmd::Release { id } => jobs::hold(&ctx, *id, false).await?,
        Cmd::Gpus => gpus::gpus(&ctx).await?,
        Cmd::History {
            user,
            status,
            since,
            limit,
            metric,
        } => {
            history::history(
                &ctx,
                user.clone(),
                status.as_deref(),
                since.as_deref(),
                *limit,
                metric.clone(),
            )
            .await?
        }
        Cmd::Compare { runs, sort, min, csv } => results::compare(&ctx, runs, sort.clone(), *min, *csv).await?,
        Cmd::Usage { since, csv } => history::usage(&ctx, since, *csv).await?,
        Cmd::Notify { action } => notify::notify(&ctx, action).await?,
        Cmd::Book {
            action: Some(crate::cli::BookAction::Cancel { id }),
            ..
        } => book::cancel(&ctx, *id).await?,
        Cmd::Book {
            action: None,
            gpus,
            gpu_type,
            at,
            length,
            note,
        } => book::book(&ctx, *gpus, gpu_type.clone(), at.as_deref(), *length, note.clone()).await?,
        Cmd::Bookings { all } => book::bookings(&ctx, *all).await?,
        Cmd::Sim(args) => sim::sim(args, ctx.json)?,
        Cmd::Status => status::status(&ctx, cli.host.as_deref()).await?,
    }
    Ok(ExitCode::SUCCESS)
}
