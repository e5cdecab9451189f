//! `gantry status`: which engine this CLI talks to, and how it is.

use std::path::Path;

use anyhow::Result;
use gantry_core::client::FoundBy;
use gantry_core::protocol::StatusInfo;

use super::Ctx;
use crate::print::{print_json, print_status};
use crate::term::{esc, outln};

/// `host`: `--host`, when the engine is a workstation's.
pub async fn status(ctx: &Ctx, host: Option<&str>) -> Result<()> {
    let s = ctx.client.status().await?;
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Located<'a> {
            #[serde(flatten)]
            status: &'a StatusInfo,
            found_by: Option<FoundBy>,
            socket: Option<&'a Path>,
            host: Option<&'a str>,
        }
        let located = match host {
            Some(h) => Located {
                status: &s,
                found_by: None,
                socket: None,
                host: Some(h),
            },
            None => Located {
                status: &s,
                found_by: Some(ctx.found_by),
                socket: Some(&ctx.socket),
                host: None,
            },
        };
        return print_json(&located);
    }
    let at = esc(&ctx.socket.display().to_string()).into_owned();
    outln!(
        "{}",
        match (host, ctx.found_by) {
            (Some(h), _) => format!(
                "remote: {} ({}, through ssh)",
                esc(h),
                if s.system {
                    "system engine"
                } else {
                    "an engine of your own there"
                }
            ),
            (None, FoundBy::System) => format!("system engine at {at}"),
            (None, FoundBy::StateDir) => format!("engine from --state-dir at {at}"),
            (None, FoundBy::User) => format!("your own engine at {at}"),
        }
    );
    print_status(&s);
    Ok(())
}
