//! Results benchmarks (issue 30): compare, history with a metric column, ingestion.

use std::time::{Duration, Instant};

use gantry_core::protocol::SubmitRequest;
use gantry_core::spec::{validate_text, Format, Origin};
use gantry_core::store::{HistoryFilter, Store};

use super::{median, owner, proc_cpu_ticks, Daemon, IMAGE};

/// Results of `n` points per metric for job `id` (4 metrics), as a reader writes them.
pub fn seed_results(st: &mut Store, id: i64, points: usize, lr: f64) {
    use gantry_core::protocol::MetricSource;
    use gantry_core::store::{Logged, ResultsBatch, ResultsLimits};
    let mut b = ResultsBatch::new(MetricSource::File);
    for s in 0..points as i64 {
        let loss = 2.3 / (1.0 + lr * 30.0 * s as f64);
        for (name, v) in [
            ("val/loss", loss),
            ("val/acc", 1.0 - loss / 2.5),
            ("train/loss", loss * 0.9),
            ("lr", lr),
        ] {
            b.points.push(Logged {
                name: name.into(),
                step: Some(s),
                at: s,
                value: v,
            });
        }
    }
    st.add_results(id, 1, &b, &ResultsLimits::default()).unwrap();
}

/// `gantry compare sweep` with a `runs`-run sweep (each 4 metrics of 1,000 points) in the store:
/// the API call and the whole command (medians of 10).
pub async fn compare_cost(runs: usize) -> (f64, f64) {
    let text = format!(
        "name: sweep\nimage: {IMAGE}\ncommand: 'true'\ngpus: 8\nmatrix: {{lr: [{}]}}\n",
        (0..runs)
            .map(|i| format!("{}", 0.0001 * (i + 1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let job = validate_text(&text, Format::Yaml, &Origin::default()).unwrap();
    // Jobs that can never start here (8 GPUs on 1): held, they stay queued while compared.
    let d = Daemon::start("sim:1x24GiB", |state| {
        let mut st = Store::open(&state.join("gantry.db")).unwrap();
        for (i, j) in gantry_core::spec::expand(&job).iter().enumerate() {
            let id = st.insert_job(j, &owner(), "bench", None, |_, _| None).unwrap();
            st.set_held(id, true, "bench").unwrap();
            seed_results(&mut st, id, 1000, 0.0001 * (i + 1) as f64);
        }
    });
    let client = d.client();
    let q = gantry_core::protocol::CompareQuery {
        name: Some("sweep".into()),
        sort: Some("val/loss".into()),
        ..Default::default()
    };
    let mut api = vec![];
    for _ in 0..10 {
        let t0 = Instant::now();
        let c = client.compare(&q).await.unwrap();
        api.push(t0.elapsed().as_secs_f64());
        assert_eq!(c.rows.len(), runs);
    }
    let mut cli = vec![];
    for _ in 0..10 {
        let t0 = Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args([
                "--state-dir",
                d.state.to_str().unwrap(),
                "compare",
                "sweep",
                "--sort",
                "val/loss",
            ])
            .output()
            .unwrap();
        cli.push(t0.elapsed().as_secs_f64());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    (median(api), median(cli))
}

/// A history page (50, newest first) with a metric column, `n` finished runs each with it; and how
/// long seeding them took (seconds).
pub async fn history_metric_cost(n: usize) -> (f64, f64) {
    let t = Instant::now();
    let d = Daemon::start("sim:1x24GiB", |state| {
        let mut st = Store::open(&state.join("gantry.db")).unwrap();
        st.seed_completed_runs(n).unwrap();
        let ids: Vec<i64> = (1..=n as i64).collect();
        st.seed_metric(&ids, "val/loss", |id| 1.0 / id as f64).unwrap();
    });
    let seed = t.elapsed().as_secs_f64();
    let client = d.client();
    let f = HistoryFilter {
        limit: Some(50),
        metric: Some("val/loss".into()),
        ..Default::default()
    };
    let mut times = vec![];
    for _ in 0..20 {
        let t0 = Instant::now();
        let rows = client.history(&f).await.unwrap();
        times.push(t0.elapsed().as_secs_f64());
        assert!(
            rows.iter().take(50).all(|r| r.metric.is_some()),
            "every run has the metric"
        );
        std::hint::black_box(rows);
    }
    (median(times), seed)
}

pub struct Ingest {
    pub points: u64,
    pub stored: u64,
    pub wall: f64,
    pub cpu: f64,
    pub db_growth: u64,
}

/// The database's size on disk, with its write-ahead log.
fn db_size(state: &std::path::Path) -> u64 {
    ["gantry.db", "gantry.db-wal"]
        .iter()
        .map(|f| std::fs::metadata(state.join(f)).map(|m| m.len()).unwrap_or(0))
        .sum()
}

/// One job writing 250 JSON lines of 4 metrics for each second since it started (1,000 points/s) to `GANTRY_METRICS`
/// for `secs` seconds: the engine's CPU seconds from its submit to its results read, and how much
/// the database grew.
pub async fn ingest_cost(secs: u64) -> Ingest {
    let d = Daemon::start("sim:1x24GiB", |_| {});
    let client = d.client();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = d.child.id();
    let (cpu0, db0) = (proc_cpu_ticks(pid), db_size(&d.state));
    let text = format!(
        "image: {IMAGE}\ngpus: 0\ncommand:\n  - sh\n  - -c\n  - |\n    start=$(date +%s); end=$((start + {secs})); n=0\n    while [ $(date +%s) -lt $end ]; do\n      want=$(( ($(date +%s) - start + 1) * 250 ))\n      awk -v a=$n -v b=$want 'BEGIN {{ for (n = a; n < b; n++) printf(\"{{\\\"step\\\": %d, \\\"train/loss\\\": %.6f, \\\"val/acc\\\": %.6f, \\\"lr\\\": 0.001, \\\"grad_norm\\\": %.3f}}\\n\", n, 1 / (n + 1), n / (n + 1), 1 + n % 7) }}' >> $GANTRY_METRICS\n      n=$want; sleep 1\n    done\n"
    );
    let req = SubmitRequest {
        text,
        file_name: "ingest.yaml".into(),
        base_dir: None,
        idempotency_key: None,
        origin: Default::default(),
        begin: None,
    };
    let t0 = Instant::now();
    let id = client.submit(&req).await.unwrap().job_id;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let j = client.job(id).await.unwrap();
        if j.job.state.is_final() {
            assert_eq!(j.job.state.as_str(), "succeeded", "{j:?}");
            break;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (proc_cpu_ticks(pid) - cpu0) as f64
        / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap().unwrap() as f64;
    let r = client.job_results(id, None).await.unwrap();
    assert!(r.ingest.notes.is_empty(), "{:?}", r.ingest);
    Ingest {
        points: r.metrics.iter().map(|m| m.count).sum(),
        stored: r.metrics.iter().map(|m| m.points.len() as u64).sum(),
        wall,
        cpu,
        db_growth: db_size(&d.state).saturating_sub(db0),
    }
}
