//! The MLflow tracking endpoint of a Docker-backend attempt: scripts that already log to MLflow
//! need no change. Each attempt's container is given `MLFLOW_TRACKING_URI=http://127.0.0.1:PORT`
//! and a random `MLFLOW_TRACKING_TOKEN` ([`endpoint_env`]); once it runs, the engine binds a
//! listener on 127.0.0.1:PORT *inside the container's own network namespace* (`Executor::listen_in`),
//! so only that attempt's processes can reach it, and every request must carry the token as
//! `Authorization: Bearer`. The classic tracking calls a training script makes ([`handle`]) become
//! the job's metrics, params and tags (source `mlflow`), through the same store path and
//! `[results]` bounds as `GANTRY_METRICS`; anything else gets an MLflow-shaped error saying what
//! is supported. The listener and its connections live in one task, dropped when the attempt ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use serde_json::{json, Value};
use tracing::{debug, warn};

use super::super::Engine;
use crate::defaults::{MLFLOW_BODY_MAX, MLFLOW_CONNECTIONS, MLFLOW_IDLE, MLFLOW_KEPT_BYTES, MLFLOW_REQUESTS_PER_S};
use crate::protocol::results::parse_non_finite;
use crate::protocol::MetricSource;
use crate::store::{Logged, ResultsBatch, ResultsLimits};

pub const URI_VAR: &str = "MLFLOW_TRACKING_URI";
pub const TOKEN_VAR: &str = "MLFLOW_TRACKING_TOKEN";

/// Ports an endpoint is given: below Linux's ephemeral range (32768+), so none of the job's own
/// outgoing connections can hold it before the engine binds it.
const PORTS: std::ops::Range<u16> = 20_000..30_000;
/// MLflow's own bounds on one `log-batch` (its server refuses more): metrics, params, tags.
const BATCH_METRICS: usize = 1000;
const BATCH_PARAMS: usize = 100;
const BATCH_TAGS: usize = 100;
/// Experiments one attempt may create (a script makes one or two).
const EXPERIMENTS: usize = 100;
/// Runs one attempt may create (a script makes one, a few with nested runs).
const RUNS: usize = 1000;

/// `None` without /dev/urandom: then no endpoint, rather than one behind a guessable token.
fn random_bytes<const N: usize>() -> Option<[u8; N]> {
    use std::io::Read;
    let mut b = [0u8; N];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => Some(b),
        Err(e) => {
            warn!("reading /dev/urandom: {e}; jobs get no MLflow endpoint");
            None
        }
    }
}

/// The environment of an attempt's MLflow client: a port in its own network namespace and a
/// random token. `None` where its spec names its own tracking server (the script keeps it), or
/// where no random token can be made.
pub fn endpoint_env(spec_env: &BTreeMap<String, String>) -> Option<Vec<(String, String)>> {
    if spec_env.contains_key(URI_VAR) {
        return None;
    }
    let r = random_bytes::<2>()?;
    let port = PORTS.start + u16::from_le_bytes(r) % (PORTS.end - PORTS.start);
    let token: String = random_bytes::<24>()?.iter().map(|b| format!("{b:02x}")).collect();
    Some(vec![
        (URI_VAR.into(), format!("http://127.0.0.1:{port}")),
        (TOKEN_VAR.into(), token),
    ])
}

/// The file attempt `n`'s string command waits for (`Launch::start_gate`), in its results folder.
fn gate_name(n: u32) -> String {
    format!(".mlflow-bound-{n}")
}

/// [`gate_name`] as the container sees it.
pub fn gate_in_container(n: u32) -> String {
    format!("{}/{}", super::RESULTS_MOUNT, gate_name(n))
}

/// Open the gate of attempt `n` in the job's results folder (`dir`, the owner's, in a folder only
/// the engine changes): a new empty file, never through a link the owner left there.
pub(super) fn open_gate(dir: &std::path::Path, n: u32) {
    use std::os::unix::fs::OpenOptionsExt;
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o444)
        .open(dir.join(gate_name(n)));
    match made {
        Ok(_) => {}
        // Made before (an engine restart), or by the job itself: it only lets itself go on.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => debug!("opening the start gate in {}: {e}", dir.display()),
    }
}

/// The port and token a container was given, read back from its environment (`KEY=VALUE`): after
/// a restart the engine binds the same endpoint again.
pub fn endpoint_of(env: &[String]) -> Option<(u16, String)> {
    let var = |k: &str| env.iter().find_map(|e| e.strip_prefix(k)?.strip_prefix('='));
    let port = var(URI_VAR)?.strip_prefix("http://127.0.0.1:")?.parse().ok()?;
    let token = var(TOKEN_VAR)?.to_string();
    (!token.is_empty()).then_some((port, token))
}

#[derive(Debug, Clone)]
struct Experiment {
    id: String,
    name: String,
    created: i64,
}

#[derive(Debug, Clone)]
struct Run {
    id: String,
    name: String,
    experiment_id: String,
    user_id: String,
    status: String,
    start_time: i64,
    end_time: Option<i64>,
    params: BTreeMap<String, String>,
    tags: BTreeMap<String, String>,
    /// Each metric's latest (value, timestamp, step).
    metrics: BTreeMap<String, (f64, i64, i64)>,
}

/// What one attempt's MLflow client has made: experiments and runs, as `runs/get` returns them.
#[derive(Debug)]
pub struct Tracking {
    job_id: i64,
    attempt: u32,
    experiments: Vec<Experiment>,
    runs: HashMap<String, Run>,
    /// Bytes of params, tags and metric names kept in `runs` ([`MLFLOW_KEPT_BYTES`] at most).
    kept: usize,
}

impl Tracking {
    pub fn new(job_id: i64, attempt: u32, now_ms: i64) -> Tracking {
        Tracking {
            job_id,
            attempt,
            experiments: vec![Experiment {
                id: "0".into(),
                name: "Default".into(),
                created: now_ms,
            }],
            runs: HashMap::new(),
            kept: 0,
        }
    }
}

impl Tracking {
    /// The run `id` names: one this attempt made, made again when this engine restarted while the
    /// attempt ran (the client goes on with the run id it has).
    fn run(&mut self, id: &str, now_ms: i64) -> Option<(&mut Run, &mut usize)> {
        let ours = format!("{:016x}{:08x}", self.job_id, self.attempt);
        if !self.runs.contains_key(id) && id.len() == 32 && id.starts_with(&ours) && self.runs.len() < RUNS {
            let run = Run {
                id: id.to_string(),
                name: format!("job-{}-attempt-{}", self.job_id, self.attempt),
                experiment_id: "0".into(),
                user_id: String::new(),
                status: "RUNNING".into(),
                start_time: now_ms,
                end_time: None,
                params: BTreeMap::new(),
                tags: BTreeMap::new(),
                metrics: BTreeMap::new(),
            };
            self.runs.insert(id.to_string(), run);
        }
        let Tracking { runs, kept, .. } = self;
        runs.get_mut(id).map(|r| (r, kept))
    }
}

/// One request's answer: the HTTP status, its JSON, and what it logged (to be written).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub batch: Option<ResultsBatch>,
}

impl Reply {
    fn ok(body: Value) -> Reply {
        Reply {
            status: 200,
            body,
            batch: None,
        }
    }
    fn logged(b: ResultsBatch) -> Reply {
        Reply {
            status: 200,
            body: json!({}),
            batch: Some(b),
        }
    }
}

/// MLflow's error JSON with its HTTP status.
pub fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
    Reply {
        status,
        body: json!({"error_code": code, "message": message.into()}),
        batch: None,
    }
}

/// Where runs' artifacts "are": MLflow's proxied artifact store on this same endpoint, whose calls get
/// the error saying artifacts are not kept (an empty location would have the client copy files into
/// the job's working folder).
const ARTIFACTS: &str = "mlflow-artifacts:/not-kept-by-gantry";

const SUPPORTED: &str = "Gantry's MLflow endpoint keeps a job's metrics, params and tags: experiments/get-by-name, \
experiments/create, experiments/get, runs/create, runs/get, runs/update, runs/log-metric, runs/log-batch, \
runs/log-parameter and runs/set-tag under /api/2.0/mlflow/. Artifacts, models, traces and searches are not kept: \
to use a full MLflow server, set MLFLOW_TRACKING_URI in the job's env (Gantry then leaves it alone)";

fn not_found(method: &str, path: &str) -> Reply {
    error(
        404,
        "ENDPOINT_NOT_FOUND",
        format!("{method} {path} is not served here. {SUPPORTED}"),
    )
}

fn bad(message: impl Into<String>) -> Reply {
    error(400, "INVALID_PARAMETER_VALUE", message)
}

/// A string field (MLflow sends ids and values as strings; numbers are taken as written).
fn text(v: &Value, k: &str) -> Option<String> {
    match v.get(k)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// An int64 field: a JSON number, or a string of one (protobuf's JSON form).
fn int(v: &Value, k: &str) -> Option<i64> {
    match v.get(k)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A double: a number, or "NaN"/"Infinity"/"-Infinity" as protobuf's JSON writes them.
fn double(v: &Value, k: &str) -> Option<f64> {
    match v.get(k)? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok().or_else(|| parse_non_finite(s)),
        _ => None,
    }
}

fn num_json(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else if x.is_nan() {
        json!("NaN")
    } else if x > 0.0 {
        json!("Infinity")
    } else {
        json!("-Infinity")
    }
}

fn kv_list(m: &BTreeMap<String, String>) -> Value {
    Value::Array(m.iter().map(|(k, v)| json!({"key": k, "value": v})).collect())
}

fn experiment_json(x: &Experiment) -> Value {
    json!({
        "experiment_id": x.id,
        "name": x.name,
        "artifact_location": ARTIFACTS,
        "lifecycle_stage": "active",
        "creation_time": x.created,
        "last_update_time": x.created,
        "tags": [],
    })
}

fn run_info(r: &Run) -> Value {
    let mut info = json!({
        "run_id": r.id,
        "run_uuid": r.id,
        "run_name": r.name,
        "experiment_id": r.experiment_id,
        "user_id": r.user_id,
        "status": r.status,
        "start_time": r.start_time,
        "artifact_uri": ARTIFACTS,
        "lifecycle_stage": "active",
    });
    if let Some(t) = r.end_time {
        info["end_time"] = json!(t);
    }
    info
}

fn run_json(r: &Run) -> Value {
    let metrics: Vec<Value> = r
        .metrics
        .iter()
        .map(|(k, (v, t, s))| json!({"key": k, "value": num_json(*v), "timestamp": t, "step": s}))
        .collect();
    json!({
        "info": run_info(r),
        "data": {"metrics": metrics, "params": kv_list(&r.params), "tags": kv_list(&r.tags)},
        "inputs": {},
    })
}

/// The run a request names (`run_id`, or the older `run_uuid`).
fn run_id(v: &Value) -> Option<String> {
    text(v, "run_id").or_else(|| text(v, "run_uuid"))
}

/// At most `n` chars of `s` (names and user ids kept in memory are bounded like the store's keys).
fn cut(s: String, n: u32) -> String {
    match s.char_indices().nth(n as usize) {
        Some((i, _)) => s[..i].to_string(),
        None => s,
    }
}

/// Keep `k = v` in an in-memory map bounded like the store (`max_series` entries of `max_name_len`)
/// and within the attempt's budget (`kept`, at most [`MLFLOW_KEPT_BYTES`]).
fn keep(kept: &mut usize, m: &mut BTreeMap<String, String>, k: &str, v: &str, lim: &ResultsLimits) {
    if k.len() > lim.max_name_len as usize || !(m.contains_key(k) || m.len() < lim.max_series as usize) {
        return;
    }
    let v = cut(v.to_string(), 8 * lim.max_name_len);
    let old = m.get(k).map_or(0, |o| k.len() + o.len());
    let new = *kept - old.min(*kept) + k.len() + v.len();
    if new > MLFLOW_KEPT_BYTES {
        return;
    }
    *kept = new;
    m.insert(k.to_string(), v);
}

/// Answer one request. `query` is the URL's query string, `body` the request's (JSON for POST).
pub fn handle(
    t: &mut Tracking,
    method: &str,
    path: &str,
    query: &str,
    body: &[u8],
    now_ms: i64,
    lim: &ResultsLimits,
) -> Reply {
    let Some(route) = path
        .strip_prefix("/api/2.0/mlflow/")
        .or_else(|| path.strip_prefix("/ajax-api/2.0/mlflow/"))
    else {
        return not_found(method, path);
    };
    let args: Value = if method == "GET" {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).unwrap_or_default();
        Value::Object(pairs.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
    } else if body.iter().all(|b| b.is_ascii_whitespace()) {
        json!({})
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(v @ Value::Object(_)) => v,
            _ => return bad("the request body is not a JSON object"),
        }
    };
    match (method, route) {
        ("GET", "experiments/get-by-name") => {
            let Some(name) = text(&args, "experiment_name") else {
                return bad("experiments/get-by-name needs experiment_name");
            };
            match t.experiments.iter().find(|x| x.name == name) {
                Some(x) => Reply::ok(json!({"experiment": experiment_json(x)})),
                None => error(
                    404,
                    "RESOURCE_DOES_NOT_EXIST",
                    format!("Could not find experiment with name '{name}'"),
                ),
            }
        }
        ("GET", "experiments/get") => {
            let id = text(&args, "experiment_id").unwrap_or_default();
            match t.experiments.iter().find(|x| x.id == id) {
                Some(x) => Reply::ok(json!({"experiment": experiment_json(x)})),
                None => error(
                    404,
                    "RESOURCE_DOES_NOT_EXIST",
                    format!("No Experiment with id={id} exists"),
                ),
            }
        }
        ("POST", "experiments/create") => {
            let Some(name) = text(&args, "name").filter(|n| !n.is_empty()) else {
                return bad("experiments/create needs a name");
            };
            if t.experiments.iter().any(|x| x.name == name) {
                return error(
                    400,
                    "RESOURCE_ALREADY_EXISTS",
                    format!("Experiment '{name}' already exists."),
                );
            }
            if t.experiments.len() >= EXPERIMENTS || name.len() > lim.max_name_len as usize {
                return bad(format!(
                    "a job may create at most {EXPERIMENTS} experiments, with names of at most {} bytes",
                    lim.max_name_len
                ));
            }
            let id = t.experiments.len().to_string();
            t.experiments.push(Experiment {
                id: id.clone(),
                name: name.clone(),
                created: now_ms,
            });
            let mut b = ResultsBatch::new(MetricSource::Mlflow);
            b.tags.push(("mlflow.experimentName".into(), name));
            Reply {
                status: 200,
                body: json!({"experiment_id": id}),
                batch: Some(b),
            }
        }
        ("POST", "runs/create") => {
            if t.runs.len() >= RUNS {
                return bad(format!("a job may create at most {RUNS} MLflow runs"));
            }
            let experiment_id = text(&args, "experiment_id").unwrap_or_else(|| "0".into());
            if !t.experiments.iter().any(|x| x.id == experiment_id) {
                return error(
                    404,
                    "RESOURCE_DOES_NOT_EXIST",
                    format!("No Experiment with id={experiment_id} exists"),
                );
            }
            // Numbered on from those known (after a restart, from the ones the client still names).
            let mut n = t.runs.len();
            let mut id = format!("{:016x}{:08x}{:08x}", t.job_id, t.attempt, n);
            while t.runs.contains_key(&id) {
                n += 1;
                id = format!("{:016x}{:08x}{:08x}", t.job_id, t.attempt, n);
            }
            let name = text(&args, "run_name")
                .filter(|n| !n.is_empty())
                .map(|n| cut(n, lim.max_name_len))
                .unwrap_or_else(|| format!("job-{}-attempt-{}", t.job_id, t.attempt));
            let mut run = Run {
                id: id.clone(),
                name: name.clone(),
                experiment_id,
                user_id: cut(text(&args, "user_id").unwrap_or_default(), lim.max_name_len),
                status: "RUNNING".into(),
                start_time: int(&args, "start_time").unwrap_or(now_ms),
                end_time: None,
                params: BTreeMap::new(),
                tags: BTreeMap::new(),
                metrics: BTreeMap::new(),
            };
            let mut b = ResultsBatch::new(MetricSource::Mlflow);
            let tags = args.get("tags").and_then(Value::as_array).cloned().unwrap_or_default();
            for tag in tags.iter().take(BATCH_TAGS) {
                if let (Some(k), Some(v)) = (text(tag, "key"), text(tag, "value")) {
                    keep(&mut t.kept, &mut run.tags, &k, &v, lim);
                    b.tags.push((k, v));
                }
            }
            keep(&mut t.kept, &mut run.tags, "mlflow.runName", &name, lim);
            b.tags.push(("mlflow.runName".into(), name));
            let body = json!({"run": run_json(&run)});
            t.runs.insert(id, run);
            Reply {
                status: 200,
                body,
                batch: Some(b),
            }
        }
        ("GET", "runs/get") => match run_id(&args).and_then(|id| t.run(&id, now_ms)) {
            Some((r, _)) => Reply::ok(json!({"run": run_json(r)})),
            None => no_run(&args),
        },
        ("POST", "runs/update") => {
            let Some((r, kept)) = run_id(&args).and_then(|id| t.run(&id, now_ms)) else {
                return no_run(&args);
            };
            if let Some(s) = text(&args, "status") {
                r.status = s.chars().take(32).collect();
            }
            if let Some(e) = int(&args, "end_time") {
                r.end_time = Some(e);
            }
            let mut b = ResultsBatch::new(MetricSource::Mlflow);
            if let Some(n) = text(&args, "run_name").filter(|n| !n.is_empty()) {
                r.name = cut(n.clone(), lim.max_name_len);
                keep(kept, &mut r.tags, "mlflow.runName", &n, lim);
                b.tags.push(("mlflow.runName".into(), n));
            }
            Reply {
                status: 200,
                body: json!({"run_info": run_info(r)}),
                batch: Some(b),
            }
        }
        ("POST", "runs/log-metric") => {
            let Some((r, kept)) = run_id(&args).and_then(|id| t.run(&id, now_ms)) else {
                return no_run(&args);
            };
            let mut b = ResultsBatch::new(MetricSource::Mlflow);
            match metric(&args, now_ms) {
                Ok(p) => {
                    note_metric(kept, r, &p, lim);
                    b.points.push(p);
                    Reply::logged(b)
                }
                Err(why) => bad(why),
            }
        }
        ("POST", "runs/log-parameter") => {
            let Some((r, kept)) = run_id(&args).and_then(|id| t.run(&id, now_ms)) else {
                return no_run(&args);
            };
            let (Some(k), Some(v)) = (text(&args, "key"), text(&args, "value")) else {
                return bad("runs/log-parameter needs key and value");
            };
            keep(kept, &mut r.params, &k, &v, lim);
            let mut b = ResultsBatch::new(MetricSource::Mlflow);
            b.params.push((k, v));
            Reply::logged(b)
        }
        ("POST", "runs/set-tag") => {
            let Some((r, kept)) = run_id(&args).and_then(|id| t.run(&id, now_ms)) else {
                return no_run(&args);
            };
            let (Some(k), Some(v)) = (text(&args, "key"), text(&args, "value")) else {
                return bad("runs/set-tag needs key and value");
            };
            keep(kept, &mut r.tags, &k, &v, lim);
            let mut b = ResultsBatch::new(MetricSource::Mlflow);
            b.tags.push((k, v));
            Reply::logged(b)
        }
        ("POST", "runs/log-batch") => {
            let Some((r, kept)) = run_id(&args).and_then(|id| t.run(&id, now_ms)) else {
                return no_run(&args);
            };
            let list = |k: &str| args.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
            let (metrics, params, tags) = (list("metrics"), list("params"), list("tags"));
            if metrics.len() > BATCH_METRICS || params.len() > BATCH_PARAMS || tags.len() > BATCH_TAGS {
                return bad(format!(
                    "a log-batch holds at most {BATCH_METRICS} metrics, {BATCH_PARAMS} params and {BATCH_TAGS} tags \
                     (MLflow's own limits); this one has {}, {} and {}",
                    metrics.len(),
                    params.len(),
                    tags.len()
                ));
            }
            let mut b = ResultsBatch::new(MetricSource::Mlflow);
            for m in &metrics {
                match metric(m, now_ms) {
                    Ok(p) => {
                        note_metric(kept, r, &p, lim);
                        b.points.push(p);
                    }
                    Err(why) => return bad(why),
                }
            }
            for (list, into_params) in [(&params, true), (&tags, false)] {
                for kv in list {
                    let (Some(k), Some(v)) = (text(kv, "key"), text(kv, "value")) else {
                        return bad("each param and tag of a log-batch needs key and value");
                    };
                    if into_params {
                        keep(kept, &mut r.params, &k, &v, lim);
                        b.params.push((k, v));
                    } else {
                        keep(kept, &mut r.tags, &k, &v, lim);
                        b.tags.push((k, v));
                    }
                }
            }
            Reply::logged(b)
        }
        _ => not_found(method, path),
    }
}

fn no_run(args: &Value) -> Reply {
    match run_id(args) {
        Some(id) => error(
            404,
            "RESOURCE_DOES_NOT_EXIST",
            format!("Run '{id}' not found (this attempt's runs are the ones it created)"),
        ),
        None => bad("the request names no run_id"),
    }
}

/// One metric of a request: key, value, step (0 when absent, as MLflow) and timestamp.
fn metric(v: &Value, now_ms: i64) -> Result<Logged, String> {
    let name = text(v, "key").ok_or("a metric needs a key")?;
    let value = double(v, "value").ok_or_else(|| format!("metric {name:?} has no numeric value"))?;
    Ok(Logged {
        name,
        step: Some(int(v, "step").unwrap_or(0)),
        at: int(v, "timestamp").unwrap_or(now_ms),
        value,
    })
}

fn note_metric(kept: &mut usize, r: &mut Run, p: &Logged, lim: &ResultsLimits) {
    let at = (p.value, p.at, p.step.unwrap_or(0));
    if let Some(m) = r.metrics.get_mut(&p.name) {
        *m = at;
    } else if p.name.len() <= lim.max_name_len as usize
        && r.metrics.len() < lim.max_series as usize
        && *kept + p.name.len() + 24 <= MLFLOW_KEPT_BYTES
    {
        *kept += p.name.len() + 24;
        r.metrics.insert(p.name.clone(), at);
    }
}

/// Does `header` (an `Authorization` value) carry `token`? Compared in constant time.
fn authorized(header: Option<&[u8]>, token: &str) -> bool {
    let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
        return false;
    };
    let want = token.as_bytes();
    given.len() == want.len() && given.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

type Resp = hyper::Response<Full<Bytes>>;

fn respond(r: &Reply) -> Resp {
    let mut resp = hyper::Response::new(Full::new(Bytes::from(r.body.to_string())));
    *resp.status_mut() = hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// One attempt's endpoint, shared by its connections.
struct Endpoint {
    engine: Weak<Engine>,
    token: String,
    tracking: Mutex<Tracking>,
    /// When the next request may be handled ([`MLFLOW_REQUESTS_PER_S`]).
    next: Mutex<tokio::time::Instant>,
}

impl Endpoint {
    async fn serve(self: Arc<Self>, req: hyper::Request<hyper::body::Incoming>) -> Resp {
        // Each request is a write of the store: a job calling as fast as it can waits its turn
        // instead of taking the engine's time (MLflow's own client is well under the rate).
        let turn = {
            let mut next = self.next.lock().unwrap();
            let at = (*next).max(tokio::time::Instant::now());
            *next = at + Duration::from_secs(1) / MLFLOW_REQUESTS_PER_S;
            at
        };
        tokio::time::sleep_until(turn).await;
        if !authorized(
            req.headers().get(hyper::header::AUTHORIZATION).map(|h| h.as_bytes()),
            &self.token,
        ) {
            return respond(&error(
                401,
                "UNAUTHENTICATED",
                format!(
                    "this endpoint answers only its job's MLflow client: send the job's {TOKEN_VAR} as a Bearer token"
                ),
            ));
        }
        let too_big = || {
            respond(&error(
                413,
                "INVALID_PARAMETER_VALUE",
                format!("request bodies are at most {MLFLOW_BODY_MAX} bytes here"),
            ))
        };
        let declared = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MLFLOW_BODY_MAX as u64) {
            return too_big();
        }
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let body = Limited::new(req.into_body(), MLFLOW_BODY_MAX);
        let body = match tokio::time::timeout(MLFLOW_IDLE, body.collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => return too_big(),
            Err(_) => return respond(&bad("the request body did not arrive in time")),
        };
        let Some(e) = self.engine.upgrade() else {
            return respond(&error(503, "TEMPORARILY_UNAVAILABLE", "the engine is stopping"));
        };
        let lim = e.policy().results;
        let mut reply = {
            let mut t = self.tracking.lock().unwrap();
            handle(&mut t, &method, &path, &query, &body, e.now(), &lim)
        };
        if let Some(mut b) = reply.batch.take() {
            let (job_id, attempt) = {
                let t = self.tracking.lock().unwrap();
                (t.job_id, t.attempt)
            };
            b.bytes = body.len() as u64;
            // Written off the async workers, as the file readers' batches are.
            let written = tokio::task::spawn_blocking(move || {
                let used = e.reader().results_bytes(job_id).unwrap_or(0);
                if used >= lim.max_bytes {
                    // Past the job's bound: nothing more is kept, but the script goes on (an error
                    // would stop the training for a bound on what Gantry keeps).
                    let mut over = ResultsBatch::new(MetricSource::Mlflow);
                    over.bytes_unread = (body.len() as u64).max(1);
                    b = over;
                }
                let r = e.store().add_results(job_id, attempt, &b, &lim);
                if let Err(err) = &r {
                    e.store_failed(&format!("recording the MLflow results of job {job_id}"), err);
                }
                r.is_ok()
            })
            .await;
            if !matches!(written, Ok(true)) {
                reply = error(
                    503,
                    "TEMPORARILY_UNAVAILABLE",
                    "the engine could not record this; try again",
                );
            }
        }
        respond(&reply)
    }
}

/// Serve an attempt's MLflow client on `listener` (bound in its network namespace) until dropped:
/// the connections are this task's, so aborting it closes the listener and every connection.
pub(super) async fn serve(
    engine: Weak<Engine>,
    job_id: i64,
    attempt: u32,
    listener: std::net::TcpListener,
    token: String,
    now_ms: i64,
) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(err) => {
            warn!(job = job_id, "the MLflow endpoint: {err}");
            return;
        }
    };
    let ep = Arc::new(Endpoint {
        engine,
        token,
        tracking: Mutex::new(Tracking::new(job_id, attempt, now_ms)),
        next: Mutex::new(tokio::time::Instant::now()),
    });
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(err) => {
                debug!(job = job_id, "the MLflow endpoint: accepting: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        // Only the job's own processes reach it: too many at once is the job's own doing.
        if conns.len() >= MLFLOW_CONNECTIONS {
            drop(stream);
            continue;
        }
        let ep = ep.clone();
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let ep = ep.clone();
                async move { Ok::<_, std::convert::Infallible>(ep.serve(req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(MLFLOW_IDLE)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(err) = conn.await {
                debug!("the MLflow endpoint: a connection ended: {err}");
            }
        });
    }
}

#[cfg(test)]
#[path = "mlflow_tests.rs"]
mod tests;
