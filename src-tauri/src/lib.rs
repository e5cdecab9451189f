//! Gantry desktop app: a thin Tauri shell over the engine's API client.
//!
//! On start the app finds an engine the way the CLI does (`GANTRY_STATE_DIR`, then the system engine,
//! then the user's own). If none answers it hosts one in-process (the embedded default) — which serves
//! the same socket, so every command below goes through one API client — unless another engine holds
//! this machine's GPUs: then it uses that engine if it is the same user's, or says whose it is.
//!
//! The header's machine switcher moves every command to a workstation's engine through
//! `ssh HOST gantry proxy` (the same client as `gantry --host`); `GANTRY_HOST` starts there.

use std::path::PathBuf;
use std::sync::Arc;

use gantry_core::client::{self as core_client, Client, EngineRef, FoundBy, Target};
use gantry_core::daemon::EngineSetup;
use gantry_core::engine::{Engine, Paths};
use gantry_core::machine_lock::{LockError, MachineLock};
use gantry_core::machines;
use gantry_core::protocol::routes::parse_query;
use gantry_core::protocol::{
    BookRequest, BookingView, Bookings, BookingsQuery, ConnectionEvent, EngineEvent, EngineView, GpuMinute, GpuStatus,
    HistoryFilter, HistoryRow, JobChanged, JobDetailView as JobDetail, JobState, Machines, Preview,
    QueueEntryView as QueueEntry, RecentSample, SessionAsk, StatusInfo, TimelineRun, UsageReport, WhoAmI,
};
use tauri::ipc::Channel;
use tauri::{Emitter, Manager, State};
use tauri_plugin_notification::NotificationExt;

type R<T> = Result<T, String>;

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

pub struct AppState {
    /// This computer's engine (found, hosted or blocked).
    local: (Client, EngineRef),
    /// The engine in use: `local`, or a remote workstation's.
    current: std::sync::RwLock<(Client, EngineRef)>,
    /// The task forwarding the current engine's events (replaced on a switch).
    events: std::sync::Mutex<Option<tauri::async_runtime::JoinHandle<()>>>,
    /// The saved remote workstations (JSON in the app's config dir).
    machines_file: PathBuf,
    /// Held while this app hosts the engine.
    _lock: Option<MachineLock>,
}

impl AppState {
    fn client(&self) -> Client {
        self.current.read().unwrap().0.clone()
    }
    fn host(&self) -> Option<String> {
        match &self.current.read().unwrap().1 {
            EngineRef::Remote { host } => Some(host.clone()),
            _ => None,
        }
    }
}

/// Which engine this app talks to (the header), or why there is none.
#[tauri::command]
async fn engine(s: State<'_, AppState>) -> R<EngineView> {
    Ok(s.current.read().unwrap().1.view())
}
/// "This computer" and the remote workstations to switch to.
#[tauri::command]
async fn machines(s: State<'_, AppState>) -> R<Machines> {
    Ok(machines::list(&s.machines_file, s.host()))
}
/// Use HOST's engine through ssh (`None`: this computer's); the UI reloads on success.
#[tauri::command]
async fn connect_machine(app: tauri::AppHandle, s: State<'_, AppState>, host: Option<String>) -> R<EngineView> {
    switch(&app, &s, host).await.map_err(e)
}
#[tauri::command]
async fn forget_machine(s: State<'_, AppState>, host: String) -> R<Vec<String>> {
    machines::remember(&s.machines_file, &host, false).map_err(e)
}
#[tauri::command]
async fn status(s: State<'_, AppState>) -> R<StatusInfo> {
    s.client().status().await.map_err(e)
}
#[tauri::command]
async fn whoami(s: State<'_, AppState>) -> R<WhoAmI> {
    s.client().whoami().await.map_err(e)
}
#[tauri::command]
async fn queue(s: State<'_, AppState>) -> R<Vec<QueueEntry>> {
    s.client().queue().await.map_err(e)
}
#[tauri::command]
async fn job(s: State<'_, AppState>, id: i64) -> R<JobDetail> {
    s.client().job(id).await.map_err(e)
}
#[tauri::command]
async fn cancel(s: State<'_, AppState>, id: i64) -> R<JobState> {
    s.client().cancel(id).await.map_err(e)
}
#[tauri::command]
async fn set_priority(s: State<'_, AppState>, id: i64, priority: i32) -> R<bool> {
    s.client().set_priority(id, priority).await.map_err(e)
}
#[tauri::command]
async fn rerun(s: State<'_, AppState>, id: i64) -> R<i64> {
    s.client().rerun(id).await.map(|r| r.job_id).map_err(e)
}
#[tauri::command]
async fn gpus(s: State<'_, AppState>) -> R<GpuStatus> {
    s.client().gpus().await.map_err(e)
}
#[tauri::command]
async fn gpu_recent(s: State<'_, AppState>, since: i64) -> R<Vec<RecentSample>> {
    s.client().gpus_recent(since).await.map_err(e)
}
#[tauri::command]
async fn gpu_minutes(s: State<'_, AppState>, index: u32, from: i64, to: i64) -> R<Vec<GpuMinute>> {
    s.client().gpu_minutes(index, from, to).await.map_err(e)
}
/// Per-user GPU-hours, jobs, mean wait and fair-share usage since `since_ms` (as `gantry usage`).
#[tauri::command]
async fn usage(s: State<'_, AppState>, since_ms: i64) -> R<UsageReport> {
    s.client().usage(since_ms).await.map_err(e)
}
/// The Usage view's efficiency: per user GPU-hours held vs used and CPU efficiency, per local day.
#[tauri::command]
async fn usage_efficiency(
    s: State<'_, AppState>,
    since_ms: i64,
    tz_offset_min: i32,
) -> R<gantry_core::protocol::EfficiencyReport> {
    s.client()
        .usage_efficiency(&gantry_core::protocol::EfficiencyQuery {
            since_ms,
            tz_offset_min,
        })
        .await
        .map_err(e)
}
/// What a job logged: metric series (at most `max_points` points each), params and tags.
#[tauri::command]
async fn job_results(s: State<'_, AppState>, id: i64, max_points: Option<u32>) -> R<gantry_core::protocol::JobResults> {
    s.client().job_results(id, max_points).await.map_err(e)
}
/// Runs side by side, best first (History's Compare, a sweep's view).
#[tauri::command]
async fn compare(
    s: State<'_, AppState>,
    query: gantry_core::protocol::CompareQuery,
) -> R<gantry_core::protocol::Comparison> {
    s.client().compare(&query).await.map_err(e)
}
/// The Usage view's charts: GPU-hours per user per bucket, utilization by local day and hour.
#[tauri::command]
async fn usage_charts(
    s: State<'_, AppState>,
    since_ms: i64,
    bucket_ms: i64,
    tz_offset_min: i32,
) -> R<gantry_core::protocol::UsageCharts> {
    s.client()
        .usage_charts(&gantry_core::protocol::UsageChartsQuery {
            since_ms,
            bucket_ms,
            tz_offset_min,
        })
        .await
        .map_err(e)
}
/// `query` is the URL query string built by the UI (filters, sort, page), read as the engine reads it.
#[tauri::command]
async fn history(s: State<'_, AppState>, query: String) -> R<Vec<HistoryRow>> {
    s.client()
        .history(&parse_query::<HistoryFilter>(&query).map_err(e)?)
        .await
        .map_err(e)
}
#[tauri::command]
async fn history_count(s: State<'_, AppState>, query: String) -> R<i64> {
    s.client()
        .history_count(&parse_query::<HistoryFilter>(&query).map_err(e)?)
        .await
        .map_err(e)
}
#[tauri::command]
async fn timeline(s: State<'_, AppState>, from: i64, to: i64) -> R<Vec<TimelineRun>> {
    s.client().timeline(from, to).await.map_err(e)
}
#[tauri::command]
async fn logs(s: State<'_, AppState>, id: i64) -> R<String> {
    s.client()
        .logs(id)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(e)
}
/// Live log tail through a Channel until the job ends or the view closes (`unwatch`).
#[tauri::command]
async fn follow_logs(s: State<'_, AppState>, id: i64, on_chunk: Channel<String>) -> R<()> {
    let ch = on_chunk.id();
    s.client()
        .follow_logs(id, |c| {
            live(ch) && on_chunk.send(String::from_utf8_lossy(c).into_owned()).is_ok()
        })
        .await
        .map_err(e)
}
/// Channels of closed or hidden views (`unwatch`): their streams end at the next message. A webview
/// cannot tell Rust that it dropped a channel, and sending to a dead one still succeeds.
static UNWATCHED: std::sync::Mutex<std::collections::BTreeSet<u32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());
fn live(channel: u32) -> bool {
    !UNWATCHED.lock().unwrap_or_else(|p| p.into_inner()).remove(&channel)
}

/// Live GPU samples (1 Hz, the `gpus` events) through a Channel, until `unwatch` with its id.
#[tauri::command]
async fn watch_gpus(s: State<'_, AppState>, on_sample: Channel<EngineEvent>) -> R<()> {
    let id = on_sample.id();
    s.client()
        .events(|ev| !matches!(ev, EngineEvent::Gpus { .. }) || (live(id) && on_sample.send(ev).is_ok()))
        .await
        .map_err(e)
}
/// End the stream behind a channel (`watch_gpus`, `follow_logs`) whose view closed.
#[tauri::command]
fn unwatch(id: u32) {
    UNWATCHED.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
}
#[tauri::command]
async fn preview_paths(s: State<'_, AppState>, paths: Vec<PathBuf>) -> R<Vec<Preview>> {
    let mut out = Vec::new();
    for p in paths {
        out.push(s.client().preview_file(&p).await.map_err(e)?);
    }
    Ok(out)
}
#[tauri::command]
async fn submit_paths(s: State<'_, AppState>, paths: Vec<PathBuf>) -> R<Vec<Result<Vec<i64>, String>>> {
    let mut out = Vec::new();
    for p in paths {
        out.push(s.client().submit_file(&p).await.map_err(e));
    }
    Ok(out)
}
#[tauri::command]
async fn open_inbox(app: tauri::AppHandle, s: State<'_, AppState>) -> R<()> {
    let st = s.client().status().await.map_err(e)?;
    if let Some(host) = s.host() {
        return Err(format!(
            "your drop folder {} is on {host}: drop spec files on this window instead, or use it there (`ssh {host}`)",
            st.inbox.display()
        ));
    }
    std::fs::create_dir_all(&st.inbox).map_err(e)?;
    tauri_plugin_opener::OpenerExt::opener(&app)
        .open_path(st.inbox.to_string_lossy(), None::<&str>)
        .map_err(e)
}

/// Queue a session (`gantry shell` / `gantry notebook`); its id. The app has no terminal: the page
/// shows the `gantry attach ID` command to run in one.
#[tauri::command]
async fn start_session(s: State<'_, AppState>, ask: SessionAsk) -> R<i64> {
    s.client().start_session(&ask).await.map(|r| r.job_id).map_err(e)
}
/// `gantry open ID [PORT]`: a URL on this computer for one of the job's ports (with a notebook's
/// token), which the page opens in the browser (the opener plugin, loopback URLs only). A
/// workstation's port is forwarded over the shared ssh connection, as `gantry --host … open` does.
#[tauri::command]
async fn open_port(s: State<'_, AppState>, id: i64, port: Option<u16>) -> R<String> {
    let client = s.client();
    let o = client.open_port(id, port).await.map_err(e)?;
    if s.host().is_none() {
        return Ok(o.url);
    }
    let local = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_err(e)?
        .port();
    let mut forward = client
        .target()
        .forward_command(local, &o.address)
        .ok_or("not an ssh target")?;
    let out = forward
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|err| format!("running ssh: {err}"))?;
    if !out.status.success() {
        return Err(format!(
            "ssh could not forward port {local} to {}: {}",
            o.address,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(o.url.replace(&o.address, &format!("127.0.0.1:{local}")))
}

/// The bookings timeline: open bookings (`all`: closed ones too) and the lab's rules (`gantry bookings`).
#[tauri::command]
async fn bookings(s: State<'_, AppState>, all: bool) -> R<Bookings> {
    s.client()
        .bookings(&BookingsQuery { all, limit: None })
        .await
        .map_err(e)
}
/// A slot dragged on the timeline, booked for the caller (`gantry book`).
#[tauri::command]
async fn book(s: State<'_, AppState>, req: BookRequest) -> R<BookingView> {
    s.client().book(&req).await.map_err(e)
}
#[tauri::command]
async fn cancel_booking(s: State<'_, AppState>, id: i64) -> R<BookingView> {
    s.client().cancel_booking(id).await.map_err(e)
}

/// Find the engine, or host one in-process (holding the machine lock), set up as `gantry daemon`
/// sets up its engine ([`EngineSetup`], from this process's environment: `GANTRY_CONFIG` included).
fn connect_or_embed(rt: &tokio::runtime::Handle) -> anyhow::Result<(EngineRef, Option<MachineLock>)> {
    let setup = EngineSetup::from_env();
    let (socket, by) = core_client::locate(setup.state_dir.clone());
    // The system engine accepted a connection: use it even if it is slow to answer right now.
    if by == FoundBy::System || rt.block_on(Client::new(&socket).status()).is_ok() {
        tracing::info!("connected to the running engine at {}", socket.display());
        return Ok((EngineRef::Found { by, socket }, None));
    }
    let cfg = setup.config()?;
    let lock = match rt.block_on(EngineSetup::lock(&cfg)) {
        Ok(l) => l,
        // Another engine manages these GPUs: the same user's (another app, a daemon) is ours to use.
        Err(LockError::Held(h)) => {
            let mine = h.is_mine() && h.socket.as_deref().is_some_and(core_client::answers);
            tracing::warn!("{}", LockError::Held(h.clone()));
            return Ok((
                if mine {
                    EngineRef::Holder(h)
                } else {
                    EngineRef::Blocked(h)
                },
                None,
            ));
        }
        Err(err) => return Err(err.into()),
    };
    let (socket, gpus) = (cfg.paths.socket(), cfg.gpus.clone());
    let engine: Arc<Engine> = {
        let _guard = rt.enter();
        Engine::open(cfg)?
    };
    rt.spawn(async move {
        if let Err(err) = gantry_core::daemon::run_engine(engine, std::future::pending()).await {
            tracing::error!("embedded engine stopped: {err}");
        }
    });
    let client = Client::new(&socket);
    for _ in 0..100 {
        if rt.block_on(client.status()).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    tracing::info!("hosting the engine in this app (embedded) at {}", socket.display());
    Ok((EngineRef::Embedded { socket, gpus }, lock))
}

/// Make `host` (`None`: this computer) the engine every command uses, after it answered once; a
/// host that answers is saved for the switcher.
async fn switch(app: &tauri::AppHandle, s: &AppState, host: Option<String>) -> anyhow::Result<EngineView> {
    let (client, engine) = match &host {
        None => s.local.clone(),
        Some(h) => {
            let client = Client::to(Target::ssh(h)?);
            client.status().await?;
            if let Err(err) = machines::remember(&s.machines_file, h, true) {
                tracing::warn!("cannot save {h} in {}: {err}", s.machines_file.display());
            }
            (client, EngineRef::Remote { host: h.clone() })
        }
    };
    let view = engine.view();
    *s.current.write().unwrap() = (client.clone(), engine.clone());
    if let Some(old) = s.events.lock().unwrap().take() {
        old.abort();
    }
    if !matches!(engine, EngineRef::Blocked(_)) {
        *s.events.lock().unwrap() = Some(tauri::async_runtime::spawn(supervise(app.clone(), client, host)));
    }
    Ok(view)
}

/// The current engine's events. For a workstation, a lost connection is announced (`connection`
/// event: the UI's banner) and retried with backoff until it answers again (then the UI reloads).
async fn supervise(app: tauri::AppHandle, client: Client, host: Option<String>) {
    loop {
        forward_events(app.clone(), client.clone()).await;
        let Some(host) = &host else { return };
        let (mut delay, mut lost) = (std::time::Duration::from_secs(1), false);
        loop {
            match client.status().await {
                Ok(_) => {
                    if lost {
                        let _ = app.emit(
                            "connection",
                            ConnectionEvent {
                                host: host.clone(),
                                ok: true,
                                error: None,
                                retry_in_s: None,
                            },
                        );
                    }
                    break;
                }
                Err(err) => {
                    lost = true;
                    tracing::warn!("lost {host}: {err}; retrying in {delay:?}");
                    let _ = app.emit(
                        "connection",
                        ConnectionEvent {
                            host: host.clone(),
                            ok: false,
                            error: Some(err.to_string()),
                            retry_in_s: Some(delay.as_secs()),
                        },
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(30));
                }
            }
        }
    }
}

/// Job state changes -> `job-changed` events, desktop notifications for my jobs, tray summary.
async fn forward_events(app: tauri::AppHandle, client: Client) {
    let me = client.whoami().await.ok();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<EngineEvent>();
    let reader = {
        let client = client.clone();
        tokio::spawn(async move {
            let _ = client.events(|ev| tx.send(ev).is_ok()).await;
        })
    };
    let mut last_tray = 0i64;
    while let Some(ev) = rx.recv().await {
        match ev {
            EngineEvent::Job { job_id, state, at } => {
                let _ = app.emit("job-changed", JobChanged { job_id, state, at });
                if state.is_final() {
                    if let (Ok(d), Some(me)) = (client.job(job_id).await, &me) {
                        if d.job.owner_uid == me.uid {
                            let body = match d.job.exit_code {
                                Some(c) => format!("{} — exit code {c}", state.as_str()),
                                None => state.as_str().to_string(),
                            };
                            let _ = app
                                .notification()
                                .builder()
                                .title(format!("Job {job_id} {}: {}", state.as_str(), d.job.name))
                                .body(body)
                                .show();
                        }
                    }
                }
            }
            EngineEvent::Gpus { at, gpus } => {
                if at - last_tray >= 5_000 {
                    last_tray = at;
                    let busy = gpus.iter().filter(|g| g.utilization > 5).count();
                    let queued = client
                        .queue()
                        .await
                        .map(|q| q.iter().filter(|j| j.job.state == JobState::Queued).count())
                        .unwrap_or(0);
                    let line = format!("Gantry: {busy}/{} GPUs busy · {queued} queued", gpus.len());
                    if let Some(t) = app.tray_by_id("gantry") {
                        let _ = t.set_tooltip(Some(&line));
                        let _ = t.set_title(Some(&line));
                    }
                }
            }
        }
    }
    reader.abort();
}

/// Draw the page without GPU compositing. The app is a few charts and tables: compositing buys nothing,
/// yet costs the idle WebKit process most of its CPU and memory (a GL context per page; software GL
/// under Xvfb or SSH forwarding), and on a GPU workstation it would take GPU memory from the jobs.
/// Not under WebDriver (tauri-driver sets TAURI_WEBVIEW_AUTOMATION): WebKitWebDriver's screenshots hang
/// without compositing (WebKitGTK 2.50 under Xvfb), so the e2e keeps WebKit's default.
#[cfg(target_os = "linux")]
fn light_webview(app: &tauri::App) {
    use webkit2gtk::{CacheModel, HardwareAccelerationPolicy, SettingsExt, WebContextExt, WebViewExt};
    // GANTRY_LIGHT_WEBVIEW=1 keeps it light under WebDriver too: the app benchmark measures the rendering
    // users get, and takes no screenshots.
    let automated =
        std::env::var_os("TAURI_WEBVIEW_AUTOMATION").is_some() && std::env::var_os("GANTRY_LIGHT_WEBVIEW").is_none();
    if let Some(w) = app.get_webview_window("main") {
        let _ = w.with_webview(move |wv| {
            // One local page, never browsed: WebKit's page and resource caches only hold memory.
            if let Some(c) = wv.inner().context() {
                c.set_cache_model(CacheModel::DocumentViewer);
            }
            if automated {
                return;
            }
            if let Some(s) = wv.inner().settings() {
                s.set_hardware_acceleration_policy(HardwareAccelerationPolicy::Never);
            }
        });
    }
}

fn build_tray(app: &tauri::App) -> tauri::Result<()> {
    use tauri::menu::{Menu, MenuItem};
    use tauri::tray::TrayIconBuilder;
    let show = MenuItem::with_id(app, "show", "Show Gantry", true, None::<&str>)?;
    let quit = MenuItem::with_id(app, "quit", "Quit", true, None::<&str>)?;
    let menu = Menu::with_items(app, &[&show, &quit])?;
    let mut b = TrayIconBuilder::with_id("gantry")
        .menu(&menu)
        .tooltip("Gantry")
        .on_menu_event(|app, ev| match ev.id.as_ref() {
            "show" => {
                if let Some(w) = app.get_webview_window("main") {
                    let _ = w.show();
                    let _ = w.set_focus();
                }
            }
            "quit" => app.exit(0),
            _ => {}
        });
    if let Some(icon) = app.default_window_icon() {
        b = b.icon(icon.clone());
    }
    b.build(app)?;
    Ok(())
}

pub fn run() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tauri::Builder::default()
        .plugin(tauri_plugin_single_instance::init(|app, _args, _cwd| {
            if let Some(w) = app.get_webview_window("main") {
                let _ = w.show();
                let _ = w.set_focus();
            }
        }))
        .plugin(tauri_plugin_notification::init())
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_opener::init())
        .setup(|app| {
            let rt = tauri::async_runtime::handle();
            let (engine, lock) = connect_or_embed(rt.inner())?;
            // Blocked: no engine; the UI shows why and calls nothing else.
            let client = Client::new(
                engine
                    .socket()
                    .map(PathBuf::from)
                    .unwrap_or_else(|| Paths::default_state_dir().join("gantry.sock")),
            );
            let machines_file = app
                .path()
                .app_config_dir()
                .map(|d| d.join("machines.json"))
                .unwrap_or_else(|_| Paths::default_state_dir().join("machines.json"));
            let local = (client, engine);
            app.manage(AppState {
                current: std::sync::RwLock::new(local.clone()),
                local,
                events: Default::default(),
                machines_file,
                _lock: lock,
            });
            let host = std::env::var("GANTRY_HOST").ok().filter(|h| !h.is_empty());
            if let Err(err) = rt.block_on(switch(app.handle(), &app.state::<AppState>(), host.clone())) {
                // Start on this computer; the switcher offers the host again.
                tracing::warn!("cannot use {}: {err:#}", host.as_deref().unwrap_or("this computer"));
                rt.block_on(switch(app.handle(), &app.state::<AppState>(), None))?;
            }
            #[cfg(target_os = "linux")]
            light_webview(app);
            if let Err(err) = build_tray(app) {
                tracing::warn!("no tray icon: {err}");
            }
            Ok(())
        })
        .invoke_handler(tauri::generate_handler![
            engine,
            machines,
            connect_machine,
            forget_machine,
            status,
            whoami,
            queue,
            job,
            cancel,
            set_priority,
            rerun,
            gpus,
            gpu_recent,
            gpu_minutes,
            history,
            history_count,
            timeline,
            usage,
            usage_charts,
            usage_efficiency,
            job_results,
            compare,
            logs,
            follow_logs,
            watch_gpus,
            unwatch,
            preview_paths,
            submit_paths,
            open_inbox,
            start_session,
            open_port,
            bookings,
            book,
            cancel_booking
        ])
        .run(tauri::generate_context!("../tauri.conf.json"))
        .expect("error while running Gantry");
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_core::protocol::SubmitRequest;

    /// The app hosts its engine the way `gantry daemon` does: the lab config in `GANTRY_CONFIG` holds
    /// (it once did not: the embedded engine ran on the built-in policy).
    #[test]
    fn the_embedded_engine_obeys_the_lab_config_in_gantry_config_and_the_submit_preview_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        // Both ranges: as root (CI), the caller is an admin.
        std::fs::write(&config, "[limits]\npriority = [-2, 2]\nadmin_priority = [-2, 2]\n").unwrap();
        for (k, v) in [
            ("GANTRY_STATE_DIR", dir.path().join("state")),
            ("GANTRY_INBOX", dir.path().join("inbox")),
            ("GANTRY_CONFIG", config.clone()),
            ("GANTRY_GPUS", "sim:1x24GiB".into()),
            // No system engine of this machine, if it has one.
            ("GANTRY_SYSTEM_SOCKET", dir.path().join("no-system.sock")),
        ] {
            std::env::set_var(k, v);
        }
        let rt = tauri::async_runtime::handle();
        let (engine, lock) = connect_or_embed(rt.inner()).unwrap();
        assert!(
            matches!(engine, EngineRef::Embedded { .. }) && lock.is_some(),
            "{engine:?}"
        );
        let client = Client::new(engine.socket().unwrap());
        assert_eq!(rt.block_on(client.status()).unwrap().config_file, Some(config));
        let spec = |priority: i32| SubmitRequest {
            text: format!("image: busybox\ngpus: 0\npriority: {priority}\n"),
            file_name: "p.yaml".into(),
            base_dir: None,
            idempotency_key: None,
            origin: Default::default(),
            begin: None,
        };
        let refused = rt.block_on(client.submit(&spec(5))).unwrap_err().to_string();
        assert!(
            refused.contains("priority 5 is outside the range you may use (-2..2)"),
            "{refused}"
        );

        // The Submit page's preview of a dropped file says so before Submit (the dry run's refusal),
        // and where an accepted one would start or why it would wait.
        let file = |name: &str, priority: i32| {
            let path = dir.path().join(name);
            std::fs::write(&path, spec(priority).text).unwrap();
            rt.block_on(client.preview_file(&path)).unwrap()
        };
        let over = file("over.yaml", 5);
        assert!(over.job.is_none(), "{over:?}");
        let error = over.error.unwrap_or_default();
        assert!(
            error.contains("priority 5 is outside the range you may use (-2..2)"),
            "{error}"
        );
        let ok = file("ok.yaml", 1);
        let plan = ok.plan.expect("the dry run's answer");
        // Where it would start, or why it would wait (here maybe "the engine has not looked at its GPUs yet").
        assert!(
            ok.job.is_some()
                && ok.error.is_none()
                && plan.jobs.len() == 1
                && (plan.jobs[0].starts_now || plan.jobs[0].reason.is_some()),
            "{plan:?}"
        );
    }
}
