//! The `[results]`, `[bookings]` and `[sessions]` sections.

use super::*;

impl Check<'_> {
    /// `[results]`: the bounds on each job's metrics.
    pub(super) fn results(&mut self, raw: &RawResults) -> crate::store::ResultsLimits {
        let mut r = crate::store::ResultsLimits::default();
        if let Some(n) = self.count("max_points", &raw.max_points, 1_000_000) {
            r.max_points = (n as u32).max(16);
        }
        if let Some(n) = self.count("max_series", &raw.max_series, 100_000) {
            r.max_series = n as u32;
        }
        if let Some(n) = self.count("max_name_len", &raw.max_name_len, 4096) {
            r.max_name_len = n as u32;
        }
        if let Some(v) = &raw.max_bytes_per_job {
            match crate::units::parse_bytes(v.get_ref()) {
                Some(b) if b >= 4096 => r.max_bytes = b,
                _ => self.fail(
                    v.span(),
                    format!(
                        "results `max_bytes_per_job` = {:?} is not a size of at least 4 KiB",
                        v.get_ref()
                    ),
                    "write e.g. \"256MiB\" or \"1GiB\" (bytes of metric and event files read per job)",
                ),
            }
        }
        r
    }

    pub(super) fn bookings(&mut self, raw: &RawBookings) -> super::Bookings {
        let mut b = super::Bookings::default();
        if let Some(e) = &raw.enabled {
            b.enabled = *e.get_ref();
        }
        // 0 turns the weekly limit off (the built-in default is a limit: a fresh machine is bounded).
        if raw.max_gpu_hours_per_week.as_ref().is_some_and(|v| *v.get_ref() == 0) {
            b.max_gpu_hours_per_week = None;
        } else if let Some(n) = self.count("max_gpu_hours_per_week", &raw.max_gpu_hours_per_week, 100_000) {
            b.max_gpu_hours_per_week = Some(n as u32);
        }
        b.max_gpus = self.count("max_gpus", &raw.max_gpus, 1024).map(|n| n as u32);
        let year = Duration::from_secs(366 * 24 * 3600);
        let day = Duration::from_secs(24 * 3600);
        if let Some(d) = self.duration("max_ahead", &raw.max_ahead, year) {
            b.max_ahead = d;
        }
        if let Some(d) = self.duration("release_after", &raw.release_after, day) {
            b.release_after = d;
        }
        let month = Duration::from_secs(31 * 24 * 3600);
        if let Some(d) = self.duration("max_length", &raw.max_length, month) {
            b.max_length = d;
        }
        if let (Some(v), Some(d)) = (&raw.slot, self.duration("slot", &raw.slot, day)) {
            let secs = d.as_secs();
            if d.subsec_nanos() != 0 || secs % 60 != 0 || (24 * 3600) % secs != 0 {
                self.fail(
                    v.span(),
                    format!(
                        "bookings `slot` = {:?} is not a whole number of minutes that divides a day",
                        v.get_ref()
                    ),
                    "use e.g. \"15m\", \"30m\", \"1h\" or \"2h\"",
                );
            } else {
                b.slot = d;
            }
        }
        b
    }

    pub(super) fn sessions(&mut self, raw: &RawSessions) -> Sessions {
        let mut s = Sessions::default();
        // 0 turns the limit off (the built-in default is a limit: a session jumps the queue).
        if raw.max_gpus.as_ref().is_some_and(|v| *v.get_ref() == 0) {
            s.max_gpus = None;
        } else if let Some(n) = self.count("max_gpus", &raw.max_gpus, 1024) {
            s.max_gpus = Some(n as u32);
        }
        let week = Duration::from_secs(7 * 24 * 3600);
        if let Some(d) = self.duration("max_length", &raw.max_length, week) {
            s.max_length = d;
        }
        if let Some(d) = self.duration("default_length", &raw.default_length, week) {
            s.default_length = d;
        }
        if s.default_length > s.max_length {
            let at = raw
                .default_length
                .as_ref()
                .or(raw.max_length.as_ref())
                .map(|v| v.span())
                .unwrap_or(0..0);
            self.fail(
                at,
                format!(
                    "sessions `default_length` ({}) is longer than `max_length` ({})",
                    human(s.default_length),
                    human(s.max_length)
                ),
                "lower `default_length` or raise `max_length`",
            );
        }
        if let Some(b) = &raw.before_batch {
            s.before_batch = *b.get_ref();
        }
        if let Some(i) = &raw.notebook_image {
            let name = i.get_ref().trim();
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                self.fail(
                    i.span(),
                    format!("sessions `notebook_image` = {:?} is not an image name", i.get_ref()),
                    "write an image with `jupyter lab` in it, e.g. \"quay.io/jupyter/pytorch-notebook:cuda12-latest\"",
                );
            } else {
                s.notebook_image = Some(name.to_string());
            }
        }
        if let Some(v) = &raw.idle_after {
            if v.get_ref().trim() == "none" {
                s.idle_after = None;
            } else if let Some(d) = self.duration("idle_after", &raw.idle_after, week) {
                s.idle_after = Some(d);
            }
        }
        if let Some(b) = &raw.idle_batch {
            s.idle_batch = *b.get_ref();
        }
        if let Some(v) = &raw.keep_free {
            if *v.get_ref() == 0 {
                s.keep_free = 0;
            } else if let Some(n) = self.count("keep_free", &raw.keep_free, 1024) {
                s.keep_free = n as u32;
            }
        }
        if let Some(v) = &raw.forward_port {
            match u16::try_from(*v.get_ref()) {
                Ok(p) if (1..1024).contains(&p) => s.forward_port = p,
                _ => self.fail(
                    v.span(),
                    format!("sessions `forward_port` = {} is not a port below 1024", v.get_ref()),
                    "only root may bind a port below 1024, so no other user can answer a forward's URL: use one \
                     no service here listens on, e.g. 1021",
                ),
            }
        }
        s
    }
}
