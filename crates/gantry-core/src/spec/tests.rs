use super::*;

fn ok_yaml(t: &str) -> ValidJob {
    validate_text(
        t,
        Format::Yaml,
        &Origin {
            file_name: Some("x.yaml".into()),
            base_dir: Some("/home/a".into()),
        },
    )
    .unwrap()
}
fn err_yaml(t: &str) -> SpecError {
    validate_text(t, Format::Yaml, &Origin::default()).unwrap_err()
}

#[test]
fn a_byte_order_mark_is_skipped() {
    let j = ok_yaml("\u{feff}image: busybox\ncommand: [echo, hi]\n");
    assert_eq!(j.spec.image, "busybox");
    let t = parse("\u{feff}image = \"busybox\"\n", Format::Toml).unwrap();
    assert_eq!(t.image, "busybox");
    let e = parse_template("\u{feff}image = \"busybox\"\n", Format::Toml).unwrap_err();
    assert!(e.message.contains("{config}"), "{e}");
}

#[test]
fn full_yaml_spec_parses() {
    let j = ok_yaml(
        "name: resnet\nimage: paddle:2.6\ncommand: [python, train.py]\nworkdir: /w\nenv: {A: '1'}\n\
         mounts: ['/data:/data:ro', 'out:/out']\ngpus: 2\ngpu_memory: 20GiB\npriority: 5\ntimeout: 24h\nretries: 2\n",
    );
    assert_eq!(j.name, "resnet");
    assert_eq!(j.gpus, 2);
    assert_eq!(j.gpu_memory, Some(20 << 30));
    assert_eq!(j.timeout, Some(Duration::from_secs(86400)));
    assert_eq!(j.retries, 2);
    assert_eq!(
        j.mounts[0],
        Mount {
            host: "/data".into(),
            container: "/data".into(),
            read_only: true
        }
    );
    assert_eq!(j.mounts[1].host, "/home/a/out");
    // Relative paths are resolved against the spec's folder, `..` included; `access` then checks them as the user.
    assert_eq!(
        ok_yaml("image: a\nmounts: ['../../../../etc:/etc2']\n").mounts[0].host,
        "/etc"
    );
    // Only whole components match the deny-list.
    assert_eq!(
        ok_yaml("image: a\nmounts: ['/run/dockerd-data:/d']\n").mounts[0].host,
        "/run/dockerd-data"
    );
    assert_eq!(j.spec.command.unwrap().argv(), vec!["python", "train.py"]);
}

#[test]
fn gpu_type_and_min_gpu_memory_make_a_filter() {
    let j = ok_yaml("image: a\ngpus: 2\ngpu_type: ' h100 '\nmin_gpu_memory: 40GiB\n");
    let f = j.gpu_filter();
    assert_eq!((f.gpu_type.as_deref(), f.min_memory), (Some("h100"), Some(40 << 30)));
    assert!(f.eligible("NVIDIA H100 80GB HBM3", 80 << 30));
    assert!(!f.eligible("NVIDIA H100 PCIe", 32 << 30), "too little memory");
    assert!(!f.eligible("NVIDIA A100-SXM4-80GB", 80 << 30), "another card");
    assert!(ok_yaml("image: a\n").gpu_filter().is_any());
}

#[test]
fn toml_spec_and_defaults() {
    let j = validate_text(
        "image = \"busybox\"\ncommand = \"echo hi\"\n",
        Format::Toml,
        &Origin {
            file_name: Some("exp1.toml".into()),
            base_dir: None,
        },
    )
    .unwrap();
    assert_eq!(j.name, "exp1");
    assert_eq!(j.gpus, 1);
    assert_eq!(j.gpu_memory, None);
    assert_eq!(j.spec.command.unwrap().argv(), vec!["/bin/sh", "-c", "echo hi"]);
}

#[test]
fn preemptible_and_checkpoint_parse_and_are_checked() {
    let j = ok_yaml("image: a\npreemptible: true\ncheckpoint: {signal: usr1, grace: 5m}\n");
    assert_eq!(j.spec.preemptible, Some(true));
    assert_eq!(
        (j.spec.checkpoint_signal(), j.spec.checkpoint_grace()),
        ("SIGUSR1".to_string(), Some(Duration::from_secs(300)))
    );
    let d = ok_yaml("image: a\n");
    assert_eq!(
        (
            d.spec.preemptible,
            d.spec.checkpoint_signal(),
            d.spec.checkpoint_grace()
        ),
        (None, "SIGTERM".to_string(), None)
    );
    for (text, want, line) in [
        (
            "image: a\ncheckpoint: {signal: SIGKILL}\n",
            "`checkpoint.signal` \"SIGKILL\" is not a checkpoint signal",
            2,
        ),
        (
            "image: a\ncheckpoint:\n  grace: 2h\n",
            "`checkpoint.grace` \"2h\" is longer than an hour",
            2,
        ),
        ("image: a\ncheckpoint: {grace: soon}\n", "is not a duration", 2),
        (
            "image: a\ncheckpoint: {signal: SIGUSR1, every: 5m}\n",
            "unknown field `every`",
            2,
        ),
        ("image: a\npreemptible: sometimes\n", "preemptible", 2),
    ] {
        let e = err_yaml(text);
        assert!(e.message.contains(want), "{text}: {e}");
        assert_eq!(e.line, Some(line), "{text}: {e}");
    }
}

#[test]
fn unknown_field_points_at_line() {
    let e = err_yaml("image: a\ngpu: 2\n");
    assert!(e.message.contains("unknown field `gpu`"), "{e}");
    assert_eq!(e.line, Some(2));
    assert!(e.hint.contains("gantry schema"));
}

#[test]
fn unknown_field_suggests_the_nearest_known_one() {
    let e = err_yaml("image: a\ngpu: 2\n");
    assert!(e.hint.starts_with("did you mean `gpus`?"), "{e}");
    assert!(e.to_string().contains("did you mean `gpus`?"), "{e}");
    let e = validate_text("image = \"a\"\ntimout = \"1h\"\n", Format::Toml, &Origin::default()).unwrap_err();
    assert!(e.hint.starts_with("did you mean `timeout`?"), "{e}");
    // Nothing close: no guess.
    let e = err_yaml("image: a\nbanana: 2\n");
    assert!(!e.hint.contains("did you mean"), "{e}");
    assert_eq!(edit_distance("gpu", "gpus"), 1);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(suggest_field("unknown field `x`, expected `a` or `b`"), None);
}

#[test]
fn toml_unknown_field_has_line() {
    let e = validate_text("image = \"a\"\n\nbogus = 1\n", Format::Toml, &Origin::default()).unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
    assert_eq!(e.line, Some(3));
}

#[test]
fn bad_yaml_syntax_has_position() {
    let e = err_yaml("image: a\ncommand: [unclosed\n");
    assert!(e.line.is_some(), "{e:?}");
}

#[test]
fn value_errors_are_clear() {
    let cases = [
        ("image: a\ngpus: -1\n", "must be 0 or more", Some(2)),
        (
            "mounts: ['/data:/usr/data']\n",
            "inside this machine's system folders",
            Some(1),
        ),
        (
            "image: host\nmounts: ['/data:/etc']\n",
            "inside this machine's system folders",
            Some(2),
        ),
        ("image: ''\n", "`image` is empty", Some(1)),
        ("image: a\ngpu_memory: lots\n", "not a memory size", Some(2)),
        ("image: a\ntimeout: forever\n", "not a duration", Some(2)),
        (
            "image: a\nmounts: ['/var/run/docker.sock:/d']\n",
            "container engine",
            Some(2),
        ),
        (
            "image: a\nmounts: ['/a/../var/run/docker.sock:/d']\n",
            "container engine",
            Some(2),
        ),
        (
            "image: a\nmounts: ['/run/containerd/containerd.sock:/d']\n",
            "container engine",
            Some(2),
        ),
        (
            "image: a\nmounts: ['/var/run/docker:/d']\n",
            "container engine",
            Some(2),
        ),
        ("image: a\nmounts: ['/:/host']\n", "whole host file system", Some(2)),
        (
            "image: a\nmounts: ['/data/..:/host:ro']\n",
            "whole host file system",
            Some(2),
        ),
        ("image: a\nmounts: ['rel:/d']\n", "relative", Some(2)),
        ("image: a\nmounts: ['/a:b']\n", "not absolute", Some(2)),
        ("image: a\ngpus: 0\ngpu_memory: 1GiB\n", "`gpus` is 0", Some(3)),
        ("image: a\ncommand: []\n", "empty list", Some(2)),
        ("image: a\nworkdir: w\n", "not an absolute path", Some(2)),
        ("image: a\nretries: -3\n", "between 0 and 100", Some(2)),
        ("image: a\ngpu_type: ' '\n", "`gpu_type` is empty", Some(2)),
        ("image: a\ngpus: 0\ngpu_type: H100\n", "`gpus` is 0", Some(3)),
        ("image: a\ngpu_type: \"H\\e100\"\n", "not a GPU name", Some(2)),
        ("image: a\nmin_gpu_memory: big\n", "not a memory size", Some(2)),
        ("image: a\ngpus: 0\nmin_gpu_memory: 40GiB\n", "`gpus` is 0", Some(3)),
    ];
    for (text, want, line) in cases {
        let e = err_yaml(text);
        assert!(e.message.contains(want), "{text:?}: {e}");
        assert_eq!(e.line, line, "{text:?}: {e}");
        assert!(!e.hint.is_empty());
    }
}

#[test]
fn deep_nesting_huge_durations_and_empty_names_are_handled() {
    let deep = format!(
        "image: a\nenv: {{X: {}1{}}}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let e = err_yaml(&deep);
    assert!(e.message.contains("more than 32 levels"), "{e}");
    assert!(
        ok_yaml("image: a\ncommand: \"echo '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\"\n")
            .spec
            .image
            == "a",
        "brackets in strings are text"
    );
    assert!(err_yaml("image: a\ntimeout: 300000000years\n")
        .message
        .contains("longer than a year"));
    assert!(err_yaml("image: a\nexpected_runtime: 400d\n")
        .message
        .contains("longer than a year"));
    let j = validate_text(
        "image: a\n",
        Format::Yaml,
        &Origin {
            file_name: Some(".yaml".into()),
            base_dir: None,
        },
    )
    .unwrap();
    assert_eq!(j.name, "job");
}

#[test]
fn byte_sizes() {
    assert_eq!(parse_bytes("20GiB"), Some(20 << 30));
    assert_eq!(parse_bytes("512 MiB"), Some(512 << 20));
    assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
    assert_eq!(parse_bytes("100"), Some(100));
    assert_eq!(parse_bytes("GiB"), None);
    assert_eq!(parse_bytes("5XB"), None);
    assert_eq!(format_bytes(24 << 30), "24.0 GiB");
}

#[test]
fn nvidia_runtime_variables_are_refused_in_env() {
    for k in [
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_NVSWITCH",
        "NVIDIA_IMEX_CHANNELS",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "nvidia_visible_devices",
    ] {
        let e = validate_text(
            &format!("image: a\nenv: {{{k}: all}}\n"),
            Format::Yaml,
            &Origin::default(),
        )
        .unwrap_err();
        assert!(e.message.contains(k) && e.line == Some(2), "{k}: {e}");
    }
    assert!(validate_text(
        "image: a\nenv: {CUDA_VISIBLE_DEVICES: '5', MY_NVIDIA_HOME: x}\n",
        Format::Yaml,
        &Origin::default()
    )
    .is_ok());
}

#[test]
fn template_substitutes_config() {
    let t = parse_template(
        "image = \"paddle\"\ncommand = \"python tools/train.py -c {config}\"\ngpus = 1\n",
        Format::Toml,
    )
    .unwrap();
    let i = instantiate_template(
        &t,
        "paddle-train",
        "/home/a/Gantry/inbox/paddle-train/accepted/7-exp.yaml",
        "exp.yaml",
    );
    assert_eq!(i.spec.name.as_deref(), Some("paddle-train:exp"));
    assert_eq!(
        i.spec.command.unwrap(),
        Command::Shell("python tools/train.py -c /gantry/config/exp.yaml".into())
    );
    assert_eq!(
        i.config,
        Mount {
            host: "/home/a/Gantry/inbox/paddle-train/accepted/7-exp.yaml".into(),
            container: "/gantry/config/exp.yaml".into(),
            read_only: true
        }
    );
    // Names a shell or a mount string would split stay one argument, one mount.
    for name in ["my run.yaml", "lr01 (1).yaml", "lr=0.1:bs=32.yaml"] {
        let i = instantiate_template(&t, "paddle-train", &format!("/in/accepted/7-{name}"), name);
        let Some(Command::Shell(cmd)) = i.spec.command else {
            panic!("a string command")
        };
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(cmd.replace("python tools/train.py -c", "printf %s"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("/gantry/config/{name}"));
        assert!(i.spec.mounts.is_empty() && i.config.container == format!("/gantry/config/{name}"));
    }
    assert!(
        parse_template("image = \"p\"\ncommand = \"python x.py\"\n", Format::Toml)
            .unwrap_err()
            .message
            .contains("{config}")
    );
}

#[test]
fn matrix_expands_into_one_job_per_combination() {
    let j = ok_yaml("name: sweep\nimage: a\ncommand: python train.py --lr {lr} --bs {bs}\nmatrix: {lr: [0.1, 0.01], bs: [32, 64]}\nafter: [12, prep]\nexpected_runtime: 2h\n");
    assert_eq!(j.expected_runtime, Some(Duration::from_secs(7200)));
    assert_eq!(j.spec.after, vec![IdOrName::Id(12), IdOrName::Name("prep".into())]);
    let jobs = expand(&j);
    assert_eq!(jobs.len(), 4);
    let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "sweep[bs=32,lr=0.1]",
            "sweep[bs=32,lr=0.01]",
            "sweep[bs=64,lr=0.1]",
            "sweep[bs=64,lr=0.01]"
        ]
    );
    assert_eq!(
        jobs[1].spec.command.as_ref().unwrap(),
        &Command::Shell("python train.py --lr 0.01 --bs 32".into())
    );
    assert_eq!(jobs[1].spec.env.get("LR").map(String::as_str), Some("0.01"));
    assert!(jobs.iter().all(|j| j.spec.matrix.is_empty()));
    assert_eq!(expand(&ok_yaml("image: a\n")).len(), 1);
    assert!(err_yaml("image: a\nmatrix: {lr: []}\n").message.contains("no values"));
    assert!(err_yaml("image: a\nexpected_runtime: soon\n")
        .message
        .contains("not a duration"));
}

#[test]
fn sizes_users_could_abuse_are_bounded() {
    let keys: Vec<String> = (0..64).map(|i| format!("k{i}: [0, 1]")).collect();
    let e = err_yaml(&format!("image: a\nmatrix: {{{}}}\n", keys.join(", ")));
    assert!(e.message.contains("more than 1000 jobs"), "{e}");
    let vals: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
    let e = err_yaml(&format!(
        "image: a\nenv: {{B: {}}}\nmatrix: {{i: [{}]}}\n",
        "x".repeat(20_000),
        vals.join(",")
    ));
    assert!(
        e.message.contains("1000 jobs of this spec") && e.message.contains("the limit is 16.0 MiB"),
        "{e}"
    );
    assert_eq!(e.line, Some(3));
    let mounts: Vec<String> = (0..101).map(|i| format!("'/d:/m{i}'")).collect();
    assert!(err_yaml(&format!("image: a\nmounts: [{}]\n", mounts.join(",")))
        .message
        .contains("the limit is 100"));
    let after: Vec<String> = (1..=101).map(|i| i.to_string()).collect();
    assert!(err_yaml(&format!("image: a\nafter: [{}]\n", after.join(",")))
        .message
        .contains("the limit is 100"));
    let j = ok_yaml(&format!(
        "name: s\nimage: a\nmatrix: {{v: ['{}', b]}}\n",
        "é".repeat(500)
    ));
    let names: Vec<String> = expand(&j).into_iter().map(|j| j.name).collect();
    assert_eq!(names[0].chars().count(), 200);
    assert!(
        names[0].starts_with("s[v=éé") && names[0].ends_with("…]"),
        "{}",
        names[0]
    );
    assert_eq!(names[1], "s[v=b]");
    for bad in [r#""a\e[2Jb""#, r#""line\nbreak""#, r#""abc\u202Egpj.exe""#] {
        let e = err_yaml(&format!("image: a\nname: {bad}\n"));
        assert!(e.message.contains("control characters"), "{e}");
        assert_eq!(e.line, Some(2));
    }
    let j = ok_yaml("name: s\nimage: a\nmatrix: {v: [\"\\e[2J\"]}\n");
    assert_eq!(expand(&j)[0].name, "s[v=\\u{1b}[2J]");
    assert_eq!(
        expand(&j)[0].spec.env["V"],
        "\u{1b}[2J",
        "the value itself is the job's business"
    );
}

#[test]
fn schema_lists_fields() {
    let s = json_schema();
    let props = s["properties"].as_object().unwrap();
    for f in [
        "name",
        "image",
        "command",
        "workdir",
        "env",
        "mounts",
        "gpus",
        "gpu_memory",
        "gpu_type",
        "min_gpu_memory",
        "priority",
        "timeout",
        "retries",
        "expected_runtime",
        "after",
        "begin",
        "matrix",
        "preemptible",
        "checkpoint",
    ] {
        assert!(props.contains_key(f), "{f}");
    }
    assert_eq!(s["additionalProperties"], serde_json::json!(false));
}

#[test]
fn container_settings_parse_and_are_checked() {
    let j = ok_yaml("image: a\ncpus: 0.5\nmemory: 64GiB\nshm_size: 16GiB\nipc: host\nhome: mount\nulimits: {memlock: unlimited, stack: 64MiB}\n");
    assert_eq!(
        j.limits,
        Limits {
            cpus_milli: Some(500),
            memory: Some(64 << 30),
            shm_size: Some(16 << 30),
            memlock: Some(-1),
            stack: Some(64 << 20),
            pids_limit: None
        }
    );
    assert_eq!(ok_yaml("image: a\npids_limit: 512\n").limits.pids_limit, Some(512));
    assert_eq!((j.spec.ipc, j.spec.home), (Some(Ipc::Host), Some(Home::Mount)));
    let t = validate_text(
        "image = \"a\"\ncpus = 8\n[ulimits]\nstack = \"8MiB\"\n",
        Format::Toml,
        &Origin::default(),
    )
    .unwrap();
    assert_eq!(
        (t.limits.cpus_milli, t.limits.stack, t.limits.memory),
        (Some(8000), Some(8 << 20), None)
    );
    assert_eq!(ok_yaml("image: a\n").limits, Limits::default());
    let cases = [
        ("image: a\ncpus: 0\n", "`cpus` is 0; it must be from 0.01 to 1024", 2),
        ("image: a\ncpus: 5000\n", "from 0.01 to 1024", 2),
        (
            "image: a\nmemory: lots\n",
            "`memory` \"lots\" is not a size of at least 6.0 MiB",
            2,
        ),
        ("image: a\nmemory: 1KiB\n", "at least 6.0 MiB", 2),
        ("image: a\nshm_size: 0\n", "`shm_size` \"0\" is not a size", 2),
        (
            "image: a\nmemory: 1GiB\nshm_size: 2GiB\n",
            "`shm_size` (2.0 GiB) is larger than `memory` (1.0 GiB)",
            3,
        ),
        (
            "image: a\nipc: shareable\n",
            "unknown variant `shareable`, expected `private` or `host`",
            2,
        ),
        ("image: a\nhome: nfs\n", "unknown variant `nfs`", 2),
        (
            "image: a\nulimits:\n  stack: big\n",
            "ulimit `stack` \"big\" is not `unlimited` or a size",
            2,
        ),
        ("image: a\nulimits: {nofile: 10}\n", "unknown field `nofile`", 2),
        (
            "image: a\npids_limit: 3\n",
            "`pids_limit` is 3; it must be from 16 to 4194304",
            2,
        ),
    ];
    for (text, want, line) in cases {
        let e = err_yaml(text);
        assert!(e.message.contains(want), "{text:?}: {e}");
        assert_eq!(e.line, Some(line), "{text:?}: {e}");
        assert!(!e.hint.is_empty());
    }
    let s = json_schema();
    for f in ["cpus", "memory", "shm_size", "ipc", "home", "ulimits", "pids_limit"] {
        assert!(
            s["properties"].as_object().unwrap().contains_key(f),
            "{f} missing from the schema"
        );
    }
    let text = serde_json::to_string(&s).unwrap();
    assert!(
        text.contains("\"host\"") && text.contains("\"tmpfs\"") && text.contains("memlock"),
        "{text}"
    );
}
