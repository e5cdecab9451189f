//! Attacks on a job's MLflow endpoint (issue 30) by the job's own owner: whatever a job sends to
//! the endpoint the root engine serves for it, the engine's memory stays bounded (the store keeps
//! the results within `[results]`; what `runs/get` reads back is kept in memory within a budget).

use crate::helpers::*;
use std::path::Path;

fn submit_as(e: &Engine, u: &User, dir: &Path, file: &str, text: &str) -> i64 {
    let f = u.write(&dir.join(file), text);
    let v = e.json_as(u, &["submit", f.to_str().unwrap()]);
    v[0]["job_ids"][0]
        .as_i64()
        .unwrap_or_else(|| panic!("submit failed: {v}"))
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// 400 runs, each with a 400 KB name and user id and 100 params of 1,900 bytes: ~400 MB if the
/// engine kept it all. Then it says so and holds on until `go`, its endpoint still up.
const FLOOD: &str = r#"import os, json, http.client, urllib.parse, time
u = urllib.parse.urlparse(os.environ['MLFLOW_TRACKING_URI'])
h = {'Authorization': 'Bearer ' + os.environ['MLFLOW_TRACKING_TOKEN'], 'Content-Type': 'application/json'}
c = http.client.HTTPConnection(u.hostname, u.port)
def post(path, body):
    c.request('POST', '/api/2.0/mlflow/' + path, json.dumps(body), h)
    r = c.getresponse()
    return r.status, json.loads(r.read())
codes = {}
big = 'n' * 400000
for i in range(400):
    s, r = post('runs/create', {'experiment_id': '0', 'run_name': big + str(i), 'user_id': big})
    codes[s] = codes.get(s, 0) + 1
    if s != 200:
        continue
    rid = r['run']['info']['run_id']
    s, _ = post('runs/log-batch', {'run_id': rid, 'params': [{'key': 'p%d' % j, 'value': 'v' * 1900} for j in range(100)]})
    codes[s] = codes.get(s, 0) + 1
print('codes', json.dumps(codes), flush=True)
open('flooded', 'w').close()
while not os.path.exists('go'):
    time.sleep(0.1)
"#;

#[test]
fn a_job_flooding_its_mlflow_endpoint_with_huge_runs_and_params_does_not_grow_the_engines_memory() {
    let e = Engine::start_unbounded_cpu_only(&[]);
    let alice = user("gantry-alice");
    let dir = alice.private_dir("security-mlflow-flood");
    alice.write(&dir.join("flood.py"), FLOOD);
    let d = dir.display();
    let spec =
        format!("name: flood\nimage: host\ngpus: 0\nworkdir: {d}\nmounts: ['{d}:{d}']\ncommand: python3 flood.py\n");
    let before = rss_kib(e.pid());
    let id = submit_as(&e, &alice, &dir, "flood.yaml", &spec);
    e.wait_until("the flood sent", || dir.join("flooded").exists());
    let during = rss_kib(e.pid());
    std::fs::write(dir.join("go"), "").unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    // Training goes on: every call was answered 200.
    assert!(e.logs(id).contains(r#"codes {"200": 800}"#), "{}", e.logs(id));
    let grown = during.saturating_sub(before) / 1024;
    eprintln!(
        "engine RSS: {} MiB before, {} MiB while the job held its runs",
        before / 1024,
        during / 1024
    );
    assert!(
        grown < 128,
        "the engine grew by {grown} MiB serving one job's MLflow calls"
    );
}
