//! Images are pulled before a job is placed: a queued job whose image is missing waits as "pulling
//! IMAGE" and holds no GPU; one pull per image, stopped when no queued job needs it any more (they
//! were cancelled) or after the lab's `[images] pull_timeout`; a pull that fails fails its jobs with
//! Docker's reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::engine::Engine;
use crate::executor::Executor;
use crate::protocol::JobState;

/// An image found on this machine is looked at again after this long (ms): it may have been removed.
const PRESENT_FOR_MS: i64 = 30_000;

enum Pull {
    Present { at: i64 },
    Pulling { cancel: CancellationToken, n: u64 },
    Failed(String),
}

#[derive(Default)]
pub(super) struct Pulls {
    images: Arc<Mutex<HashMap<String, Pull>>>,
    /// Numbers each pull, so a pull that ends never overwrites a later pull's entry.
    next: std::sync::atomic::AtomicU64,
}

impl Pulls {
    /// Every pull stops (nothing is queued).
    pub fn stop_all(&self) {
        for (image, p) in self.images.lock().unwrap().drain() {
            if let Pull::Pulling { cancel, .. } = p {
                info!("pull of {image} stopped: no queued job needs it any more");
                cancel.cancel();
            }
        }
    }

    /// Before a pass: start the pulls queued jobs need, stop the ones no job needs, fail the jobs of
    /// a failed pull (or of an image the lab no longer allows). Returns the jobs that wait for a
    /// pull, with their reason.
    pub async fn before_pass(&self, e: &Arc<Engine>, exec: &Arc<dyn Executor>) -> Vec<(i64, String)> {
        let rows = e.queue.lock().unwrap().rows();
        let mut wanted: HashMap<String, Vec<i64>> = HashMap::new();
        // `image: host` is made on this machine at launch (`Executor::ensure_host_root`), never pulled.
        for r in rows.iter().filter(|r| r.image != crate::spec::HOST_IMAGE) {
            wanted.entry(r.image.clone()).or_default().push(r.id);
        }
        {
            let mut map = self.images.lock().unwrap();
            map.retain(|image, p| match p {
                Pull::Pulling { cancel, .. } if !wanted.contains_key(image) => {
                    info!("pull of {image} stopped: no queued job needs it any more (cancelled)");
                    cancel.cancel();
                    false
                }
                Pull::Present { .. } | Pull::Failed(_) => wanted.contains_key(image),
                _ => true,
            });
        }
        let policy = e.policy();
        let mut waiting = vec![];
        let mut fail: Vec<(i64, String)> = vec![];
        for (image, ids) in wanted {
            if let Err(why) = policy.images.check(&image, &|k| e.set_in(k)) {
                fail.extend(
                    ids.iter()
                        .map(|id| (*id, format!("{why} (the lab config changed since it was queued)"))),
                );
                continue;
            }
            let now = e.now();
            let known = {
                let mut map = self.images.lock().unwrap();
                match map.get(&image) {
                    Some(Pull::Present { at }) if now - at < PRESENT_FOR_MS => continue,
                    Some(Pull::Pulling { .. }) => Some(pulling(&image)),
                    Some(Pull::Failed(why)) => {
                        let why = why.clone();
                        map.remove(&image);
                        fail.extend(ids.iter().map(|id| (*id, why.clone())));
                        continue;
                    }
                    _ => None,
                }
            };
            if let Some(reason) = known {
                waiting.extend(ids.iter().map(|id| (*id, reason.clone())));
                continue;
            }
            match exec.has_image(&image).await {
                Ok(true) => {
                    self.images.lock().unwrap().insert(image, Pull::Present { at: now });
                }
                Ok(false) => {
                    waiting.extend(ids.iter().map(|id| (*id, pulling(&image))));
                    self.start(
                        e,
                        exec,
                        &image,
                        policy.images.pull_timeout,
                        e.set_in("images.pull_timeout"),
                    );
                }
                // Docker away: the pass says so (every job's reason).
                Err(err) => warn!("cannot look for image {image}: {err}"),
            }
        }
        for (id, why) in fail {
            match e.store().fail_queued(id, &why) {
                Ok(true) => {
                    crate::engine::append_log(&e.log_of(id), &why);
                    e.notify_job(id, JobState::Failed)
                }
                Ok(false) => {}
                Err(err) => e.store_failed(&format!("failing job {id}"), &err),
            }
        }
        waiting
    }

    fn start(
        &self,
        e: &Arc<Engine>,
        exec: &Arc<dyn Executor>,
        image: &str,
        timeout: std::time::Duration,
        set_in: String,
    ) {
        let cancel = CancellationToken::new();
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.images.lock().unwrap().insert(
            image.to_string(),
            Pull::Pulling {
                cancel: cancel.clone(),
                n,
            },
        );
        info!("pulling {image} before placing the jobs that need it");
        let (images, exec, e2, image) = (self.images.clone(), exec.clone(), e.clone(), image.to_string());
        e.tasks.spawn(async move {
            let ended = tokio::select! {
                _ = cancel.cancelled() => None,
                _ = e2.shutdown.cancelled() => None,
                r = tokio::time::timeout(timeout, exec.pull(&image)) => Some(r),
            };
            let next = match ended {
                None => return, // stopped: its entry is gone already
                Some(Ok(Ok(()))) => {
                    info!("pulled {image}");
                    Pull::Present { at: e2.now() }
                }
                Some(Ok(Err(err))) => {
                    warn!("pull of {image} failed: {err}");
                    Pull::Failed(err.to_string())
                }
                Some(Err(_)) => {
                    let t = crate::units::duration_setting(timeout);
                    warn!("pull of {image} stopped after {t}");
                    Pull::Failed(format!("image {image:?} was not pulled within {t}, the lab's pull timeout{set_in}; the pull was stopped. Check the registry, or load the image locally (`docker load`)"))
                }
            };
            let mut map = images.lock().unwrap();
            // Only if it is still this pull's entry (not stopped and started again meanwhile).
            if matches!(map.get(&image), Some(Pull::Pulling { n: m, .. }) if *m == n) {
                map.insert(image, next);
            }
            drop(map);
            e2.wake.notify_one();
        });
    }
}

/// Why a job waits for its image.
fn pulling(image: &str) -> String {
    format!("pulling {image}; the job holds no GPU meanwhile")
}
