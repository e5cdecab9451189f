//! Unit tests of the executor: GPUs held by foreign containers, the job's environment, the host
//! root's tar and reading a file out of a tar stream.

use super::docker::first_plain_file;
use super::*;
use crate::spec::{validate_text, Format, Origin};

fn launch(job: &ValidJob, uuids: &[&str]) -> Vec<String> {
    job_env(&Launch {
        preemptible: false,
        restart_count: 0,
        engine_id: "e",
        db_uid: "d",
        name: "gantry-d-j7-a1".into(),
        job_id: 7,
        attempt_id: 1,
        attempt_n: 1,
        job,
        uid: 1000,
        gid: 1000,
        groups: vec![],
        mounts: vec![],
        gpus: (0..uuids.len() as u32).collect(),
        gpu_uuids: uuids.iter().map(|s| s.to_string()).collect(),
        gpu_total_memory: Some(40 << 30),
        binding: GpuBinding::EnvOnly,
        container: ContainerSettings {
            home: Some("/home/u".into()),
            ..Default::default()
        },
        command: None,
        image: None,
        results_env: vec![("GANTRY_METRICS".into(), "/gantry/results/metrics-1.jsonl".into())],
        start_gate: None,
    })
}

#[test]
fn the_host_root_mirrors_the_machines_links_and_mounts_its_folders() {
    let merged = [
        ("usr", TopLevel::Dir),
        ("bin", TopLevel::Link("usr/bin".into())),
        ("lib", TopLevel::Link("usr/lib".into())),
        ("etc", TopLevel::Dir),
        ("opt", TopLevel::Dir),
    ];
    let r = HostRoot::of(&merged);
    assert_eq!(r.binds, ["/usr", "/etc", "/opt"]);
    assert!(r.tag.starts_with("gantry-host-root:"));
    let split = HostRoot::of(&[
        ("usr", TopLevel::Dir),
        ("bin", TopLevel::Dir),
        ("sbin", TopLevel::Dir),
        ("etc", TopLevel::Dir),
    ]);
    assert_eq!(
        split.binds,
        ["/usr", "/bin", "/etc"],
        "/sbin is the container's own (Docker's init is there)"
    );
    assert_ne!(r.tag, split.tag, "another layout, another image");
    assert_eq!(r.tag, HostRoot::of(&merged).tag);
    // Headers a tar reader takes: checksum, link, sticky /tmp.
    let h = &r.tar[512..1024];
    assert_eq!(&h[..4], b"tmp/");
    assert_eq!(&h[100..107], b"0001777");
    let sum: u32 = h
        .iter()
        .enumerate()
        .map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) })
        .sum();
    assert_eq!(std::str::from_utf8(&h[148..154]).unwrap(), format!("{sum:06o}"));
    let link = r.tar.chunks(512).find(|c| c.starts_with(b"bin\0")).unwrap();
    assert_eq!((link[156], &link[157..164]), (b'2', &b"usr/bin"[..]));
    assert_eq!(r.tar.len() % 512, 0);
}

#[test]
fn the_first_plain_file_of_a_tar_stream() {
    fn header(name: &str, typ: u8, size: usize) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = typ;
        h
    }
    let body = b"root:x:0:0::/root:/bin/sh\n";
    let mut tar = header("passwd", b'0', body.len());
    tar.extend_from_slice(body);
    tar.resize(1024 + 1024, 0);
    assert_eq!(first_plain_file(&tar).as_deref(), Some(&body[..]));
    let mut pax = header("PaxHeaders/passwd", b'x', 20);
    pax.extend_from_slice(&[b'p'; 20]);
    pax.resize(1024, 0);
    pax.extend_from_slice(&tar);
    assert_eq!(
        first_plain_file(&pax).as_deref(),
        Some(&body[..]),
        "an extended header first"
    );
    assert_eq!(
        first_plain_file(&header("passwd", b'2', 0)),
        None,
        "a symlink is not read"
    );
    assert_eq!(first_plain_file(&tar[..520]), None, "a cut archive");
}

#[test]
fn gpus_held_by_foreign_containers() {
    let req = |ids: Option<Vec<&str>>, count: Option<i64>| DeviceRequest {
        driver: Some("nvidia".into()),
        device_ids: ids.map(|v| v.into_iter().map(String::from).collect()),
        count,
        capabilities: Some(vec![vec!["gpu".into()]]),
        ..Default::default()
    };
    let env = |v: &str| vec![format!("NVIDIA_VISIBLE_DEVICES={v}")];
    #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
    let rows: Vec<(Vec<DeviceRequest>, Option<&str>, Vec<String>, Option<GpuSet>)> = vec![
        (
            vec![req(Some(vec!["GPU-a", "GPU-b"]), None)],
            None,
            vec![],
            Some(GpuSet::Ids(vec!["GPU-a".into(), "GPU-b".into()])),
        ),
        (vec![req(None, Some(-1))], None, vec![], Some(GpuSet::All)),
        (vec![req(None, Some(2))], None, vec![], Some(GpuSet::All)),
        // A CUDA image's own `NVIDIA_VISIBLE_DEVICES=all` gives no GPU without the nvidia runtime.
        (vec![], Some("runc"), env("all"), None),
        (vec![], Some("nvidia"), env("all"), Some(GpuSet::All)),
        (
            vec![],
            Some("nvidia"),
            env("0,GPU-c"),
            Some(GpuSet::Ids(vec!["0".into(), "GPU-c".into()])),
        ),
        (vec![], Some("nvidia"), env("void"), None),
        (vec![], None, vec![], None),
    ];
    for (reqs, rt, e, want) in rows {
        assert_eq!(gpus_of(&reqs, rt, &e), want, "{reqs:?} {rt:?} {e:?}");
    }
    assert!(GpuSet::Ids(vec!["1".into()]).holds(1, "GPU-x") && GpuSet::Ids(vec!["GPU-x".into()]).holds(3, "GPU-x"));
    assert!(!GpuSet::Ids(vec!["GPU-y".into()]).holds(0, "GPU-x"));
}

#[test]
fn env_binds_exactly_the_assigned_gpus() {
    let j = validate_text(
        "image: a\ngpus: 2\nenv: {CUDA_VISIBLE_DEVICES: '5', MY: x}\n",
        Format::Yaml,
        &Origin::default(),
    )
    .unwrap();
    let env = launch(&j, &["GPU-a", "GPU-b"]);
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b".to_string()));
    assert!(
        env.contains(&"CUDA_VISIBLE_DEVICES=0,1".to_string()),
        "a spec must not override the GPU binding: {env:?}"
    );
    assert!(env.contains(&"GANTRY_JOB_ID=7".to_string()));
    assert!(env.contains(&"GANTRY_METRICS=/gantry/results/metrics-1.jsonl".to_string()));
    assert!(env.contains(&"MY=x".to_string()));
    assert!(!env.iter().any(|e| e.starts_with("XLA_")));
    assert!(env.contains(&"HOME=/home/u".to_string()), "{env:?}");
    let own = validate_text("image: a\nenv: {HOME: /w}\n", Format::Yaml, &Origin::default()).unwrap();
    assert!(
        launch(&own, &[]).contains(&"HOME=/w".to_string()),
        "a spec's HOME is kept"
    );
}

#[test]
fn shared_gpu_gets_memory_hints_and_cpu_job_sees_none() {
    let j = validate_text("image: a\ngpu_memory: 10GiB\n", Format::Yaml, &Origin::default()).unwrap();
    let env = launch(&j, &["GPU-a"]);
    assert!(
        env.contains(&"FLAGS_fraction_of_gpu_memory_to_use=0.250".to_string()),
        "{env:?}"
    );
    assert!(env.contains(&"XLA_PYTHON_CLIENT_MEM_FRACTION=0.250".to_string()));
    assert!(env.contains(&"TF_FORCE_GPU_ALLOW_GROWTH=true".to_string()));
    let cpu = validate_text("image: a\ngpus: 0\n", Format::Yaml, &Origin::default()).unwrap();
    let env = launch(&cpu, &[]);
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
}

#[test]
fn a_string_command_runs_behind_its_start_gate_and_a_list_is_left_as_it_is() {
    use crate::spec::Command;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    std::fs::write(&gate, "").unwrap();
    let list = Command::Exec(vec!["python".into(), "train.py".into()]);
    assert_eq!(command_argv(&list, Some("/gantry/results/g")), list.argv());
    let s = Command::Shell("echo ran \"$0\"".into());
    assert_eq!(command_argv(&s, None), s.argv());
    let argv = command_argv(&s, Some(gate.to_str().unwrap()));
    assert_ne!(argv, s.argv());
    let out = std::process::Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran /bin/sh\n");
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}
