//! `/metrics` in Prometheus' text format (issue 20), served on `[metrics] listen` (off by default,
//! loopback unless the lab sets `allow_remote`). GPU figures carry the job and user holding each
//! GPU (as `gantry gpus` shows them); queue and running jobs per user; wait and run time
//! histograms and outcome counters since the engine started; engine health.
//!
//! [`METRICS`] lists every family once (name, type, help); the Grafana dashboard in `packaging/`
//! may only use these (a test checks it).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::engine::Engine;
use crate::protocol::{EngineEvent, JobState};

/// Every metric family: name, type, help.
pub const METRICS: &[(&str, &str, &str)] = &[
    (
        "gantry_gpu_utilization_ratio",
        "gauge",
        "GPU utilization (0 to 1) over the last sample, by GPU and the job and user holding it.",
    ),
    (
        "gantry_gpu_memory_used_bytes",
        "gauge",
        "GPU memory in use, by GPU and the job and user holding it.",
    ),
    ("gantry_gpu_memory_total_bytes", "gauge", "GPU memory in all, by GPU."),
    ("gantry_gpu_temperature_celsius", "gauge", "GPU temperature, by GPU."),
    ("gantry_gpu_power_watts", "gauge", "GPU power draw, by GPU."),
    ("gantry_queued_jobs", "gauge", "Jobs waiting in the queue, by user."),
    ("gantry_running_jobs", "gauge", "Jobs starting or running, by user."),
    ("gantry_running_gpus", "gauge", "GPUs held by running jobs, by user."),
    (
        "gantry_job_wait_seconds",
        "histogram",
        "Time from submit to first start of jobs started since the engine started.",
    ),
    (
        "gantry_job_run_seconds",
        "histogram",
        "Run time of the last attempt of jobs that ended since the engine started.",
    ),
    (
        "gantry_jobs_ended_total",
        "counter",
        "Jobs that ended since the engine started, by outcome.",
    ),
    (
        "gantry_store_problem",
        "gauge",
        "1 while the engine cannot write its state database (no job starts), else 0.",
    ),
    (
        "gantry_backend_problem",
        "gauge",
        "1 while Docker or Slurm cannot be reached, else 0.",
    ),
    (
        "gantry_engine_info",
        "gauge",
        "Always 1; the engine's version and GPU backend as labels.",
    ),
];

/// Histogram bounds (seconds): a minute to a week.
const BUCKETS: [f64; 12] = [
    10.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    3.0 * 3600.0,
    6.0 * 3600.0,
    12.0 * 3600.0,
    86400.0,
    3.0 * 86400.0,
    7.0 * 86400.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

/// Figures counted from the engine's events since it started.
#[derive(Debug, Default)]
struct Counted {
    wait: Histogram,
    run: Histogram,
    ended: BTreeMap<&'static str, u64>,
}

/// A label value in the text format: `\`, `"` and line breaks escaped.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn labels(pairs: &[(&str, String)]) -> String {
    let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", esc(v))).collect();
    format!("{{{}}}", inner.join(","))
}

/// The whole page.
fn render(e: &Engine, c: &Counted) -> String {
    let mut out = String::new();
    let mut fam: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    fn put(fam: &mut BTreeMap<&'static str, Vec<String>>, name: &'static str, l: String, v: f64) {
        fam.entry(name).or_default().push(format!("{name}{l} {}", num(v)));
    }
    let g = e.gpu_status();
    for s in &g.gpus {
        let holders: Vec<_> = g
            .users
            .iter()
            .filter(|u| u.gpu == s.index && u.job_id.is_some())
            .collect();
        let mut jobs: Vec<String> = holders.iter().filter_map(|u| u.job_id.map(|j| j.to_string())).collect();
        let mut users: Vec<String> = holders.iter().filter_map(|u| u.user.clone()).collect();
        jobs.dedup();
        users.sort();
        users.dedup();
        let base = vec![
            ("gpu", s.index.to_string()),
            ("uuid", s.uuid.clone()),
            ("name", s.name.clone()),
        ];
        let mut held = base.clone();
        held.push(("job", jobs.join(",")));
        held.push(("user", users.join(",")));
        put(
            &mut fam,
            "gantry_gpu_utilization_ratio",
            labels(&held),
            s.utilization as f64 / 100.0,
        );
        put(
            &mut fam,
            "gantry_gpu_memory_used_bytes",
            labels(&held),
            s.memory_used as f64,
        );
        put(
            &mut fam,
            "gantry_gpu_memory_total_bytes",
            labels(&base),
            s.memory_total as f64,
        );
        if let Some(t) = s.temperature_c {
            put(&mut fam, "gantry_gpu_temperature_celsius", labels(&base), t as f64);
        }
        if let Some(p) = s.power_w {
            put(&mut fam, "gantry_gpu_power_watts", labels(&base), p);
        }
    }
    let mut queued: BTreeMap<String, u64> = BTreeMap::new();
    let mut running: BTreeMap<String, u64> = BTreeMap::new();
    let mut gpus: BTreeMap<String, u64> = BTreeMap::new();
    match e.queue() {
        Ok(q) => {
            for r in q {
                match r.job.state {
                    JobState::Queued => *queued.entry(r.job.owner.clone()).or_default() += 1,
                    JobState::Starting | JobState::Running => {
                        *running.entry(r.job.owner.clone()).or_default() += 1;
                        *gpus.entry(r.job.owner.clone()).or_default() += r.gpus_assigned.len() as u64;
                    }
                    _ => {}
                }
            }
        }
        Err(err) => warn!("metrics: cannot read the queue: {err}"),
    }
    for (name, m) in [
        ("gantry_queued_jobs", &queued),
        ("gantry_running_jobs", &running),
        ("gantry_running_gpus", &gpus),
    ] {
        for (u, n) in m {
            put(&mut fam, name, labels(&[("user", u.clone())]), *n as f64);
        }
    }
    for (name, h) in [("gantry_job_wait_seconds", &c.wait), ("gantry_job_run_seconds", &c.run)] {
        let lines = fam.entry(name).or_default();
        for (i, b) in BUCKETS.iter().enumerate() {
            lines.push(format!("{name}_bucket{{le=\"{}\"}} {}", num(*b), h.counts[i]));
        }
        lines.push(format!("{name}_bucket{{le=\"+Inf\"}} {}", h.count));
        lines.push(format!("{name}_sum {}", num(h.sum)));
        lines.push(format!("{name}_count {}", h.count));
    }
    for s in JobState::ALL.into_iter().filter(|s| s.is_final()) {
        let n = c.ended.get(s.as_str()).copied().unwrap_or(0);
        put(
            &mut fam,
            "gantry_jobs_ended_total",
            labels(&[("outcome", s.as_str().to_string())]),
            n as f64,
        );
    }
    let h = e.health();
    put(
        &mut fam,
        "gantry_store_problem",
        String::new(),
        h.store_problem.is_some() as u8 as f64,
    );
    put(
        &mut fam,
        "gantry_backend_problem",
        String::new(),
        h.backend_problem.is_some() as u8 as f64,
    );
    let backend = format!("{:?}", g.backend).to_lowercase();
    put(
        &mut fam,
        "gantry_engine_info",
        labels(&[
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("gpu_backend", backend),
        ]),
        1.0,
    );
    for (name, kind, help) in METRICS {
        // Every family is described, with or without samples now (a dashboard's names always exist).
        let lines = fam.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Count waits, run times and outcomes from the engine's job events.
async fn count(e: Arc<Engine>, c: Arc<Mutex<Counted>>) {
    let mut sub = e.subscribe();
    loop {
        let (job_id, state) = match sub.recv().await {
            Ok(EngineEvent::Job { job_id, state, .. }) => (job_id, state),
            Ok(_) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                warn!("metrics: {n} job events missed (the engine was busier than the counter)");
                continue;
            }
            Err(_) => return,
        };
        if state != JobState::Running && !state.is_final() {
            continue;
        }
        let e2 = e.clone();
        let Ok(Ok(d)) = tokio::task::spawn_blocking(move || e2.job_detail(job_id)).await else {
            continue;
        };
        let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
        if state == JobState::Running {
            if d.attempts.len() == 1 {
                if let Some(s) = d.job.started_at {
                    c.wait.observe((s - d.job.submitted_at).max(0) as f64 / 1000.0);
                }
            }
        } else {
            *c.ended.entry(state.as_str()).or_default() += 1;
            if let Some(a) = d.attempts.last() {
                if let Some(end) = a.ended_at {
                    c.run.observe((end - a.started_at).max(0) as f64 / 1000.0);
                }
            }
        }
    }
}

/// Serve `/metrics` on `addr` until the engine stops.
///
/// Bounded, as every listener of a root engine (issue 29, hole 7): at most `[metrics] max_connections`
/// connections are open at once (more are closed as they come, so a flood cannot take the engine's file
/// descriptors from its API and jobs), and one that has not sent a whole request head `[metrics]
/// idle_timeout` after it opened or after its last answer is closed.
pub async fn serve(e: Arc<Engine>, addr: SocketAddr) {
    let counted = Arc::new(Mutex::new(Counted::default()));
    let counter = tokio::spawn(count(e.clone(), counted.clone()));
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(err) => {
            warn!("metrics: cannot listen on {addr} (`[metrics] listen`): {err}; no metrics are served");
            counter.abort();
            return;
        }
    };
    // The counter stops with this task (the daemon aborts it when the engine stops).
    let _counter = AbortOnDrop(counter);
    let settings = e.cfg.lab.metrics.clone();
    info!(
        "metrics on http://{addr}/metrics (at most {} connections, idle ones closed after {}s)",
        settings.max_connections,
        settings.idle_timeout.as_secs_f64()
    );
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (e, c) = (e.clone(), counted.clone());
            async move {
                let body = tokio::task::spawn_blocking(move || {
                    let c = c.lock().unwrap_or_else(|p| p.into_inner());
                    render(&e, &c)
                })
                .await
                .unwrap_or_default();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(settings.max_connections));
    let mut turned_away = TurnedAway::default();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(err) => {
                // Out of file descriptors (or another transient error): wait instead of spinning.
                if turned_away.note(tokio::time::Instant::now()) {
                    warn!("metrics: accepting a connection failed: {err}");
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            if turned_away.note(tokio::time::Instant::now()) {
                warn!(
                    "metrics: {} connections are open (`[metrics] max_connections`): closing new ones until some end",
                    settings.max_connections
                );
            }
            continue;
        };
        let app = app.clone();
        let idle = settings.idle_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let mut app = app.clone();
                async move { tower_service::Service::call(&mut app, req).await }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(idle)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(err) = conn.await {
                tracing::debug!("metrics: a connection ended: {err}");
            }
        });
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connections turned away (or failed accepts): logged at most once a minute.
#[derive(Default)]
struct TurnedAway {
    last: Option<tokio::time::Instant>,
}

impl TurnedAway {
    fn note(&mut self, now: tokio::time::Instant) -> bool {
        let due = self
            .last
            .is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_secs(60));
        if due {
            self.last = Some(now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_count_cumulatively_and_labels_are_escaped() {
        let mut h = Histogram::default();
        h.observe(5.0);
        h.observe(120.0);
        assert_eq!((h.counts[0], h.counts[1], h.counts[2], h.count), (1, 1, 2, 2));
        assert_eq!(labels(&[("user", "a\"b\\c\nd".into())]), "{user=\"a\\\"b\\\\c\\nd\"}");
        assert_eq!((num(1.0), num(0.25)), ("1".to_string(), "0.25".to_string()));
        let names: Vec<&str> = METRICS.iter().map(|m| m.0).collect();
        let mut sorted = names.clone();
        sorted.dedup();
        assert_eq!(names.len(), sorted.len());
        assert!(METRICS
            .iter()
            .all(|(n, t, _)| n.starts_with("gantry_") && (*t != "counter" || n.ends_with("_total"))));
    }
}
