//! Learned runtime estimates: a pure, deterministic model from the runtimes of *completed* jobs to
//! the distribution of a queued or running job's (remaining) runtime. The engine feeds it its
//! store's finished runs; the simulator feeds it the jobs that have finished on its virtual clock.
//! Neither ever shows it the job's own duration.
//!
//! Jobs are grouped from specific to general: the same owner, name, image and request shape; the
//! same request shape (GPUs, GPU memory, CPUs, RAM); the same GPU count and sharing; everyone. An
//! estimate comes from the most specific group with at least [`MIN_SAMPLES`] runs that outlived the
//! job's elapsed time. It is a distribution (quantiles), not one number: runtimes are heavy-tailed
//! (on the Alibaba trace the median is 9 minutes and the p99 32 hours), so a mean says little.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// A group's estimate needs this many past runs (that outlived the elapsed time). With 8 samples the
/// largest exceeds the group's true p80 with probability 1 - 0.8^8 = 83%, so the p80 we report is
/// inside the data rather than extrapolated; fewer falls back to a broader group.
pub const MIN_SAMPLES: usize = 8;
/// Each group remembers its most recent runs only, so the model follows drift (a project whose
/// runs grow longer) and stays small (bounded memory for 100k-job histories).
pub const WINDOW: usize = 128;

/// What is known about a job before it runs: never its runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobKey {
    pub user: String,
    pub name: String,
    pub image: String,
    pub gpus: u32,
    /// Declared memory per GPU (`None`: whole GPUs).
    pub gpu_memory: Option<u64>,
    pub cpus_milli: u64,
    pub memory: u64,
}

impl JobKey {
    /// The groups a job belongs to, most specific first.
    fn groups(&self) -> [String; 3] {
        let shape = format!(
            "{}|{:?}|{}|{}",
            self.gpus, self.gpu_memory, self.cpus_milli, self.memory
        );
        [
            format!("j|{}|{}|{}|{shape}", self.user, self.name, self.image),
            format!("s|{shape}"),
            format!("g|{}|{}", self.gpus, self.gpu_memory.is_some()),
        ]
    }
}

/// Which group an estimate came from (for how much to trust it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Past runs of the same owner, name, image and shape.
    SameJob,
    /// Past runs of the same request shape.
    SameShape,
    /// Past runs asking for as many GPUs.
    SameGpus,
    /// All past runs.
    All,
    /// No past run outlived this one: it has run `elapsed` and is assumed to run as long again
    /// (the median remaining life of a heavy-tailed, Pareto-like runtime with shape 1).
    Elapsed,
}

/// Distribution of the remaining runtime (ms from now).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub p50_ms: i64,
    pub p80_ms: i64,
    pub p95_ms: i64,
    /// How many past runs it rests on.
    pub samples: usize,
    pub basis: Basis,
}

impl Estimate {
    /// The `q` quantile (0.5, 0.8 or 0.95; others round to the nearest of these).
    pub fn quantile(&self, q: f64) -> i64 {
        if q < 0.65 {
            self.p50_ms
        } else if q < 0.875 {
            self.p80_ms
        } else {
            self.p95_ms
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Group {
    /// In completion order (oldest first) and sorted.
    recent: VecDeque<i64>,
    sorted: Vec<i64>,
}

impl Group {
    fn add(&mut self, ms: i64) {
        if self.recent.len() == WINDOW {
            if let Some(old) = self.recent.pop_front() {
                if let Ok(i) = self.sorted.binary_search(&old) {
                    self.sorted.remove(i);
                }
            }
        }
        self.recent.push_back(ms);
        let i = self.sorted.partition_point(|x| *x <= ms);
        self.sorted.insert(i, ms);
    }
}

/// Runtimes of completed jobs, grouped.
#[derive(Debug, Clone, Default)]
pub struct History {
    groups: HashMap<String, Group>,
    all: Group,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// A history of these runs, oldest first.
    pub fn from_runs(runs: &[(JobKey, i64)]) -> Self {
        let mut h = History::new();
        for (k, ms) in runs {
            h.record(k, *ms);
        }
        h
    }

    /// Record a finished run (its wall time on the GPUs).
    pub fn record(&mut self, key: &JobKey, runtime_ms: i64) {
        let ms = runtime_ms.max(1);
        for g in key.groups() {
            self.groups.entry(g).or_default().add(ms);
        }
        self.all.add(ms);
    }

    /// Remaining runtime of a job that has run `elapsed_ms` so far (0 for a queued job): the
    /// quantiles of `d - elapsed` over past runtimes `d > elapsed` of its most specific group with
    /// enough of them. `None` until [`MIN_SAMPLES`] jobs have completed.
    pub fn estimate(&self, key: &JobKey, elapsed_ms: i64) -> Option<Estimate> {
        if self.all.sorted.len() < MIN_SAMPLES {
            return None;
        }
        let elapsed = elapsed_ms.max(0);
        let [a, b, c] = key.groups();
        let levels = [
            (self.groups.get(&a), Basis::SameJob),
            (self.groups.get(&b), Basis::SameShape),
            (self.groups.get(&c), Basis::SameGpus),
            (Some(&self.all), Basis::All),
        ];
        for (g, basis) in levels {
            let Some(g) = g else { continue };
            let from = g.sorted.partition_point(|x| *x <= elapsed);
            let alive = &g.sorted[from..];
            if alive.len() >= MIN_SAMPLES {
                let q = |p: f64| alive[((alive.len() as f64 * p).ceil() as usize).clamp(1, alive.len()) - 1] - elapsed;
                return Some(Estimate {
                    p50_ms: q(0.5),
                    p80_ms: q(0.8),
                    p95_ms: q(0.95),
                    samples: alive.len(),
                    basis,
                });
            }
        }
        // Outlived (nearly) everything seen: Lindy's rule.
        let e = elapsed.max(1);
        Some(Estimate {
            p50_ms: e,
            p80_ms: 4 * e,
            p95_ms: 19 * e,
            samples: 0,
            basis: Basis::Elapsed,
        })
    }
}

/// The runtime the scheduler plans a queued job with (backfill, shortest-first order, start
/// estimates). Without a declaration: the learned median. With one: the declaration, unless its
/// owner's attempts overran their declarations (past the lab's margin) `strikes` times or more in
/// the window (`overruns`): then the declaration counts for no less than the learned p80 of the
/// job's shape, and for nothing while nothing is learned (a job of unknown runtime is not
/// backfilled). A user whose promise failed is judged by what their runs took, not what they say.
pub fn trusted_runtime(declared: Option<i64>, learned: Option<&Estimate>, overruns: u32, strikes: u32) -> Option<i64> {
    match declared {
        None => learned.map(|e| e.p50_ms),
        Some(d) if overruns < strikes => Some(d),
        Some(d) => learned.map(|e| d.max(e.p80_ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str, name: &str, gpus: u32) -> JobKey {
        JobKey {
            user: user.into(),
            name: name.into(),
            image: "img".into(),
            gpus,
            ..Default::default()
        }
    }

    #[test]
    fn most_specific_group_with_enough_runs_wins() {
        let mut h = History::new();
        assert_eq!(h.estimate(&key("a", "x", 1), 0), None, "nothing completed yet");
        for i in 0..MIN_SAMPLES as i64 - 1 {
            h.record(&key("z", "z", 2), 1 + i);
        }
        assert_eq!(h.estimate(&key("a", "x", 1), 0), None, "too few runs to say anything");
        let mut h = History::new();
        for i in 0..10 {
            h.record(&key("a", "train", 1), 1000 + i); // a's `train`: about 1 s
            h.record(&key("b", "sweep", 1), 100_000 + i); // b's `sweep`: about 100 s
        }
        let e = h.estimate(&key("a", "train", 1), 0).unwrap();
        assert_eq!((e.basis, e.samples, e.p50_ms), (Basis::SameJob, 10, 1004));
        // A new name falls back to the shape (both jobs' runs), then to everything.
        let e = h.estimate(&key("c", "new", 1), 0).unwrap();
        assert_eq!(
            (e.basis, e.samples, e.p50_ms, e.p95_ms),
            (Basis::SameShape, 20, 1009, 100_008)
        );
        let e = h.estimate(&key("c", "new", 4), 0).unwrap();
        assert_eq!((e.basis, e.samples), (Basis::All, 20));
    }

    #[test]
    fn remaining_time_is_conditional_on_elapsed() {
        let mut h = History::new();
        for i in 1..=10 {
            h.record(&key("a", "x", 1), i * 1000); // 1..10 s
        }
        // Run 2.5 s: the runs that lasted longer are 3..10 s (8 of them), so 0.5..7.5 s remain; nearest
        // rank: p50 = 4th (6 s), p80 = 7th (9 s), p95 = 8th (10 s).
        let e = h.estimate(&key("a", "x", 1), 2500).unwrap();
        assert_eq!((e.samples, e.p50_ms, e.p80_ms, e.p95_ms), (8, 3500, 6500, 7500));
        // Outlived everything: as long again.
        let e = h.estimate(&key("a", "x", 1), 60_000).unwrap();
        assert_eq!((e.basis, e.p50_ms), (Basis::Elapsed, 60_000));
    }

    #[test]
    fn a_jobs_own_runtime_never_enters_its_estimate() {
        // The simulator records a job only once it has finished; until then nothing about its own
        // duration can change its estimate. Two histories that differ only in a job that has not
        // finished yet give the same estimate for it.
        let mut h = History::new();
        for i in 0..9 {
            h.record(&key("a", "x", 1), 1000 * (i + 1));
        }
        let before = h.estimate(&key("a", "x", 1), 0);
        let mut leaked = h.clone();
        leaked.record(&key("a", "x", 1), 1_000_000); // what recording it early would do
        assert_ne!(
            before,
            leaked.estimate(&key("a", "x", 1), 0),
            "the test can fail: a leak would show"
        );
        assert_eq!(before, History::estimate(&h, &key("a", "x", 1), 0));
    }

    /// Issue 18 item 7: the learned estimate, not the declaration, is trusted for a user whose
    /// declarations were overrun.
    #[test]
    fn a_declaration_counts_until_its_owner_overran_one() {
        let e = Estimate {
            p50_ms: 40_000,
            p80_ms: 53_000,
            p95_ms: 60_000,
            samples: 10,
            basis: Basis::SameJob,
        };
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let cases: [(&str, Option<i64>, Option<&Estimate>, u32, Option<i64>); 6] = [
            ("no declaration: the learned median", None, Some(&e), 0, Some(40_000)),
            ("no declaration, nothing learned: unknown", None, None, 3, None),
            (
                "an honest owner's declaration is used as declared",
                Some(1_000),
                Some(&e),
                0,
                Some(1_000),
            ),
            (
                "bob overran once: his 1 s declaration counts as the learned p80, 53 s",
                Some(1_000),
                Some(&e),
                1,
                Some(53_000),
            ),
            (
                "...and a declaration longer than the p80 stays as declared",
                Some(90_000),
                Some(&e),
                1,
                Some(90_000),
            ),
            (
                "...nothing learned yet: unknown, so never backfilled",
                Some(1_000),
                None,
                1,
                None,
            ),
        ];
        for (name, declared, learned, overruns, want) in cases {
            assert_eq!(trusted_runtime(declared, learned, overruns, 1), want, "{name}");
        }
        assert_eq!(
            trusted_runtime(Some(1_000), Some(&e), 1, 2),
            Some(1_000),
            "below the strikes (2 here): still trusted"
        );
        assert_eq!(trusted_runtime(Some(1_000), Some(&e), 2, 2), Some(53_000));
    }

    #[test]
    fn window_forgets_old_runs() {
        let mut h = History::new();
        for _ in 0..WINDOW {
            h.record(&key("a", "x", 1), 1000);
        }
        for _ in 0..WINDOW {
            h.record(&key("a", "x", 1), 9000);
        }
        assert_eq!(h.estimate(&key("a", "x", 1), 0).unwrap().p50_ms, 9000);
    }
}
