//! What is generated from Gantry's own definitions: the job spec's JSON Schema (`gantry schema`, for
//! editors) and the shell completions and man page (`gantry generate`, for the package).

use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::Cli;
use crate::print::print_json;
use crate::term::outln;

pub fn schema() -> Result<()> {
    print_json(&gantry_core::spec::json_schema())
}

/// Completions for bash, zsh and fish, and `gantry.1`, generated from the same clap definition the CLI
/// parses with, so they cannot drift from it.
pub fn generate(dir: &Path) -> Result<()> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut Cli::command(), "gantry", dir)
            .with_context(|| format!("cannot write {shell} completions into {}", dir.display()))?;
        outln!("{}", path.display());
    }
    let mut man = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut man)?;
    let path = dir.join("gantry.1");
    std::fs::write(&path, man).with_context(|| format!("cannot write {}", path.display()))?;
    outln!("{}", path.display());
    Ok(())
}
