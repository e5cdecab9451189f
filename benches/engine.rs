//! Engine benchmarks (not timed tests): prints a table and writes it to target/bench/engine.md.
//! Run with `scripts/bench.sh` (or `cargo bench --bench engine`). Needs Docker and the test image.
//!
//! 1. dispatch: spec renamed into the inbox -> container process running, vs a bare create+start of
//!    the same container through the Docker API (the executor's own calls).
//! 2. submit throughput through the API with 0, 10,000 and 100,000 jobs queued.
//! 3. history query (filter + sort + one page + count) with 100,000 completed runs: mixed, then the p95
//!    of each filter the UI offers over every sort and pages from the first to the last.
//! 4. engine idle with 8 simulated GPUs sampled at 1 Hz: CPU and resident memory.
//! 5. a job writing 40 MB without a newline: the engine's CPU time and peak memory while it copies
//!    the output (lines are cut at 64 KiB in one pass; this was quadratic and unbounded).
//! 6. `gantry ls` with 100,000 jobs queued (one running): the queue through the API, and the whole
//!    command printing its table.
//! 7. slow log readers: 16 streams (the default per-user cap) of one 32 MiB log, each read at
//!    1 KiB/s: `gantry ls`'s API call meanwhile, and the engine's memory before and while they read.
//! 8. the notification outbox: a job's whole life (start, running, end) in the store, with nobody
//!    subscribed and with a subscriber (each change then writes its notification in its transaction).
//! 9. results: `gantry compare` of a 200-run sweep; history with a metric column at 100,000 runs.
//! 10. ingestion: a job logging 1,000 points/s for 10 minutes (`GANTRY_BENCH_INGEST_S` shortens it):
//!     the engine's CPU seconds and the database's growth.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gantry_core::client::Client;
use gantry_core::executor::{DockerExecutor, Executor, GpuBinding, Launch};
use gantry_core::protocol::{EngineEvent, SubmitRequest};
use gantry_core::spec::{validate_text, Format, Origin};
use gantry_core::store::{HistoryFilter, JobState, Owner, Store};

const IMAGE: &str = "gantry-test/busybox:1";

#[path = "engine/results.rs"]
mod results;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows: Vec<(String, String, String)> = vec![];
    let quick = std::env::var("GANTRY_BENCH_QUICK").is_ok();
    let only = std::env::var("GANTRY_BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only == name;

    // 1. Dispatch latency.
    if run("dispatch") {
        let (gantry, bare) = rt.block_on(dispatch(if quick { 5 } else { 20 }));
        rows.push((
            "dispatch: inbox rename -> container running (median)".into(),
            ms(gantry),
            format!("{:.2}x bare create+start ({})", gantry / bare, ms(bare)),
        ));
    }

    // 2. Submit throughput with a deep queue.
    let levels: &[usize] = if quick { &[0, 10_000] } else { &[0, 10_000, 100_000] };
    let mut base = 0.0;
    for &n in levels.iter().filter(|_| run("submit")) {
        let (per, ready) = rt.block_on(submit_cost(n, 200));
        if n == 0 {
            base = per;
        }
        rows.push((
            format!("submit via API, {n} jobs queued (mean of 200)"),
            ms(per),
            format!("{:.2}x the cost at 0 (goal <= 1.2x)", per / base),
        ));
        rows.push((
            format!("engine start with {n} jobs queued: API answering"),
            ms(ready),
            String::new(),
        ));
    }

    // 3. History query at 100k completed runs.
    if run("history") {
        let (p50, p95, combos) = history_query(if quick { 20_000 } else { 100_000 });
        rows.push((
            format!(
                "history query at {} runs: filter+sort+page+count, p50",
                if quick { "20k" } else { "100k" }
            ),
            ms(p50),
            String::new(),
        ));
        rows.push(("history query p95 (goal <= 20 ms)".into(), ms(p95), String::new()));
        for (label, [p50, p95, first]) in combos {
            rows.push((
                format!("history p95: {label}"),
                ms(p95),
                format!(
                    "p50 {}; first view of the filter (count not cached) p95 {}",
                    ms(p50),
                    ms(first)
                ),
            ));
        }
    }

    // 4. Idle engine.
    if run("idle") {
        let (cpu, rss) = idle(if quick { 10 } else { 30 });
        rows.push((
            "engine idle, 8 simulated GPUs at 1 Hz: CPU".into(),
            format!("{cpu:.2}% of one core"),
            "goal <= 1%".into(),
        ));
        rows.push((
            "engine idle: resident memory".into(),
            format!("{rss:.1} MB"),
            "goal <= 40 MB".into(),
        ));
    }

    // 5. One endless line.
    if run("longline") {
        let (cpu, peak, base) = rt.block_on(long_line(40_000_000));
        rows.push((
            "a 40 MB line without newline: engine CPU time while it is copied".into(),
            format!("{cpu:.2} s"),
            "linear in the output".into(),
        ));
        rows.push((
            "a 40 MB line without newline: engine peak memory".into(),
            format!("{peak:.1} MB"),
            format!("{base:.1} MB before the job"),
        ));
    }

    // 6. `gantry ls` with a deep queue.
    if run("ls") {
        let n = if quick { 10_000 } else { 100_000 };
        let c = rt.block_on(ls_cost(n));
        rows.push((
            format!("ls: the queue through the API, {n} jobs queued (median of 20)"),
            ms(c.api),
            "goal < 100 ms".into(),
        ));
        rows.push((
            "ls through the API: CPU time per call".into(),
            ms(c.engine_cpu + c.client_cpu),
            format!("engine {}, client {}", ms(c.engine_cpu), ms(c.client_cpu)),
        ));
        rows.push((
            format!("`gantry ls` with {n} jobs queued: its page through the API (median of 20)"),
            ms(c.page),
            "goal < 100 ms".into(),
        ));
        rows.push((
            format!("`gantry ls` with {n} jobs queued, table to /dev/null (median of 5)"),
            ms(c.cli),
            "the whole command: the next 100 to start and the caller's first 100".into(),
        ));
        rows.push((
            format!("`gantry ls --all` with {n} jobs queued, table to /dev/null (median of 5)"),
            ms(c.cli_all),
            "every job".into(),
        ));
    }

    // 7. Slow readers of a big log.
    if run("slowlogs") {
        let (ls, before, during) = rt.block_on(slow_log_readers(16, 32 << 20));
        rows.push((
            "ls through the API while 16 slow readers (1 KiB/s) stream a 32 MiB log (median of 10)".into(),
            ms(ls),
            "goal < 100 ms".into(),
        ));
        rows.push((
            "engine memory while they read".into(),
            format!("{during:.1} MB"),
            format!("{before:.1} MB before; unbounded readers once took 1.7 GB"),
        ));
    }

    // 8. The outbox's cost per job.
    if run("outbox") {
        let n = if quick { 500 } else { 2000 };
        let (none, subscribed) = outbox_cost(n);
        rows.push((
            format!("job life in the store (start, running, end), nobody subscribed (mean of {n})"),
            ms(none),
            String::new(),
        ));
        rows.push((
            "the same with a subscriber: 2 notifications written per job".into(),
            ms(subscribed),
            format!("{:.2}x", subscribed / none),
        ));
    }

    // 9. Results (issue 30): `gantry compare` of a 200-run sweep, history with a metric column.
    if run("results") {
        let (api, cli) = rt.block_on(results::compare_cost(200));
        rows.push((
            "`gantry compare` of a 200-run sweep, 4 metrics each: API call / whole command (median of 10)".into(),
            format!("{} / {}", ms(api), ms(cli)),
            "goal <= 100 ms".into(),
        ));
        let n = if quick { 10_000 } else { 100_000 };
        let (h, seed) = rt.block_on(results::history_metric_cost(n));
        rows.push((
            format!("history page of 50 with a metric column, {n} runs each with the metric (median of 20)"),
            ms(h),
            format!("goal <= 50 ms (seeding took {seed:.0} s)"),
        ));
    }

    // 10. Ingestion (issue 30): a job logging 1,000 points/s (`GANTRY_BENCH_INGEST_S`, default 600 s).
    if run("ingest") {
        let secs: u64 = std::env::var("GANTRY_BENCH_INGEST_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(if quick { 30 } else { 600 });
        let r = rt.block_on(results::ingest_cost(secs));
        rows.push((
            format!(
                "a job logging {:.0} points/s for {} s ({} points): engine CPU / database growth",
                r.points as f64 / r.wall,
                r.wall.round(),
                r.points
            ),
            format!("{:.1} CPU s / {:.1} MiB", r.cpu, r.db_growth as f64 / 1048576.0),
            format!(
                "{:.2}% of one core; {:.0} bytes per point logged; {} points stored",
                100.0 * r.cpu / r.wall,
                r.db_growth as f64 / r.points.max(1) as f64,
                r.stored
            ),
        ));
    }

    let mut out = String::from("| benchmark | result | comparison |\n|---|---|---|\n");
    for (a, b, c) in &rows {
        out += &format!("| {a} | {b} | {c} |\n");
    }
    println!("\n{out}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("engine.md"), &out).unwrap();
    println!("written to {}", dir.join("engine.md").display());
}

fn ms(s: f64) -> String {
    format!("{:.2} ms", s * 1000.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Daemon {
    child: Child,
    state: PathBuf,
    _dir: tempfile::TempDir,
    /// Seconds from spawning the engine to its API answering.
    ready: f64,
}

impl Daemon {
    fn start(gpus: &str, prepare: impl FnOnce(&Path)) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        prepare(&state);
        let child = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .arg("--state-dir")
            .arg(&state)
            .args(["daemon", "--gpus", gpus])
            .env(
                "RUST_LOG",
                std::env::var("GANTRY_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(match std::env::var_os("GANTRY_BENCH_LOG_FILE") {
                Some(f) => Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(f).unwrap()),
                None => Stdio::null(),
            })
            .spawn()
            .unwrap();
        let t = Instant::now();
        let mut d = Daemon {
            child,
            state,
            _dir: dir,
            ready: 0.0,
        };
        while std::os::unix::net::UnixStream::connect(d.state.join("gantry.sock")).is_err()
            || !d.state.join("inbox/accepted").exists()
        {
            assert!(t.elapsed() < Duration::from_secs(120), "daemon did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        d.ready = t.elapsed().as_secs_f64();
        d
    }
    fn client(&self) -> Client {
        Client::new(self.state.join("gantry.sock"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        // Only this engine's containers: others (tests, another engine) may share the Docker daemon.
        let Ok(id) = std::fs::read_to_string(self.state.join("logs/.engine-id")) else {
            return;
        };
        let filter = format!("label=dev.gantry.engine={}", id.trim());
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ids=$(docker ps -aq --filter {filter}); [ -z \"$ids\" ] || docker rm -f $ids >/dev/null"
            ))
            .status();
    }
}

async fn dispatch(n: usize) -> (f64, f64) {
    let d = Daemon::start("sim:8x80GiB", |_| {});
    let client = d.client();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(i64, JobState, Instant)>();
    let c2 = client.clone();
    tokio::spawn(async move {
        let _ = c2
            .events(|ev| {
                if let EngineEvent::Job { job_id, state, .. } = ev {
                    let _ = tx.send((job_id, state, Instant::now()));
                }
                true
            })
            .await;
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut gantry = vec![];
    for i in 0..n {
        let staging = d.state.join(format!("s{i}.yaml"));
        std::fs::write(&staging, format!("image: {IMAGE}\ncommand: sleep 1\ngpus: 1\n")).unwrap();
        let t0 = Instant::now();
        std::fs::rename(&staging, d.state.join(format!("inbox/j{i}.yaml"))).unwrap();
        loop {
            let (_, state, at) = rx.recv().await.unwrap();
            if state == JobState::Running {
                gantry.push((at - t0).as_secs_f64());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Bare: the same container through the same Docker API calls, nothing else.
    let exec = DockerExecutor::connect().unwrap();
    let job = validate_text(
        &format!("image: {IMAGE}\ncommand: sleep 1\ngpus: 1\n"),
        Format::Yaml,
        &Origin::default(),
    )
    .unwrap();
    let mut bare = vec![];
    for i in 0..n {
        let l = Launch {
            engine_id: "benchbare0000000",
            db_uid: "benchbare",
            name: format!("gantry-benchbare-j{}-a1", 1_000_000 + i),
            job_id: 1_000_000 + i as i64,
            attempt_id: 1,
            attempt_n: 1,
            job: &job,
            uid: 0,
            gid: 0,
            groups: vec![],
            mounts: vec![],
            gpus: vec![0],
            gpu_uuids: vec!["GPU-bench".into()],
            gpu_total_memory: None,
            binding: GpuBinding::EnvOnly,
            container: Default::default(),
            preemptible: false,
            restart_count: 0,
            results_env: vec![],
            start_gate: None,
            command: None,
            image: None,
        };
        let t0 = Instant::now();
        let id = exec.create(&l).await.unwrap();
        exec.start(&id).await.unwrap();
        bare.push(t0.elapsed().as_secs_f64());
        exec.remove(&id).await.unwrap();
    }
    (median(gantry), median(bare))
}

fn owner() -> Owner {
    Owner {
        uid: 0,
        gid: 0,
        name: "root".into(),
    }
}

/// Mean submit time with `queued` jobs waiting, once the engine has settled (its start-up pass done),
/// and how long the engine took to answer after starting.
async fn submit_cost(queued: usize, n: usize) -> (f64, f64) {
    let job = validate_text(
        &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\n"),
        Format::Yaml,
        &Origin::default(),
    )
    .unwrap();
    // One simulated GPU, held by a long job, so everything else stays queued.
    let d = Daemon::start("sim:1x24GiB", |state| {
        let mut st = Store::open(&state.join("gantry.db")).unwrap();
        st.bulk(|st| {
            for _ in 0..queued {
                st.insert_job(&job, &owner(), "bench", None, |_, _| None).unwrap();
            }
        })
        .unwrap();
    });
    let ready = d.ready;
    let client = d.client();
    // Let the start-up pass finish: this measures a running engine, not one starting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = format!("image: {IMAGE}\ncommand: 'true'\ngpus: 1\npriority: -1\n");
    let req = SubmitRequest {
        text,
        file_name: "b.yaml".into(),
        base_dir: None,
        idempotency_key: None,
        origin: Default::default(),
        begin: None,
    };
    let t0 = Instant::now();
    for _ in 0..n {
        client.submit(&req).await.unwrap();
    }
    (t0.elapsed().as_secs_f64() / n as f64, ready)
}

/// `gantry ls` with `queued` jobs waiting behind one running job: the API call (what the app pays)
/// and the whole command (connect, fetch, print the table), medians; and the CPU time of one API
/// call in the engine and in the client, which a busy machine does not inflate as it does the wall
/// time.
async fn ls_cost(queued: usize) -> LsCost {
    // Every job sleeps: should the running one's container vanish (another engine's clean-up on a
    // shared Docker), the next one holds the GPU again and the queue stays as deep.
    let long = validate_text(
        &format!("image: {IMAGE}\ncommand: [sleep, '3600']\ngpus: 1\nenv: {{SEED: '1'}}\n"),
        Format::Yaml,
        &Origin::default(),
    )
    .unwrap();
    let d = Daemon::start("sim:1x24GiB", |state| {
        let mut st = Store::open(&state.join("gantry.db")).unwrap();
        st.bulk(|st| {
            for i in 0..=queued {
                let who = Owner {
                    uid: 2000 + (i % 4) as u32,
                    gid: 2000,
                    name: format!("user{}", i % 4),
                };
                st.insert_job(&long, &who, "bench", None, |_, _| None).unwrap();
            }
        })
        .unwrap();
    });
    let client = d.client();
    // Measure a settled engine: a job running, the start-up pass done.
    let t = Instant::now();
    while !client
        .queue()
        .await
        .unwrap()
        .iter()
        .any(|q| q.job.state == JobState::Running)
    {
        assert!(t.elapsed() < Duration::from_secs(120), "no job started");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = 20;
    let (engine0, client0) = (proc_cpu_ticks(d.child.id()), proc_cpu_ticks(std::process::id()));
    let mut api = vec![];
    for _ in 0..n {
        let t0 = Instant::now();
        let q = client.queue().await.unwrap();
        api.push(t0.elapsed().as_secs_f64());
        assert!(q.len() + 10 > queued, "{} jobs listed", q.len());
    }
    let ticks = |t0: u64, pid: u32| (proc_cpu_ticks(pid) - t0) as f64 / 100.0 / n as f64; // USER_HZ
    let (engine_cpu, client_cpu) = (ticks(engine0, d.child.id()), ticks(client0, std::process::id()));
    let mut page = vec![];
    for _ in 0..n {
        let t0 = Instant::now();
        let p = client.queue_page(gantry_core::defaults::LS_QUEUED_SHOWN).await.unwrap();
        page.push(t0.elapsed().as_secs_f64());
        assert!(p.queued + 10 > queued, "{} jobs queued", p.queued);
    }
    let cli = |args: &[&str]| {
        let mut t = vec![];
        for _ in 0..5 {
            let t0 = Instant::now();
            let st = Command::new(env!("CARGO_BIN_EXE_gantry"))
                .arg("--state-dir")
                .arg(&d.state)
                .args(args)
                .stdout(Stdio::null())
                .status()
                .unwrap();
            t.push(t0.elapsed().as_secs_f64());
            assert!(st.success());
        }
        median(t)
    };
    LsCost {
        api: median(api),
        page: median(page),
        cli: cli(&["ls"]),
        cli_all: cli(&["ls", "--all"]),
        engine_cpu,
        client_cpu,
    }
}

struct LsCost {
    api: f64,
    page: f64,
    cli: f64,
    cli_all: f64,
    engine_cpu: f64,
    client_cpu: f64,
}

/// Percentile `p` (0..100) of `v`.
fn pct(v: &mut [f64], p: usize) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * p).div_ceil(100).max(1) - 1]
}

/// Mixed queries (p50, p95), then per filter the UI offers: [p50, p95, p95 of a filter's first view].
#[allow(clippy::type_complexity)]
fn history_query(n: usize) -> (f64, f64, Vec<(String, [f64; 3])>) {
    let dir = tempfile::tempdir().unwrap();
    let mut st = Store::open(&dir.path().join("h.db")).unwrap();
    let users = st.seed_completed_runs(n).unwrap();
    let sorts = ["finished", "duration", "name", "gpu_hours", "owner"];
    let mut times = vec![];
    for i in 0..200 {
        let f = HistoryFilter {
            user: (i % 2 == 0).then(|| users[i % users.len()].to_string()),
            status: (i % 3 == 0).then_some(JobState::Succeeded),
            text: (i % 5 == 0).then(|| format!("exp-{}", i % 20)),
            sort: Some(sorts[i % sorts.len()].into()),
            asc: Some(i % 2 == 1),
            limit: Some(200),
            offset: Some(((i * 997) % 5000) as u32),
            ..Default::default()
        };
        let t0 = Instant::now();
        let rows = st.history(&f).unwrap();
        let _count = st.history_count(&f).unwrap();
        let el = t0.elapsed().as_secs_f64();
        if el > 0.02 && std::env::var("GANTRY_BENCH_VERBOSE").is_ok() {
            eprintln!("slow {:.1} ms: {f:?}", el * 1000.0);
        }
        times.push(el);
        std::hint::black_box(rows);
    }
    // The seeded runs all ended within the seeding: a date range is a slice of that span.
    let mut span = |asc| {
        st.history(&HistoryFilter {
            sort: Some("finished".into()),
            asc: Some(asc),
            limit: Some(1),
            ..Default::default()
        })
        .unwrap()[0]
            .finished_at
            .unwrap()
    };
    let (first, last) = (span(true), span(false));
    let third = (last - first) / 3;
    let all_sorts = [
        "finished",
        "started",
        "duration",
        "gpu_hours",
        "name",
        "owner",
        "exit_code",
        "id",
    ];
    let u = users.clone();
    let combos: Vec<(&str, Box<dyn Fn(usize) -> HistoryFilter>)> = vec![
        ("no filter", Box::new(|_| HistoryFilter::default())),
        (
            "status matching 85% (succeeded) + sort by another column",
            Box::new(|_| HistoryFilter {
                status: Some(JobState::Succeeded),
                ..Default::default()
            }),
        ),
        (
            "status matching 14% (failed)",
            Box::new(|_| HistoryFilter {
                status: Some(JobState::Failed),
                ..Default::default()
            }),
        ),
        (
            "text search, 55% of runs (\"exp-1\")",
            Box::new(|_| HistoryFilter {
                text: Some("exp-1".into()),
                ..Default::default()
            }),
        ),
        (
            "text search, 5% of runs (\"exp-7\")",
            Box::new(|_| HistoryFilter {
                text: Some("exp-7".into()),
                ..Default::default()
            }),
        ),
        (
            "date range (middle third)",
            Box::new(move |_| HistoryFilter {
                since: Some(first + third),
                until: Some(last - third),
                ..Default::default()
            }),
        ),
        (
            "user",
            Box::new(move |i| HistoryFilter {
                user: Some(u[i % u.len()].to_string()),
                ..Default::default()
            }),
        ),
        (
            "image",
            Box::new(|_| HistoryFilter {
                image: Some("img2:1".into()),
                ..Default::default()
            }),
        ),
        (
            "user + status + text",
            Box::new(move |i| HistoryFilter {
                user: Some(users[i % users.len()].to_string()),
                status: Some(JobState::Succeeded),
                text: Some("exp".into()),
                ..Default::default()
            }),
        ),
    ];
    let mut out = vec![];
    for (label, make) in &combos {
        let (mut page, mut fresh) = (vec![], vec![]);
        for i in 0..64 {
            let base = make(i);
            // Every sort (another column than the finish time for the 85% status), both directions, pages
            // spread from the first to the last (scrolling to the end).
            let sort = if label.starts_with("status matching 85%") {
                all_sorts[1 + i % 7]
            } else {
                all_sorts[i % 8]
            };
            let count = st.history_count(&base).unwrap() as usize;
            let offset = if i % 16 == 15 {
                count.saturating_sub(200)
            } else {
                count * (i % 16) / 16
            };
            let f = HistoryFilter {
                sort: Some(sort.into()),
                asc: Some(i % 2 == 1),
                limit: Some(200),
                offset: Some(offset as u32),
                ..base.clone()
            };
            let t0 = Instant::now();
            std::hint::black_box(st.history(&f).unwrap());
            std::hint::black_box(st.history_count(&f).unwrap());
            page.push(t0.elapsed().as_secs_f64());
            // The first view of a filter: its count is not cached yet (a `since` 1 ms earlier each time
            // is a new filter that matches the same runs).
            let new = HistoryFilter {
                since: Some(base.since.unwrap_or(first) - 1 - i as i64),
                offset: Some(0),
                ..f
            };
            let t0 = Instant::now();
            std::hint::black_box(st.history_count(&new).unwrap());
            std::hint::black_box(st.history(&new).unwrap());
            fresh.push(t0.elapsed().as_secs_f64());
        }
        out.push((
            label.to_string(),
            [pct(&mut page, 50), pct(&mut page, 95), pct(&mut fresh, 95)],
        ));
    }
    (pct(&mut times, 50), pct(&mut times, 95), out)
}

fn proc_cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn rss_mb(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    kb / 1024.0
}

fn peak_rss_mb(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    kb / 1024.0
}

/// A job printing `bytes` without a newline, from its drop to its end: the engine's CPU seconds, its
/// peak resident memory (MB) and that peak before the job.
async fn long_line(bytes: u64) -> (f64, f64, f64) {
    let d = Daemon::start("sim:2x24GiB", |_| {});
    let client = d.client();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<JobState>();
    tokio::spawn(async move {
        let _ = client
            .events(|ev| {
                if let EngineEvent::Job { state, .. } = ev {
                    let _ = tx.send(state);
                }
                true
            })
            .await;
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = d.child.id();
    let (t0, base) = (proc_cpu_ticks(pid), peak_rss_mb(pid));
    let staging = d.state.join("long.yaml");
    std::fs::write(
        &staging,
        format!("image: {IMAGE}\ngpus: 0\ncommand: \"busybox head -c {bytes} /dev/zero | busybox tr '\\\\0' x\"\n"),
    )
    .unwrap();
    std::fs::rename(&staging, d.state.join("inbox/long.yaml")).unwrap();
    while let Some(state) = rx.recv().await {
        if state.is_final() {
            break;
        }
    }
    let cpu = (proc_cpu_ticks(pid) - t0) as f64 / 100.0; // USER_HZ
    (cpu, peak_rss_mb(pid), base)
}

/// `readers` raw connections streaming one job's `bytes`-long log (every other one following it),
/// each read 1 KiB a second: the median `ls` API call meanwhile, and the engine's resident memory
/// (MB) before the readers and at most while they read.
async fn slow_log_readers(readers: usize, bytes: u64) -> (f64, f64, f64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = Daemon::start("sim:2x24GiB", |_| {});
    let client = d.client();
    let text = format!("name: chatty\nimage: {IMAGE}\ngpus: 0\ncommand: \"busybox yes 'a line of a long log read slowly by many' | busybox head -c {}; exec sleep 600\"\n", bytes + (1 << 20));
    let id = client
        .submit(&SubmitRequest {
            text,
            file_name: "chatty.yaml".into(),
            base_dir: None,
            idempotency_key: None,
            origin: Default::default(),
            begin: None,
        })
        .await
        .unwrap()
        .job_id;
    let t = Instant::now();
    let size = || {
        std::fs::read_dir(d.state.join("logs"))
            .unwrap()
            .flatten()
            .find(|f| f.file_name().to_string_lossy().ends_with(&format!("-{id}.log")))
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len())
    };
    while size() < bytes {
        assert!(t.elapsed() < Duration::from_secs(300), "the log did not grow");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pid = d.child.id();
    let before = rss_mb(pid);
    let mut tasks = vec![];
    for i in 0..readers {
        let socket = d.state.join("gantry.sock");
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
            let q = if i % 2 == 1 { "?follow=true" } else { "" };
            s.write_all(format!("GET /v1/jobs/{id}/logs{q} HTTP/1.1\r\nHost: gantry\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut buf = [0u8; 1024];
            loop {
                if s.read(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut times, mut during) = (vec![], 0.0f64);
    for _ in 0..10 {
        let t0 = Instant::now();
        client.queue().await.unwrap();
        times.push(t0.elapsed().as_secs_f64());
        during = during.max(rss_mb(pid));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for t in tasks {
        t.abort();
    }
    (median(times), before, during)
}

fn idle(secs: u64) -> (f64, f64) {
    let d = Daemon::start("sim:8x80GiB", |_| {});
    std::thread::sleep(Duration::from_secs(3));
    let pid = d.child.id();
    let hz = 100.0; // USER_HZ on Linux
    let t0 = proc_cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(secs));
    let t1 = proc_cpu_ticks(pid);
    let cpu = (t1 - t0) as f64 / hz / secs as f64 * 100.0;
    (cpu, rss_mb(pid))
}

/// Seconds per job for start -> running -> end in a file database, without and with a subscriber.
fn outbox_cost(n: usize) -> (f64, f64) {
    use gantry_core::protocol::{EndReason, NotifyEvent, NotifyTarget};
    let per = |subscribe: bool| {
        let dir = tempfile::tempdir().unwrap();
        let mut st = Store::open(&dir.path().join("bench.db")).unwrap();
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            name: "ada".into(),
        };
        if subscribe {
            st.notify_subscribe(
                1000,
                "ada",
                &NotifyTarget::Webhook {
                    url: "http://127.0.0.1:9/h".into(),
                },
                &[NotifyEvent::Finished],
                None,
                10,
            )
            .unwrap();
        }
        let job = validate_text(&format!("image: {IMAGE}\ngpus: 0\n"), Format::Yaml, &Origin::default()).unwrap();
        let ids: Vec<i64> = (0..n)
            .map(|_| st.insert_job(&job, &owner, "bench", None, |_, _| None).unwrap())
            .collect();
        let end = gantry_core::store::Ending {
            exit_code: Some(0),
            reason: EndReason::Exited,
            message: None,
            next: JobState::Succeeded,
            not_before: None,
        };
        let t = Instant::now();
        for id in ids {
            let a = st.begin_attempt(id, &[], &[]).unwrap().unwrap();
            st.set_running(id).unwrap();
            st.end_attempt(id, a.id, &end).unwrap();
        }
        t.elapsed().as_secs_f64() / n as f64
    };
    (per(false), per(true))
}
