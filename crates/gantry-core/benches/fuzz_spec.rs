//! Fuzzes the job spec parser for a fixed time: `scripts/fuzz-spec.sh [SECONDS] [SEED]`. Not a test
//! and not in CI. Specs arrive from any local user (CLI, drop folder) and are parsed inside the root
//! engine, so a panic, a stack overflow or a hang there is a denial of service for everyone.
//!
//! Inputs: known-nasty texts first (deep nesting, alias bombs, huge lines), then, until time is up,
//! a mix of generated specs (every field, interesting values, YAML and TOML), mutated ones (byte
//! flips, syntax tokens, splices of earlier inputs) and random bytes. Each text goes through
//! `validate_text` as YAML and as TOML, `parse_template` and, when valid, `expand`, on a thread with a
//! tokio worker's 2 MiB stack. Besides panics it checks what the engine relies on: an accepted job
//! stays within the documented limits, survives the store's JSON round trip, and its durations fit
//! the engine's i64 milliseconds, and parsing one spec takes under a second. Findings (one file per
//! kind, with the first input) go to target/fuzz-spec/; the run exits 1 when there are any.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_core::spec::{self, Format, Origin, ValidJob};
use serde_json::{json, Map, Value};

/// Every documented field.
const FIELDS: &[&str] = &[
    "name",
    "image",
    "command",
    "workdir",
    "env",
    "mounts",
    "gpus",
    "gpu_memory",
    "priority",
    "timeout",
    "retries",
    "expected_runtime",
    "after",
    "matrix",
];

const STRINGS: &[&str] = &[
    "",
    " ",
    "a",
    "busybox",
    "gantry-test/busybox:1",
    "a b",
    "\t",
    "\u{0}",
    "é",
    "日本語",
    "\u{202e}evil",
    "\u{feff}",
    "\x1b[31mred",
    "\r\n",
    "'",
    "\"",
    "#",
    ":",
    "- ",
    "{",
    "[",
    "*a",
    "&a",
    "!!binary",
    "~",
    "null",
    "true",
    "0x10",
    "1e999",
    "-0",
    "NaN",
    ".inf",
    "{lr}",
    "{config}",
    "{config}{config}",
    "../..",
    "/",
    "a:b:c",
    "${HOME}",
    "%s%n",
    "\\",
    "\u{10ffff}",
];
const INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    63,
    64,
    65,
    100,
    101,
    1000,
    i32::MAX as i64,
    i32::MIN as i64,
    i32::MAX as i64 + 1,
    i64::MAX,
    i64::MIN,
];
const SIZES: &[&str] = &[
    "20GiB",
    "0",
    "1",
    "1.5T",
    "512 MiB",
    "99999999999999999999TiB",
    "1e309",
    "-1G",
    ".5G",
    "5.G",
    "NaN",
    "inf",
    "GiB",
    "1..2G",
    " 3 g ",
    "18446744073709551616",
    "0.0000001K",
    "١٢GiB",
];
const DURATIONS: &[&str] = &[
    "24h",
    "0s",
    "1ns",
    "90m",
    "1h 30m",
    "18446744073709551615s",
    "584942417355y",
    "300000000y",
    "99999999999999h",
    "1y",
    "-1s",
    "1.5h",
    "1h1h1h",
    "",
    "  ",
    "1 fortnight",
];
const HOSTS: &[&str] = &[
    "/data",
    "rel",
    "../../etc",
    "/var/run/docker.sock",
    "/a/../var/run/docker.sock",
    "",
    "/",
    "//x",
    "/x/./y",
    "~",
    "/run/containerd/x",
    "x/../../../../",
    "/srv/g/gantry.sock",
    "/tmp/\u{0}",
    "/é",
];
const CONTAINERS: &[&str] = &["/d", "d", "", "/", "/a:b", "/gantry/config/x"];
const MODES: &[&str] = &["ro", "rw", "xx", "", "ro:ro"];
/// Syntax pieces for mutations.
const TOKENS: &[&str] = &[
    ":",
    ": ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    "#",
    "&a ",
    "*a",
    "!!str ",
    "!!int ",
    "\n",
    "\t",
    "  ",
    "=",
    " = ",
    "[[x]]\n",
    "[x]\n",
    "\"\"\"",
    "'''",
    "\\u0000",
    "\\",
    "é",
    "\u{feff}",
    "---\n",
    "...\n",
    "%YAML 1.2\n",
    "<<: *a\n",
    "? ",
    "|\n",
    ">-\n",
    "0x",
    "1e",
    "-",
    "inf",
    ".nan",
    "~",
    ",",
    "0o7",
    "1979-05-27T07:32:00Z",
    "\r",
    "\u{0}",
    "{config}",
    "{lr}",
    "image: a\n",
    "image = \"a\"\n",
    "matrix:\n  a: [1, 2]\n",
];

/// The seeds for mutation: valid specs in both syntaxes, using every feature.
const SEEDS: &[&str] = &[
    "name: resnet\nimage: paddle:2.6\ncommand: [python, train.py]\nworkdir: /w\nenv: {A: '1'}\nmounts: ['/data:/data:ro', 'out:/out']\ngpus: 2\ngpu_memory: 20GiB\npriority: 5\ntimeout: 24h\nretries: 2\n",
    "name: sweep\nimage: a\ncommand: python train.py --lr {lr} --bs {bs}\nmatrix: {lr: [0.1, 0.01], bs: [32, 64]}\nafter: [12, prep]\nexpected_runtime: 2h\n",
    "image = \"busybox\"\ncommand = \"echo hi\"\n",
    "image = \"paddle\"\ncommand = \"python tools/train.py -c {config}\"\ngpus = 1\n[env]\nA = \"1\"\n[matrix]\nlr = [0.1, 0.2]\nflag = [true, false]\n",
    "base: &b\n  image: a\n  gpus: 0\n<<: *b\ncommand: |\n  echo one\n  echo two\n",
    "image: !!str 123\ngpus: 0x1\npriority: -0\nmatrix: {x: [.nan, .inf, -.inf, ~, 'a', 1e308]}\n",
    "%YAML 1.2\n---\nimage: a\n...\n---\nimage: b\n",
    "image = 'a'\nmounts = ['/x:/y:ro']\nafter = [1, \"two\"]\nexpected_runtime = \"1h 30m\"\ntimeout = \"90m\"\n",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

fn gen_string(r: &mut Rng) -> String {
    match r.below(4) {
        0 => r.pick(STRINGS).to_string(),
        1 => r.pick(STRINGS).repeat(1 + r.below(300)),
        2 => (0..r.below(40))
            .map(|_| char::from_u32(r.below(0x11_0000) as u32).unwrap_or('x'))
            .collect(),
        _ => format!("{}{}", r.pick(STRINGS), r.pick(STRINGS)),
    }
}

fn gen_scalar(r: &mut Rng) -> Value {
    match r.below(5) {
        0 => json!(*r.pick(INTS)),
        1 => json!([0.1, 1e308, -0.0, 5e-324, 0.5][r.below(5)]),
        2 => json!(r.chance(50)),
        3 => json!(gen_string(r)),
        _ => json!(r.pick(DURATIONS)),
    }
}

/// Anything at all, nested a little.
fn gen_any(r: &mut Rng, depth: u32) -> Value {
    match if depth > 2 { 0 } else { r.below(3) } {
        0 => gen_scalar(r),
        1 => Value::Array((0..r.below(4)).map(|_| gen_any(r, depth + 1)).collect()),
        _ => Value::Object(
            (0..r.below(4))
                .map(|_| (gen_string(r), gen_any(r, depth + 1)))
                .collect(),
        ),
    }
}

fn gen_mount(r: &mut Rng) -> String {
    let mut m = format!("{}:{}", r.pick(HOSTS), r.pick(CONTAINERS));
    if r.chance(50) {
        let _ = write!(m, ":{}", r.pick(MODES));
    }
    m
}

/// A plausible value for `field`, or (sometimes) anything.
fn gen_field(r: &mut Rng, field: &str) -> Value {
    if r.chance(10) {
        return gen_any(r, 0);
    }
    match field {
        "command" if r.chance(50) => Value::Array((0..r.below(4)).map(|_| json!(gen_string(r))).collect()),
        "env" => Value::Object((0..r.below(4)).map(|_| (gen_string(r), json!(gen_string(r)))).collect()),
        "mounts" => Value::Array((0..r.below(4)).map(|_| json!(gen_mount(r))).collect()),
        "gpus" | "priority" | "retries" => json!(*r.pick(INTS)),
        "gpu_memory" => json!(r.pick(SIZES)),
        "timeout" | "expected_runtime" => json!(r.pick(DURATIONS)),
        "after" => Value::Array(
            (0..r.below(4))
                .map(|_| {
                    if r.chance(50) {
                        json!(*r.pick(INTS))
                    } else {
                        json!(gen_string(r))
                    }
                })
                .collect(),
        ),
        "matrix" => {
            // 64 keys of 2 values: 2^64 combinations, which wraps a usize product to 0.
            let keys = *r.pick(&[0usize, 1, 2, 3, 10, 40, 63, 64, 65, 70]);
            let width = 1 + r.below(3);
            Value::Object(
                (0..keys)
                    .map(|k| {
                        (
                            format!("k{k}"),
                            Value::Array((0..width).map(|_| gen_scalar(r)).collect()),
                        )
                    })
                    .collect(),
            )
        }
        _ => json!(gen_string(r)),
    }
}

/// A spec built field by field, written as YAML or TOML.
fn gen_spec(r: &mut Rng) -> Option<String> {
    let mut m = Map::new();
    for f in FIELDS {
        if *f == "image" && r.chance(90) || r.chance(40) {
            m.insert(f.to_string(), gen_field(r, f));
        }
    }
    if r.chance(5) {
        m.insert(gen_string(r), gen_any(r, 0)); // an unknown field
    }
    let v = Value::Object(m);
    if r.chance(50) {
        serde_yaml_ng::to_string(&v).ok()
    } else {
        toml::to_string(&v).ok()
    }
}

fn mutate(r: &mut Rng, corpus: &[String]) -> String {
    let mut b: Vec<u8> = r.pick(corpus).clone().into_bytes();
    for _ in 0..1 + r.below(4) {
        let at = r.below(b.len() + 1);
        match r.below(7) {
            0 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] = r.next() as u8;
            }
            1 => {
                let t = r.pick(TOKENS).as_bytes().to_vec();
                b.splice(at..at, t);
            }
            2 => {
                let end = (at + r.below(16)).min(b.len());
                b.drain(at..end);
            }
            3 => {
                let end = (at + r.below(32)).min(b.len());
                let piece = b[at..end].repeat(1 + r.below(10));
                b.splice(at..at, piece);
            }
            4 => {
                let other = r.pick(corpus).as_bytes();
                let from = r.below(other.len() + 1);
                b.truncate(at);
                b.extend_from_slice(&other[from..]);
            }
            5 => b.truncate(at),
            _ => {
                let line = format!(
                    "{}{}{}\n",
                    r.pick(FIELDS),
                    r.pick(&[": ", " = ", ":", "="]),
                    gen_scalar(r)
                );
                b.splice(at..at, line.into_bytes());
            }
        }
    }
    b.truncate(64 << 10);
    String::from_utf8_lossy(&b).into_owned()
}

fn random_text(r: &mut Rng) -> String {
    let n = r.below(200);
    if r.chance(50) {
        let bytes: Vec<u8> = (0..n).map(|_| r.next() as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        (0..n).map(|_| *r.pick(TOKENS)).collect()
    }
}

/// Known-nasty inputs, tried first: (what, text).
fn nasty() -> Vec<(String, String)> {
    let mut v = vec![];
    for n in [1_000, 10_000, 30_000] {
        v.push((format!("{n} nested ["), format!("image: {}", "[".repeat(n))));
        v.push((format!("{n} nested {{"), format!("image: a\nenv: {}", "{a: ".repeat(n))));
        v.push((
            format!("{n} nested TOML arrays"),
            format!("image = \"a\"\nafter = {}", "[".repeat(n)),
        ));
        v.push((
            format!("{n} nested TOML inline tables"),
            format!("image = \"a\"\nenv = {}", "{a = ".repeat(n)),
        ));
    }
    v.push((
        "1400 nested block lists".into(),
        (0..1_400).map(|i| format!("{}- \n", " ".repeat(i))).collect(),
    ));
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let _ = writeln!(
            bomb,
            "{}: &{} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]",
            (b'a' + i) as char,
            (b'a' + i) as char,
            p = (b'a' + i - 1) as char
        );
    }
    bomb.push_str("image: a\nmatrix: {k: *l}\n");
    v.push(("alias bomb (10^12 elements)".into(), bomb));
    v.push(("1 MiB line".into(), format!("image: {}\n", "a".repeat(1 << 20))));
    v.push((
        "1 MiB of keys".into(),
        (0..60_000).map(|i| format!("k{i}: 1\n")).collect(),
    ));
    v.push((
        "100k matrix values".into(),
        format!("image: a\nmatrix:\n  k: [{}]\n", vec!["1"; 100_000].join(",")),
    ));
    v.push((
        "64 matrix keys x 2".into(),
        format!(
            "image: a\nmatrix:\n{}",
            (0..64).map(|k| format!("  k{k}: [1, 2]\n")).collect::<String>()
        ),
    ));
    // The engine reads at most MAX_SPEC_BYTES of a spec.
    for (_, t) in v.iter_mut() {
        let mut end = t.len().min(spec::MAX_SPEC_BYTES as usize);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
    }
    v
}

/// A broken rule: (kind, for de-duplication; detail).
type Problem = (String, String);

/// Checks one text in both syntaxes; returns broken rules (panics propagate to the caller).
fn check(text: &str, origin: &Origin) -> Vec<Problem> {
    let mut bad = vec![];
    for format in [Format::Yaml, Format::Toml] {
        let t0 = Instant::now();
        let parsed = spec::validate_text(text, format, origin);
        if t0.elapsed() > SLOW {
            bad.push((
                format!("slow {format:?} parse"),
                format!("validate_text took {:.1?} for {} bytes", t0.elapsed(), text.len()),
            ));
        }
        match parsed {
            Ok(job) => check_valid(&job, &mut bad),
            Err(e) => {
                // YAML also breaks lines at a lone CR, and reports an unexpected end one line further.
                let lines = text
                    .replace("\r\n", "\n")
                    .chars()
                    .filter(|c| matches!(c, '\n' | '\r'))
                    .count()
                    + 2;
                if e.message.trim().is_empty() {
                    bad.push((format!("{format:?} error without a message"), format!("{e:?}")));
                }
                if e.line.is_some_and(|l| l == 0 || l > lines) {
                    bad.push((
                        format!("{format:?} error line out of range"),
                        format!("line {:?} of {lines}: {e}", e.line),
                    ));
                }
                let _ = e.to_string();
            }
        }
        if let Ok(t) = spec::parse_template(text, format) {
            let inst = spec::instantiate_template(&t, "tmpl", "/home/u/Gantry/inbox/tmpl/accepted/1-x.yaml", "x.yaml");
            if let Ok(job) = spec::validate(inst.spec, origin) {
                check_valid(&job, &mut bad);
            }
        }
    }
    bad
}

fn check_valid(job: &ValidJob, bad: &mut Vec<Problem>) {
    let s = &job.spec;
    let mut rule = |broken: bool, kind: &str, detail: String| {
        if broken {
            bad.push((kind.to_string(), detail));
        }
    };
    rule(job.gpus > 64, "accepted gpus > 64", format!("gpus {}", job.gpus));
    rule(
        job.retries > 100,
        "accepted retries > 100",
        format!("retries {}", job.retries),
    );
    rule(
        job.name.trim().is_empty(),
        "accepted an empty name",
        format!("name {:?}", job.name),
    );
    let chars = job.name.chars().count();
    rule(
        chars > gantry_core::spec::MAX_NAME_CHARS,
        "accepted a name over the length limit",
        format!("{chars} characters"),
    );
    rule(
        s.image.trim().is_empty(),
        "accepted an empty image",
        format!("image {:?}", s.image),
    );
    for m in &job.mounts {
        let normal = m.host.starts_with('/')
            && !m.host.split('/').any(|c| c == ".." || c == ".")
            && m.container.starts_with('/');
        rule(
            !normal,
            "accepted a mount that is not absolute and normalized",
            format!("{m:?}"),
        );
        let engine = [
            "/var/run/docker.sock",
            "/run/docker.sock",
            "/run/containerd",
            "/var/run/containerd",
        ]
        .iter()
        .any(|f| m.host.starts_with(f));
        rule(engine, "accepted a mount of the container engine", format!("{m:?}"));
    }
    // The store keeps milliseconds as i64 (`as i64`, wrapping) and the engine adds them to "now".
    let now_ms = 1_800_000_000_000u128;
    for (what, d) in [("timeout", job.timeout), ("expected_runtime", job.expected_runtime)] {
        if let Some(d) = d.filter(|d| d.as_millis() + now_ms > i64::MAX as u128) {
            rule(
                true,
                &format!("accepted a {what} that overflows i64 milliseconds"),
                format!("{d:?} = {} ms", d.as_millis()),
            );
        }
    }
    let combos = s.matrix.values().try_fold(1usize, |acc, v| acc.checked_mul(v.len()));
    match combos {
        Some(c) if c <= 1000 => {
            let jobs = spec::expand(job);
            rule(
                jobs.len() != c,
                "expand made the wrong number of jobs",
                format!("{} jobs for {c} combinations", jobs.len()),
            );
            for j in jobs {
                // The store keeps each job as JSON and reads it back for every later step.
                let back = serde_json::to_string(&j).map(|t| serde_json::from_str::<ValidJob>(&t));
                if !matches!(&back, Ok(Ok(b)) if *b == j) {
                    rule(
                        true,
                        "an accepted job does not survive the store's JSON round trip",
                        format!("{back:?}"),
                    );
                }
            }
        }
        _ => rule(
            true,
            "accepted a matrix over 1000 combinations",
            combos.map_or("more than 2^64".into(), |c| c.to_string()),
        ),
    }
}

/// Parsing one spec (at most 1 MiB) longer than this stalls the engine for everyone.
const SLOW: Duration = Duration::from_secs(1);

/// The text being checked, for the abort handler (a stack overflow cannot be caught).
static CURRENT: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static CURRENT_LEN: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_abort(_: libc::c_int) {
    let (p, n) = (CURRENT.load(Ordering::SeqCst), CURRENT_LEN.load(Ordering::SeqCst));
    let head = b"\nfuzz-spec: the process aborted (stack overflow?) on this input:\n";
    // SAFETY: write(2) is async-signal-safe; `p..p+n` is the live input string of the fuzz thread.
    unsafe {
        libc::write(2, head.as_ptr().cast(), head.len());
        if !p.is_null() {
            libc::write(2, p.cast(), n.min(4096));
        }
        libc::signal(libc::SIGABRT, libc::SIG_DFL);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let seconds: u64 = args.first().map(|s| s.parse().expect("SECONDS")).unwrap_or(60);
    let seed: u64 = args.get(1).map(|s| s.parse().expect("SEED")).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    let out_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-spec");
    println!(
        "fuzz-spec: {seconds} s, seed {seed}; crashes go to {}",
        out_dir.display()
    );
    let panic_msg: Arc<Mutex<String>> = Arc::default();
    {
        let m = panic_msg.clone();
        std::panic::set_hook(Box::new(move |info| *m.lock().unwrap() = info.to_string()));
    }
    // SAFETY: installing a plain C handler for SIGABRT.
    unsafe { libc::signal(libc::SIGABRT, on_abort as *const () as libc::sighandler_t) };
    // A tokio worker's stack: the engine parses specs on one.
    let fuzz = std::thread::Builder::new().stack_size(2 << 20).spawn(move || {
        let mut r = Rng(seed);
        let (mut tried, mut valid) = (0u64, 0u64);
        let mut corpus: Vec<String> = SEEDS.iter().map(|s| s.to_string()).collect();
        // Per kind of problem: how often, the first detail and the first input.
        let mut findings: BTreeMap<String, (u64, String, String)> = BTreeMap::new();
        let origins = [
            Origin::default(),
            Origin {
                file_name: Some("x.yaml".into()),
                base_dir: Some("/home/u/specs".into()),
            },
            Origin {
                file_name: Some(format!("{}.toml", "n".repeat(250))),
                base_dir: Some("/".into()),
            },
            Origin {
                file_name: Some(".yaml".into()),
                base_dir: None,
            },
        ];
        let run =
            |what: &str, text: &str, origin: &Origin, findings: &mut BTreeMap<String, (u64, String, String)>| -> bool {
                CURRENT_LEN.store(text.len(), Ordering::SeqCst);
                CURRENT.store(text.as_ptr() as *mut u8, Ordering::SeqCst);
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| check(text, origin)));
                let problems = result.unwrap_or_else(|_| {
                    let msg = panic_msg.lock().unwrap().clone();
                    vec![(format!("PANIC {}", msg.lines().next().unwrap_or("")), msg)]
                });
                let ok = problems.is_empty();
                for (kind, detail) in problems {
                    let f = findings.entry(kind.clone()).or_insert_with(|| {
                        println!(
                            "FOUND ({what}): {kind}: {detail}\n  input ({} bytes): {:?}",
                            text.len(),
                            text.chars().take(300).collect::<String>()
                        );
                        (0, detail, text.to_string())
                    });
                    f.0 += 1;
                }
                ok
            };
        for (what, text) in nasty() {
            let t0 = Instant::now();
            tried += 1;
            run(&what, &text, &origins[0], &mut findings);
            println!("  nasty input: {what}: {:.1?}", t0.elapsed());
        }
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < deadline {
            let (what, text) = match r.below(10) {
                0..=3 => ("generated", gen_spec(&mut r).unwrap_or_default()),
                4..=8 => ("mutated", mutate(&mut r, &corpus)),
                _ => ("random", random_text(&mut r)),
            };
            let origin = &origins[r.below(origins.len())];
            tried += 1;
            if run(what, &text, origin, &mut findings) && spec::validate_text(&text, Format::Yaml, origin).is_ok() {
                valid += 1;
                // Valid inputs are the best seeds for more mutation; keep a bounded, rotating set.
                if corpus.len() < 2000 {
                    corpus.push(text);
                } else {
                    let i = SEEDS.len() + r.below(corpus.len() - SEEDS.len());
                    corpus[i] = text;
                }
            }
            if tried % 100_000 == 0 {
                println!("  {tried} inputs, {valid} valid, {} kinds of finding", findings.len());
            }
        }
        (findings, tried, valid)
    });
    let (findings, tried, valid) = fuzz.expect("spawn").join().expect("the fuzz thread died");
    std::fs::create_dir_all(&out_dir).unwrap();
    println!("fuzz-spec: {tried} inputs tried ({valid} valid YAML specs), seed {seed}");
    for (i, (kind, (n, detail, input))) in findings.iter().enumerate() {
        println!("  {n:>8} x {kind}");
        std::fs::write(
            out_dir.join(format!("finding-{i}.txt")),
            format!("{kind}\n{detail}\n---- input ----\n{input}"),
        )
        .unwrap();
    }
    if !findings.is_empty() {
        std::process::exit(1);
    }
}
