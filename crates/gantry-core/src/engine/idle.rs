//! Idle sessions given back (`[sessions] idle_after`): a running session whose GPUs have all sat at
//! 0 % utilization (the sampler's NVML samples) for `idle_after` is warned (its log, a
//! `session_idle` notification, an event in its history), then ended `idle_after / 4` later unless
//! its GPUs were used meanwhile. Batch jobs too when the lab sets `[sessions] idle_batch`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::joblog::append_log;
use super::Engine;
use crate::gpu::GpuSample;
use crate::protocol::notify::NotifyEvent;

/// What the idle watch knows of one running job: since when its GPUs are idle, when it was warned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdleMark {
    pub idle_since: Option<i64>,
    pub warned_at: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStep {
    Nothing,
    Warn,
    End,
}

/// One sample's decision: `idle` is whether all the job's GPUs are at 0 % now.
pub fn idle_step(mark: &mut IdleMark, idle: bool, now: i64, idle_after: Duration) -> IdleStep {
    if !idle {
        *mark = IdleMark::default();
        return IdleStep::Nothing;
    }
    let since = *mark.idle_since.get_or_insert(now);
    let after = idle_after.as_millis() as i64;
    match mark.warned_at {
        None if now - since >= after => {
            mark.warned_at = Some(now);
            IdleStep::Warn
        }
        Some(w) if now - w >= after / 4 => IdleStep::End,
        _ => IdleStep::Nothing,
    }
}

impl Engine {
    /// After each GPU sample: warn and end the running jobs whose GPUs are idle.
    pub(super) fn watch_idle(self: &Arc<Self>, samples: &[GpuSample], marks: &mut HashMap<i64, IdleMark>) {
        let policy = self.policy();
        let Some(after) = policy.sessions.idle_after else {
            marks.clear();
            return;
        };
        let now = self.now();
        let util: HashMap<u32, u32> = samples.iter().map(|g| (g.index, g.utilization)).collect();
        let jobs: Vec<(i64, Vec<u32>)> = self
            .running
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, h)| h.run.is_some() && !h.gpus.is_empty())
            .map(|(id, h)| (*id, h.gpus.clone()))
            .collect();
        marks.retain(|id, _| jobs.iter().any(|j| j.0 == *id));
        for (id, gpus) in jobs {
            // A GPU without a sample is not known to be idle.
            let idle = gpus.iter().all(|g| util.get(g) == Some(&0));
            let mark = marks.entry(id).or_default();
            let step = idle_step(mark, idle, now, after);
            if step == IdleStep::Nothing {
                continue;
            }
            let job = match self.reader().job(id) {
                Ok(Some(j)) => j,
                Ok(None) => continue,
                Err(e) => {
                    warn!(job = id, "cannot read job for the idle watch: {e}");
                    continue;
                }
            };
            if !job.job.spec.interactive && !policy.sessions.idle_batch {
                continue;
            }
            let what = if job.job.spec.interactive { "session" } else { "job" };
            let idle_for = crate::units::duration_setting(after);
            match step {
                IdleStep::Warn => {
                    let text = format!(
                        "{what} {id}: its GPUs have been idle for {idle_for}; it ends in {} unless they are used ([sessions] idle_after)",
                        crate::units::duration_setting(after / 4)
                    );
                    info!(job = id, "{text}");
                    append_log(&self.log_of(id), &text);
                    // No terminal attached: nobody to tell there (the log and notification remain).
                    let _ = self.session_notices.send((id, text.clone()));
                    let noted = self.store().note_event(id, &text);
                    if let Err(e) = noted {
                        self.store_failed(&format!("recording job {id}'s idle warning"), &e);
                    }
                    let recorded = self.store().notify_record(
                        NotifyEvent::SessionIdle,
                        Some(id),
                        Some(job.owner_uid),
                        Some(&text),
                    );
                    if let Err(e) = recorded {
                        self.store_failed(&format!("recording job {id}'s idle notification"), &e);
                    }
                }
                IdleStep::End => {
                    let text = format!("ended: its GPUs were idle for {idle_for} ([sessions] idle_after)");
                    info!(job = id, "{what} {id} {text}");
                    append_log(&self.log_of(id), &text);
                    // One store lock at a time (a guard in one expression lives to its end).
                    let noted = self.store().note_event(id, &text);
                    let recorded = match noted {
                        Ok(()) => self.store().request_cancel(id).map(|_| ()),
                        Err(e) => Err(e),
                    };
                    match recorded {
                        Ok(_) => {
                            if let Some(h) = self.running.lock().unwrap().get(&id) {
                                h.cancel.cancel();
                            }
                            marks.remove(&id);
                        }
                        Err(e) => self.store_failed(&format!("ending idle job {id}"), &e),
                    }
                }
                IdleStep::Nothing => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_gpus_warn_then_end_unless_used_meanwhile() {
        let after = Duration::from_secs(40);
        // (utilization is 0, now in s, the step wanted)
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(&str, Vec<(bool, i64, IdleStep)>)> = vec![
            (
                "idle throughout: warned at 40 s, ended 10 s later",
                vec![
                    (true, 0, IdleStep::Nothing),
                    (true, 39, IdleStep::Nothing),
                    (true, 40, IdleStep::Warn),
                    (true, 45, IdleStep::Nothing),
                    (true, 50, IdleStep::End),
                ],
            ),
            (
                "busy: never",
                vec![
                    (false, 0, IdleStep::Nothing),
                    (false, 100, IdleStep::Nothing),
                    (false, 1000, IdleStep::Nothing),
                ],
            ),
            (
                "used after the warning: the count starts again",
                vec![
                    (true, 0, IdleStep::Nothing),
                    (true, 40, IdleStep::Warn),
                    (false, 45, IdleStep::Nothing),
                    (true, 46, IdleStep::Nothing),
                    (true, 60, IdleStep::Nothing),
                    (true, 86, IdleStep::Warn),
                    (true, 96, IdleStep::End),
                ],
            ),
            (
                "used before the warning",
                vec![
                    (true, 0, IdleStep::Nothing),
                    (true, 30, IdleStep::Nothing),
                    (false, 31, IdleStep::Nothing),
                    (true, 60, IdleStep::Nothing),
                    (true, 99, IdleStep::Nothing),
                    (true, 100, IdleStep::Warn),
                ],
            ),
        ];
        for (name, steps) in rows {
            let mut mark = IdleMark::default();
            for (idle, at, want) in steps {
                assert_eq!(idle_step(&mut mark, idle, at * 1000, after), want, "{name} at {at} s");
            }
        }
    }
}
