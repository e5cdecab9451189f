//! `gantry inbox [init]`: the caller's drop folder.

use std::os::unix::fs::DirBuilderExt;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use gantry_core::client::Target;

use super::Ctx;
use crate::cli::InboxAction;
use crate::print::{print_inbox, print_json};

pub async fn inbox(ctx: &Ctx, action: Option<&InboxAction>) -> Result<ExitCode> {
    let mut info = ctx.client.inbox().await?;
    let init = matches!(action, Some(InboxAction::Init));
    if let (true, Some(Target::Ssh { host, .. })) = (init && info.per_user, &ctx.remote) {
        // The folder is made by the user on the workstation, not on this computer.
        bail!("your drop folder is on {host}: run `ssh {host} gantry inbox init` there");
    }
    if init && info.per_user {
        // Made by the user, as the user: the engine only checks it and watches it.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&info.path)
            .with_context(|| format!("cannot create your drop folder {}", info.path.display()))?;
        info = ctx
            .client
            .inbox_init()
            .await
            .context("the engine does not watch your drop folder")?;
    }
    if ctx.json {
        print_json(&info)?;
    } else {
        print_inbox(&info, init);
    }
    Ok(if init && !info.watched {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
