//! `gantry`: the command-line client (and `gantry daemon`, the engine).
//!
//! - [`cli`]: the commands and flags (clap)
//! - [`cmd`]: what each command does, one file per group of commands
//! - [`print`]: the human output of the engine's answers
//! - [`term`]: stdout and text from other users made safe for the terminal

mod cli;
mod cmd;
mod print;
mod print_efficiency;
mod term;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(cmd::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gantry: {}", term::escape(&format!("{e:#}"), "\n"));
            std::process::ExitCode::FAILURE
        }
    }
}
