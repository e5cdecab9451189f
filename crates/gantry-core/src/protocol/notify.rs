//! Notifications on the wire: the events a user (or the lab) can be told about, subscriptions
//! (`gantry notify add|ls|rm`), the delivery log (`gantry notify log`) and the webhook body. Pure
//! data: imports nothing of the crate (the job spec's `notify:` names [`NotifyEvent`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// What a notification is about. New kinds go at the end of [`NotifyEvent::ALL`]; each has a
/// stable snake_case name (the spec's `notify:`, `--on`, the webhook's `event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// A job's attempt began running.
    Started,
    /// A job succeeded.
    Finished,
    /// A job failed (after its last retry).
    Failed,
    /// A job passed its `timeout` and was stopped.
    TimedOut,
    /// A job was cancelled.
    Cancelled,
    /// A job was stopped to make room for another (it is queued again).
    Preempted,
    /// An interactive session has been idle and will be stopped soon.
    SessionIdle,
    /// A GPU booking is about to start.
    BookingStarting,
    /// The engine cannot write its state database (lab webhooks only).
    StoreProblem,
    /// `gantry notify test`.
    Test,
    /// A GPU booking was released: none of its owner's jobs or sessions used it in time (`[bookings] release_after`).
    BookingReleased,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 11] = [
        NotifyEvent::Started,
        NotifyEvent::Finished,
        NotifyEvent::Failed,
        NotifyEvent::TimedOut,
        NotifyEvent::Cancelled,
        NotifyEvent::Preempted,
        NotifyEvent::SessionIdle,
        NotifyEvent::BookingStarting,
        NotifyEvent::StoreProblem,
        NotifyEvent::Test,
        NotifyEvent::BookingReleased,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Started => "started",
            NotifyEvent::Finished => "finished",
            NotifyEvent::Failed => "failed",
            NotifyEvent::TimedOut => "timed_out",
            NotifyEvent::Cancelled => "cancelled",
            NotifyEvent::Preempted => "preempted",
            NotifyEvent::SessionIdle => "session_idle",
            NotifyEvent::BookingStarting => "booking_starting",
            NotifyEvent::StoreProblem => "store_problem",
            NotifyEvent::Test => "test",
            NotifyEvent::BookingReleased => "booking_released",
        }
    }

    pub fn parse(s: &str) -> Option<NotifyEvent> {
        Self::ALL.into_iter().find(|e| e.as_str() == s)
    }

    /// The names, for error messages.
    pub fn names() -> String {
        Self::ALL.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// Whether this is about one job (and so goes to its owner).
    pub fn is_job_event(self) -> bool {
        matches!(
            self,
            NotifyEvent::Started
                | NotifyEvent::Finished
                | NotifyEvent::Failed
                | NotifyEvent::TimedOut
                | NotifyEvent::Cancelled
                | NotifyEvent::Preempted
        )
    }

    /// What a user subscribes to when `--on` is not given.
    pub const DEFAULT_ON: [NotifyEvent; 3] = [NotifyEvent::Finished, NotifyEvent::Failed, NotifyEvent::TimedOut];
}

/// Where a notification goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NotifyTarget {
    Email {
        address: String,
    },
    /// `http://` or `https://`, to a host the lab allows (`[notify] webhook_hosts`).
    Webhook {
        url: String,
    },
}

impl NotifyTarget {
    pub fn kind(&self) -> &'static str {
        match self {
            NotifyTarget::Email { .. } => "email",
            NotifyTarget::Webhook { .. } => "webhook",
        }
    }
    pub fn address(&self) -> &str {
        match self {
            NotifyTarget::Email { address } => address,
            NotifyTarget::Webhook { url } => url,
        }
    }
}

/// `POST /v1/notify`: subscribe the caller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct NotifyAdd {
    pub target: NotifyTarget,
    /// Empty: [`NotifyEvent::DEFAULT_ON`].
    #[serde(default)]
    pub on: Vec<NotifyEvent>,
    /// Only this job (which must be the caller's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<i64>,
}

/// One subscription. `owner` is `None` for the lab's own webhooks (`[notify] webhooks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct Subscription {
    pub id: i64,
    pub owner: Option<String>,
    pub target: NotifyTarget,
    pub on: Vec<NotifyEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<i64>,
    pub created_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not sent yet, or to be tried again at `next_at`.
    Pending,
    Delivered,
    /// Given up after the lab's `max_tries`.
    Failed,
    /// Never sent: too many of the user's notifications were waiting (`[notify] max_pending`).
    Dropped,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
            DeliveryState::Dropped => "dropped",
        }
    }
    pub fn parse(s: &str) -> Option<DeliveryState> {
        [Self::Pending, Self::Delivered, Self::Failed, Self::Dropped]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

/// One notification to one target (`gantry notify log`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct NotifyDelivery {
    /// Stable across retries and restarts: the webhook's `id` and `Gantry-Event-Id` header, the
    /// email's `Message-ID` (a receiver that saw it already can drop the copy).
    pub id: String,
    pub event: NotifyEvent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<i64>,
    pub target: NotifyTarget,
    pub state: DeliveryState,
    pub tries: u32,
    /// When the event happened.
    pub at: i64,
    /// The next try, while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_at: Option<i64>,
    /// When it was delivered, given up or dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// `GET /v1/notify/log`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS)]
pub struct NotifyLogQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// The job a notification is about, as its webhook body carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct NotifyJob {
    pub id: i64,
    pub name: String,
    pub owner: String,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it ended (may quote the spec): only in the owner's own notifications.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A webhook's JSON body (schema `gantry.notification/1`, see the guide's "Notifications",
/// docs/book/src/notifications.md).
/// `text` is what Slack and Mattermost incoming webhooks show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct NotifyPayload {
    pub schema: String,
    pub id: String,
    pub event: NotifyEvent,
    /// When it happened (ms since the epoch).
    pub at: i64,
    /// The machine (its host name).
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<NotifyJob>,
    pub text: String,
}

pub const PAYLOAD_SCHEMA: &str = "gantry.notification/1";
