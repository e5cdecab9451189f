//! Where a job fits: GPU choice (best fit / FGD fragmentation), taking GPUs, and topology (NVLink, PCIe).

#[allow(unused_imports)]
use super::*;

/// Free memory on each GPU for fragmentation purposes (0 where a job holds it whole or an outside
/// process uses it), and whether it can take a whole-GPU job.
pub(super) fn frag_view(slots: &[Slot]) -> Vec<(u64, bool, u64)> {
    slots
        .iter()
        .map(|s| {
            if s.external || s.exclusive_by.is_some() {
                (0, false, s.total)
            } else {
                (s.free_for_shared(), s.is_empty(), s.total)
            }
        })
        .collect()
}

/// FGD's fragmentation of a machine for one request shape: the free GPU memory that cannot serve it.
/// If the machine can host the shape, that is the free memory of GPUs too full for it; if it cannot,
/// all its free memory. `gpus` = (free memory, takes a whole-GPU job, total).
pub fn fragmentation(gpus: &[(u64, bool, u64)], shape: &Shape) -> u64 {
    let serves = |g: &(u64, bool, u64)| match shape.gpu_memory {
        None => g.1,
        Some(m) => g.0 >= m,
    };
    let free: u64 = gpus.iter().map(|g| g.0).sum();
    if gpus.iter().filter(|g| serves(g)).count() >= shape.gpus as usize {
        gpus.iter().filter(|g| !serves(g)).map(|g| g.0).sum()
    } else {
        free
    }
}

/// Expected fragmentation: weighted by each shape's share of recent requests.
pub fn expected_fragmentation(gpus: &[(u64, bool, u64)], shapes: &[Shape]) -> f64 {
    shapes.iter().map(|s| s.weight * fragmentation(gpus, s) as f64).sum()
}

/// Pick GPUs for `job`, or say why not.
pub(super) fn choose(slots: &[Slot], job: &QueuedJob, ctx: &Ctx, explain: bool) -> Result<Vec<u32>, String> {
    let n = job.gpus as usize;
    let all = slots.len();
    let every = slots;
    let fgd = (ctx.packing == Packing::Fgd && !ctx.shapes.is_empty() && job.gpu_memory.is_some()).then(|| {
        let view = frag_view(every);
        (expected_fragmentation(&view, ctx.shapes), view)
    });
    let slots: Vec<&Slot> = slots.iter().filter(|s| job.filter.eligible(&s.name, s.total)).collect();
    if job.filter.is_any() && n > all {
        return Err(format!("needs {n} GPUs, this machine has {all}"));
    }
    if n > slots.len() {
        return Err(format!(
            "waits for {}: this machine has {} such GPU{}",
            job.filter.describe(job.gpus),
            slots.len(),
            if slots.len() == 1 { "" } else { "s" }
        ));
    }
    let mut reasons: Vec<String> = vec![];
    let mut reasons_push = |r: &dyn Fn() -> String| {
        if explain {
            reasons.push(r());
        }
    };
    let mut candidates: Vec<(u64, u32)> = vec![]; // (sort key, index)
    for s in slots.iter() {
        if let Some((r, shadow)) = s.reserved_by {
            if r != job.job_id && !may_backfill(job, shadow, ctx) {
                reasons_push(&|| format!("GPU {} reserved for job {r}", s.index));
                continue;
            }
        }
        if let Some(why) = book::refuses(s, job, ctx) {
            reasons_push(&|| why.clone());
            continue;
        }
        if s.external {
            reasons_push(&|| {
                format!(
                    "GPU {} in use outside this engine (another engine's job, or a process outside Gantry)",
                    s.index
                )
            });
            continue;
        }
        if let Some(j) = s.exclusive_by {
            reasons_push(&|| format!("GPU {} held by job {j}", s.index));
            continue;
        }
        match job.gpu_memory {
            None => {
                if s.is_empty() {
                    candidates.push((0, s.index));
                } else {
                    reasons_push(&|| format!("GPU {} shared by job {}", s.index, list_i64(&s.shared_jobs)));
                }
            }
            Some(m) => {
                let free = s.free_for_shared();
                if free >= m {
                    // Best fit: least free memory left first, keeping whole GPUs free for big jobs.
                    let left = free - m;
                    let key = match (&fgd, ctx.packing) {
                        (Some((before, view)), _) => {
                            // The growth of expected fragmentation if it goes here (in millionths of a
                            // GPU), then best fit among equals.
                            let mut after = view.clone();
                            if let Some(i) = every.iter().position(|x| x.index == s.index) {
                                after[i].0 = after[i].0.saturating_sub(m);
                                after[i].1 = false;
                            }
                            let grow = (expected_fragmentation(&after, ctx.shapes) - before) / s.total.max(1) as f64;
                            let grow = ((grow * 1e6).round() as i64 + (1 << 30)).clamp(0, (1 << 40) - 1) as u64;
                            (grow << 24) | (left >> 20).min((1 << 24) - 1)
                        }
                        (None, Packing::WorstFit) => u64::MAX - left,
                        (None, _) => left,
                    };
                    candidates.push((key, s.index));
                } else {
                    reasons_push(&|| {
                        format!(
                            "GPU {} has {} free{}, needs {}",
                            s.index,
                            crate::units::format_bytes(free),
                            if s.outside_used > 0 {
                                format!(" ({} used outside Gantry)", crate::units::format_bytes(s.outside_used))
                            } else {
                                String::new()
                            },
                            crate::units::format_bytes(m)
                        )
                    });
                }
            }
        }
    }
    if candidates.len() >= n {
        Ok(pick(candidates, n, &ctx.topology))
    } else if !explain {
        Err(String::new())
    } else {
        let what = match job.gpu_memory {
            None => format!("needs {n} free GPU{}", if n == 1 { "" } else { "s" }),
            Some(m) => format!(
                "needs {n} GPU{} with {} free",
                if n == 1 { "" } else { "s" },
                crate::units::format_bytes(m)
            ),
        };
        let which = if job.filter.is_any() {
            String::new()
        } else {
            let matching: Vec<u32> = slots.iter().map(|s| s.index).collect();
            format!(
                "waits for {}: GPU{} {} match{}; ",
                job.filter.describe(job.gpus),
                if matching.len() == 1 { "" } else { "s" },
                list(&matching),
                if matching.len() == 1 { "es" } else { "" }
            )
        };
        Err(format!(
            "{which}{what}, {} available ({})",
            candidates.len(),
            summarize(&reasons)
        ))
    }
}

pub(super) fn take(slots: &mut [Slot], job: &QueuedJob, chosen: &[u32], ctx: &Ctx) {
    for s in slots.iter_mut().filter(|s| chosen.contains(&s.index)) {
        match job.gpu_memory {
            None => s.exclusive_by = Some(job.job_id),
            Some(m) => {
                s.shared_declared += m;
                s.shared_jobs.push(job.job_id);
            }
        }
        s.ends.push(job.expected_runtime_ms.map(|r| ctx.now + r));
    }
}

/// Links between GPUs (by index) as NVML reports them; empty when it reports none (simulated GPUs).
#[derive(Debug, Clone, Default)]
pub(super) struct Topology(std::collections::HashMap<(u32, u32), crate::gpu::Link>);

impl Topology {
    pub(super) fn of(gpus: &[GpuView]) -> Self {
        Topology(
            gpus.iter()
                .flat_map(|g| {
                    g.links
                        .iter()
                        .map(move |l| ((g.index.min(l.peer), g.index.max(l.peer)), l.link))
                })
                .collect(),
        )
    }
    /// Lower is closer; pairs NVML says nothing about rank below every known link.
    pub(super) fn rank(&self, a: u32, b: u32) -> u8 {
        self.0.get(&(a.min(b), a.max(b))).map(|l| *l as u8).unwrap_or(u8::MAX)
    }
}

/// Choose `n` of the candidates (sort key, index; lower keys are better). The GPUs whose keys are
/// below the n-th best are in every best placement; the rest come from those tied with it, and when
/// the topology is known, they are the ones best connected: the set whose worst link is closest, then
/// the one with the most close links. Greedy from each possible start, which is exact for 2 GPUs and
/// for the usual NVLink pairs and quads.
pub(super) fn pick(mut cands: Vec<(u64, u32)>, n: usize, topo: &Topology) -> Vec<u32> {
    cands.sort();
    let plain = |c: &[(u64, u32)]| {
        let mut v: Vec<u32> = c.iter().take(n).map(|c| c.1).collect();
        v.sort();
        v
    };
    if n < 2 || topo.0.is_empty() {
        return plain(&cands);
    }
    let bar = cands[n - 1].0;
    let must: Vec<u32> = cands.iter().filter(|c| c.0 < bar).map(|c| c.1).collect();
    let ties: Vec<u32> = cands.iter().filter(|c| c.0 == bar).map(|c| c.1).collect();
    if ties.len() == n - must.len() {
        return plain(&cands);
    }
    let seeds: Vec<Vec<u32>> = if must.is_empty() {
        ties.iter().map(|t| vec![*t]).collect()
    } else {
        vec![must]
    };
    let mut best: Option<((u8, u32), Vec<u32>)> = None;
    for mut set in seeds {
        // Per tied GPU not yet taken: (its worst link to the set, the sum of its links to the set).
        let mut pool: Vec<(u8, u32, u32)> = ties
            .iter()
            .filter(|t| !set.contains(t))
            .map(|t| {
                set.iter().fold((0u8, 0u32, *t), |(w, sum, t), s| {
                    (w.max(topo.rank(t, *s)), sum + topo.rank(t, *s) as u32, t)
                })
            })
            .collect();
        let mut score = set
            .iter()
            .enumerate()
            .flat_map(|(i, a)| set[i + 1..].iter().map(move |b| (*a, *b)))
            .fold((0u8, 0u32), |(w, sum), (a, b)| {
                (w.max(topo.rank(a, b)), sum + topo.rank(a, b) as u32)
            });
        while set.len() < n {
            let (k, &(w, sum, t)) = pool
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| **p)
                .expect("enough tied GPUs");
            pool.swap_remove(k);
            score = (score.0.max(w), score.1 + sum);
            for p in pool.iter_mut() {
                let r = topo.rank(p.2, t);
                *p = (p.0.max(r), p.1 + r as u32, p.2);
            }
            set.push(t);
        }
        set.sort();
        if best.as_ref().is_none_or(|(s, b)| (score, &set) < (*s, b)) {
            best = Some((score, set));
        }
    }
    best.map(|b| b.1).unwrap_or_default()
}

/// What the job detail says about a multi-GPU placement when the topology is known:
/// "GPUs 0,1: NVLink", or the worst link of a larger set ("GPUs 0,1,2,3: same PCIe switch or closer").
pub fn topology_note(gpus: &[GpuView], chosen: &[u32]) -> Option<String> {
    let topo = Topology::of(gpus);
    let links: Vec<Option<crate::gpu::Link>> = chosen
        .iter()
        .enumerate()
        .flat_map(|(i, a)| chosen[i + 1..].iter().map(move |b| (*a, *b)))
        .map(|(a, b)| topo.0.get(&(a.min(b), a.max(b))).copied())
        .collect();
    if links.is_empty() || links.iter().any(|l| l.is_none()) {
        return None;
    }
    let worst = links.iter().flatten().max()?;
    let all_same = links.iter().all(|l| l.as_ref() == Some(worst));
    Some(format!(
        "GPUs {}: {}{}",
        list(chosen),
        worst.describe(),
        if all_same { "" } else { " or closer" }
    ))
}
