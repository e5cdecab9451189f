//! An in-memory executor for unit tests of the engine's retry, timeout, cancel and recovery logic
//! under `tokio::time::pause`. Containers "run" for a scripted time and exit with a scripted code.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{ExecError, Executor, Exit, Found, Frame, Launch, Life, Settled};

/// How a fake container behaves, chosen by job name.
#[derive(Debug, Clone)]
pub struct Script {
    pub runtime: Duration,
    pub code: i64,
    pub output: Vec<String>,
    /// On its checkpoint signal it saves for this long, then exits 0 (`None`: it ignores the
    /// signal and is killed at the end of the grace, code 137).
    pub checkpoint: Option<Duration>,
    /// `wait` panics (a bug in a monitor).
    pub panic_on_wait: bool,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            runtime: Duration::from_secs(1),
            code: 0,
            output: vec![],
            panic_on_wait: false,
            checkpoint: None,
        }
    }
}

struct Container {
    found: Found,
    script: Script,
    started: Option<Instant>,
    exit: Option<Exit>,
    stopped: Arc<Notify>,
}

#[derive(Default)]
pub struct FakeExecutor {
    scripts: Mutex<HashMap<String, Script>>,
    containers: Mutex<HashMap<String, Container>>,
    next: AtomicU64,
    pub down: AtomicBool,
    /// Every container ever started, by name (to assert "never ran twice").
    pub started: Mutex<Vec<String>>,
    /// Each container's environment as created, by name.
    pub envs: Mutex<Vec<(String, Vec<String>)>>,
    /// Every checkpoint signal sent: (container name, signal, grace).
    pub signals: Mutex<Vec<(String, String, Duration)>>,
    self_ref: Mutex<Option<std::sync::Weak<FakeExecutor>>>,
}

impl FakeExecutor {
    pub fn new() -> Arc<FakeExecutor> {
        let f = Arc::new(FakeExecutor::default());
        *f.self_ref.lock().unwrap() = Some(Arc::downgrade(&f));
        f
    }
    pub fn script(&self, job_name: &str, s: Script) {
        self.scripts.lock().unwrap().insert(job_name.into(), s);
    }
    pub fn live(&self) -> usize {
        self.containers.lock().unwrap().len()
    }
    fn up(&self) -> Result<(), ExecError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(ExecError::DockerUnavailable("fake Docker is down".into()));
        }
        Ok(())
    }
    /// A started container whose scripted runtime has passed has exited.
    fn age(c: &mut Container) {
        if let (None, Some(t)) = (c.exit, c.started) {
            if t.elapsed() >= c.script.runtime {
                c.exit = Some(Exit {
                    code: c.script.code,
                    oom_killed: false,
                });
                c.found.life = Life::Exited;
            }
        }
    }
}

#[async_trait::async_trait]
impl Executor for FakeExecutor {
    async fn ping(&self) -> Result<(), ExecError> {
        self.up()
    }
    async fn has_image(&self, _image: &str) -> Result<bool, ExecError> {
        self.up().map(|()| true)
    }
    async fn pull(&self, _image: &str) -> Result<(), ExecError> {
        self.up()
    }
    async fn create(&self, l: &Launch<'_>) -> Result<String, ExecError> {
        self.up()?;
        let id = format!("fake{:08}", self.next.fetch_add(1, Ordering::SeqCst));
        let script = self
            .scripts
            .lock()
            .unwrap()
            .get(&l.job.name)
            .cloned()
            .unwrap_or_default();
        self.envs.lock().unwrap().push((l.job.name.clone(), super::job_env(l)));
        let found = Found {
            container_id: id.clone(),
            name: l.name.clone(),
            job_id: l.job_id,
            attempt_id: l.attempt_id,
            db_uid: Some(l.db_uid.into()),
            gpus: l.gpus.clone(),
            // As Docker lists a created container: a start may be in flight.
            life: Life::Unsettled,
        };
        self.containers.lock().unwrap().insert(
            id.clone(),
            Container {
                found,
                script,
                started: None,
                exit: None,
                stopped: Arc::new(Notify::new()),
            },
        );
        Ok(id)
    }
    async fn start(&self, id: &str) -> Result<(), ExecError> {
        self.up()?;
        let mut cs = self.containers.lock().unwrap();
        let c = cs.get_mut(id).ok_or_else(|| ExecError::NotFound(id.into()))?;
        c.started = Some(Instant::now());
        c.found.life = Life::Running;
        self.started.lock().unwrap().push(c.found.name.clone());
        Ok(())
    }
    async fn wait(&self, id: &str) -> Result<Exit, ExecError> {
        loop {
            self.up()?;
            let (left, stopped, panic) = {
                let mut cs = self.containers.lock().unwrap();
                let c = cs.get_mut(id).ok_or_else(|| ExecError::NotFound(id.into()))?;
                Self::age(c);
                if let Some(x) = c.exit {
                    return Ok(x);
                }
                let t = c.started.unwrap_or_else(Instant::now);
                (
                    c.script.runtime.saturating_sub(t.elapsed()),
                    c.stopped.clone(),
                    c.script.panic_on_wait,
                )
            };
            assert!(!panic, "scripted panic in wait");
            tokio::select! {
                _ = tokio::time::sleep(left) => {}
                _ = stopped.notified() => {}
            }
        }
    }
    async fn exit_of(&self, id: &str) -> Result<Option<Exit>, ExecError> {
        self.up()?;
        let mut cs = self.containers.lock().unwrap();
        let c = cs.get_mut(id).ok_or_else(|| ExecError::NotFound(id.into()))?;
        Self::age(c);
        Ok(c.exit)
    }
    async fn stop(&self, id: &str, _grace: Duration) -> Result<(), ExecError> {
        self.up()?;
        let mut cs = self.containers.lock().unwrap();
        let c = cs.get_mut(id).ok_or_else(|| ExecError::NotFound(id.into()))?;
        Self::age(c);
        if c.exit.is_none() {
            c.exit = Some(Exit {
                code: 143,
                oom_killed: false,
            });
            c.found.life = Life::Exited;
        }
        c.stopped.notify_waiters();
        Ok(())
    }
    async fn stop_signal(&self, id: &str, signal: &str, grace: Duration) -> Result<(), ExecError> {
        self.up()?;
        let (after, code, stopped) = {
            let mut cs = self.containers.lock().unwrap();
            let c = cs.get_mut(id).ok_or_else(|| ExecError::NotFound(id.into()))?;
            Self::age(c);
            if c.exit.is_some() {
                return Ok(());
            }
            self.signals
                .lock()
                .unwrap()
                .push((c.found.name.clone(), signal.to_string(), grace));
            match c.script.checkpoint.filter(|t| *t < grace) {
                Some(t) => (t, 0, c.stopped.clone()),
                None => (grace, 137, c.stopped.clone()),
            }
        };
        // It exits on its own time; the call returns at once (so an engine can be stopped meanwhile,
        // as a killed one would be).
        let id = id.to_string();
        let me = self.self_ref.lock().unwrap().clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(me) = me.and_then(|w| w.upgrade()) {
                if let Some(c) = me.containers.lock().unwrap().get_mut(&id) {
                    if c.exit.is_none() {
                        c.exit = Some(Exit {
                            code,
                            oom_killed: false,
                        });
                        c.found.life = Life::Exited;
                    }
                }
            }
            stopped.notify_waiters();
        });
        Ok(())
    }
    async fn remove(&self, id: &str) -> Result<(), ExecError> {
        self.up()?;
        if let Some(c) = self.containers.lock().unwrap().remove(id) {
            c.stopped.notify_waiters();
        }
        Ok(())
    }
    async fn list_ours(&self, _engine_id: &str) -> Result<Vec<Found>, ExecError> {
        self.up()?;
        let mut cs = self.containers.lock().unwrap();
        Ok(cs
            .values_mut()
            .map(|c| {
                Self::age(c);
                c.found.clone()
            })
            .collect())
    }
    async fn settle(&self, id: &str) -> Result<Option<Settled>, ExecError> {
        self.up()?;
        let mut cs = self.containers.lock().unwrap();
        Ok(cs.get_mut(id).map(|c| {
            Self::age(c);
            match (c.started, c.exit) {
                (None, _) => Settled::NeverStarted,
                (Some(_), None) => Settled::Running,
                (Some(_), Some(_)) => Settled::Ended,
            }
        }))
    }
    async fn foreign_gpu_users(&self, _engine_id: &str) -> Result<Vec<super::ForeignGpuUse>, ExecError> {
        self.up()?;
        Ok(vec![])
    }
    async fn gpu_taken(
        &self,
        _id: &str,
        _engine_id: &str,
        _gpus: &[(Option<u32>, String)],
    ) -> Result<Option<String>, ExecError> {
        self.up()?;
        Ok(None)
    }
    fn logs(&self, id: &str, _since_s: i64, _follow: bool) -> BoxStream<'static, Result<Frame, ExecError>> {
        let lines: Vec<Result<Frame, ExecError>> = match self.containers.lock().unwrap().get(id) {
            Some(c) => c
                .script
                .output
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    Ok(Frame::stdout(Bytes::from(format!(
                        "2026-01-01T00:00:{:02}.000000001Z {l}\n",
                        i % 60
                    ))))
                })
                .collect(),
            None => vec![],
        };
        futures_util::stream::iter(lines).boxed()
    }
}
