//! The job owner's name inside the container: `/etc/passwd` and `/etc/group` for a job, the image's
//! own entries plus one for the owner (and their groups), so `whoami`, `id -un` and Python's
//! `getpass.getuser()` work for a user the image never heard of. The engine writes them into its own
//! state dir ([`crate::staging::Staging::write_generated`]) and mounts them read-only.
//!
//! Pure: the caller reads the image's files and the owner's names.

/// The most of an image's `/etc/passwd` or `/etc/group` that is kept (a real one is a few KiB).
pub const IMAGE_FILE_MAX: usize = 1 << 20;

/// Who a job runs as, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// `$HOME` in the container.
    pub home: String,
    /// Named groups: the primary group first, then the supplementary ones.
    pub groups: Vec<(String, u32)>,
}

/// Can this go into a passwd or group field? (Names from the host's user database, but one served by
/// LDAP could hold anything: nothing that would split a field or a line.)
pub fn is_safe_field(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && !s.chars().any(|c| c == ':' || c == ',' || c.is_control())
}

/// The image's lines (none from a file over [`IMAGE_FILE_MAX`]) that have `fields` fields, except those `drop` says.
fn image_lines(image: Option<&[u8]>, fields: usize, drop: impl Fn(&[&str]) -> bool) -> Vec<&str> {
    let Some(text) = image
        .filter(|b| b.len() <= IMAGE_FILE_MAX)
        .and_then(|b| std::str::from_utf8(b).ok())
    else {
        return vec![];
    };
    text.lines()
        .filter(|l| {
            let f: Vec<&str> = l.split(':').collect();
            f.len() == fields && !f[0].is_empty() && !drop(&f)
        })
        .collect()
}

/// `/etc/passwd`: the image's entries but any with the owner's name or uid, root's if the image has
/// none, and the owner's.
pub fn passwd(image: Option<&[u8]>, a: &Account) -> String {
    let uid = a.uid.to_string();
    let kept = image_lines(image, 7, |f| f[0] == a.name || f[2] == uid);
    let mut out = String::new();
    if a.uid != 0 && !kept.iter().any(|l| l.split(':').nth(2) == Some("0")) {
        out.push_str("root:x:0:0:root:/root:/bin/sh\n");
    }
    for l in kept {
        out.push_str(l);
        out.push('\n');
    }
    out.push_str(&format!(
        "{}:x:{}:{}:{}:{}:/bin/sh\n",
        a.name, a.uid, a.gid, a.name, a.home
    ));
    out
}

/// `/etc/group`: the image's groups but any with one of the owner's group names or gids, root's if
/// the image has none, and the owner's groups (the owner a member of the supplementary ones).
pub fn group(image: Option<&[u8]>, a: &Account) -> String {
    let gids: Vec<String> = a.groups.iter().map(|g| g.1.to_string()).collect();
    let kept = image_lines(image, 4, |f| {
        a.groups.iter().any(|g| g.0 == f[0]) || gids.iter().any(|g| g == f[2])
    });
    let mut out = String::new();
    if !gids.iter().any(|g| g == "0") && !kept.iter().any(|l| l.split(':').nth(2) == Some("0")) {
        out.push_str("root:x:0:\n");
    }
    for l in kept {
        out.push_str(l);
        out.push('\n');
    }
    for (i, (name, gid)) in a.groups.iter().enumerate() {
        let members = if i == 0 || *gid == a.gid { "" } else { a.name.as_str() };
        out.push_str(&format!("{name}:x:{gid}:{members}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Account {
        Account {
            name: "alice".into(),
            uid: 1001,
            gid: 1001,
            home: "/home/alice".into(),
            groups: vec![("alice".into(), 1001), ("lab".into(), 2000)],
        }
    }

    #[test]
    fn the_owner_is_added_to_the_images_own_entries() {
        let image = b"root:x:0:0:root:/root:/bin/bash\nubuntu:x:1001:1001::/home/ubuntu:/bin/bash\nalice:x:5:5::/:/bin/false\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\nnot an entry\n";
        assert_eq!(
            passwd(Some(image), &alice()),
            "root:x:0:0:root:/root:/bin/bash\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\nalice:x:1001:1001:alice:/home/alice:/bin/sh\n",
            "the image's user with the same uid or name gives way"
        );
        assert_eq!(
            passwd(None, &alice()),
            "root:x:0:0:root:/root:/bin/sh\nalice:x:1001:1001:alice:/home/alice:/bin/sh\n"
        );
        let groups = b"root:x:0:\nlab:x:77:\nvideo:x:44:\nubuntu:x:1001:\n";
        assert_eq!(
            group(Some(groups), &alice()),
            "root:x:0:\nvideo:x:44:\nalice:x:1001:\nlab:x:2000:alice\n"
        );
        assert_eq!(group(None, &alice()), "root:x:0:\nalice:x:1001:\nlab:x:2000:alice\n");
        let root = Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
            groups: vec![("root".into(), 0)],
        };
        assert_eq!(passwd(None, &root), "root:x:0:0:root:/root:/bin/sh\n");
        assert_eq!(group(None, &root), "root:x:0:\n");
        // An image's file that is not text, or is huge, adds nothing of its own.
        assert_eq!(passwd(Some(&[0xff, 0xfe, b'\n']), &alice()), passwd(None, &alice()));
        assert!(
            is_safe_field("gantry-alice")
                && !is_safe_field("a:b")
                && !is_safe_field("a\nroot:x:0:0")
                && !is_safe_field("")
        );
    }
}
