//! What a run measured: the [`Report`], computed from the run's results (`report`), and the mean
//! with its confidence interval over seeds.

use super::trace::gpu_seconds;
use super::*;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub policy: String,
    pub jobs: usize,
    pub gpus: u32,
    pub dropped_cpu_only: usize,
    pub dropped_too_big: usize,
    pub makespan_s: f64,
    /// max(total GPU-seconds / GPUs, latest arrival + its duration)
    pub lower_bound_s: f64,
    pub makespan_ratio: f64,
    /// Allocated GPU capacity / total, averaged over the time some job was waiting.
    pub alloc_share_while_waiting: f64,
    pub mean_wait_s: f64,
    pub p95_wait_s: f64,
    /// Mean wait by GPUs asked (1, 2, 4, 8...).
    pub mean_wait_by_gpus: BTreeMap<u32, f64>,
    /// Each user's share of the GPU time handed out while jobs were waiting (under contention).
    pub user_share: BTreeMap<String, f64>,
    /// Mean wait per user.
    pub mean_wait_by_user: BTreeMap<String, f64>,
    /// Scheduler calls made (for speed reporting).
    pub plan_calls: usize,
    /// Idle capacity while some job held a reservation, as a share of the waiting time (the part of
    /// `1 - alloc_share_while_waiting` that reservations account for).
    #[serde(default)]
    pub idle_share_while_reserving: f64,
    /// Mean over jobs asking for 4+ GPUs of how long the jobs running at their arrival still had to
    /// run: what even a perfect drain for them costs without preemption.
    #[serde(default)]
    pub big_drain_bound_s: f64,
    /// Idle capacity on GPUs that hold a shared job, as a share of the waiting time (fragments).
    #[serde(default)]
    pub idle_share_fragments: f64,
    /// Idle capacity while only jobs asking for 2+ GPUs waited (drains no policy can fill).
    #[serde(default)]
    pub idle_share_only_wide_waiting: f64,
    /// Preemptions made (`--preempt`).
    #[serde(default)]
    pub preemptions: usize,
    /// GPU-hours lost to preemption (work since the last checkpoint, the grace, the restart cost).
    #[serde(default)]
    pub gpu_hours_lost: f64,
    /// The same as a share of the trace's GPU-hours of work.
    #[serde(default)]
    pub lost_share: f64,
    /// What preemption did to the machine's capacity, measured (issue 32): `--preempt` runs only.
    #[serde(default)]
    pub mechanisms: Mechanisms,
    /// Each job's start (ms on the virtual clock), for tests.
    #[serde(skip)]
    pub starts_ms: Vec<Option<i64>>,
}

/// The mechanisms by which preemption can leave GPUs emptier, each measured on the run (issue 32).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Mechanisms {
    /// GPU-hours of capacity left unallocated on GPUs claimed for a waiting job (freed, or free
    /// beside its victims, and kept for it until it starts).
    pub claim_idle_gpu_h: f64,
    /// Victims none of whose GPUs the job they were stopped for started on.
    pub victims_unused: usize,
    /// Victims holding whole GPUs stopped for a job that shares a GPU by memory.
    pub shared_over_exclusive: usize,
    /// Victims of the waiting job's own user.
    pub own_user: usize,
    /// Victims asking for more GPUs than the job they were stopped for.
    pub wider: usize,
    /// GPUs of allocation given up at the swap: over each preemption decision, the victims'
    /// allocation less the waiting job's when that is positive (GPU-hours: × the time until the
    /// victims could have come back is not known, so this is a count of GPUs, summed).
    pub alloc_given_up_gpus: f64,
    /// Hours from a preemption decision to its job's start, summed (the grace at best).
    pub decision_to_start_h: f64,
    /// Preempted jobs' waits after their preemptions, GPU-hours (their GPUs × the re-wait).
    pub rewait_gpu_h: f64,
    /// Jobs preempted more than once.
    pub preempted_twice: usize,
}

impl Report {
    /// Mean wait of jobs asking for 4 or more GPUs over that of 1-GPU jobs (`None`: no such jobs).
    pub fn big_over_one(&self) -> Option<f64> {
        let w1 = self.mean_wait_by_gpus.get(&1).copied().filter(|w| *w > 0.0)?;
        let big: Vec<f64> = self
            .mean_wait_by_gpus
            .iter()
            .filter(|(g, _)| **g >= 4)
            .map(|(_, w)| *w)
            .collect();
        (!big.is_empty()).then(|| big.iter().sum::<f64>() / big.len() as f64 / w1)
    }
}

#[allow(clippy::too_many_arguments)] // the run's results, each measured apart, into one row
pub(super) fn report(
    trace: &Trace,
    cfg: &SimConfig,
    start: &[Option<i64>],
    rewait_ms: &[i64],
    end_ms: &[Option<i64>],
    waiting_time: f64,
    alloc_integral: f64,
    user_integral: HashMap<String, f64>,
    plan_calls: usize,
) -> Report {
    let jobs = &trace.jobs;
    let mut waits: Vec<f64> = vec![];
    let mut by_gpus: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
    let mut by_user: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    let mut makespan = 0.0f64;
    for (k, (j, s)) in jobs.iter().zip(start).enumerate() {
        let Some(s) = s else { continue };
        // Every wait counts: before its first start and after each preemption.
        let w = (*s as f64 / MS - j.submit_s).max(0.0) + rewait_ms.get(k).copied().unwrap_or(0) as f64 / MS;
        waits.push(w);
        let e = by_gpus.entry(j.gpus).or_default();
        e.0 += w;
        e.1 += 1;
        let u = by_user.entry(j.user.clone()).or_default();
        u.0 += w;
        u.1 += 1;
        makespan = makespan.max(match (rewait_ms.get(k), end_ms.get(k)) {
            (Some(r), Some(Some(e))) if *r > 0 || e - s > (j.duration_s * MS).round().max(1.0) as i64 => *e as f64 / MS,
            _ => *s as f64 / MS + j.duration_s,
        });
    }
    let total: f64 = jobs.iter().map(gpu_seconds).sum();
    let first = jobs.first().map(|j| j.submit_s).unwrap_or(0.0);
    let lb = (total / cfg.gpus as f64).max(jobs.iter().map(|j| j.submit_s + j.duration_s).fold(0.0, f64::max) - first);
    let makespan = makespan - first;
    waits.sort_by(f64::total_cmp);
    let mean = if waits.is_empty() {
        0.0
    } else {
        waits.iter().sum::<f64>() / waits.len() as f64
    };
    let p95 = waits
        .get(((waits.len() as f64 * 0.95).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    Report {
        policy: format!("{:?}", cfg.policy).to_lowercase()
            + if cfg.declared_runtimes { "+runtimes" } else { "" }
            + match &cfg.lying {
                Some(l) if cfg.declared_runtimes && l.checked => "+liars+checked",
                Some(_) if cfg.declared_runtimes => "+liars",
                _ => "",
            }
            + if cfg.fair_share_half_life_s.is_some() {
                "+fairshare"
            } else {
                ""
            }
            + if cfg.preempt.is_some() && cfg.policy == Policy::Gantry {
                "+preempt"
            } else {
                ""
            },
        jobs: jobs.len(),
        gpus: cfg.gpus,
        dropped_cpu_only: trace.dropped_cpu_only,
        dropped_too_big: trace.dropped_too_big,
        makespan_s: makespan,
        lower_bound_s: lb,
        makespan_ratio: if lb > 0.0 { makespan / lb } else { 1.0 },
        alloc_share_while_waiting: if waiting_time > 0.0 {
            alloc_integral / waiting_time
        } else {
            1.0
        },
        mean_wait_s: mean,
        p95_wait_s: p95,
        mean_wait_by_gpus: by_gpus.into_iter().map(|(g, (s, c))| (g, s / c as f64)).collect(),
        mean_wait_by_user: by_user.into_iter().map(|(u, (s, c))| (u, s / c as f64)).collect(),
        user_share: {
            let sum: f64 = user_integral.values().sum();
            user_integral
                .into_iter()
                .map(|(u, s)| (u, if sum > 0.0 { s / sum } else { 0.0 }))
                .collect()
        },
        plan_calls,
        ..Default::default()
    }
}

/// Mean and 95% confidence half-width (Student's t) of `xs`.
pub fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom, then the normal's.
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    let t = T.get(n - 2).copied().unwrap_or(1.96);
    (mean, t * (var / n as f64).sqrt())
}
