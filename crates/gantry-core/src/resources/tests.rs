use super::*;
use crate::spec::{validate_text, Format, Origin};
const G: u64 = 1 << 30;

fn job(yaml: &str) -> ValidJob {
    validate_text(&format!("image: a\n{yaml}"), Format::Yaml, &Origin::default()).unwrap()
}
fn needs(c: &Containers, j: &ValidJob, cap: CpuRam, gpu_count: usize) -> CpuRam {
    c.needs(j.gpus, j.limits.cpus_milli, j.limits.memory, cap, gpu_count)
}
fn machine(cpus: u64, gib: u64) -> Machine {
    Machine {
        total: CpuRam {
            cpus_milli: cpus * 1000,
            memory: gib * G,
        },
        memlock_max: None,
    }
}

/// Issue 18 item 10: on a 4-GPU box with 1 CPU for jobs, each GPU's share is 0.2 CPUs; no job may
/// hold so much that another GPU is left without its share.
#[test]
fn no_job_holds_the_share_the_other_gpus_need() {
    let c = Containers::default();
    let cap = CpuRam {
        cpus_milli: 1000,
        memory: 10 * G,
    };
    // (gpus, ceiling CPUs, ceiling memory GiB): the capacity less 0.2 CPUs and 2 GiB per other GPU.
    for (gpus, cpus, gib) in [(0, 200, 2), (1, 400, 4), (2, 600, 6), (4, 1000, 10)] {
        assert_eq!(
            c.ceiling(gpus, cap, 4),
            CpuRam {
                cpus_milli: cpus,
                memory: gib * G
            },
            "{gpus} GPUs"
        );
    }
    // Every default share is under its ceiling; a machine without GPUs has none.
    for gpus in 0..=4 {
        let d = c.needs(gpus, None, None, cap, 4);
        let ceil = c.ceiling(gpus, cap, 4);
        assert!(
            d.cpus_milli <= ceil.cpus_milli && d.memory <= ceil.memory,
            "{gpus}: {d:?} > {ceil:?}"
        );
    }
    assert_eq!(c.ceiling(0, cap, 0), cap);
    // No per-GPU share ("none"): nothing is kept for other GPUs.
    let none = Containers {
        cpus_per_gpu: Amount::Unlimited,
        memory_per_gpu: Amount::Unlimited,
        ..Containers::default()
    };
    assert_eq!(c.ceiling(1, cap, 4).cpus_milli, 400);
    assert_eq!(
        none.ceiling(1, cap, 4),
        CpuRam {
            cpus_milli: u64::MAX,
            memory: u64::MAX
        }
    );
    // Refused at submit with what it may have and why.
    let set_in = |k: &str| format!(" ({k} in /etc/gantry/config.toml)");
    let err = c
        .check_share(&job("gpus: 1\ncpus: 1\n"), cap, 4, &set_in)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "the job asks for 1 CPU; a 1-GPU job may hold at most 0.4 CPUs here, so that the other 3 GPUs keep their share (0.2 CPUs each) of the 1 CPU for jobs (containers.cpus_per_gpu in /etc/gantry/config.toml)\n  fix: ask for at most `cpus: 0.4`, or for more GPUs"
    );
    let err = c
        .check_share(&job("gpus: 0\nmemory: 3GiB\n"), cap, 4, &set_in)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("the job asks for 3.0 GiB of memory; a CPU-only job may hold at most 2.0 GiB here, so that the other 4 GPUs keep their share (2.0 GiB each)"), "{err}");
    for ok in [
        "gpus: 1\ncpus: 0.4\n",
        "gpus: 4\ncpus: 1\nmemory: 10GiB\n",
        "gpus: 1\n",
        "gpus: 0\ncpus: 0.2\n",
    ] {
        assert!(c.check_share(&job(ok), cap, 4, &set_in).is_ok(), "{ok}");
    }
    assert!(none
        .check_share(&job("gpus: 1\ncpus: 1\nmemory: 10GiB\n"), cap, 4, &set_in)
        .is_ok());
}

/// Issue 28 item 6: a job sharing a GPU by declared memory gets that part of the GPU's share, so
/// the jobs packed on one GPU hold one share together; what its spec sets is kept.
#[test]
fn a_gpu_sharing_job_gets_its_part_of_the_gpus_share() {
    let c = Containers::default();
    // 4 GPUs of 24 GiB, 10 CPUs and 50 GiB for jobs: a share is 2 CPUs and 10 GiB.
    let cap = CpuRam {
        cpus_milli: 10_000,
        memory: 50 * G,
    };
    let part = |m: u64| Some((m * G, 24 * G));
    // (gpus, declared GPU memory GiB, spec CPUs, expected CPUs, expected memory)
    type Case = (u32, Option<u64>, Option<u64>, u64, u64);
    let cases: &[Case] = &[
        (1, None, None, 2_000, 10 * G),
        (1, Some(8), None, 666, 10 * G / 3),
        (1, Some(12), None, 1_000, 5 * G),
        (2, Some(12), None, 2_000, 10 * G),
        (1, Some(24), None, 2_000, 10 * G),
        (1, Some(8), Some(1_500), 1_500, 10 * G / 3),
        (0, Some(8), None, 2_000, 10 * G),
    ];
    for (gpus, mem, cpus, want_cpus, want_mem) in cases {
        let got = c.needs_sharing(*gpus, *cpus, None, cap, 4, mem.and_then(part));
        assert_eq!(
            got,
            CpuRam {
                cpus_milli: *want_cpus,
                memory: *want_mem
            },
            "{gpus} GPUs, {mem:?} GiB, {cpus:?}"
        );
    }
    // Three 8 GiB jobs on one 24 GiB GPU hold no more than its share.
    let one = c.needs_sharing(1, None, None, cap, 4, part(8));
    assert!(3 * one.cpus_milli <= 2_000 && 3 * one.memory <= 10 * G);
    // A lab's own per-GPU amount is split the same way; floors hold.
    let set = Containers {
        cpus_per_gpu: Amount::Is(8_000),
        ..Containers::default()
    };
    assert_eq!(set.needs_sharing(1, None, None, cap, 4, part(6)).cpus_milli, 2_000);
    assert_eq!(c.needs_sharing(1, None, None, cap, 4, Some((1, 24 * G))).cpus_milli, 10);
}

/// Issue 33: CPU-only jobs together hold `cpu_only_shares` equal shares (one by default).
#[test]
fn cpu_only_jobs_together_hold_the_labs_number_of_shares() {
    let cap = CpuRam {
        cpus_milli: 1_000,
        memory: 10 * G,
    };
    let c = Containers::default();
    assert_eq!(
        c.cpu_only_limit(cap, 4),
        CpuRam {
            cpus_milli: 200,
            memory: 2 * G
        }
    );
    let two = Containers {
        cpu_only_shares: 2,
        ..Containers::default()
    };
    assert_eq!(two.cpu_only_limit(cap, 4).cpus_milli, 400);
    // A lab whose CPU-only default is larger than an equal share counts in that unit; "none" is not bounded.
    let big = Containers {
        cpu_only_cpus: Amount::Is(500),
        cpu_only_memory: Amount::Unlimited,
        ..Containers::default()
    };
    assert_eq!(
        big.cpu_only_limit(cap, 4),
        CpuRam {
            cpus_milli: 500,
            memory: u64::MAX
        }
    );
    // No GPUs: the whole machine is the CPU-only share; as many shares as there are: all of it.
    assert_eq!(c.cpu_only_limit(cap, 0), cap);
    let all = Containers {
        cpu_only_shares: 3,
        ..Containers::default()
    };
    assert_eq!(
        all.cpu_only_limit(
            CpuRam {
                cpus_milli: 2_000,
                memory: 10 * G
            },
            2
        )
        .cpus_milli,
        2_000
    );
}

#[test]
fn capacity_is_the_machine_less_the_reserve_and_jobs_get_a_share_per_gpu() {
    let c = Containers::default();
    let cap = machine(65, 514).for_jobs(&c);
    assert_eq!(
        cap,
        CpuRam {
            cpus_milli: 64_000,
            memory: 512 * G
        }
    );
    assert_eq!(
        machine(1, 2).for_jobs(&c),
        CpuRam {
            cpus_milli: 500,
            memory: G
        },
        "at least half a small machine"
    );
    // 7 GPUs: 8 shares (one kept for CPU-only jobs).
    assert_eq!(
        needs(&c, &job("gpus: 2\n"), cap, 7),
        CpuRam {
            cpus_milli: 16_000,
            memory: 128 * G
        }
    );
    assert_eq!(
        needs(&c, &job("gpus: 0\n"), cap, 7),
        CpuRam {
            cpus_milli: 8_000,
            memory: 64 * G
        }
    );
    assert_eq!(
        needs(&c, &job("gpus: 2\ncpus: 3\nmemory: 10GiB\n"), cap, 7),
        CpuRam {
            cpus_milli: 3_000,
            memory: 10 * G
        }
    );
    let set = Containers {
        cpus_per_gpu: Amount::Is(6_000),
        memory_per_gpu: Amount::Unlimited,
        cpu_only_cpus: Amount::Is(2_000),
        ..c
    };
    assert_eq!(
        needs(&set, &job("gpus: 3\n"), cap, 7),
        CpuRam {
            cpus_milli: 18_000,
            memory: 0
        }
    );
    assert_eq!(
        needs(&set, &job("gpus: 0\n"), cap, 7),
        CpuRam {
            cpus_milli: 2_000,
            memory: 64 * G
        }
    );
    assert_eq!(
        mem_total("MemTotal:       24567890 kB\nMemFree: 1 kB\n"),
        Some(24567890 * 1024)
    );
    let m = Machine::read();
    assert!(m.total.cpus_milli >= 1000 && m.total.memory > 0, "{m:?}");
}

#[test]
fn container_settings_follow_the_spec_then_the_lab() {
    let c = Containers::default();
    let m = machine(17, 130);
    let s = c.settings(
        &job(""),
        CpuRam {
            cpus_milli: 8_000,
            memory: 64 * G,
        },
        &m,
        Some("/home/alice"),
    );
    assert_eq!(
        s,
        ContainerSettings {
            nano_cpus: Some(8_000_000_000),
            memory: Some(64 << 30),
            shm_size: Some(32 << 30),
            memlock: Some(-1),
            stack: Some(64 << 20),
            ipc_host: false,
            home: Some("/home/alice".into()),
            home_tmpfs: true,
            pids_limit: Some(4096),
            cpuset: None,
            threads: Some(8),
            log_file_size: None,
            user: None,
            layer_size: None,
        }
    );
    // A spec may lower the lab's process limit; a lab that lowered it later wins.
    assert_eq!(
        c.settings(&job("pids_limit: 100\n"), CpuRam::default(), &m, None)
            .pids_limit,
        Some(100)
    );
    let strict = Containers {
        pids_limit: 64,
        ..Containers::default()
    };
    assert_eq!(
        strict
            .settings(&job("pids_limit: 100\n"), CpuRam::default(), &m, None)
            .pids_limit,
        Some(64)
    );
    let at = |k: &str| format!(" ({k})");
    let e = strict.check_pids(&job("pids_limit: 100\n"), &at).unwrap_err();
    assert_eq!(
        e.message,
        "`pids_limit` is 100; this machine allows at most 64 processes per job (containers.pids_limit)"
    );
    assert!(strict.check_pids(&job("pids_limit: 64\n"), &at).is_ok() && strict.check_pids(&job(""), &at).is_ok());
    // Threads: the share rounded up (a half CPU still runs one thread); none without a limit.
    assert_eq!(
        c.settings(
            &job(""),
            CpuRam {
                cpus_milli: 1_500,
                memory: G
            },
            &m,
            None
        )
        .threads,
        Some(2)
    );
    assert_eq!(
        c.settings(
            &job(""),
            CpuRam {
                cpus_milli: 300,
                memory: G
            },
            &m,
            None
        )
        .threads,
        Some(1)
    );
    assert_eq!(c.home_mount(&job(""), Some("/home/alice")), None);
    let no_limit = c.settings(&job(""), CpuRam::default(), &m, None);
    assert_eq!(
        (no_limit.nano_cpus, no_limit.memory, no_limit.shm_size, no_limit.threads),
        (None, None, Some(8 << 30), None)
    );
    assert_eq!(no_limit.home.as_deref(), Some(FALLBACK_HOME));
    let own = c.settings(
        &job("shm_size: 1GiB\nulimits: {memlock: 1MiB, stack: 8MiB}\n"),
        CpuRam::default(),
        &m,
        Some("/root"),
    );
    assert_eq!(
        (own.shm_size, own.memlock, own.stack),
        (Some(1 << 30), Some(1 << 20), Some(8 << 20))
    );
    let lab = Containers {
        shm_size: Some(2 * G),
        ..Containers::default()
    };
    assert_eq!(
        lab.settings(
            &job(""),
            CpuRam {
                cpus_milli: 1,
                memory: 64 * G
            },
            &m,
            None
        )
        .shm_size,
        Some(2 << 30)
    );
    // Where containers may not lock unlimited memory, they get the most they may.
    let tight = Machine {
        memlock_max: Some(8 << 20),
        ..m
    };
    assert_eq!(
        c.settings(&job(""), CpuRam::default(), &tight, None).memlock,
        Some(8 << 20)
    );
    // home: mount, where enabled: the home is a mount (checked as the owner), no tmpfs.
    let mount = Containers {
        home: Home::Mount,
        ..Containers::default()
    };
    let s = mount.settings(&job(""), CpuRam::default(), &m, Some("/home/alice/"));
    assert!(!s.home_tmpfs && s.home.as_deref() == Some("/home/alice"));
    assert_eq!(
        mount.home_mount(&job(""), Some("/home/alice")),
        Some(crate::spec::Mount {
            host: "/home/alice".into(),
            container: "/home/alice".into(),
            read_only: false
        })
    );
    assert_eq!(mount.home_mount(&job("home: tmpfs\n"), Some("/home/alice")), None);
    assert_eq!(
        mount.home_mount(&job("mounts: ['/data:/home/alice']\n"), Some("/home/alice")),
        None,
        "a spec mount there wins"
    );
    assert!(
        !c.settings(
            &job("mounts: ['/data:/home/alice']\n"),
            CpuRam::default(),
            &m,
            Some("/home/alice")
        )
        .home_tmpfs
    );
}

#[test]
fn whole_cpu_shares_get_free_cpus_near_their_gpus_first() {
    use std::collections::BTreeSet;
    assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
    assert_eq!(parse_cpu_list(" 1 , 1-2,x,5-4"), vec![1, 2]);
    assert_eq!(cpu_list(&[8, 0, 1, 2, 3, 10, 11]), "0-3,8,10-11");
    assert_eq!(cpu_list(&[5]), "5");
    let pool: Vec<u32> = (0..16).collect();
    let node1: Vec<u32> = (8..16).collect();
    let none = BTreeSet::new();
    assert_eq!(
        pick_cpus(4, &pool, &none, &node1),
        Some(vec![8, 9, 10, 11]),
        "the GPU's NUMA node first"
    );
    let taken: BTreeSet<u32> = (8..14).collect();
    assert_eq!(
        pick_cpus(4, &pool, &taken, &node1),
        Some(vec![0, 1, 14, 15]),
        "then the other node, never a taken CPU"
    );
    assert_eq!(pick_cpus(2, &pool, &taken, &[]), Some(vec![0, 1]));
    assert_eq!(
        pick_cpus(11, &pool, &taken, &node1),
        None,
        "10 free: not enough, never shared"
    );
    assert_eq!(pick_cpus(0, &pool, &none, &[]), None);
    // Jobs pinned one after the other never share a CPU.
    let mut held = BTreeSet::new();
    for _ in 0..4 {
        let got = pick_cpus(4, &pool, &held, &node1).unwrap();
        assert!(got.iter().all(|c| held.insert(*c)), "{got:?} overlaps {held:?}");
    }
    assert_eq!(pick_cpus(1, &pool, &held, &node1), None);
    let t = Topology::read();
    assert!(!t.cpus.is_empty(), "{t:?}");
}

#[test]
fn ipc_host_and_home_mount_need_the_lab_to_allow_them() {
    let c = Containers::default();
    let at = |k: &str| format!(" ({k} in /etc/gantry/config.toml)");
    let e = c.check(&job("ipc: host\n"), &at).unwrap_err();
    assert!(
        e.message.starts_with("`ipc: host` is not allowed on this machine")
            && e.message
                .ends_with("(containers.allow_ipc_host in /etc/gantry/config.toml)"),
        "{e}"
    );
    assert!(e.hint.contains("allow_ipc_host = true"), "{e}");
    let e = c.check(&job("home: mount\n"), &at).unwrap_err();
    assert!(e.message.contains("`home: mount` is not enabled"), "{e}");
    assert!(c.check(&job("ipc: private\nhome: tmpfs\n"), &at).is_ok());
    let open = Containers {
        allow_ipc_host: true,
        home: Home::Mount,
        ..c
    };
    assert!(open.check(&job("ipc: host\nhome: mount\n"), &at).is_ok());
    assert!(
        open.settings(&job("ipc: host\n"), CpuRam::default(), &machine(2, 2), None)
            .ipc_host
    );
}
