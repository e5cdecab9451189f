//! The engine's "now": every timestamp, deadline, backoff and estimate the engine computes reads one
//! [`Clock`]. Production reads the wall clock; the engine's tests read [`TokioClock`], which follows
//! tokio's clock, so under `tokio::time::pause` the engine's "now" moves exactly as far as tokio's
//! timers do. Imports nothing of the crate.

use std::sync::Arc;

pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The wall clock (what gets stored and shown).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// The wall-clock time it was made at, moved on by tokio's clock since: under paused time it stands
/// still until tokio's timers move it on (auto-advance included).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    wall_ms: i64,
    at: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> TokioClock {
        TokioClock {
            wall_ms: now_ms(),
            at: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        self.wall_ms
            + tokio::time::Instant::now()
                .saturating_duration_since(self.at)
                .as_millis() as i64
    }
}

pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// The wall clock now, in ms since the epoch (what is stored and shown; the engine reads its [`Clock`]).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_moves_with_paused_time() {
        let c = TokioClock::new();
        let t0 = c.now_ms();
        tokio::time::sleep(std::time::Duration::from_secs(90)).await;
        assert_eq!(c.now_ms() - t0, 90_000);
    }
}
