use super::*;
use std::path::Path;

fn parse(t: &str) -> Result<LabConfig, PolicyError> {
    LabConfig::parse(t, Path::new("/etc/gantry/config.toml"))
}
fn err(t: &str) -> String {
    parse(t).unwrap_err().to_string()
}

#[test]
fn the_documented_example_parses_and_an_empty_file_is_the_defaults() {
    let full = r#"
gpus = [0, 1, "GPU-5160a7ed-0000-4000-8000-000000000002"]
[access]
admins = ["root"]
admin_group = "root"
see_others = "all"
[limits]
priority = [-5, 5]
admin_priority = [-100, 100]
max_queued_jobs = 10
max_running_gpus = 4
default_timeout = "7d"
max_timeout = "30d"
[fair_share]
half_life = "12h"
[jobs]
stop_grace = "20s"
retry_backoff = "5s"
reserve_after = "1h"
[logs]
cap = "1GiB"
keep = "90d"
streams_per_user = 4
[history]
keep = "365d"
[inbox]
group = "gantry"
path = "Gantry/inbox"
templates = "/etc/gantry/templates"
max_watches = 32
"#;
    let c = parse(full).unwrap();
    let p = &c.policy;
    assert_eq!(
        (
            p.user_priority,
            p.admin_priority,
            p.max_queued_per_user,
            p.max_running_gpus
        ),
        ((-5, 5), (-100, 100), 10, Some(4))
    );
    assert_eq!(p.default_timeout, Some(Duration::from_secs(7 * 86400)));
    assert_eq!(
        (p.log_cap, p.see_others, p.admin_gid),
        (1 << 30, SeeOthers::All, Some(0))
    );
    assert_eq!(p.log_keep, Some(Duration::from_secs(90 * 86400)));
    assert_eq!((p.log_streams_per_user, p.inbox_watches_per_user), (4, 32));
    assert_eq!(c.gpus.as_ref().unwrap().gpus.len(), 3);
    assert_eq!(
        (c.inbox_path.as_deref(), c.inbox_group.as_deref()),
        (Some(Path::new("Gantry/inbox")), Some("gantry"))
    );
    let d = parse("").unwrap();
    assert_eq!(d.policy, Policy::default());
    assert_eq!(d.gpus, None);
    assert_eq!(parse("gpus = \"all\"\n").unwrap().gpus, None);
}

#[test]
fn problems_name_the_file_line_and_column_and_how_to_fix() {
    let cases: &[(&str, &str)] = &[
        (
            "[limits]\nmax_queud_jobs = 3\n",
            "config.toml:2:1: unknown field `max_queud_jobs`",
        ),
        (
            "[limits]\npriority = [10, -10]\n",
            "config.toml:2:12: `priority` = [10, -10]: the lowest value is above the highest; swap them: [-10, 10]",
        ),
        (
            "[limits]\ndefault_timeout = \"40d\"\nmax_timeout = \"30d\"\n",
            "config.toml:2:19: `default_timeout` (40d) is longer than `max_timeout` (30d)",
        ),
        (
            "[access]\nadmins = [\"root\", \"nosuchuser-x\"]\n",
            "config.toml:2:19: `admins` names \"nosuchuser-x\", which is not a user",
        ),
        (
            "[access]\nadmin_group = \"nosuchgroup-x\"\n",
            "config.toml:2:15: `admin_group` = \"nosuchgroup-x\" is not a group",
        ),
        (
            "[access]\nsee_others = \"some\"\n",
            "`see_others` = \"some\" is not a choice",
        ),
        (
            "[logs]\ncap = \"lots\"\n",
            "config.toml:2:7: `cap` = \"lots\" is not a size",
        ),
        (
            "[jobs]\nstop_grace = \"soon\"\n",
            "`stop_grace` = \"soon\" is not a duration",
        ),
        ("gpus = [0, 0]\n", "GPU 0 twice"),
        ("gpus = \"some\"\n", "config.toml:1:8: `gpus` = \"some\" is not \"all\""),
        (
            "[limits]\nmax_running_gpus = 0\n",
            "`max_running_gpus` = 0 is out of range",
        ),
        (
            "[limits]\nmax_queued_jobs = \"many\"\n",
            "config.toml:2:19: invalid type: string \"many\", expected i64",
        ),
        ("[inbox]\npath = \"../x\"\n", "not a plain path"),
        (
            "[logs]\nstreams_per_user = 0\n",
            "config.toml:2:20: `streams_per_user` = 0 is out of range; use a number from 1 to 1024",
        ),
        (
            "[inbox]\nmax_watches = 1000000\n",
            "config.toml:2:15: `max_watches` = 1000000 is out of range; use a number from 1 to 65536",
        ),
        ("simulate = \"sim:lots\"\n", "invalid simulated GPU spec"),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
    // Every problem is reported, not just the first.
    let e = parse("[limits]\npriority = [1, 0]\nadmin_priority = [1, 0]\n").unwrap_err();
    assert_eq!(e.problems.iter().map(|p| p.line).collect::<Vec<_>>(), vec![2, 3]);
}

#[test]
fn containers_table_parses_and_explains_its_mistakes() {
    use crate::resources::{Amount, Containers};
    let c = parse("[containers]\nshm_size = \"16GiB\"\nmemlock = \"unlimited\"\nstack = \"32MiB\"\nallow_ipc_host = true\nhome = \"mount\"\ncpus_per_gpu = 8\nmemory_per_gpu = \"64GiB\"\ncpu_only_cpus = 0.5\ncpu_only_memory = \"none\"\ncpu_only_shares = 2\nreserve_cpus = 2\nreserve_memory = \"4GiB\"\npids_limit = 1024\nhost_image = false\n").unwrap().policy.containers;
    assert_eq!(
        c,
        Containers {
            shm_size: Some(16 << 30),
            memlock: -1,
            stack: 32 << 20,
            allow_ipc_host: true,
            home: crate::spec::Home::Mount,
            cpus_per_gpu: Amount::Is(8000),
            memory_per_gpu: Amount::Is(64 << 30),
            cpu_only_cpus: Amount::Is(500),
            cpu_only_memory: Amount::Unlimited,
            cpu_only_shares: 2,
            reserve_cpus_milli: 2000,
            reserve_memory: 4 << 30,
            pids_limit: 1024,
            host_image: false,
        }
    );
    assert_eq!(
        parse("[containers]\nshm_size = \"auto\"\ncpus_per_gpu = \"auto\"\n")
            .unwrap()
            .policy
            .containers,
        Containers::default()
    );
    let cases: &[(&str, &str)] = &[
        ("[containers]\nshm = \"1GiB\"\n", "config.toml:2:1: unknown field `shm`"),
        (
            "[containers]\nshm_size = \"lots\"\n",
            "config.toml:2:12: `shm_size` = \"lots\" is not \"auto\" or a size",
        ),
        (
            "[containers]\nmemlock = \"-1\"\n",
            "`memlock` = \"-1\" is not \"unlimited\" or a size",
        ),
        (
            "[containers]\nhome = \"nfs\"\n",
            "`home` = \"nfs\" is not a choice; write \"tmpfs\"",
        ),
        (
            "[containers]\ncpus_per_gpu = 0\n",
            "config.toml:2:16: `cpus_per_gpu` = 0 is not a number of CPUs from 0.01 to 1024",
        ),
        ("[containers]\ncpus_per_gpu = \"many\"\n", "is not a number of CPUs"),
        (
            "[containers]\nmemory_per_gpu = \"1KiB\"\n",
            "`memory_per_gpu` = \"1KiB\" is not a size of at least 6 MiB",
        ),
        (
            "[containers]\ncpu_only_shares = 0\n",
            "config.toml:2:19: `cpu_only_shares` = 0 is not a number of shares from 1 to 1024",
        ),
        (
            "[containers]\nreserve_cpus = \"auto\"\n",
            "`reserve_cpus` = \"auto\" is not a number of CPUs from 0 to 1024",
        ),
        (
            "[containers]\nallow_ipc_host = \"yes\"\n",
            "config.toml:2:18: invalid type: string \"yes\", expected a boolean",
        ),
        (
            "[containers]\npids_limit = 8\n",
            "config.toml:2:14: `pids_limit` = 8 is not a number of processes from 16 to 4194304",
        ),
        (
            "[containers]\npids_limit = \"many\"\n",
            "config.toml:2:14: invalid type: string \"many\", expected i64",
        ),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
    let changed = parse("[containers]\nallow_ipc_host = true\n")
        .unwrap()
        .policy
        .changes_from(&Policy::default());
    assert_eq!(changed, vec!["containers.allow_ipc_host: false -> true"]);
}

#[test]
fn images_table_parses_and_explains_its_mistakes() {
    let i = parse("[images]\nallow = [\"registry.lab.example/*\", \"pytorch/*\"]\npull_timeout = \"10m\"\n")
        .unwrap()
        .policy
        .images;
    assert_eq!(
        i,
        Images {
            allow: Some(vec!["registry.lab.example/*".into(), "pytorch/*".into()]),
            pull_timeout: Duration::from_secs(600)
        }
    );
    assert_eq!(parse("").unwrap().policy.images, Images::default());
    let cases: &[(&str, &str)] = &[
        (
            "[images]\nallow = [\"https://r.example/*\"]\n",
            "config.toml:2:10: images `allow` lists \"https://r.example/*\", which is not an image pattern",
        ),
        (
            "[images]\nallow = [\"a b\"]\n",
            "is not an image pattern; write an image name with `*`",
        ),
        (
            "[images]\nallow = \"pytorch/*\"\n",
            "config.toml:2:9: invalid type: string \"pytorch/*\", expected a sequence",
        ),
        (
            "[images]\npull_timeout = \"2d\"\n",
            "`pull_timeout` = \"2d\" is longer than 1d; use at most \"1d\"",
        ),
        ("[images]\npull = \"1m\"\n", "config.toml:2:1: unknown field `pull`"),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
    let changed = parse("[images]\npull_timeout = \"1h\"\n")
        .unwrap()
        .policy
        .changes_from(&Policy::default());
    assert_eq!(changed, vec!["images.pull_timeout: 30m -> 1h"]);
}

#[test]
fn gpu_memory_enforcement_settings_parse() {
    let p = parse("[jobs]\ngpu_memory_margin = \"50%\"\ngpu_memory_grace = \"1m\"\n")
        .unwrap()
        .policy;
    assert_eq!(
        (p.gpu_memory_margin_pct, p.gpu_memory_grace),
        (50.0, Duration::from_secs(60))
    );
    let d = Policy::default();
    assert_eq!(
        (d.gpu_memory_margin_pct, d.gpu_memory_grace),
        (20.0, Duration::from_secs(30))
    );
    assert!(err("[jobs]\ngpu_memory_margin = \"lots\"\n")
        .contains("config.toml:2:21: `gpu_memory_margin` = \"lots\" is not a percentage from 0% to 1000%"));
    assert!(err("[jobs]\ngpu_memory_margin = \"20\"\n").contains("is not a percentage"));
    assert!(err("[jobs]\ngpu_memory_grace = \"soon\"\n").contains("`gpu_memory_grace` = \"soon\" is not a duration"));
}

#[test]
fn overrun_margin_parses_and_is_checked() {
    assert_eq!(Policy::default().overrun_margin, Duration::from_secs(30));
    assert_eq!(
        parse("[jobs]\noverrun_margin = \"2m\"\n")
            .unwrap()
            .policy
            .overrun_margin,
        Duration::from_secs(120)
    );
    assert!(
        err("[jobs]\noverrun_margin = \"late\"\n")
            .contains("config.toml:2:18: `overrun_margin` = \"late\" is not a duration"),
        "{}",
        err("[jobs]\noverrun_margin = \"late\"\n")
    );
    assert!(
        err("[jobs]\noverrun_margin = \"2d\"\n").contains("`overrun_margin` = \"2d\" is longer than 1d"),
        "{}",
        err("[jobs]\noverrun_margin = \"2d\"\n")
    );
}

#[test]
fn disk_table_parses_and_explains_its_mistakes() {
    let d = parse("[disk]\nmin_free = \"5%\"\nlayer_size = \"none\"\n")
        .unwrap()
        .policy
        .disk;
    assert_eq!(
        d,
        Disk {
            min_free: MinFree::Percent(5.0),
            layer_size: None
        }
    );
    assert_eq!(
        parse("[disk]\nmin_free = \"20GiB\"\nlayer_size = \"50GiB\"\n")
            .unwrap()
            .policy
            .disk,
        Disk {
            min_free: MinFree::Bytes(20 << 30),
            layer_size: Some(50 << 30)
        }
    );
    assert_eq!(parse("").unwrap().policy.disk, Disk::default());
    for (text, want) in [
        ("[disk]\nmin_free = \"lots\"\n", "config.toml:2:12: disk `min_free` = \"lots\" is not a size or a percentage; write e.g. \"10GiB\" or \"5%\""),
        ("[disk]\nmin_free = \"120%\"\n", "is not a size or a percentage"),
        ("[disk]\nlayer_size = \"10MiB\"\n", "config.toml:2:14: disk `layer_size` = \"10MiB\" is not a size of at least 1 GiB or \"none\""),
        ("[disk]\nfree = \"1GiB\"\n", "config.toml:2:1: unknown field `free`"),
    ] {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
}

#[test]
fn sessions_table_parses_and_explains_its_mistakes() {
    let s = parse("[sessions]\nmax_gpus = 2\ndefault_length = \"1h\"\nmax_length = \"8h\"\nbefore_batch = false\nnotebook_image = \"quay.io/jupyter/pytorch-notebook:cuda12-latest\"\n").unwrap().policy.sessions;
    let nb = Some("quay.io/jupyter/pytorch-notebook:cuda12-latest".to_string());
    assert_eq!(
        s,
        Sessions {
            max_gpus: Some(2),
            default_length: Duration::from_secs(3600),
            max_length: Duration::from_secs(8 * 3600),
            before_batch: false,
            notebook_image: nb,
            ..Sessions::default()
        }
    );
    let idle = parse("[sessions]\nidle_after = \"4s\"\nidle_batch = true\nkeep_free = 2\n")
        .unwrap()
        .policy
        .sessions;
    assert_eq!(
        (idle.idle_after, idle.idle_batch, idle.keep_free),
        (Some(Duration::from_secs(4)), true, 2)
    );
    let off = parse("[sessions]\nidle_after = \"none\"\nkeep_free = 0\n")
        .unwrap()
        .policy
        .sessions;
    assert_eq!((off.idle_after, off.keep_free), (None, 0));
    assert_eq!(Sessions::default().idle_after, Some(Duration::from_secs(3600)));
    assert_eq!(parse("").unwrap().policy.sessions, Sessions::default());
    // A fresh machine bounds what sessions (which jump the queue, never preempted) may claim; 0 lifts it.
    assert_eq!(Sessions::default().max_gpus, Some(2));
    assert_eq!(
        parse("[sessions]\nmax_gpus = 0\n").unwrap().policy.sessions.max_gpus,
        None
    );
    let cases: &[(&str, &str)] = &[
        ("[sessions]\nmax_gpu = 2\n", "config.toml:2:1: unknown field `max_gpu`"),
        (
            "[sessions]\nmax_gpus = -1\n",
            "config.toml:2:12: `max_gpus` = -1 is out of range",
        ),
        (
            "[sessions]\nmax_length = \"forever\"\n",
            "config.toml:2:14: `max_length` = \"forever\" is not a duration",
        ),
        (
            "[sessions]\nmax_length = \"30d\"\n",
            "`max_length` = \"30d\" is longer than 7d",
        ),
        (
            "[sessions]\ndefault_length = \"10h\"\nmax_length = \"2h\"\n",
            "config.toml:2:18: sessions `default_length` (10h) is longer than `max_length` (2h)",
        ),
        (
            "[sessions]\nmax_length = \"1h\"\n",
            "config.toml:2:14: sessions `default_length` (4h) is longer than `max_length` (1h); lower `default_length`",
        ),
        (
            "[sessions]\nidle_after = \"soon\"\n",
            "config.toml:2:14: `idle_after` = \"soon\" is not a duration",
        ),
        (
            "[sessions]\nforward_port = 8888\n",
            "config.toml:2:16: sessions `forward_port` = 8888 is not a port below 1024; only root may bind",
        ),
        (
            "[sessions]\nforward_port = 0\n",
            "`forward_port` = 0 is not a port below 1024",
        ),
        (
            "[sessions]\nkeep_free = -1\n",
            "config.toml:2:13: `keep_free` = -1 is out of range",
        ),
        (
            "[sessions]\nidle_batch = \"yes\"\n",
            "invalid type: string \"yes\", expected a boolean",
        ),
        (
            "[sessions]\nbefore_batch = 1\n",
            "invalid type: integer `1`, expected a boolean",
        ),
        (
            "[sessions]\nnotebook_image = \"a b\"\n",
            "config.toml:2:18: sessions `notebook_image` = \"a b\" is not an image name",
        ),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
}

#[test]
fn bookings_table_parses_and_explains_its_mistakes() {
    let b = parse("[bookings]\nenabled = false\nmax_gpu_hours_per_week = 40\nmax_ahead = \"7d\"\nmax_length = \"8h\"\nslot = \"1h\"\nrelease_after = \"15m\"\nmax_gpus = 2\n").unwrap().policy.bookings;
    let h = |n: u64| Duration::from_secs(n * 3600);
    assert_eq!(
        b,
        Bookings {
            enabled: false,
            max_gpu_hours_per_week: Some(40),
            max_ahead: h(7 * 24),
            max_length: h(8),
            slot: h(1),
            release_after: Duration::from_secs(900),
            max_gpus: Some(2)
        }
    );
    // A fresh machine is bounded: a day per booking, 48 GPU-hours a week per user, two weeks ahead.
    let d = parse("").unwrap().policy.bookings;
    assert_eq!(
        (
            d.enabled,
            d.slot,
            d.release_after,
            d.max_ahead,
            d.max_gpus,
            d.max_length,
            d.max_gpu_hours_per_week
        ),
        (
            true,
            Duration::from_secs(1800),
            Duration::from_secs(1800),
            h(14 * 24),
            None,
            h(24),
            Some(48)
        )
    );
    // 0 turns the weekly limit off.
    assert_eq!(
        parse("[bookings]\nmax_gpu_hours_per_week = 0\n")
            .unwrap()
            .policy
            .bookings
            .max_gpu_hours_per_week,
        None
    );
    let cases: &[(&str, &str)] = &[
        (
            "[bookings]\nslots = \"30m\"\n",
            "config.toml:2:1: unknown field `slots`",
        ),
        (
            "[bookings]\nslot = \"7m\"\n",
            "config.toml:2:8: bookings `slot` = \"7m\" is not a whole number of minutes that divides a day",
        ),
        ("[bookings]\nslot = \"90s\"\n", "is not a whole number of minutes"),
        (
            "[bookings]\nmax_ahead = \"2y\"\n",
            "`max_ahead` = \"2y\" is longer than",
        ),
        (
            "[bookings]\nmax_length = \"8760h\"\n",
            "`max_length` = \"8760h\" is longer than 31d",
        ),
        (
            "[bookings]\nrelease_after = \"later\"\n",
            "config.toml:2:17: `release_after` = \"later\" is not a duration",
        ),
        (
            "[bookings]\nmax_gpus = 0\n",
            "config.toml:2:12: `max_gpus` = 0 is out of range",
        ),
        (
            "[bookings]\nmax_gpu_hours_per_week = -3\n",
            "`max_gpu_hours_per_week` = -3 is out of range",
        ),
        (
            "[bookings]\nenabled = \"yes\"\n",
            "invalid type: string \"yes\", expected a boolean",
        ),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
}

#[test]
fn notify_and_metrics_tables_parse_and_explain_their_mistakes() {
    use crate::protocol::notify::NotifyEvent;
    let c = parse("[notify]\nsmtp_host = \"smtp.lab.org\"\nsmtp_from = \"gantry@lab.org\"\nwebhook_hosts = [\"Hooks.Slack.com\", \"127.0.0.1:9000\"]\nwebhooks = [{ url = \"https://chat.lab.org/h\", on = [\"failed\"] }, { url = \"http://x.org/\" }]\nmax_tries = 3\n[metrics]\nlisten = \"127.0.0.1:9464\"\n").unwrap();
    let smtp = c.notify.smtp.as_ref().unwrap();
    assert_eq!(
        (smtp.host.as_str(), smtp.port, smtp.starttls),
        ("smtp.lab.org", 587, true),
        "STARTTLS on the submission port by default"
    );
    assert_eq!(c.notify.webhook_hosts, ["hooks.slack.com", "127.0.0.1:9000"]);
    assert_eq!(
        c.notify.webhooks,
        vec![
            ("https://chat.lab.org/h".to_string(), vec![NotifyEvent::Failed]),
            ("http://x.org/".to_string(), vec![NotifyEvent::StoreProblem])
        ]
    );
    assert_eq!(
        (c.notify.max_tries, c.metrics.listen.map(|a| a.port())),
        (3, Some(9464))
    );
    assert_eq!(parse("").unwrap().metrics.listen, None, "metrics are off by default");
    let bounded = parse("[metrics]\nlisten = \"127.0.0.1:9464\"\nmax_connections = 8\nidle_timeout = \"3s\"\n")
        .unwrap()
        .metrics;
    assert_eq!(
        (bounded.max_connections, bounded.idle_timeout),
        (8, Duration::from_secs(3))
    );
    assert_eq!(
        (
            parse("").unwrap().metrics.max_connections,
            parse("").unwrap().metrics.idle_timeout
        ),
        (64, Duration::from_secs(10)),
        "bounded by default"
    );
    assert_eq!(parse("").unwrap().policy.sessions.forward_port, 1021);
    assert_eq!(
        parse("[sessions]\nforward_port = 999\n")
            .unwrap()
            .policy
            .sessions
            .forward_port,
        999
    );
    assert!(parse("[metrics]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true\n")
        .unwrap()
        .metrics
        .listen
        .is_some());
    let cases: &[(&str, &str)] = &[
        (
            "[metrics]\nlisten = \"0.0.0.0:9464\"\n",
            "config.toml:2:10: metrics `listen` = \"0.0.0.0:9464\" is not a loopback address",
        ),
        ("[metrics]\nlisten = \"localhost\"\n", "is not an address and port"),
        (
            "[metrics]\nmax_connections = 0\n",
            "config.toml:2:19: `max_connections` = 0 is out of range",
        ),
        (
            "[metrics]\nidle_timeout = \"never\"\n",
            "`idle_timeout` = \"never\" is not a duration",
        ),
        (
            "[notify]\nsmtp_host = \"smtp.lab.org\"\n",
            "config.toml:2:13: `smtp_host` is set but `smtp_from` is not",
        ),
        (
            "[notify]\nsmtp_host = \"a\"\nsmtp_from = \"nobody\"\n",
            "`smtp_from` = \"nobody\" is not an email address",
        ),
        (
            "[notify]\nsmtp_port = 25\n",
            "`smtp_port` is set but `smtp_host` is not",
        ),
        (
            "[notify]\nwebhook_hosts = [\"a b\"]\n",
            "`webhook_hosts` lists \"a b\": it is not a host name",
        ),
        (
            "[notify]\nwebhooks = [{ url = \"ftp://x/\" }]\n",
            "is not an http:// or https:// URL",
        ),
        (
            "[notify]\nwebhooks = [{ url = \"http://x.org/\", on = [\"sometimes\"] }]\n",
            "lists \"sometimes\", which is not an event",
        ),
        ("[notify]\nsmtp_relay = \"x\"\n", "unknown field `smtp_relay`"),
        ("[notify]\nmax_tries = 0\n", "`max_tries` = 0 is out of range"),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
    let changed = parse("[metrics]\nlisten = \"127.0.0.1:9464\"\n")
        .unwrap()
        .restart_only_changes(&LabConfig::default());
    assert_eq!(changed, ["metrics"]);
}

#[test]
fn preemption_table_parses_and_explains_its_mistakes() {
    let p = Policy::default().preemption;
    assert_eq!(
        (p.enabled, p.default_preemptible, p.rules()),
        (false, false, None),
        "off out of the box"
    );
    assert_eq!(
        (p.rules.min_run_ms, p.rules.max_per_day, p.rules.priority_gap),
        (10 * 60_000, 3, Some(11))
    );
    // A user's highest priority does not preempt a priority-0 job by priority alone.
    assert!(Policy::default().user_priority.1 < p.rules.priority_gap.unwrap());
    let p = parse("[preemption]\nenabled = true\ndefault_preemptible = true\nreserve_after = false\npriority_gap = 5\nfair_share = true\nmin_run = \"30m\"\nmax_per_day = 2\n").unwrap().policy.preemption;
    let want = crate::scheduler::PreemptRules {
        overdue: false,
        priority_gap: Some(5),
        fair_share: true,
        min_run_ms: 30 * 60_000,
        max_per_day: 2,
    };
    assert_eq!((p.enabled, p.default_preemptible, p.rules()), (true, true, Some(want)));
    assert_eq!(
        parse("[preemption]\npriority_gap = 0\n")
            .unwrap()
            .policy
            .preemption
            .rules
            .priority_gap,
        None
    );
    let cases: &[(&str, &str)] = &[
        (
            "[preemption]\nenable = true\n",
            "config.toml:2:1: unknown field `enable`",
        ),
        (
            "[preemption]\nenabled = \"yes\"\n",
            "config.toml:2:11: invalid type: string \"yes\", expected a boolean",
        ),
        (
            "[preemption]\npriority_gap = -1\n",
            "config.toml:2:16: `priority_gap` = -1 is out of range; use a number from 1 to 2000",
        ),
        (
            "[preemption]\nmin_run = \"soon\"\n",
            "config.toml:2:11: `min_run` = \"soon\" is not a duration",
        ),
        (
            "[preemption]\nmin_run = \"2d\"\n",
            "`min_run` = \"2d\" is longer than 1d",
        ),
        (
            "[preemption]\nmax_per_day = 0\n",
            "config.toml:2:15: `max_per_day` = 0 is out of range",
        ),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
    }
    let changed = parse("[preemption]\nenabled = true\n")
        .unwrap()
        .policy
        .changes_from(&Policy::default());
    assert_eq!(changed, vec!["preemption.enabled: false -> true"]);
}

#[test]
fn gpus_resolve_against_the_machine_by_index_or_uuid() {
    let inv: Vec<(u32, String)> = (0..4).map(|i| (i, format!("GPU-{i}"))).collect();
    let c = parse("\n\ngpus = [0, \"GPU-3\"]\n").unwrap();
    assert_eq!(c.gpus.as_ref().unwrap().resolve(&inv).unwrap(), BTreeSet::from([0, 3]));
    let c = parse("gpus = [0, 7]\n").unwrap();
    let e = c.gpus.unwrap().resolve(&inv).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/gantry/config.toml:1:8: `gpus` names GPU 7, which this machine does not have"),
        "{e}"
    );
    assert!(e.contains("0 (GPU-0), 1 (GPU-1)"), "{e}");
}

#[test]
fn admins_and_what_they_may_do() {
    let p = Policy::default();
    assert!(p.is_admin(0) && !p.is_admin(4242));
    assert_eq!(
        (p.priority_range(0), p.priority_range(4242)),
        (config::ADMIN_PRIORITY, config::USER_PRIORITY)
    );
    assert!(p.may_see_private(4242, 4242) && p.may_see_private(0, 4242) && !p.may_see_private(4243, 4242));
    let all = Policy {
        see_others: SeeOthers::All,
        ..Policy::default()
    };
    assert!(all.may_see_private(4243, 4242));
    // The root group's members (gid 0 is root's primary group) are admins.
    let g = parse("[access]\nadmin_group = \"root\"\n").unwrap().policy;
    assert_eq!(g.admin_gid, Some(0));
    let changes = g.changes_from(&p);
    assert!(
        changes
            .iter()
            .any(|c| c.starts_with("access.admin_group: None -> Some(\"root\")")),
        "{changes:?}"
    );
}

/// The packaged /etc/gantry/config.toml is valid as shipped, and every key it documents (the
/// commented `#key = value` lines) is one the engine reads, with a valid example value.
#[test]
fn the_packaged_config_is_valid_and_documents_only_real_keys() {
    let shipped = include_str!("../../../../packaging/config.toml").replace("\"gantry-admins\"", "\"root\"");
    let path = Path::new("/etc/gantry/config.toml");
    LabConfig::parse(&shipped, path).unwrap_or_else(|e| panic!("as shipped: {e}"));
    let mut documented = 0;
    let all: String = shipped
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(kv)
                if kv
                    .split_once(" = ")
                    .is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')) =>
            {
                documented += 1;
                format!("{kv}\n")
            }
            _ => format!("{l}\n"),
        })
        .collect();
    assert!(documented >= 19, "only {documented} documented keys found");
    LabConfig::parse(&all, path).unwrap_or_else(|e| panic!("with every documented key set: {e}"));
}
