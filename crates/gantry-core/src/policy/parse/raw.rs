//! The lab config file's shape as serde reads it: one `Raw*` struct per section, every value
//! with its position (`S`), unknown keys refused.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) gpus: Option<Spanned<toml::Value>>,
    pub(super) simulate: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) access: RawAccess,
    #[serde(default)]
    pub(super) limits: RawLimits,
    #[serde(default)]
    pub(super) fair_share: RawFairShare,
    #[serde(default)]
    pub(super) jobs: RawJobs,
    #[serde(default)]
    pub(super) preemption: RawPreemption,
    #[serde(default)]
    pub(super) logs: RawLogs,
    #[serde(default)]
    pub(super) history: RawHistory,
    #[serde(default)]
    pub(super) inbox: RawInbox,
    #[serde(default)]
    pub(super) containers: RawContainers,
    #[serde(default)]
    pub(super) images: RawImages,
    #[serde(default)]
    pub(super) disk: RawDisk,
    pub(super) backend: S<String>,
    #[serde(default)]
    pub(super) slurm: RawSlurm,
    #[serde(default)]
    pub(super) sessions: RawSessions,
    #[serde(default)]
    pub(super) bookings: RawBookings,
    #[serde(default)]
    pub(super) notify: RawNotify,
    #[serde(default)]
    pub(super) metrics: RawMetrics,
    #[serde(default)]
    pub(super) results: RawResults,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResults {
    pub(super) max_points: S<i64>,
    pub(super) max_series: S<i64>,
    pub(super) max_name_len: S<i64>,
    pub(super) max_bytes_per_job: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSessions {
    pub(super) max_gpus: S<i64>,
    pub(super) default_length: S<String>,
    pub(super) max_length: S<String>,
    pub(super) before_batch: S<bool>,
    pub(super) notebook_image: S<String>,
    pub(super) idle_after: S<String>,
    pub(super) idle_batch: S<bool>,
    pub(super) keep_free: S<i64>,
    pub(super) forward_port: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBookings {
    pub(super) enabled: S<bool>,
    pub(super) max_gpu_hours_per_week: S<i64>,
    pub(super) max_ahead: S<String>,
    pub(super) max_length: S<String>,
    pub(super) slot: S<String>,
    pub(super) release_after: S<String>,
    pub(super) max_gpus: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotify {
    pub(super) smtp_host: S<String>,
    pub(super) smtp_port: S<i64>,
    pub(super) smtp_starttls: S<bool>,
    pub(super) smtp_from: S<String>,
    pub(super) smtp_credentials: S<String>,
    pub(super) webhook_hosts: S<Vec<Spanned<String>>>,
    pub(super) webhooks: S<Vec<Spanned<RawLabHook>>>,
    pub(super) max_tries: S<i64>,
    pub(super) retry_backoff: S<String>,
    pub(super) max_pending: S<i64>,
    pub(super) max_targets: S<i64>,
    pub(super) max_tests_per_hour: S<i64>,
    pub(super) email_domains: S<Vec<Spanned<String>>>,
    pub(super) email_to: S<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLabHook {
    pub(super) url: Spanned<String>,
    #[serde(default)]
    pub(super) on: Vec<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: S<String>,
    pub(super) allow_remote: S<bool>,
    pub(super) max_connections: S<i64>,
    pub(super) idle_timeout: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlurm {
    pub(super) partition: S<String>,
    pub(super) account: S<String>,
    pub(super) qos: S<String>,
    pub(super) poll: S<String>,
    pub(super) log_dir: S<String>,
    pub(super) runtime: S<String>,
    pub(super) shard_memory: S<String>,
    pub(super) max_nice: S<i64>,
    pub(super) jobcomp_log: S<String>,
    pub(super) node_samples: S<String>,
}

/// Sizes and CPU counts are strings or numbers (`cpus_per_gpu = 8`, `= "auto"`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawContainers {
    pub(super) shm_size: S<String>,
    pub(super) memlock: S<String>,
    pub(super) stack: S<String>,
    pub(super) allow_ipc_host: S<bool>,
    pub(super) home: S<String>,
    pub(super) cpus_per_gpu: S<toml::Value>,
    pub(super) memory_per_gpu: S<String>,
    pub(super) cpu_only_cpus: S<toml::Value>,
    pub(super) cpu_only_memory: S<String>,
    pub(super) cpu_only_shares: S<i64>,
    pub(super) reserve_cpus: S<toml::Value>,
    pub(super) reserve_memory: S<String>,
    pub(super) pids_limit: S<i64>,
    pub(super) host_image: S<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccess {
    pub(super) admins: S<Vec<Spanned<String>>>,
    pub(super) admin_group: S<String>,
    pub(super) see_others: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) priority: S<Vec<i64>>,
    pub(super) admin_priority: S<Vec<i64>>,
    pub(super) max_queued_jobs: S<i64>,
    pub(super) max_running_gpus: S<i64>,
    pub(super) default_timeout: S<String>,
    pub(super) max_timeout: S<String>,
    pub(super) max_begin: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFairShare {
    pub(super) half_life: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJobs {
    pub(super) stop_grace: S<String>,
    pub(super) retry_backoff: S<String>,
    pub(super) reserve_after: S<String>,
    pub(super) gpu_memory_margin: S<String>,
    pub(super) gpu_memory_grace: S<String>,
    pub(super) overrun_margin: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPreemption {
    pub(super) enabled: S<bool>,
    pub(super) default_preemptible: S<bool>,
    pub(super) reserve_after: S<bool>,
    pub(super) priority_gap: S<i64>,
    pub(super) fair_share: S<bool>,
    pub(super) min_run: S<String>,
    pub(super) max_per_day: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLogs {
    pub(super) cap: S<String>,
    pub(super) keep: S<String>,
    pub(super) streams_per_user: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHistory {
    pub(super) keep: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawImages {
    pub(super) allow: S<Vec<Spanned<String>>>,
    pub(super) pull_timeout: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDisk {
    pub(super) min_free: S<String>,
    pub(super) layer_size: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInbox {
    pub(super) group: S<String>,
    pub(super) path: S<String>,
    pub(super) templates: S<String>,
    pub(super) max_watches: S<i64>,
}
