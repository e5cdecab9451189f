//! `[disk]`: Docker's disk (its root dir holds every job's writable layer, images and Docker's logs)
//! is shared by all jobs and the engine. Each job's writable layer is bounded where the storage
//! driver can (`--storage-opt size`), and below a free-space threshold no new job starts, naming
//! the jobs that wrote the most. Pure: the engine measures, these decide and word.

use crate::units::format_bytes;

/// Below this much free space in Docker's root dir, no new job starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MinFree {
    Bytes(u64),
    /// Of the file system's size.
    Percent(f64),
}

impl MinFree {
    pub fn bytes(&self, total: u64) -> u64 {
        match *self {
            MinFree::Bytes(b) => b,
            MinFree::Percent(p) => (total as f64 * p / 100.0) as u64,
        }
    }

    pub fn show(&self) -> String {
        match self {
            MinFree::Bytes(b) => format_bytes(*b),
            MinFree::Percent(p) => format!("{p}%"),
        }
    }

    /// `"10GiB"`, `"5%"`.
    pub fn parse(s: &str) -> Option<MinFree> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p.trim().parse().ok()?;
            return (p.is_finite() && (0.0..=100.0).contains(&p)).then_some(MinFree::Percent(p));
        }
        crate::units::parse_bytes(s).map(MinFree::Bytes)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Disk {
    pub min_free: MinFree,
    /// Each job's writable layer, where the storage driver can bound it; `None`: unbounded.
    pub layer_size: Option<u64>,
}

impl Default for Disk {
    fn default() -> Self {
        Disk {
            min_free: MinFree::Bytes(crate::defaults::DISK_MIN_FREE),
            layer_size: Some(crate::defaults::LAYER_SIZE),
        }
    }
}

/// A container of Gantry's and what its writable layer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub job_id: Option<i64>,
    /// Its owner's name (or uid).
    pub owner: String,
    pub size_rw: u64,
}

/// Whether Docker's storage driver bounds a container's writable layer (`--storage-opt size`):
/// overlay2 only on xfs mounted with project quotas, btrfs and zfs always. `Err`: why not.
pub fn layer_bound(driver: &str, backing: Option<&str>, mount_options: Option<&str>) -> Result<(), String> {
    let pquota = mount_options.is_some_and(|o| o.split(',').any(|x| matches!(x, "pquota" | "prjquota")));
    match (driver, backing) {
        ("btrfs" | "zfs", _) => Ok(()),
        ("overlay2", Some("xfs")) if pquota => Ok(()),
        ("overlay2", Some("xfs")) => {
            Err("Docker's overlay2 is on xfs without project quotas (mount it with `pquota`)".into())
        }
        ("overlay2", Some(fs)) => Err(format!(
            "Docker's overlay2 is on {fs}; Docker bounds it only on xfs with `pquota`, btrfs or zfs"
        )),
        (d, _) => Err(format!(
            "Docker's storage driver {d} cannot bound it here (overlay2 on xfs with `pquota`, btrfs and zfs can)"
        )),
    }
}

/// Why no new job starts (`None`: enough space): free space of `root` below the lab's threshold,
/// with the largest writers first.
pub fn low_disk(root: &str, free: u64, total: u64, min: MinFree, set_in: &str, writers: &[Writer]) -> Option<String> {
    let need = min.bytes(total);
    if free >= need {
        return None;
    }
    let mut w: Vec<&Writer> = writers.iter().filter(|w| w.size_rw > 0).collect();
    w.sort_by_key(|w| std::cmp::Reverse(w.size_rw));
    let top: Vec<String> = w
        .iter()
        .take(3)
        .map(|w| match w.job_id {
            Some(id) => format!("job {id} ({}) {}", w.owner, format_bytes(w.size_rw)),
            None => format!("a container of {} {}", w.owner, format_bytes(w.size_rw)),
        })
        .collect();
    let writers = if top.is_empty() {
        "no Gantry job holds much of it; look at images and other containers (`docker system df`)".to_string()
    } else {
        format!("top writers: {}", top.join(", "))
    };
    Some(format!(
        "Docker's disk ({root}) has {} free, below the lab's minimum of {}{set_in}: no new job starts until space is freed ({writers})",
        format_bytes(free),
        min.show()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_drivers_bound_a_layer() {
        let rows: &[(&str, Option<&str>, Option<&str>, bool)] = &[
            ("overlay2", Some("extfs"), Some("rw,relatime"), false),
            (
                "overlay2",
                Some("xfs"),
                Some("rw,relatime,attr2,inode64,prjquota"),
                true,
            ),
            ("overlay2", Some("xfs"), Some("rw,pquota"), true),
            ("overlay2", Some("xfs"), Some("rw,relatime"), false),
            ("btrfs", Some("btrfs"), None, true),
            ("zfs", None, None, true),
            ("vfs", None, None, false),
        ];
        for (d, b, o, ok) in rows {
            assert_eq!(layer_bound(d, *b, *o).is_ok(), *ok, "{d} {b:?} {o:?}");
        }
        assert_eq!(
            layer_bound("overlay2", Some("extfs"), None).unwrap_err(),
            "Docker's overlay2 is on extfs; Docker bounds it only on xfs with `pquota`, btrfs or zfs"
        );
    }

    #[test]
    fn low_disk_names_the_top_writers() {
        let gib = 1u64 << 30;
        let w = |id: i64, who: &str, g: u64| Writer {
            job_id: Some(id),
            owner: who.into(),
            size_rw: g * gib,
        };
        let writers = vec![
            w(1, "alice", 1),
            w(2, "bob", 40),
            w(3, "carol", 3),
            w(4, "dan", 2),
            Writer {
                job_id: None,
                owner: "uid 1007".into(),
                size_rw: 0,
            },
        ];
        // (free, total, min, starts)
        let rows = [
            (20 * gib, 100 * gib, MinFree::Bytes(10 * gib), true),
            (5 * gib, 100 * gib, MinFree::Bytes(10 * gib), false),
            (6 * gib, 100 * gib, MinFree::Percent(5.0), true),
            (4 * gib, 100 * gib, MinFree::Percent(5.0), false),
        ];
        for (free, total, min, starts) in rows {
            assert_eq!(
                low_disk("/var/lib/docker", free, total, min, "", &writers).is_none(),
                starts,
                "{free} of {total}, min {min:?}"
            );
        }
        let msg = low_disk(
            "/var/lib/docker",
            5 * gib,
            100 * gib,
            MinFree::Bytes(10 * gib),
            " (disk.min_free in /etc/gantry/config.toml)",
            &writers,
        )
        .unwrap();
        assert_eq!(
            msg,
            "Docker's disk (/var/lib/docker) has 5.0 GiB free, below the lab's minimum of 10.0 GiB (disk.min_free in /etc/gantry/config.toml): no new job starts until space is freed (top writers: job 2 (bob) 40.0 GiB, job 3 (carol) 3.0 GiB, job 4 (dan) 2.0 GiB)"
        );
        assert!(low_disk("/d", 1, 100, MinFree::Percent(50.0), "", &[])
            .unwrap()
            .contains("no Gantry job holds much of it"));
        assert_eq!(MinFree::parse("5%"), Some(MinFree::Percent(5.0)));
        assert_eq!(MinFree::parse("10GiB"), Some(MinFree::Bytes(10 * gib)));
        assert_eq!(MinFree::parse("101%"), None);
    }
}
