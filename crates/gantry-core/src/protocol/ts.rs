//! `ui/src/types.ts`, generated from the protocol's Rust types with ts-rs (64-bit integers as
//! `number`: milliseconds and byte counts stay far below 2^53). The test below fails when the
//! checked-in file differs; `GANTRY_WRITE_TS=1` makes it write the file instead.

use std::any::TypeId;

use ts_rs::{Config, TS};

use super::*;
use crate::spec::{Command, Home, IdOrName, Ipc, JobSpec, MatrixPart, Mount, Scalar, SpecError, Ulimits, ValidJob};

/// How to refresh the file; the stale-file test prints it.
pub const REFRESH: &str = "GANTRY_WRITE_TS=1 cargo test --workspace --lib types_ts";

/// The checked-in file, relative to the workspace root.
pub const PATH: &str = "ui/src/types.ts";

/// Collects declarations and checks that every type they name is declared too.
struct Out {
    cfg: Config,
    text: String,
    declared: Vec<(TypeId, String)>,
    named: Vec<(String, String)>,
}

impl Out {
    fn decl<T: TS + 'static>(&mut self) -> &mut Self {
        if let Some(docs) = T::docs() {
            self.text.push_str(&docs);
        }
        self.text.push_str("export ");
        self.text.push_str(&T::decl(&self.cfg));
        self.text.push('\n');
        let name = T::ident(&self.cfg);
        self.declared.push((TypeId::of::<T>(), name.clone()));
        for d in T::dependencies(&self.cfg) {
            self.named.push((name.clone(), d.ts_name));
        }
        self
    }

    fn line(&mut self, s: &str) -> &mut Self {
        self.text.push_str(s);
        self.text.push('\n');
        self
    }
}

/// The whole file.
pub fn typescript() -> String {
    let mut o = Out {
        cfg: Config::new().with_large_int("number"),
        text: String::new(),
        declared: vec![],
        named: vec![],
    };
    o.line(&format!("// Generated from the Rust protocol types (crates/gantry-core/src/protocol) by ts-rs: do not edit.\n// Refresh: {REFRESH}\n"));
    o.decl::<JobState>();
    let finals: Vec<String> = JobState::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(|s| format!("{:?}", s.as_str()))
        .collect();
    o.line(&format!(
        "export const FINAL_STATES: JobState[] = [{}];",
        finals.join(", ")
    ));
    o.decl::<EngineKind>()
        .decl::<EngineView>()
        .decl::<Machines>()
        .decl::<ConnectionEvent>()
        .decl::<SessionAsk>();
    o.decl::<BackendKind>()
        .decl::<Orphan>()
        .decl::<StatusInfo>()
        .decl::<WhoAmI>();
    o.decl::<NotifyEvent>();
    o.decl::<Command>()
        .decl::<Ipc>()
        .decl::<Home>()
        .decl::<Ulimits>()
        .decl::<crate::spec::Checkpoint>()
        .decl::<IdOrName>()
        .decl::<Scalar>()
        .decl::<JobSpec>();
    o.decl::<crate::spec::Limits>()
        .decl::<MatrixPart>()
        .decl::<Mount>()
        .decl::<ValidJob>()
        .decl::<SpecError>()
        .decl::<Preview>()
        .decl::<PreviewJob>()
        .decl::<SubmitPreview>();
    o.line("/** Rust `Result<Vec<i64>, String>` as serde writes it: one per submitted file. */");
    o.line(&format!(
        "export type SubmitResult = {};",
        <Result<Vec<i64>, String> as TS>::inline(&o.cfg)
    ));
    o.decl::<JobView>()
        .decl::<QueueJob>()
        .decl::<QueueSession>()
        .decl::<QueueEntryView>()
        .decl::<QueuePage>()
        .decl::<EndReason>()
        .decl::<Attempt>()
        .decl::<Event>()
        .decl::<JobDetailView>()
        .decl::<JobChanged>();
    o.decl::<GpuProcess>()
        .decl::<MigParent>()
        .decl::<Link>()
        .decl::<GpuLink>()
        .decl::<GpuSample>()
        .decl::<GpuUser>()
        .decl::<GpuStatus>();
    o.decl::<RecentSample>().decl::<GpuMinute>().decl::<EngineEvent>();
    o.decl::<results::NonFinite>()
        .decl::<results::NumTs>()
        .decl::<Goal>()
        .decl::<MetricSource>()
        .decl::<MetricPoint>()
        .decl::<MetricSeries>()
        .decl::<IngestReport>()
        .decl::<JobResults>()
        .decl::<ResultsQuery>()
        .decl::<CompareQuery>()
        .decl::<CompareMetric>()
        .decl::<CompareRow>()
        .decl::<Comparison>();
    o.decl::<HistoryRow>()
        .decl::<HistoryFilter>()
        .decl::<TimelineRun>()
        .decl::<UserUsage>()
        .decl::<UsageReport>();
    o.decl::<UsageBucket>().decl::<UtilCell>().decl::<UsageCharts>();
    o.decl::<NotifyTarget>()
        .decl::<Subscription>()
        .decl::<DeliveryState>()
        .decl::<NotifyDelivery>()
        .decl::<NotifyJob>()
        .decl::<NotifyPayload>();
    o.decl::<BookingState>()
        .decl::<BookRequest>()
        .decl::<BookingView>()
        .decl::<BookingsQuery>()
        .decl::<BookingRules>()
        .decl::<Bookings>();
    for (user, dep) in &o.named {
        assert!(
            o.declared.iter().any(|(_, n)| n == dep),
            "{user} names {dep}, which protocol::ts::typescript does not declare: add it"
        );
    }
    o.text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_ts_matches_the_rust_protocol() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(PATH);
        let want = typescript();
        if std::env::var_os("GANTRY_WRITE_TS").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let line = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
            panic!("{PATH} is stale: it differs from the Rust protocol types from line {} on.\nRefresh it with:\n    {REFRESH}", line + 1);
        }
    }
}
