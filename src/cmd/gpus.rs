//! `gantry gpus`.

use anyhow::Result;

use super::Ctx;
use crate::print::{print_gpus, print_json};

pub async fn gpus(ctx: &Ctx) -> Result<()> {
    let g = ctx.client.gpus().await?;
    if ctx.json {
        print_json(&g)
    } else {
        print_gpus(&g);
        Ok(())
    }
}
