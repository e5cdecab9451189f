//! `gantry config check`: the lab config, read as the engine would read it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use gantry_core::policy::{LabConfig, SYSTEM_CONFIG};

use crate::print::print_json;
use crate::term::{esc, outln};

/// `file`: default `$GANTRY_CONFIG` (through clap), else the system engine's file.
pub fn check(file: Option<PathBuf>, json: bool) -> Result<ExitCode> {
    let root = std::env::var_os("GANTRY_SYSTEM_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    let file = file.unwrap_or_else(|| gantry_core::config::under(&root, SYSTEM_CONFIG));
    // Explicitly named or not, checking a file that is not there is a mistake worth saying.
    match LabConfig::load(&file, false) {
        Ok(lab) => {
            if json {
                print_json(&serde_json::json!({"file": file, "ok": true, "problems": []}))?;
            } else {
                outln!("OK: {}", esc(&file.display().to_string()));
                if let Some(g) = &lab.gpus {
                    outln!(
                        "note: `gpus` ({}) is checked against the machine's GPUs when the engine starts",
                        g.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", ")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            if json {
                print_json(&serde_json::json!({"file": file, "ok": false, "problems": e.problems}))?;
            } else {
                for p in &e.problems {
                    eprintln!("{}", esc(&p.to_string()));
                }
            }
            Ok(ExitCode::FAILURE)
        }
    }
}
