//! The protocol, defined once: every type the engine's API, the CLI, the app and its page exchange,
//! and every route ([`routes`]). It imports no server code: only the job spec's pure types
//! (`crate::spec`, in [`job`]); the other files import nothing of the crate, so server modules
//! (`gpu`, `store`, `engine`, `api`) can re-export them without an import cycle.
//!
//! `ui/src/types.ts` is generated from these types ([`ts::typescript`]); a test fails when it is stale.

pub mod app;
pub mod booking;
pub mod gpu;
pub mod history;
pub mod job;
pub mod notify;
pub mod results;
pub mod routes;
pub mod status;
pub mod terminal;
pub mod ts;

pub use app::{ConnectionEvent, EngineKind, EngineView, Machines, SessionAsk};
pub use booking::{BookRequest, BookingRules, BookingState, BookingView, Bookings, BookingsQuery};
pub use gpu::{
    BackendKind, GpuLink, GpuMinute, GpuProcess, GpuSample, GpuStatus, GpuUser, Link, MigParent, RecentSample,
};
pub use history::{
    HistoryFilter, HistoryRow, LogQuery, Range, Since, TimelineRun, UsageBucket, UsageCharts, UsageChartsQuery,
    UsageQuery, UsageReport, UserUsage, UtilCell,
};
pub use job::{
    ApiError, Attempt, EndReason, EngineEvent, Event, JobChanged, JobDetailView, JobState, JobView, Preview,
    PreviewJob, PriorityRequest, QueueEntryView, QueueJob, QueuePage, QueuePageQuery, QueueSession, SpecOrigin,
    SubmitPreview, SubmitRequest, Submitted,
};
pub use notify::{
    DeliveryState, NotifyAdd, NotifyDelivery, NotifyEvent, NotifyJob, NotifyLogQuery, NotifyPayload, NotifyTarget,
    Subscription,
};
pub use results::{
    CompareMetric, CompareQuery, CompareRow, Comparison, Goal, IngestReport, JobResults, MetricPoint, MetricSeries,
    MetricSource, Num, ResultsQuery,
};
pub use status::{Health, InboxInfo, Orphan, StatusInfo, WhoAmI};
