//! This machine's GPUs as the Docker backend sees them: for the scheduler (what is busy outside
//! Gantry), for the GPUs view (who is on each one), and for "does this job fit" at submit.

use crate::units;
use std::collections::HashMap;

use super::DockerBackend;
use crate::engine::Engine;
use crate::gpu::GpuSample;
use crate::protocol::{GpuStatus, GpuUser};
use crate::scheduler::GpuView;
use crate::spec::{self, SpecError, ValidJob};
use crate::store::Job;

impl DockerBackend {
    /// GPUs as the scheduler sees them: processes outside our containers, running containers we do not
    /// know (orphans from a lost database), and other engines' or anyone's GPU containers make a GPU busy.
    pub(super) fn gpu_views(&self, e: &Engine) -> Vec<GpuView> {
        let ours: Vec<String> = e
            .running
            .lock()
            .unwrap()
            .values()
            .filter_map(|h| h.run.as_ref()?.container().map(String::from))
            .collect();
        let orphaned: Vec<u32> = e
            .health
            .read()
            .unwrap()
            .orphans
            .iter()
            .filter(|o| o.running)
            .flat_map(|o| o.gpus.clone())
            .collect();
        let foreign = self.foreign.read().unwrap();
        let simulated = e.backend_kind() == crate::protocol::BackendKind::Simulated;
        let now = e.now();
        let mut since = self.outside_since.lock().unwrap();
        let views: Vec<GpuView> = e
            .latest
            .read()
            .unwrap()
            .iter()
            .filter(|g| e.usable(g))
            .map(|g| GpuView {
                index: g.index,
                memory_total: g.memory_total,
                memory_used: g.memory_used,
                outside_used: outside_used(g, &ours),
                name: g.name.clone(),
                links: g.links.clone(),
                external_busy: orphaned.contains(&g.index)
                    || foreign.iter().any(|f| foreign_holds(&f.gpus, g, simulated))
                    || g.processes.iter().any(|p| match &p.container_id {
                        Some(c) => !ours.iter().any(|o| o == c),
                        None => true,
                    }),
                outside_since_ms: None,
            })
            .collect();
        views
            .into_iter()
            .map(|mut v| {
                if v.external_busy {
                    v.outside_since_ms = Some(*since.entry(v.index).or_insert(now));
                } else {
                    since.remove(&v.index);
                }
                v
            })
            .collect()
    }

    pub(super) fn status(&self, e: &Engine) -> GpuStatus {
        // (job, GPUs, container) of every running job: a snapshot, so no lock is held across the store.
        let running: Vec<(i64, Vec<u32>, Option<String>)> = e
            .running
            .lock()
            .unwrap()
            .iter()
            .map(|(id, h)| {
                (
                    *id,
                    h.gpus.clone(),
                    h.run.as_ref().and_then(|r| r.container().map(String::from)),
                )
            })
            .collect();
        let mut holders: HashMap<u32, Vec<i64>> = HashMap::new();
        for (id, gpus, _) in &running {
            for g in gpus {
                holders.entry(*g).or_default().push(*id);
            }
        }
        let mut holders: Vec<(u32, Vec<i64>)> = holders
            .into_iter()
            .map(|(g, mut v)| {
                v.sort();
                (g, v)
            })
            .collect();
        holders.sort();
        let gpus = e.latest.read().unwrap().clone();
        let users = self.gpu_users(e, &gpus, &running);
        GpuStatus {
            backend: e.backend_kind,
            note: e.backend_note.clone(),
            gpus,
            holders,
            users,
            library: e.backend_library.clone(),
            reserved: e.reserved_gpus(),
        }
    }

    /// Who is on each GPU: this engine's jobs (by their containers), then every other process, then
    /// containers outside this engine that hold a GPU but run nothing on it yet.
    fn gpu_users(&self, e: &Engine, gpus: &[GpuSample], running: &[(i64, Vec<u32>, Option<String>)]) -> Vec<GpuUser> {
        // Names of containers outside this engine: other engines' jobs, `docker run --gpus`, orphans.
        let mut names: HashMap<String, String> = self
            .foreign
            .read()
            .unwrap()
            .iter()
            .map(|f| (f.container_id.clone(), f.name.clone()))
            .collect();
        names.extend(
            e.health
                .read()
                .unwrap()
                .orphans
                .iter()
                .map(|o| (o.container_id.clone(), o.name.clone())),
        );
        let foreign = self.foreign.read().unwrap().clone();
        let simulated = e.backend_kind() == crate::protocol::BackendKind::Simulated;
        let mut jobs: HashMap<i64, Option<Job>> = HashMap::new();
        let mut out = vec![];
        for g in gpus {
            for (id, _, cid) in running.iter().filter(|(_, on, _)| on.contains(&g.index)) {
                let job = jobs.entry(*id).or_insert_with(|| e.reader().job(*id).ok().flatten());
                let mine: Vec<_> = g
                    .processes
                    .iter()
                    .filter(|p| p.container_id.is_some() && p.container_id == *cid)
                    .collect();
                // Known only when NVML lists the job's processes, each with its memory.
                let used_memory = if mine.is_empty() {
                    None
                } else {
                    mine.iter().try_fold(0, |acc, p| p.used_memory.map(|m| acc + m))
                };
                out.push(GpuUser {
                    gpu: g.index,
                    job_id: Some(*id),
                    job_name: job.as_ref().map(|j| j.name.clone()),
                    user: job.as_ref().map(|j| j.owner.clone()),
                    pid: None,
                    command: None,
                    container: None,
                    used_memory,
                    since: job.as_ref().and_then(|j| j.started_at),
                    idle_since: None,
                });
            }
            let ours = |c: &Option<String>| c.is_some() && running.iter().any(|(_, _, r)| r == c);
            let idle_since = e.idle_since(&g.uuid);
            for p in g.processes.iter().filter(|p| !ours(&p.container_id)) {
                out.push(GpuUser {
                    gpu: g.index,
                    job_id: None,
                    job_name: None,
                    user: p.uid.map(crate::access::user_name),
                    pid: Some(p.pid),
                    command: p.command.clone(),
                    container: p.container_id.as_ref().map(|c| {
                        names
                            .get(c)
                            .cloned()
                            .unwrap_or_else(|| c[..12.min(c.len())].to_string())
                    }),
                    used_memory: p.used_memory,
                    since: None,
                    idle_since,
                });
            }
            for f in foreign.iter().filter(|f| foreign_holds(&f.gpus, g, simulated)) {
                if !g
                    .processes
                    .iter()
                    .any(|p| p.container_id.as_deref() == Some(f.container_id.as_str()))
                {
                    out.push(GpuUser {
                        gpu: g.index,
                        job_id: None,
                        job_name: None,
                        user: None,
                        pid: None,
                        command: None,
                        container: Some(f.name.clone()),
                        used_memory: None,
                        since: None,
                        idle_since,
                    });
                }
            }
        }
        out
    }
}

/// Reject jobs this machine can never run: more GPUs, or bigger ones, than Gantry may use here.
pub(super) fn check_fits(e: &Engine, job: &ValidJob) -> Result<(), SpecError> {
    let gpus: Vec<GpuSample> = e
        .latest
        .read()
        .unwrap()
        .iter()
        .filter(|g| e.usable(g))
        .cloned()
        .collect();
    let filter = job.gpu_filter();
    if job.gpus > 0 && !filter.is_any() {
        let fit = gpus.iter().filter(|g| filter.eligible(&g.name, g.memory_total)).count();
        if fit < job.gpus as usize {
            let listed = gpus
                .iter()
                .map(|g| format!("GPU {} {} ({})", g.index, g.name, spec::format_bytes(g.memory_total)))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(SpecError::new(
                format!(
                    "the job asks for {}, this machine has {fit} such GPU{} for Gantry jobs: {listed}",
                    filter.describe(job.gpus),
                    if fit == 1 { "" } else { "s" }
                ),
                "change `gpu_type` (part of a name above, any case) or `min_gpu_memory`, or ask for fewer GPUs",
            ));
        }
    }
    if job.gpus as usize > gpus.len() {
        let kept = e.reserved_gpus();
        let why = if kept.is_empty() {
            String::new()
        } else {
            format!(
                " (GPU {} kept for interactive use{})",
                kept.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","),
                e.set_in("gpus")
            )
        };
        return Err(SpecError::new(
            format!(
                "the job asks for {} GPUs, this machine has {} for Gantry jobs{why}",
                job.gpus,
                gpus.len()
            ),
            format!("ask for at most {} GPUs", gpus.len()),
        ));
    }
    // CPUs and RAM this machine can never give: refused now, like GPUs, instead of waiting forever.
    let cap = e.machine.for_jobs(&e.policy().containers);
    never_fits_cpu_ram(
        job.limits.cpus_milli,
        job.limits.memory,
        cap,
        e.machine.total,
        &e.set_in("containers.reserve_cpus"),
    )?;
    // No job may hold so much CPU or RAM that the other GPUs cannot run (the per-GPU share is the
    // default and, for the other GPUs, kept free).
    e.policy()
        .containers
        .check_share(job, cap, gpus.len(), &|k| e.set_in(k))?;
    if let Some(m) = job.gpu_memory {
        let max = gpus.iter().map(|g| g.memory_total).max().unwrap_or(0);
        if m > max {
            return Err(SpecError::new(
                format!(
                    "the job asks for {} per GPU, the largest GPU here has {}",
                    spec::format_bytes(m),
                    spec::format_bytes(max)
                ),
                "lower `gpu_memory`, or leave it out to get whole GPUs",
            ));
        }
    }
    Ok(())
}

/// Does a container's GPU set include this device? Docker's indexes are NVML's, and a container
/// given a whole GPU holds its MIG instances too.
/// Does a container outside this engine hold `g`? On simulated GPUs only one naming `g`'s UUID does
/// (another engine of the same simulated machine): GPU indexes and `--gpus all` in someone's `docker
/// run` are the real machine's GPUs, not the simulation's.
fn foreign_holds(set: &crate::executor::GpuSet, g: &GpuSample, simulated: bool) -> bool {
    match simulated {
        true => set.holds_claim(None, &g.uuid),
        false => held_by(set, g),
    }
}

fn held_by(set: &crate::executor::GpuSet, g: &GpuSample) -> bool {
    match &g.mig_parent {
        Some(p) => set.holds(p.index, &g.uuid) || set.holds(p.index, &p.uuid),
        None => set.holds(g.index, &g.uuid),
    }
}

/// Measured memory that this engine's jobs do not use. Unknown (0: the scheduler then falls back to
/// the measured total) when one of our processes does not report its memory.
fn outside_used(g: &GpuSample, ours: &[String]) -> u64 {
    let mine = g
        .processes
        .iter()
        .filter(|p| p.container_id.as_ref().is_some_and(|c| ours.contains(c)));
    match mine.map(|p| p.used_memory).sum::<Option<u64>>() {
        Some(m) => g.memory_used.saturating_sub(m),
        None => 0,
    }
}

/// A job's `cpus`/`memory` beyond what this machine has for jobs (`cap`, of `total`): refused, saying
/// both figures ("1 CPU", never "1 CPUs"). `set_in` says where the lab's reserve is set.
fn never_fits_cpu_ram(
    cpus_milli: Option<u64>,
    memory: Option<u64>,
    cap: crate::scheduler::CpuRam,
    total: crate::scheduler::CpuRam,
    set_in: &str,
) -> Result<(), SpecError> {
    let reserve = format!(
        "the machine's {} and {}, less the lab's reserve for the OS and Docker{set_in}",
        units::cpus_count(total.cpus_milli),
        units::format_bytes(total.memory)
    );
    if let Some(c) = cpus_milli.filter(|c| *c > cap.cpus_milli) {
        return Err(SpecError::new(
            format!(
                "the job asks for {}, this machine has {} for jobs ({reserve})",
                units::cpus_count(c),
                units::format_cpus(cap.cpus_milli)
            ),
            format!("ask for at most `cpus: {}`", units::format_cpus(cap.cpus_milli)),
        ));
    }
    if let Some(m) = memory.filter(|m| *m > cap.memory) {
        return Err(SpecError::new(
            format!(
                "the job asks for {} of memory, this machine has {} for jobs ({reserve})",
                units::format_bytes(m),
                units::format_bytes(cap.memory)
            ),
            format!("ask for at most `memory: {}`", units::format_bytes(cap.memory)),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::CpuRam;

    /// Issue 22 leftover: the refusal counts CPUs as the rest of Gantry does ("1 CPU").
    #[test]
    fn cpu_counts_in_a_refusal_say_1_cpu() {
        const G: u64 = 1 << 30;
        let one = CpuRam {
            cpus_milli: 1000,
            memory: 2 * G,
        };
        let half = CpuRam {
            cpus_milli: 500,
            memory: G,
        };
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let table: [(Option<u64>, Option<u64>, CpuRam, CpuRam, Option<&str>); 4] = [
            (
                Some(1000),
                None,
                half,
                one,
                Some("the job asks for 1 CPU, this machine has 0.5 for jobs (the machine's 1 CPU and 2.0 GiB, less"),
            ),
            (
                Some(3000),
                None,
                one,
                CpuRam {
                    cpus_milli: 2000,
                    memory: 4 * G,
                },
                Some("the job asks for 3 CPUs, this machine has 1 for jobs (the machine's 2 CPUs and 4.0 GiB, less"),
            ),
            (
                None,
                Some(2 * G),
                half,
                one,
                Some("the job asks for 2.0 GiB of memory, this machine has 1.0 GiB for jobs (the machine's 1 CPU and"),
            ),
            (Some(500), Some(G), half, one, None),
        ];
        for (cpus, memory, cap, total, want) in table {
            let got = never_fits_cpu_ram(cpus, memory, cap, total, "")
                .err()
                .map(|e| e.message);
            match (want, &got) {
                (Some(w), Some(g)) => assert!(g.starts_with(w), "{g}"),
                (None, None) => {}
                _ => panic!("{cpus:?} {memory:?}: {got:?}"),
            }
        }
    }
}
