//! CPU and RAM for the scheduler, and each job's container settings, from the lab's `[containers]`.

use super::Engine;
use crate::policy::Policy;
use crate::scheduler::CpuRam;

impl Engine {
    /// CPU and RAM the machine has for jobs under `p` (the machine less the lab's reserve).
    pub(super) fn host_capacity(&self, p: &Policy) -> CpuRam {
        self.machine.for_jobs(&p.containers)
    }

    /// The CPU and RAM a job is limited to and counted for (see [`crate::resources::Containers::needs`]).
    pub(super) fn job_needs(&self, p: &Policy, gpus: u32, cpus_milli: Option<u64>, memory: Option<u64>) -> CpuRam {
        let gpu_count = self.latest.read().unwrap().iter().filter(|g| self.usable(g)).count();
        p.containers.needs(gpus, cpus_milli, memory, self.host_capacity(p), gpu_count)
    }

    /// The owner's home folder (their passwd entry), where a job's HOME goes.
    pub(super) fn home_of(uid: u32) -> Option<String> {
        nix::unistd::User::from_uid(uid.into()).ok().flatten().map(|u| u.dir.to_string_lossy().into_owned())
    }
}
