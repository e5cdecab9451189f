//! Choosing GPUs (issue 12, item 5): `gpu_type` and `min_gpu_memory` route jobs on a machine with
//! mixed cards, MIG instances are devices of their own, and multi-GPU jobs get the best-connected GPUs
//! when NVML reports the topology.

use crate::helpers::*;
use serde_json::{json, Value};
use std::process::Command;

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The GPUs of a job's latest attempt.
fn gpus_of(e: &Engine, id: i64) -> Vec<u64> {
    let d = e.wait_state(id, "running");
    d["attempts"].as_array().unwrap().last().unwrap()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect()
}

fn refused(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "must be refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_mixed_machine_routes_jobs_by_gpu_type_and_memory_and_refuses_what_it_has_not() {
    let e = Engine::start(&["--gpus", "sim:2xA100-40GiB+2xH100-80GiB"]);
    let names: Vec<(u64, String)> = e.json(&["gpus"])["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["index"].as_u64().unwrap(), g["name"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        names,
        vec![
            (0, "Simulated A100".into()),
            (1, "Simulated A100".into()),
            (2, "Simulated H100".into()),
            (3, "Simulated H100".into())
        ]
    );

    // Any case, part of the name: both land on the H100s although GPUs 0 and 1 come first.
    let h1 = e.submit_yaml("h1", &format!("image: {IMAGE}\ncommand: sleep 300\ngpu_type: h100\n"));
    let h2 = e.submit_yaml("h2", &format!("image: {IMAGE}\ncommand: sleep 300\ngpu_type: H100\n"));
    let mut on = [gpus_of(&e, h1), gpus_of(&e, h2)].concat();
    on.sort();
    assert_eq!(on, vec![2, 3]);

    // Only the H100s have 60 GiB: with both busy, the job waits and says for what, while the A100s idle.
    let big = e.submit_yaml(
        "big",
        &format!("image: {IMAGE}\ncommand: sleep 300\nmin_gpu_memory: 60GiB\n"),
    );
    e.wait_until("the reason naming the filter", || {
        e.show(big)["reason"].as_str().is_some_and(|r| {
            r.starts_with("waits for a GPU with ≥ 60.0 GiB: GPUs 2,3 match; needs 1 free GPU, 0 available")
        })
    });
    assert_eq!(e.show(big)["job"]["state"], "queued");
    // `gantry run` takes the same choice as flags.
    let out = e.gantry(&[
        "--json",
        "run",
        "--image",
        IMAGE,
        "--gpu-type",
        "A100",
        "--",
        "sleep",
        "300",
    ]);
    assert!(out.status.success(), "{out:?}");
    let run_id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["job_id"]
        .as_i64()
        .unwrap();
    assert!(gpus_of(&e, run_id)[0] < 2, "an A100");
    // A freed H100 goes to the waiting job.
    assert!(e.gantry(&["cancel", &h1.to_string()]).status.success());
    let freed = e.wait_final(h1)["attempts"][0]["gpus"][0].as_u64().unwrap();
    assert_eq!(gpus_of(&e, big), vec![freed]);

    // What the machine does not have is refused at submit, with the machine's GPUs listed.
    let listed = "GPU 0 Simulated A100 (40.0 GiB); GPU 1 Simulated A100 (40.0 GiB); GPU 2 Simulated H100 (80.0 GiB); GPU 3 Simulated H100 (80.0 GiB)";
    let f = e.write_spec("v100.yaml", &format!("image: {IMAGE}\ngpu_type: V100\n"));
    let err = refused(&e.gantry(&["submit", f.to_str().unwrap()]));
    assert!(
        err.contains("the job asks for a V100, this machine has 0 such GPUs for Gantry jobs") && err.contains(listed),
        "{err}"
    );
    let err = refused(&e.gantry(&[
        "run",
        "--image",
        IMAGE,
        "--gpus",
        "3",
        "--gpu-type",
        "h100",
        "--min-gpu-memory",
        "40GiB",
        "--",
        "true",
    ]));
    assert!(
        err.contains("the job asks for 3 h100s with ≥ 40.0 GiB, this machine has 2 such GPUs") && err.contains(listed),
        "{err}"
    );
    let f = e.write_spec("huge.yaml", &format!("image: {IMAGE}\nmin_gpu_memory: 100GiB\n"));
    assert!(refused(&e.gantry(&["submit", f.to_str().unwrap()])).contains(listed));
    // Nothing was queued by the refusals.
    assert_eq!(e.json(&["ls"]).as_array().unwrap().len(), 3);
}

/// A MIG instance's UUID for this test.
fn mig_uuid(gpus: &FakeGpus, i: u32) -> String {
    gpus.uuid(100 + i).replacen("GPU-", "MIG-", 1)
}

#[test]
fn mig_instances_are_devices_with_their_own_uuid_and_memory_and_jobs_land_on_them() {
    require_gpu_docker();
    let gpus = FakeGpus::new();
    let mig = |i: u32, profile: &str, gib: u64| json!({"uuid": mig_uuid(&gpus, i), "name": format!("NVIDIA A100-SXM4-40GB MIG {profile}"), "memory_total": gib << 30, "memory_used": 0});
    let mut a100 = fake_gpu(&gpus.uuid(0), "NVIDIA A100-SXM4-40GB", 40, 0, &[]);
    a100["mig"] = json!([mig(0, "3g.20gb", 20), mig(1, "1g.5gb", 5)]);
    gpus.set(json!([
        a100,
        fake_gpu(&gpus.uuid(1), "NVIDIA H100 80GB HBM3", 80, 0, &[])
    ]));
    let e = Engine::start_nvml(&gpus, &[]);

    // The A100 in MIG mode is its two instances (numbered after the physical GPUs); the H100 keeps index 1.
    let g = e.json(&["gpus"]);
    let devices: Vec<(u64, &str, u64, Option<u64>)> = g["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().unwrap(),
                d["uuid"].as_str().unwrap(),
                d["memory_total"].as_u64().unwrap(),
                d["mig_parent"]["index"].as_u64(),
            )
        })
        .collect();
    let (m0, m1, h100) = (mig_uuid(&gpus, 0), mig_uuid(&gpus, 1), gpus.uuid(1));
    assert_eq!(
        devices,
        vec![
            (1, h100.as_str(), 80 << 30, None),
            (2, m0.as_str(), 20 << 30, Some(0)),
            (3, m1.as_str(), 5 << 30, Some(0))
        ],
        "{g}"
    );
    assert_eq!(g["gpus"][1]["mig_parent"]["uuid"], gpus.uuid(0), "{g}");
    assert_eq!(g["gpus"][1]["name"], "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "{g}");
    let listing = String::from_utf8_lossy(&e.gantry(&["gpus"]).stdout).into_owned();
    assert!(
        listing.contains(&format!("MIG instance {m0} of GPU 0 (NVIDIA A100-SXM4-40GB)")),
        "{listing}"
    );

    // A job asking for the 3g.20gb profile gets that instance, by its MIG UUID, in the container.
    let id = e.submit_yaml(
        "mig",
        &format!("image: {IMAGE}\ncommand: sleep 300\ngpu_type: 3g.20gb\n"),
    );
    assert_eq!(gpus_of(&e, id), vec![2]);
    let d = e.show(id);
    // The running attempt's container (the one whose GPUs were read above): under a loaded suite an
    // attempt can end before it starts (another test's engine took the shared network away) and the
    // job runs in its next one.
    let cid = d["attempts"].as_array().unwrap().last().unwrap()["container_id"]
        .as_str()
        .unwrap();
    let env: Vec<String> = serde_json::from_str(&docker(&["inspect", "-f", "{{json .Config.Env}}", cid])).unwrap();
    assert!(env.contains(&format!("NVIDIA_VISIBLE_DEVICES={m0}")), "{env:?}");
    let req: Value =
        serde_json::from_str(&docker(&["inspect", "-f", "{{json .HostConfig.DeviceRequests}}", cid])).unwrap();
    assert_eq!(req[0]["DeviceIDs"], json!([m0]), "{req}");
    // 20 GiB does not fit the 5 GiB instance; 4 GiB does.
    let small = e.submit_yaml(
        "small",
        &format!("image: {IMAGE}\ncommand: sleep 300\ngpu_type: MIG\nmin_gpu_memory: 4GiB\n"),
    );
    assert_eq!(gpus_of(&e, small), vec![3]);
}

#[test]
fn a_two_gpu_job_gets_the_nvlink_pair_and_its_detail_says_so() {
    require_gpu_docker();
    let gpus = FakeGpus::new();
    let h100 = "NVIDIA H100 80GB HBM3";
    gpus.set_config(json!({
        "gpus": (0..4).map(|i| fake_gpu(&gpus.uuid(i), h100, 80, 0, &[])).collect::<Vec<_>>(),
        "topology": [
            {"gpus": [0, 1], "ancestor": "single"},
            {"gpus": [2, 3], "ancestor": "single"},
            {"gpus": [1, 3], "ancestor": "multiple", "nvlink": true},
        ],
    }));
    let e = Engine::start_nvml(&gpus, &[]);
    let listing = String::from_utf8_lossy(&e.gantry(&["gpus"]).stdout).into_owned();
    assert!(
        listing.contains("links: NVLink: 1-3; same PCIe switch: 0-1, 2-3; across CPU sockets: 0-2, 0-3, 1-2"),
        "{listing}"
    );

    let first = e.submit_yaml("pair", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 2\n"));
    assert_eq!(
        gpus_of(&e, first),
        vec![1, 3],
        "the NVLink pair, not the first two GPUs"
    );
    let second = e.submit_yaml("rest", &format!("image: {IMAGE}\ncommand: sleep 300\ngpus: 2\n"));
    assert_eq!(gpus_of(&e, second), vec![0, 2]);

    let said = |id: i64| {
        e.show(id)["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|ev| ev["message"].as_str().map(String::from))
            .find(|m| m.starts_with("attempt 1 on"))
    };
    assert_eq!(said(first).as_deref(), Some("attempt 1 on GPU 1,3 (GPUs 1,3: NVLink)"));
    assert_eq!(
        said(second).as_deref(),
        Some("attempt 1 on GPU 0,2 (GPUs 0,2: across CPU sockets)")
    );
    let detail = String::from_utf8_lossy(&e.gantry(&["show", &first.to_string()]).stdout).into_owned();
    assert!(detail.contains("GPUs 1,3: NVLink"), "{detail}");
}
