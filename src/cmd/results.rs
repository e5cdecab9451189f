//! What runs achieved: `gantry compare`, the metrics and params `gantry show` prints.

use anyhow::{bail, Result};
use gantry_core::protocol::{CompareQuery, Comparison, JobResults, Num};
use gantry_core::units::{duration_ms, format_bytes};

use super::Ctx;
use crate::print::print_json;
use crate::term::{esc, outln};

/// `gantry compare IDS...|NAME [--sort M] [--min] [--csv]`.
pub async fn compare(ctx: &Ctx, runs: &[String], sort: Option<String>, min: bool, csv: bool) -> Result<()> {
    let all_ids = runs
        .iter()
        .all(|r| r.split(',').all(|p| p.trim().parse::<i64>().is_ok()));
    let q = match (all_ids, runs) {
        (true, _) => CompareQuery {
            ids: Some(runs.join(",")),
            sort,
            min: min.then_some(true),
            ..Default::default()
        },
        (false, [name]) => CompareQuery {
            name: Some(name.clone()),
            sort,
            min: min.then_some(true),
            ..Default::default()
        },
        _ => bail!("give job ids (`gantry compare 12 13 15`) or one name (`gantry compare sweep`), not both"),
    };
    let c = ctx.client.compare(&q).await?;
    if ctx.json {
        return print_json(&c);
    }
    if csv {
        print!("{}", compare_csv(&c));
        return Ok(());
    }
    print_compare(&c);
    Ok(())
}

fn cell(v: Option<&Num>) -> String {
    v.map(|n| n.to_string()).unwrap_or_else(|| "-".into())
}

/// The table: ID, NAME, STATE, the params that differ (all when one run), each metric's last value
/// (the sorted one marked `*`, its goal shown), DURATION, GPU-H.
pub fn print_compare(c: &Comparison) {
    let params: Vec<&String> = if c.rows.len() > 1 && !c.differing.is_empty() {
        c.differing.iter().collect()
    } else {
        c.params.iter().collect()
    };
    let mut head: Vec<String> = vec!["ID".into(), "NAME".into(), "STATE".into()];
    head.extend(params.iter().map(|p| esc(p).into_owned()));
    for m in &c.metrics {
        let sorted = c.sort.as_ref().is_some_and(|s| s.name == m.name);
        head.push(if sorted {
            format!(
                "{}* ({})",
                esc(&m.name),
                c.sort.as_ref().map(|s| s.goal.as_str()).unwrap_or("")
            )
        } else {
            esc(&m.name).into_owned()
        });
    }
    head.push("DURATION".into());
    head.push("GPU-H".into());
    let mut table: Vec<Vec<String>> = vec![head];
    for r in &c.rows {
        let mut row = vec![
            r.job_id.to_string(),
            esc(&r.name).into_owned(),
            r.state.as_str().to_string(),
        ];
        for p in &params {
            row.push(if r.hidden {
                "(hidden)".into()
            } else {
                r.params
                    .get(*p)
                    .map(|v| esc(v).into_owned())
                    .unwrap_or_else(|| "-".into())
            });
        }
        for m in &c.metrics {
            row.push(cell(r.last.get(&m.name)));
        }
        row.push(r.duration_ms.map(duration_ms).unwrap_or_else(|| "-".into()));
        row.push(format!("{:.2}", r.gpu_hours));
        table.push(row);
    }
    let widths: Vec<usize> = (0..table[0].len())
        .map(|i| table.iter().map(|r| r[i].chars().count().min(40)).max().unwrap_or(0))
        .collect();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(v, w)| {
                let v: String = v.chars().take(40).collect();
                format!("{v:<w$}")
            })
            .collect();
        outln!("{}", line.join("  ").trim_end());
    }
    if c.rows.iter().any(|r| r.hidden) {
        outln!("(hidden: another user's run; only its owner and admins see its params and metrics)");
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One row per run: id, name, state, every param, each metric's last value, duration (s), GPU-hours.
pub fn compare_csv(c: &Comparison) -> String {
    let mut head: Vec<String> = vec!["id".into(), "name".into(), "state".into()];
    head.extend(c.params.iter().map(|p| csv_field(p)));
    head.extend(c.metrics.iter().map(|m| csv_field(&m.name)));
    head.extend(["duration_s".into(), "gpu_hours".into()]);
    let mut out = head.join(",") + "\n";
    for r in &c.rows {
        let mut row = vec![r.job_id.to_string(), csv_field(&r.name), r.state.as_str().to_string()];
        row.extend(
            c.params
                .iter()
                .map(|p| csv_field(r.params.get(p).map(String::as_str).unwrap_or(""))),
        );
        row.extend(
            c.metrics
                .iter()
                .map(|m| r.last.get(&m.name).map(|n| n.to_string()).unwrap_or_default()),
        );
        row.push(
            r.duration_ms
                .map(|d| format!("{:.1}", d as f64 / 1000.0))
                .unwrap_or_default(),
        );
        row.push(format!("{:.4}", r.gpu_hours));
        out.push_str(&(row.join(",") + "\n"));
    }
    out
}

/// `gantry show`'s metrics, params and tags (nothing when the job logged none).
pub fn print_results(r: &JobResults) {
    if !r.params.is_empty() {
        outln!("params:");
        for (k, v) in &r.params {
            outln!("  {} = {}", esc(k), esc(v));
        }
    }
    if !r.metrics.is_empty() {
        outln!("metrics:           last              best");
        for m in &r.metrics {
            let best = match (m.best, m.best_step) {
                (Some(b), Some(s)) => format!("{b} @ step {s} ({})", m.goal.as_str()),
                _ => format!("- ({})", m.goal.as_str()),
            };
            outln!(
                "  {:<16} {:<17} {}   [{} points]",
                esc(&m.name),
                format!("{} @ step {}", m.last, m.last_step),
                best,
                m.count
            );
        }
    }
    if !r.tags.is_empty() {
        outln!("tags:");
        for (k, v) in &r.tags {
            outln!("  {} = {}", esc(k), esc(v));
        }
    }
    let i = &r.ingest;
    if i.garbage_lines > 0 || i.bad_records > 0 || i.dropped_points > 0 || i.bytes_limit_reached {
        outln!(
            "results notes: {} garbage lines, {} bad event records, {} points of {} names not kept",
            i.garbage_lines,
            i.bad_records,
            i.dropped_points,
            i.dropped_names
        );
    }
    if i.bytes_limit_reached {
        outln!(
            "  read {} of metric files; {} more not read",
            format_bytes(i.bytes_read),
            format_bytes(i.bytes_unread)
        );
    }
    for n in &i.notes {
        outln!("  {}", esc(n));
    }
}
