//! A job knows its owner by name (issue 22 item 2): `whoami`, `id -un` and `$USER` work as a real
//! non-root user, from an image with its own `/etc/passwd` or with none, through files the engine
//! writes into its own state dir and mounts read-only; one user's container never lists another.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Once;

use crate::dl_defaults::{container_of, docker_inspect, submit_as};
use crate::helpers::*;

/// The test image with an `/etc/passwd` and `/etc/group` of its own (a user of its own, uid 4242).
const ETC_IMAGE: &str = "gantry-test/busybox-etc:1";

fn ensure_etc_image() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let have = Command::new("docker").args(["image", "inspect", ETC_IMAGE]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if have.map(|s| s.success()).unwrap_or(false) {
            return;
        }
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -e; r=$(mktemp -d); mkdir -p $r/bin $r/tmp $r/etc; cp /bin/busybox $r/bin/busybox; \
                 for c in sh echo env sleep cat id grep true false ls; do ln -s busybox $r/bin/$c; done; \
                 printf 'root:x:0:0:root:/root:/bin/sh\\nimguser:x:4242:4242:image user:/home/imguser:/bin/sh\\n' > $r/etc/passwd; \
                 printf 'root:x:0:\\nimggroup:x:4242:imguser\\n' > $r/etc/group; \
                 tar -C $r -c . | docker import - {ETC_IMAGE} >/dev/null; rm -rf $r"
            ))
            .status()
            .unwrap();
        assert!(status.success(), "could not build {ETC_IMAGE}");
    });
}

const WHO: &str = "busybox whoami; busybox id -un; busybox id -gn; busybox id -Gn; echo \"USER=$USER LOGNAME=$LOGNAME\"; \
                   echo image users: $(busybox grep -c ^imguser: /etc/passwd); echo others: $(busybox grep -c gantry-bob /etc/passwd)";

#[test]
fn a_job_knows_its_owner_by_name_from_files_only_the_engine_writes() {
    ensure_etc_image();
    let alice = user("gantry-alice");
    let bob = user("gantry-bob");
    add_to_group(&alice, "gantry-dl-lab");
    let e = Engine::start(&[]);
    for (image, image_users) in [(IMAGE, 0), (ETC_IMAGE, 1)] {
        let id = submit_as(&e, &alice, &format!("image: {image}\ngpus: 0\ncommand: '{WHO}'\n")).unwrap();
        assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
        let mut out: Vec<String> = e
            .logs(id)
            .lines()
            .filter(|l| !l.starts_with("[gantry"))
            .map(String::from)
            .collect();
        // Her groups by name (other tests add her to more): her own first, then the lab's.
        let groups = out.remove(3);
        let groups: Vec<&str> = groups.split(' ').collect();
        assert!(
            groups[0] == "gantry-alice"
                && groups.contains(&"gantry-dl-lab")
                && groups.iter().all(|g| g.parse::<u32>().is_err()),
            "{groups:?}"
        );
        let want = [
            "gantry-alice",
            "gantry-alice",
            "gantry-alice",
            "USER=gantry-alice LOGNAME=gantry-alice",
            &format!("image users: {image_users}"),
            "others: 0",
        ];
        assert_eq!(
            out, want,
            "in {image}: the owner by name, the image's own users kept, no other user of this machine listed"
        );
    }
    // The files are the engine's: under its state dir, in folders only root can change, mounted read-only.
    let signal = bob.private_dir("identity");
    let id = submit_as(&e, &bob, &format!("image: {ETC_IMAGE}\ngpus: 0\nmounts: ['{}:/signal']\ncommand: 'busybox whoami; until [ -e /signal/done ]; do sleep 0.1; done'\n", signal.display())).unwrap();
    let c = docker_inspect(&container_of(&e, id));
    for target in ["/etc/passwd", "/etc/group"] {
        let m = c["Mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["Destination"] == target)
            .unwrap_or_else(|| panic!("no {target} mount: {}", c["Mounts"]));
        assert_eq!(m["RW"], false, "{m}");
        let source = Path::new(m["Source"].as_str().unwrap());
        assert!(source.starts_with(e.state.join("mnt")), "{m}");
        let meta = std::fs::symlink_metadata(source).unwrap();
        assert!(
            meta.is_file() && meta.uid() == 0 && meta.mode() & 0o022 == 0,
            "{m}: {meta:?}"
        );
        for dir in source.ancestors().skip(1).take_while(|d| d.starts_with(&e.state)) {
            let d = std::fs::symlink_metadata(dir).unwrap();
            assert!(
                d.is_dir() && d.uid() == 0 && d.mode() & 0o022 == 0,
                "{} can be changed by others: {:o}",
                dir.display(),
                d.mode()
            );
        }
        let text = std::fs::read_to_string(source).unwrap();
        assert!(
            text.contains("gantry-bob") && !text.contains("gantry-alice"),
            "bob's container lists bob only: {text}"
        );
    }
    std::fs::write(signal.join("done"), "").unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    assert!(e.logs(id).lines().any(|l| l == "gantry-bob"));
    e.wait_until("the generated files to go with the container", || {
        std::fs::read_dir(e.state.join("mnt"))
            .map(|d| d.count() == 0)
            .unwrap_or(true)
    });
}
