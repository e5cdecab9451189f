//! GPU bookings on the wire (`gantry book`, `gantry bookings`, `gantry book cancel`, the app's
//! bookings timeline). Pure data: imports nothing of the crate.
//!
//! A booking holds `gpus` GPUs (of `gpu_type`, when given) for its owner from `start_ms` to `end_ms`.
//! Everyone sees every booking's owner and time (so they can plan around it); the note is the
//! owner's (and root's) only, like a job's spec.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// Where a booking is in its life. Only `Booked` and `Active` hold GPUs; the others are history
/// (a booking is never deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum BookingState {
    /// Its start is ahead.
    Booked,
    /// Between its start and its end: its GPUs are its owner's.
    Active,
    /// Its end passed.
    Ended,
    /// Cancelled by its owner or root.
    Cancelled,
    /// Unused for the lab's `release_after` after its start (a no-show): its GPUs went back to everyone.
    Released,
}

impl BookingState {
    pub const ALL: [BookingState; 5] = [
        BookingState::Booked,
        BookingState::Active,
        BookingState::Ended,
        BookingState::Cancelled,
        BookingState::Released,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            BookingState::Booked => "booked",
            BookingState::Active => "active",
            BookingState::Ended => "ended",
            BookingState::Cancelled => "cancelled",
            BookingState::Released => "released",
        }
    }
    pub fn parse(s: &str) -> Option<BookingState> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }
    /// Whether it still holds (or will hold) GPUs.
    pub fn is_open(self) -> bool {
        matches!(self, BookingState::Booked | BookingState::Active)
    }
}

/// `POST /v1/bookings` ([`super::routes::BOOKINGS`]): book GPUs for the caller. Times are ms since
/// the epoch (the CLI reads `--at` in the caller's local time); both must lie on the lab's slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct BookRequest {
    pub gpus: u32,
    /// Only GPUs whose name contains this (e.g. `A100`), as a job's `gpu_type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub gpu_type: Option<String>,
    pub start_ms: i64,
    pub end_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub note: Option<String>,
}

/// One booking as the caller may see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct BookingView {
    pub id: i64,
    pub owner: String,
    pub uid: u32,
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub gpu_type: Option<String>,
    pub start_ms: i64,
    pub end_ms: i64,
    pub state: BookingState,
    /// The owner's note: `None` for someone else's booking (unless the caller is root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub note: Option<String>,
    /// Whether the caller owns it.
    pub mine: bool,
    pub created_ms: i64,
    /// When it was cancelled, released or ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub closed_ms: Option<i64>,
    /// Why it closed early ("released: unused for 30 min after its start", "cancelled by root").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub closed_why: Option<String>,
    /// While active: the GPUs (indices) it holds now.
    #[serde(default)]
    pub gpu_indices: Vec<u32>,
    /// While active: non-preemptible jobs still on the GPUs it needs (it gets them as they end).
    #[serde(default)]
    pub waiting_for: Vec<i64>,
}

/// `GET /v1/bookings` ([`super::routes::BOOKINGS`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct BookingsQuery {
    /// Also the ones that ended, were cancelled or released (newest first, at most `limit`).
    #[serde(default)]
    pub all: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub limit: Option<u32>,
}

/// The lab's `[bookings]` rules, so clients can check (and draw) before asking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct BookingRules {
    pub enabled: bool,
    /// Starts and lengths are multiples of this (ms), counted from midnight UTC.
    pub slot_ms: i64,
    /// How far ahead a booking may start (ms from now).
    pub max_ahead_ms: i64,
    /// The longest a booking may be (ms; 0 from an engine older than this field).
    #[serde(default)]
    pub max_length_ms: i64,
    /// GPU-hours one user may have booked in a week (Monday 00:00 UTC to the next, by start);
    /// `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub max_gpu_hours_week: Option<u32>,
    /// The most GPUs one booking may hold.
    pub max_gpus: u32,
    /// A booking none of its owner's jobs or sessions use this long after its start is released (ms).
    pub release_after_ms: i64,
}

/// `GET /v1/bookings`: the bookings and the rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct Bookings {
    pub now_ms: i64,
    pub rules: BookingRules,
    /// Open ones by start (and, with `all`, closed ones after them, newest first).
    pub bookings: Vec<BookingView>,
}
