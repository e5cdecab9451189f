//! The root image of an `image: host` job: this machine's top-level layout as a one-layer tar
//! (empty folders, its links), its system folders bind-mounted read-only.

/// The image an `image: host` job starts from: empty folders and this machine's top-level links
/// (`/bin -> usr/bin` on a merged-/usr system), with the machine's system folders bind-mounted
/// read-only on it ([`HostRoot::binds`]). Made once per layout with `docker import`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    /// `gantry-host-root:<hash of the layout>`.
    pub tag: String,
    /// Its only layer, a tar archive.
    pub tar: Vec<u8>,
    /// The machine's folders mounted read-only at the same path.
    pub binds: Vec<String>,
}

/// Empty folders of the host root (mount points, scratch space; `tmp` is sticky and writable by all).
/// `sbin` is the container's own: Docker puts its init at `/sbin/docker-init`, which it could not
/// create inside the machine's read-only `/sbin` (the machine's are in `/usr/sbin` on a merged-/usr
/// system, which Debian 12 and Ubuntu are).
const HOST_ROOT_DIRS: [(&str, u32); 13] = [
    ("sbin", 0o755),
    ("tmp", 0o1777),
    ("var", 0o755),
    ("var/tmp", 0o1777),
    ("home", 0o755),
    ("root", 0o700),
    ("proc", 0o555),
    ("sys", 0o555),
    ("dev", 0o755),
    ("run", 0o755),
    ("mnt", 0o755),
    ("media", 0o755),
    ("srv", 0o755),
];

/// What a top-level system folder is on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopLevel {
    Dir,
    /// A symbolic link, and where it points (`usr/bin`).
    Link(String),
}

impl HostRoot {
    /// The host root of a machine whose top-level system folders are `layout` (name, what it is).
    pub fn of(layout: &[(&str, TopLevel)]) -> HostRoot {
        let mut tar = vec![];
        for (dir, mode) in HOST_ROOT_DIRS {
            tar.extend(tar_header(dir, b'5', mode, ""));
        }
        let mut binds = vec![];
        let mut described = String::new();
        for (name, what) in layout.iter().filter(|(n, _)| *n != "sbin") {
            match what {
                TopLevel::Dir => {
                    tar.extend(tar_header(name, b'5', 0o755, ""));
                    binds.push(format!("/{name}"));
                    described.push_str(&format!("{name}/;"));
                }
                TopLevel::Link(to) => {
                    tar.extend(tar_header(name, b'2', 0o777, to));
                    described.push_str(&format!("{name}->{to};"));
                }
            }
        }
        tar.extend([0u8; 1024]);
        // FNV-1a of the layout: another machine's (or a changed) layout is another image.
        let hash = described.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        HostRoot {
            tag: format!("gantry-host-root:{:012x}", hash >> 16),
            tar,
            binds,
        }
    }

    /// This machine's.
    pub fn of_this_machine() -> HostRoot {
        let mut layout = vec![];
        for name in crate::spec::HOST_SYSTEM_FOLDERS.map(|d| d.trim_start_matches('/')) {
            match std::fs::symlink_metadata(format!("/{name}")) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(to) = std::fs::read_link(format!("/{name}")) {
                        layout.push((name, TopLevel::Link(to.to_string_lossy().into_owned())));
                    }
                }
                Ok(m) if m.is_dir() => layout.push((name, TopLevel::Dir)),
                _ => {}
            }
        }
        HostRoot::of(&layout)
    }
}

/// One ustar header (a directory or a symbolic link: no data follows), owned by root.
fn tar_header(name: &str, kind: u8, mode: u32, link: &str) -> [u8; 512] {
    let mut h = [0u8; 512];
    let name = if kind == b'5' {
        format!("{name}/")
    } else {
        name.to_string()
    };
    h[..name.len().min(100)].copy_from_slice(&name.as_bytes()[..name.len().min(100)]);
    let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}\0", w = width - 1);
        h[at..at + width].copy_from_slice(s.as_bytes());
    };
    octal(&mut h, 100, 8, u64::from(mode));
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, 0);
    octal(&mut h, 136, 12, 0);
    h[156] = kind;
    h[157..157 + link.len().min(100)].copy_from_slice(&link.as_bytes()[..link.len().min(100)]);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}
