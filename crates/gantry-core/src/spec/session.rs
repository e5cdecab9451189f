//! The spec of an interactive session: what `gantry shell`, `gantry notebook` and the app's "Start a
//! session" queue (one writer, so the three cannot drift apart).

use super::{Command, JobSpec};
use crate::protocol::SessionAsk;

/// The spec of session `ask` in `image`, with `token` as a notebook's `JUPYTER_TOKEN` (the URL
/// `gantry open` gives carries it). A shell gets its image's login shell; a notebook runs
/// `jupyter lab` on 127.0.0.1 inside its container, on its port.
pub fn session_spec(ask: &SessionAsk, image: String, token: &str) -> JobSpec {
    let default_name = if ask.notebook_port.is_some() {
        "notebook"
    } else {
        "shell"
    };
    let mut spec = JobSpec {
        name: Some(
            ask.name
                .clone()
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| default_name.into()),
        ),
        image,
        command: None,
        workdir: None,
        env: Default::default(),
        mounts: vec![],
        tensorboard: None,
        gpus: ask.gpus,
        gpu_memory: ask.gpu_memory.clone(),
        gpu_type: ask.gpu_type.clone(),
        min_gpu_memory: None,
        priority: 0,
        timeout: ask.length.clone(),
        retries: 0,
        expected_runtime: None,
        after: vec![],
        begin: None,
        matrix: Default::default(),
        cpus: ask.cpus,
        memory: ask.memory.clone(),
        shm_size: None,
        ipc: None,
        home: None,
        ulimits: None,
        pids_limit: None,
        interactive: true,
        ports: vec![],
        notify: None,
        // Someone is at the terminal: a session is never preempted.
        preemptible: Some(false),
        checkpoint: None,
    };
    if let Some(port) = ask.notebook_port {
        spec.command = Some(Command::Exec(
            [
                "jupyter",
                "lab",
                "--ip=127.0.0.1",
                &format!("--port={port}"),
                "--no-browser",
            ]
            .map(String::from)
            .to_vec(),
        ));
        spec.env.insert("JUPYTER_TOKEN".into(), token.into());
        spec.ports = vec![port];
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(notebook_port: Option<u16>) -> SessionAsk {
        SessionAsk {
            notebook_port,
            gpus: 1,
            gpu_memory: None,
            gpu_type: None,
            image: None,
            length: Some("2h".into()),
            cpus: None,
            memory: None,
            name: None,
        }
    }

    #[test]
    fn a_shell_and_a_notebook_are_never_preempted_sessions() {
        let shell = session_spec(&ask(None), "host".into(), "t0ken");
        assert_eq!(
            (
                shell.name.as_deref(),
                shell.interactive,
                shell.preemptible,
                shell.timeout.as_deref()
            ),
            (Some("shell"), true, Some(false), Some("2h"))
        );
        assert!(
            shell.command.is_none() && shell.ports.is_empty() && shell.env.is_empty(),
            "{shell:?}"
        );
        let nb = session_spec(
            &SessionAsk {
                name: Some("demo".into()),
                ..ask(Some(8890))
            },
            "jupyter:1".into(),
            "t0ken",
        );
        assert_eq!(
            (
                nb.name.as_deref(),
                nb.ports.clone(),
                nb.env.get("JUPYTER_TOKEN").map(String::as_str)
            ),
            (Some("demo"), vec![8890], Some("t0ken"))
        );
        assert!(
            matches!(&nb.command, Some(Command::Exec(a)) if a.contains(&"--port=8890".to_string()) && a.contains(&"--ip=127.0.0.1".to_string())),
            "{nb:?}"
        );
    }
}
