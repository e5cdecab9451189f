//! The trace model: [`TraceJob`] and [`Trace`], reading the two CSV formats, and reshaping a trace's
//! arrivals (rescaled to a load, perturbed per seed).

use super::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceJob {
    pub submit_s: f64,
    pub duration_s: f64,
    pub gpus: u32,
    /// Share of one GPU in thousandths (1000 = whole); `None` = whole GPUs.
    pub gpu_milli: Option<u32>,
    pub user: String,
    pub priority: i32,
    /// What the engine would know as the job's name (and image): the Gantry CSV's `name` column; for
    /// Alibaba, the QoS class (pod names there are unique).
    #[serde(default)]
    pub name: String,
    /// CPUs (thousandths) and RAM (MiB) asked for: part of the request shape the estimator groups by.
    #[serde(default)]
    pub cpus_milli: u64,
    #[serde(default)]
    pub memory_mib: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
    /// Tasks asking for no GPU (not part of a GPU queue).
    pub dropped_cpu_only: usize,
    /// Tasks asking for more GPUs than the machine has.
    pub dropped_too_big: usize,
    pub dropped_zero_duration: usize,
}

/// Parse a trace; jobs needing more than `max_gpus` are dropped and counted.
pub fn load_trace(path: &Path, max_gpus: u32) -> Result<Trace, SimError> {
    parse_trace(&std::fs::read_to_string(path)?, max_gpus)
}

pub fn parse_trace(text: &str, max_gpus: u32) -> Result<Trace, SimError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
    let (_, header) = lines.next().ok_or(SimError::UnknownFormat)?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let idx = |n: &str| cols.iter().position(|c| *c == n);
    let mut t = Trace::default();
    let alibaba = idx("num_gpu").is_some() && idx("creation_time").is_some();
    let gantry = idx("submit_s").is_some() && idx("duration_s").is_some() && idx("gpus").is_some();
    if !alibaba && !gantry {
        return Err(SimError::UnknownFormat);
    }
    for (i, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let get = |n: &str| idx(n).and_then(|k| f.get(k)).copied().unwrap_or("");
        let num = |n: &str| -> Result<f64, SimError> {
            get(n).parse::<f64>().map_err(|_| SimError::Parse {
                line: i + 1,
                msg: format!("`{n}` is not a number: {:?}", get(n)),
            })
        };
        let job = if alibaba {
            let gpus = num("num_gpu")? as u32;
            let milli = num("gpu_milli").unwrap_or(1000.0) as u32;
            TraceJob {
                submit_s: num("creation_time")?,
                duration_s: num("deletion_time")? - num("creation_time")?,
                gpus,
                gpu_milli: (gpus == 1 && milli > 0 && milli < 1000).then_some(milli),
                user: "default".into(),
                priority: 0,
                name: get("qos").to_string(),
                cpus_milli: num("cpu_milli").unwrap_or(0.0) as u64,
                memory_mib: num("memory_mib").unwrap_or(0.0) as u64,
            }
        } else {
            let mem = get("gpu_memory");
            TraceJob {
                submit_s: num("submit_s")?,
                duration_s: num("duration_s")?,
                gpus: num("gpus")? as u32,
                gpu_milli: if mem.is_empty() {
                    None
                } else if let Ok(m) = mem.parse::<u32>() {
                    Some(m.min(1000))
                } else {
                    return Err(SimError::Parse {
                        line: i + 1,
                        msg: format!("gpu_memory {mem:?}: write thousandths of a GPU (e.g. 250)"),
                    });
                },
                user: Some(get("user"))
                    .filter(|u| !u.is_empty())
                    .unwrap_or("default")
                    .to_string(),
                priority: get("priority").parse().unwrap_or(0),
                name: get("name").to_string(),
                cpus_milli: 0,
                memory_mib: 0,
            }
        };
        if job.gpus == 0 {
            t.dropped_cpu_only += 1;
        } else if job.gpus > max_gpus {
            t.dropped_too_big += 1;
        } else if job.duration_s <= 0.0 {
            t.dropped_zero_duration += 1;
        } else {
            t.jobs.push(job);
        }
    }
    t.jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    Ok(t)
}

/// Rescale arrivals so the offered GPU demand (GPU-seconds per second of arrivals) is `load` x the
/// machine's capacity.
pub fn rescale_load(jobs: &mut [TraceJob], gpus: u32, load: f64) {
    let first = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let last = jobs.iter().map(|j| j.submit_s).fold(f64::NEG_INFINITY, f64::max);
    let span = last - first;
    if span <= 0.0 || load <= 0.0 {
        return;
    }
    let work: f64 = jobs.iter().map(gpu_seconds).sum();
    let new_span = work / (load * gpus as f64);
    for j in jobs.iter_mut() {
        j.submit_s = (j.submit_s - first) * new_span / span;
    }
}

pub(super) fn gpu_seconds(j: &TraceJob) -> f64 {
    j.duration_s * j.gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(j.gpus as f64)
}

/// Arrival perturbation for `--seeds`: seed 0 is the trace as recorded; seed k moves each arrival by
/// a uniform offset within ± one mean gap between arrivals (so neighbours swap and bursts spread a
/// little, while the day-scale shape of the load stays) and re-sorts.
pub fn perturb_arrivals(jobs: &mut [TraceJob], seed: u64) {
    if seed == 0 || jobs.len() < 2 {
        return;
    }
    let first = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let last = jobs.iter().map(|j| j.submit_s).fold(f64::NEG_INFINITY, f64::max);
    let gap = (last - first) / (jobs.len() - 1) as f64;
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
    for j in jobs.iter_mut() {
        j.submit_s = (j.submit_s + (2.0 * rng.unit() - 1.0) * gap).max(first);
    }
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
}
