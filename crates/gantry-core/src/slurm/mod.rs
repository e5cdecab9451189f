//! The Slurm backend: Slurm places and runs jobs; Gantry submits them as their owner, tracks them and
//! records them in its history.
//!
//! The decisions are pure functions tested by tables: a job → `sbatch` arguments ([`sbatch_args`]) and
//! batch script ([`batch_script`]), Slurm's state and reason → Gantry's ([`seen`], [`why_waiting`]), and
//! what to do with an attempt found open after a restart ([`resume`]). [`Slurm`] runs the commands
//! (`sbatch`, `squeue --json`, `scancel`, `scontrol`) and parses their JSON or key=value output, never
//! columns by position.

mod client;
#[cfg(test)]
pub mod fake;
mod output;
mod sbatch;
mod settings;
mod state;

pub use client::*;
pub use output::*;
pub use sbatch::*;
pub use settings::*;
pub use state::*;

#[cfg(test)]
mod tests;
