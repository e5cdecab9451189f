//! What the desktop app's shell tells its page beyond the engine's own answers: which engine it
//! talks to, the machine switcher, connection events.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// How the app found the engine it talks to (`client::EngineRef`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// The machine's engine (`gantry daemon --system`).
    System,
    /// The user's own engine, in their state dir.
    User,
    /// The engine in `--state-dir` / `GANTRY_STATE_DIR`.
    StateDir,
    /// Hosted by the app itself.
    Embedded,
    /// Another engine of this user, found through the machine lock it holds.
    Holder,
    /// Another user's engine holds the machine lock: there is no engine to talk to.
    Blocked,
    /// A workstation's engine, through `ssh HOST gantry proxy`.
    Remote,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::System => "system",
            EngineKind::User => "user",
            EngineKind::StateDir => "state_dir",
            EngineKind::Embedded => "embedded",
            EngineKind::Holder => "holder",
            EngineKind::Blocked => "blocked",
            EngineKind::Remote => "remote",
        }
    }
}

/// Which engine the app talks to (from gantry-core's `EngineRef::view`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[ts(rename = "EngineInfo")]
pub struct EngineView {
    pub kind: EngineKind,
    /// One line for the header.
    pub label: String,
    pub socket: Option<PathBuf>,
    /// Why there is no engine (`blocked`: another user's engine holds this machine's GPUs), with what to do.
    pub problem: Option<String>,
}

/// The machine switcher: `current` is the remote host in use (`None`: this computer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct Machines {
    pub current: Option<String>,
    /// Saved by the user (connected once), most recent first.
    pub saved: Vec<String>,
    /// From `~/.ssh/config`, not saved yet.
    pub ssh_config: Vec<String>,
}

/// The app's `connection` event: a remote workstation's connection went away (`ok: false`, retried
/// after `retry_in_s`) or came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct ConnectionEvent {
    pub host: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_s: Option<u64>,
}

/// A session to queue, as `gantry shell` / `gantry notebook` and the app's "Start a session" ask for
/// one (`spec::session_spec` writes its spec; the lab's `[sessions]` bounds it at submit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct SessionAsk {
    /// `Some(port)`: a notebook (`jupyter lab` on that port inside the container); `None`: a shell.
    #[serde(default)]
    pub notebook_port: Option<u16>,
    pub gpus: i64,
    /// Per GPU (`20GiB`): share a GPU instead of taking a whole one.
    #[serde(default)]
    pub gpu_memory: Option<String>,
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// `None`: a shell runs in this machine's own folders (`image: host`), a notebook in the lab's
    /// `[sessions] notebook_image`.
    #[serde(default)]
    pub image: Option<String>,
    /// How long it may last (`2h`); `None`: the lab's `[sessions] default_length`.
    #[serde(default)]
    pub length: Option<String>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory: Option<String>,
    /// Its name in the queue (default: `shell` or `notebook`).
    #[serde(default)]
    pub name: Option<String>,
}
