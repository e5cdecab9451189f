//! What runs achieved: each job's metric series (from its `GANTRY_METRICS` file, its TensorBoard
//! event files and its MLflow client), params and tags, and runs compared side by side.
//!
//! Metric values may be NaN or infinite (a diverged run says so): JSON has no such numbers, so a
//! value is a [`Num`], a JSON number or one of the strings `"NaN"`, `"Infinity"`, `"-Infinity"`.
//!
//! Owner and admins only, like logs: another user's job has no results for the caller (its row in a
//! comparison says `hidden`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ts_rs::TS;

use super::job::JobState;

/// A metric value on the wire: a finite JSON number, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Num(pub f64);

impl Serialize for Num {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        if v.is_nan() {
            s.serialize_str("NaN")
        } else if v == f64::INFINITY {
            s.serialize_str("Infinity")
        } else if v == f64::NEG_INFINITY {
            s.serialize_str("-Infinity")
        } else {
            s.serialize_f64(v)
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number, \"NaN\", \"Infinity\" or \"-Infinity\"")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Num, E> {
                Ok(Num(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Num, E> {
                parse_non_finite(v)
                    .map(Num)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }
}

impl fmt::Display for Num {
    /// `0.2315`, `NaN`, `inf`, `-inf`: what `gantry show` and `compare` print.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            f.write_str("NaN")
        } else if v.is_infinite() {
            f.write_str(if v > 0.0 { "inf" } else { "-inf" })
        } else if v != 0.0 && (v.abs() >= 1e6 || v.abs() < 1e-4) {
            write!(f, "{v:.4e}")
        } else {
            // Up to 6 significant digits, trailing zeros dropped.
            let digits = (5 - v.abs().log10().floor().max(-1.0) as i32).clamp(0, 9) as usize;
            let s = format!("{v:.digits$}");
            let s = if s.contains('.') {
                s.trim_end_matches('0').trim_end_matches('.').to_string()
            } else {
                s
            };
            f.write_str(&s)
        }
    }
}

/// `NaN`, `Infinity`/`inf`, `-Infinity`/`-inf` (any case) as their value.
pub fn parse_non_finite(s: &str) -> Option<f64> {
    match s.to_ascii_lowercase().as_str() {
        "nan" | "-nan" | "+nan" => Some(f64::NAN),
        "infinity" | "inf" | "+infinity" | "+inf" => Some(f64::INFINITY),
        "-infinity" | "-inf" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// What a [`Num`] is in TypeScript (this type exists for `ui/src/types.ts` alone).
#[derive(Serialize, TS)]
#[serde(untagged)]
#[ts(rename = "Num")]
pub enum NumTs {
    Finite(f64),
    NonFinite(NonFinite),
}

/// The values JSON has no number for.
#[derive(Serialize, TS)]
pub enum NonFinite {
    #[serde(rename = "NaN")]
    NaN,
    #[serde(rename = "Infinity")]
    Infinity,
    #[serde(rename = "-Infinity")]
    NegInfinity,
}

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    Min,
    Max,
}

/// Words that make a metric's name a "lower is better" one. Exact words (split at anything not a
/// letter or digit, lowercased); the first three also inside a word (`trainloss`, `val_error2`).
const MIN_WORDS: [&str; 11] = [
    "loss",
    "error",
    "perplexity",
    "err",
    "ppl",
    "mse",
    "mae",
    "rmse",
    "nll",
    "wer",
    "cer",
];

impl Goal {
    /// The rule for a metric's best value: `Min` for names that look like a loss, an error or a
    /// perplexity (a word containing `loss`, `error` or `perplexity`, or one of `err`, `ppl`, `mse`,
    /// `mae`, `rmse`, `nll`, `wer`, `cer`: `val/loss`, `train_loss`, `eval_ppl`, `WER`), `Max` for
    /// every other (`accuracy`, `val/acc`, `f1`, `bleu`, `reward`).
    pub fn of(name: &str) -> Goal {
        let lower = name.to_ascii_lowercase();
        let min = lower
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| MIN_WORDS[..3].iter().any(|m| w.contains(m)) || MIN_WORDS[3..].contains(&w));
        if min {
            Goal::Min
        } else {
            Goal::Max
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Goal::Min => "min",
            Goal::Max => "max",
        }
    }

    /// Whether `a` is better than `b` (NaN and infinities are never best: see [`MetricSeries::best`]).
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Goal::Min => a < b,
            Goal::Max => a > b,
        }
    }
}

/// Where a metric, param or tag came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum MetricSource {
    /// The `GANTRY_METRICS` JSON-lines file.
    File,
    /// The `tensorboard:` folder's event files.
    Tensorboard,
    /// The job's MLflow client (`MLFLOW_TRACKING_URI`).
    Mlflow,
    /// The spec's `matrix` (params only).
    Matrix,
}

impl MetricSource {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricSource::File => "file",
            MetricSource::Tensorboard => "tensorboard",
            MetricSource::Mlflow => "mlflow",
            MetricSource::Matrix => "matrix",
        }
    }
    pub fn parse(s: &str) -> Option<MetricSource> {
        [Self::File, Self::Tensorboard, Self::Mlflow, Self::Matrix]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

/// One logged value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, TS)]
pub struct MetricPoint {
    /// The step the job gave (`step` in a JSON line, the event's step, MLflow's `step`); without
    /// one, how many points of this series were logged before it (all attempts).
    pub step: i64,
    /// When it was logged (ms since the epoch): the event's own time when the client gives one,
    /// else when the engine read it.
    pub at: i64,
    #[ts(as = "NumTs")]
    pub value: Num,
    /// The job's attempt that logged it (1 for the first; a preempted or retried job has several).
    pub attempt: u32,
}

/// One metric of one job, across its attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct MetricSeries {
    pub name: String,
    /// Which way is better ([`Goal::of`] its name).
    pub goal: Goal,
    /// Where its first point came from.
    pub source: MetricSource,
    /// The value logged last (latest attempt, then latest logged); NaN when the run ended diverged.
    #[ts(as = "NumTs")]
    pub last: Num,
    pub last_step: i64,
    /// The best finite value ([`Goal`]); `None` while every value is NaN or infinite.
    #[serde(default)]
    #[ts(as = "Option<NumTs>")]
    pub best: Option<Num>,
    #[serde(default)]
    pub best_step: Option<i64>,
    /// Points logged in all (more than `points` holds once older points were thinned).
    pub count: u64,
    /// In logging order (attempt, then time). Thinned to the lab's bound, keeping the first, the
    /// last, the lowest and the highest; further to the asked `max_points`; empty when 0 were asked.
    pub points: Vec<MetricPoint>,
}

/// How reading a job's metrics went: what was dropped and why. Nothing here fails a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS)]
pub struct IngestReport {
    /// Lines of `GANTRY_METRICS` that were not a JSON object (counted, skipped).
    pub garbage_lines: u64,
    /// TensorBoard records whose length or data CRC did not match, or that did not decode.
    pub bad_records: u64,
    /// Bytes read from metric files and folders, all attempts together.
    pub bytes_read: u64,
    /// Reading stopped at the lab's `[results] max_bytes_per_job`.
    pub bytes_limit_reached: bool,
    /// Bytes written to metric files beyond that bound, not read (the most seen left in one file;
    /// MLflow: the largest request not kept).
    #[serde(default)]
    pub bytes_unread: u64,
    /// Points of metrics beyond the lab's `[results] max_series_per_job` (names not kept).
    pub dropped_points: u64,
    /// Distinct names not kept for that bound.
    pub dropped_names: u64,
    /// Human-readable notes, one per kind of problem, each saying what and where (`GANTRY_METRICS:
    /// 3 lines are not JSON objects (first: line 7)`, `tensorboard: runs/ is not readable as alice`).
    pub notes: Vec<String>,
}

/// `GET /v1/jobs/{id}/results`: what a job logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct JobResults {
    pub job_id: i64,
    /// By name.
    pub metrics: Vec<MetricSeries>,
    /// The `matrix` values that made this job, then what its MLflow client logged (`log_param`).
    pub params: BTreeMap<String, String>,
    /// Where each param came from.
    pub param_sources: BTreeMap<String, MetricSource>,
    /// MLflow tags (`set_tag`; `mlflow.*` system tags included).
    pub tags: BTreeMap<String, String>,
    pub ingest: IngestReport,
}

/// `?max_points=` of `GET /v1/jobs/{id}/results`: at most this many points per series (first,
/// last, lowest and highest kept); absent: all stored; 0: summaries only.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, TS)]
#[ts(optional_fields)]
pub struct ResultsQuery {
    pub max_points: Option<u32>,
}

/// `GET /v1/compare`: which runs, sorted by what. Give `ids` or `name`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, TS)]
#[ts(optional_fields)]
pub struct CompareQuery {
    /// Job ids, comma-separated (`12,13,15`).
    pub ids: Option<String>,
    /// A sweep's name (its runs are `name[...]`) or a run's name (every run of that name).
    pub name: Option<String>,
    /// The metric rows are sorted by (best first); absent: the first metric (by name) all rows have.
    pub sort: Option<String>,
    /// Lower is better for `sort` (`--min`), whatever its name says ([`Goal::of`]).
    pub min: Option<bool>,
}

/// A metric column of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct CompareMetric {
    pub name: String,
    pub goal: Goal,
}

/// One run in a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct CompareRow {
    pub job_id: i64,
    pub name: String,
    pub owner: String,
    pub state: JobState,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// First start to end (or to now while it runs).
    pub duration_ms: Option<i64>,
    /// GPUs held × time, all attempts.
    pub gpu_hours: f64,
    pub attempts: u32,
    /// Another user's run: its params and metrics are not shown to the caller.
    pub hidden: bool,
    pub params: BTreeMap<String, String>,
    /// Each metric's last value.
    #[ts(as = "BTreeMap<String, NumTs>")]
    pub last: BTreeMap<String, Num>,
    /// Each metric's best value (absent while it has no finite one).
    #[ts(as = "BTreeMap<String, NumTs>")]
    pub best: BTreeMap<String, Num>,
}

/// `GET /v1/compare`: one row per run, best first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct Comparison {
    pub rows: Vec<CompareRow>,
    /// Every param name of the shown rows, sorted.
    pub params: Vec<String>,
    /// The params whose values differ between rows (what a sweep varied).
    pub differing: Vec<String>,
    /// Every metric of the shown rows, by name.
    pub metrics: Vec<CompareMetric>,
    /// The metric the rows are sorted by and which way (rows without it last); `None`: by id.
    pub sort: Option<CompareMetric>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_lower_is_better_when_its_name_looks_like_a_loss() {
        for n in [
            "loss",
            "val/loss",
            "train_loss",
            "trainLoss",
            "eval.perplexity",
            "val_ppl",
            "WER",
            "error_rate",
            "top1-err",
        ] {
            assert_eq!(Goal::of(n), Goal::Min, "{n}");
        }
        for n in [
            "accuracy",
            "val/acc",
            "f1",
            "bleu",
            "reward",
            "lr",
            "cerebro",
            "mean_episode_len",
        ] {
            assert_eq!(Goal::of(n), Goal::Max, "{n}");
        }
    }

    #[test]
    fn nan_and_infinities_cross_the_wire_as_themselves() {
        let v = vec![
            Num(0.5),
            Num(f64::NAN),
            Num(f64::INFINITY),
            Num(f64::NEG_INFINITY),
            Num(3.0),
        ];
        let s = serde_json::to_string(&v).unwrap();
        assert_eq!(s, r#"[0.5,"NaN","Infinity","-Infinity",3.0]"#);
        let back: Vec<Num> = serde_json::from_str(&s).unwrap();
        assert!(back[1].0.is_nan());
        assert_eq!(
            (back[2].0, back[3].0, back[4].0),
            (f64::INFINITY, f64::NEG_INFINITY, 3.0)
        );
        assert!(serde_json::from_str::<Num>("\"lots\"").is_err());
        assert_eq!(
            [Num(0.23150001), Num(1234.5678), Num(f64::NAN), Num(1e-7), Num(2.0)].map(|n| n.to_string()),
            ["0.2315", "1234.57", "NaN", "1.0000e-7", "2"]
        );
    }
}
