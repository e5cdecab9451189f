//! Interactive sessions: `gantry shell` (queue one, wait for it, attach) and `gantry attach ID`.
//!
//! The local terminal is put in raw mode, so every key (Ctrl-C included) goes to the session's
//! shell; window size changes (SIGWINCH) are sent as resize frames. Ctrl-P Ctrl-Q detaches (the
//! session keeps running), as with `docker attach`.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use gantry_core::protocol::terminal::{Decoder, Frame, SessionEnd};
use gantry_core::protocol::{JobState, SpecOrigin, SubmitRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Ctx;
use crate::cli::ShellArgs;
use crate::term::esc;

/// What detaches, said on every attach.
pub const DETACH_KEYS: &str = "Ctrl-P Ctrl-Q";
const CTRL_P: u8 = 0x10;
const CTRL_Q: u8 = 0x11;

/// Finds Ctrl-P Ctrl-Q in what is typed. A Ctrl-P waits for the next key: with Ctrl-Q it detaches,
/// with anything else both go to the shell (as `docker attach` does).
#[derive(Debug, Default)]
pub struct DetachKeys {
    held: bool,
}

impl DetachKeys {
    /// The bytes to send on, and whether the keys to detach were typed (what follows them is dropped).
    pub fn feed(&mut self, typed: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(typed.len() + 1);
        for &b in typed {
            if self.held {
                self.held = false;
                if b == CTRL_Q {
                    return (out, true);
                }
                out.push(CTRL_P);
            }
            if b == CTRL_P {
                self.held = true;
            } else {
                out.push(b);
            }
        }
        (out, false)
    }
}

/// The local terminal in raw mode until dropped (then as it was).
struct Raw {
    saved: Option<nix::sys::termios::Termios>,
}

impl Raw {
    fn enter() -> Raw {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Raw { saved: None };
        }
        let Ok(saved) = tcgetattr(&stdin) else {
            return Raw { saved: None };
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        if tcsetattr(&stdin, SetArg::TCSADRAIN, &raw).is_err() {
            return Raw { saved: None };
        }
        Raw { saved: Some(saved) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSADRAIN, saved);
        }
    }
}

/// The local terminal's size (columns, rows), if stdout or stdin is one.
fn window_size() -> Option<(u16, u16)> {
    for fd in [1, 0] {
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given, which lives here.
        let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0;
        if ok && ws.ws_col > 0 && ws.ws_row > 0 {
            return Some((ws.ws_col, ws.ws_row));
        }
    }
    None
}

/// How an attachment ended.
enum Left {
    Detached,
    Ended(SessionEnd),
    /// The connection closed without the session's end (the engine stopped, ssh broke).
    Lost,
}

/// What `gantry shell` / `notebook` ask for (the spec is `gantry_core::spec::session_spec`'s, as
/// the app's).
fn session_ask(args: &ShellArgs, notebook_port: Option<u16>) -> gantry_core::protocol::SessionAsk {
    gantry_core::protocol::SessionAsk {
        notebook_port,
        gpus: args.gpus,
        gpu_memory: args.gpu_memory.clone(),
        gpu_type: args.gpu_type.clone(),
        image: args.image.clone(),
        length: args.length.clone(),
        cpus: args.cpus,
        memory: args.memory.clone(),
        name: args.name.clone(),
    }
}

pub async fn shell(ctx: &Ctx, args: &ShellArgs) -> Result<ExitCode> {
    // No image: this machine's own folders and your home, starting where you are (when it is there).
    let image = args
        .image
        .clone()
        .unwrap_or_else(|| gantry_core::spec::HOST_IMAGE.into());
    let mut spec = gantry_core::spec::session_spec(&session_ask(args, None), image, "");
    if spec.is_host_image() && ctx.remote.is_none() {
        let here = std::env::current_dir().ok().map(|d| d.to_string_lossy().into_owned());
        let home = std::env::var("HOME").unwrap_or_default();
        spec.workdir = here.filter(|d| {
            !home.is_empty()
                && home != "/"
                && (*d == home || d.starts_with(&format!("{}/", home.trim_end_matches('/'))))
        });
    }
    let id = queue_session(ctx, &spec).await?;
    if !wait_running(ctx, id).await? {
        return Ok(ExitCode::FAILURE);
    }
    attach(ctx, id).await
}

/// `gantry notebook`: a session running `jupyter lab` on `--port` (127.0.0.1 inside its
/// container) with a fresh token, then the URL to open.
pub async fn notebook(ctx: &Ctx, args: &crate::cli::NotebookArgs) -> Result<ExitCode> {
    let image = match args.session.image.clone() {
        Some(i) => i,
        None => ctx.client.status().await?.notebook_image.context(
            "the lab config names no notebook image (`[sessions] notebook_image`): add --image IMG, an image with `jupyter lab` in it (e.g. quay.io/jupyter/pytorch-notebook:cuda12-latest)",
        )?,
    };
    let port = args.port;
    let spec = gantry_core::spec::session_spec(
        &session_ask(&args.session, Some(port)),
        image,
        &gantry_core::client::new_submit_key(),
    );
    let id = queue_session(ctx, &spec).await?;
    if !wait_running(ctx, id).await? {
        return Ok(ExitCode::FAILURE);
    }
    eprintln!("gantry: notebook {id} runs; `gantry attach {id}` shows Jupyter's output, `gantry cancel {id}` ends it");
    open(ctx, id, Some(port)).await
}

/// `gantry open ID [PORT]`: the URL on this computer. Local: the engine's loopback forward. Remote:
/// `ssh -L` through the shared connection to the workstation's forward, until Ctrl-C.
pub async fn open(ctx: &Ctx, id: i64, port: Option<u16>) -> Result<ExitCode> {
    let o = ctx.client.open_port(id, port).await?;
    let Some(target) = &ctx.remote else {
        if ctx.json {
            crate::print::print_json(&o)?;
        } else {
            crate::term::outln!("{}", o.url);
            eprintln!("gantry: port {} of job {id}, for you only, while it runs", o.port);
        }
        return Ok(ExitCode::SUCCESS);
    };
    let local = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .context("finding a free port on this computer")?
        .port();
    let forward = target
        .forward_command(local, &o.address)
        .context("an ssh target")?
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running ssh")?;
    if !forward.status.success() {
        bail!(
            "ssh could not forward port {local} to {} on {}: {}",
            o.address,
            target.describe(),
            String::from_utf8_lossy(&forward.stderr).trim()
        );
    }
    let url = o.url.replace(&o.address, &format!("127.0.0.1:{local}"));
    if ctx.json {
        crate::print::print_json(&gantry_core::protocol::terminal::Opened {
            url,
            address: format!("127.0.0.1:{local}"),
            ..o
        })?;
    } else {
        crate::term::outln!("{url}");
    }
    eprintln!(
        "gantry: forwarding through ssh to {} while job {id} runs; Ctrl-C stops",
        target.describe()
    );
    // Following the engine's events keeps the shared connection (which holds the forward) open,
    // and says when the job ends.
    let ended = ctx.client.events(|ev| !matches!(ev, gantry_core::protocol::EngineEvent::Job { job_id, state, .. } if job_id == id && state.is_final()));
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        r = ended => match r {
            Ok(()) => eprintln!("gantry: job {id} ended"),
            Err(e) => eprintln!("gantry: lost the connection to {}: {e}", target.describe()),
        },
    }
    if let Some(mut cancel) = target.cancel_forward_command(local, &o.address) {
        let _ = cancel
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Queue a session's spec; its id.
async fn queue_session(ctx: &Ctx, spec: &gantry_core::spec::JobSpec) -> Result<i64> {
    let text = serde_yaml_ng::to_string(spec)?;
    let req = SubmitRequest {
        text,
        file_name: "shell.yaml".into(),
        base_dir: None,
        idempotency_key: None,
        origin: SpecOrigin::RunFlags,
        begin: None,
    };
    let id = ctx
        .client
        .submit(&req)
        .await
        .map_err(|e| match e {
            gantry_core::client::ClientError::Api {
                spec_error: Some(se), ..
            } => anyhow::anyhow!(
                "{}",
                gantry_core::spec::SpecError {
                    line: None,
                    column: None,
                    ..se
                }
            ),
            e => e.into(),
        })?
        .job_id;
    eprintln!("gantry: session {id} queued; waiting for it to start (Ctrl-C cancels it)");
    Ok(id)
}

/// Wait until session `id` runs (`true`), printing why it waits when that changes; Ctrl-C cancels it.
async fn wait_running(ctx: &Ctx, id: i64) -> Result<bool> {
    let mut said: Option<String> = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let d = ctx.client.job(id).await?;
        match d.job.state {
            JobState::Running => return Ok(true),
            s if s.is_final() => {
                let why = d
                    .job
                    .message
                    .clone()
                    .or_else(|| d.attempts.last().and_then(|a| a.message.clone()))
                    .unwrap_or_default();
                eprintln!(
                    "gantry: session {id} ended {} before it could be attached{}",
                    s.as_str(),
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", esc(&why))
                    }
                );
                return Ok(false);
            }
            _ => {}
        }
        if let Some(r) = d.reason.filter(|r| said.as_ref() != Some(r)) {
            eprintln!("gantry: waiting: {}", esc(&r));
            said = Some(r);
        }
        tokio::select! {
            _ = &mut ctrl_c => {
                ctx.client.cancel(id).await.context("cancelling the session")?;
                eprintln!("gantry: session {id} cancelled");
                return Ok(false);
            }
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
}

/// Join session `id`'s terminal until it ends (its shell's exit status) or Ctrl-P Ctrl-Q.
pub async fn attach(ctx: &Ctx, id: i64) -> Result<ExitCode> {
    let io = ctx.client.attach(id).await?;
    let (mut rx, mut tx) = tokio::io::split(io);
    let back = match &ctx.remote {
        Some(t) => format!("gantry --host {} attach {id}", t.describe()),
        None => format!("gantry attach {id}"),
    };
    eprintln!("gantry: detach with {DETACH_KEYS}; `{back}` comes back");
    let raw = Raw::enter();
    if let Some((cols, rows)) = window_size() {
        tx.write_all(&Frame::Resize { cols, rows }.encode()).await?;
    }
    // Keys typed, read by a thread of its own (a blocking read of a terminal cannot be cancelled; the
    // thread ends with the process).
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .context("watching the window size")?;
    let mut detach = DetachKeys::default();
    let mut decoder = Decoder::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut stdin_open = true;
    let mut out = std::io::stdout();
    let left = loop {
        tokio::select! {
            typed = keys.recv(), if stdin_open => match typed {
                Some(k) => {
                    let (send, detached) = detach.feed(&k);
                    if !send.is_empty() {
                        tx.write_all(&Frame::Data(send).encode()).await?;
                    }
                    if detached {
                        break Left::Detached;
                    }
                }
                // No more input (a pipe ended): keep showing the output until the session ends.
                None => stdin_open = false,
            },
            _ = winch.recv() => {
                if let Some((cols, rows)) = window_size() {
                    tx.write_all(&Frame::Resize { cols, rows }.encode()).await?;
                }
            }
            read = rx.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break Left::Lost,
                    Ok(n) => n,
                };
                let mut ended = None;
                for f in decoder.push(&buf[..n])? {
                    match f {
                        Frame::Data(d) => {
                            out.write_all(&d)?;
                        }
                        Frame::Notice(t) => {
                            out.write_all(format!("\r\n[gantry] {}\r\n", esc(&t)).as_bytes())?;
                        }
                        Frame::Ended(end) => ended = Some(end),
                        Frame::Resize { .. } => {}
                    }
                }
                out.flush()?;
                if let Some(end) = ended {
                    break Left::Ended(end);
                }
            }
        }
    };
    drop(raw);
    Ok(match left {
        Left::Detached => {
            eprintln!("\r\ngantry: detached from session {id}; it keeps running. `{back}` comes back, `gantry cancel {id}` ends it");
            ExitCode::SUCCESS
        }
        Left::Ended(end) => {
            eprintln!("\r\ngantry: session {id} ended: {}", esc(&end.message));
            match end.exit_code {
                Some(c) if end.state != JobState::TimedOut && end.state != JobState::Cancelled => {
                    ExitCode::from(c.clamp(0, 255) as u8)
                }
                _ => ExitCode::FAILURE,
            }
        }
        Left::Lost => {
            eprintln!("\r\ngantry: the connection to session {id} closed; if it still runs, `{back}` comes back");
            ExitCode::FAILURE
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_p_ctrl_q_detaches_and_a_lone_ctrl_p_goes_through() {
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(Vec<&[u8]>, Vec<u8>, bool)> = vec![
            (vec![b"ls\r"], b"ls\r".to_vec(), false),
            (vec![b"ab\x10\x11cd"], b"ab".to_vec(), true),
            // Split across reads.
            (vec![b"x\x10", b"\x11"], b"x".to_vec(), true),
            // Ctrl-P then another key: both go to the shell (bash's previous-history).
            (vec![b"\x10a"], b"\x10a".to_vec(), false),
            (vec![b"\x10", b"\x10", b"\x11"], b"\x10".to_vec(), true),
            (vec![b"\x03"], b"\x03".to_vec(), false),
        ];
        for (reads, want, want_detach) in rows {
            let mut d = DetachKeys::default();
            let (mut sent, mut detached) = (vec![], false);
            for r in &reads {
                let (s, det) = d.feed(r);
                sent.extend(s);
                if det {
                    detached = true;
                    break;
                }
            }
            assert_eq!((sent, detached), (want, want_detach), "{reads:?}");
        }
    }
}
