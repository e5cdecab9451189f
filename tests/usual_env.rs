//! Jobs in your usual environment: no `image` (or `image: host`) runs in a container made of this
//! machine's own system folders (read-only) and the owner's home (read-write, checked as her), as
//! real users against a real root engine.

use crate::helpers::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_job_without_an_image_runs_her_script_with_the_venv_in_her_home_and_stays_isolated() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let proj = alice.private_dir("usual");
    let venv = proj.join("venv");
    let made = alice.sh(&format!("/usr/bin/python3 -m venv --without-pip {}", venv.display()));
    assert!(made.status.success(), "python3 -m venv: {}", text(&made));
    alice.write(
        &proj.join("train.py"),
        "import os, sys\nopen('out.txt', 'w').write('trained\\n')\nprint('prefix', sys.prefix)\nprint('cwd', os.getcwd())\nprint('uid', os.getuid())\nprint('CVD', os.environ.get('CUDA_VISIBLE_DEVICES'))\n",
    );
    let spec = alice.write(
        &proj.join("train.yaml"),
        &format!(
            "command: [{}/bin/python, train.py]\nworkdir: {}\ngpus: 1\n",
            venv.display(),
            proj.display()
        ),
    );
    let v = e.json_as(&alice, &["submit", spec.to_str().unwrap()]);
    let id = v[0]["job_id"].as_i64().unwrap();
    let j = e.wait_final(id);
    assert_eq!(j["job"]["state"], "succeeded", "{j}\n{}", e.logs(id));
    assert_eq!(j["job"]["image"], "host");
    let log = e.logs(id);
    for want in [
        format!("prefix {}", venv.display()),
        format!("cwd {}", proj.display()),
        format!("uid {}", alice.uid),
        "CVD 0".into(),
    ] {
        assert!(log.contains(&want), "{want:?} in {log}");
    }
    let out = std::fs::metadata(proj.join("out.txt")).expect("the script's output is in her home");
    assert_eq!((out.uid(), out.gid()), (alice.uid, alice.gid), "her files are hers");

    // `gantry run` from her project folder with the venv active: no image, her PATH and folder carried over.
    let run = alice
        .command(bin())
        .arg("--state-dir")
        .arg(&e.state)
        .args(["run", "--json", "--gpus", "0", "--", "python", "-c", "import os, sys; print('prefix', sys.prefix); print('cwd', os.getcwd()); print('venv', os.environ['VIRTUAL_ENV'])"])
        .current_dir(&proj)
        .env("PATH", format!("{}/bin:/usr/bin:/bin", venv.display()))
        .env("VIRTUAL_ENV", &venv)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", text(&run));
    let id = serde_json::from_slice::<serde_json::Value>(&run.stdout).unwrap()["job_id"]
        .as_i64()
        .unwrap();
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    let log = e.logs(id);
    for want in [
        format!("prefix {}", venv.display()),
        format!("cwd {}", proj.display()),
        format!("venv {}", venv.display()),
    ] {
        assert!(log.contains(&want), "{want:?} in {log}");
    }

    // Still a job like any: the machine's folders are read-only, no capabilities, no new privileges.
    let probe = alice.write(&proj.join("probe.yaml"), "gpus: 0\ncommand: 'touch /usr/gantry-probe; touch /etc/gantry-probe; grep -E \"^(CapEff|NoNewPrivs)\" /proc/self/status; id -un'\n");
    let id = e.json_as(&alice, &["submit", probe.to_str().unwrap()])[0]["job_id"]
        .as_i64()
        .unwrap();
    e.wait_final(id);
    let log = e.logs(id);
    assert_eq!(log.matches("Read-only file system").count(), 2, "{log}");
    assert!(
        log.contains("CapEff:\t0000000000000000") && log.contains("NoNewPrivs:\t1"),
        "{log}"
    );
    assert!(
        log.contains("gantry-alice\n"),
        "her name from the machine's own passwd: {log}"
    );
    assert!(!Path::new("/usr/gantry-probe").exists() && !Path::new("/etc/gantry-probe").exists());

    // A mount outside her reach is still refused, and nothing goes inside the system folders.
    let bad = alice.write(
        &proj.join("bad.yaml"),
        "gpus: 0\ncommand: ls /r\nmounts: ['/root:/r:ro']\n",
    );
    let out = e.gantry_user(&alice, &["submit", bad.to_str().unwrap()]);
    assert!(
        !out.status.success() && text(&out).contains("gantry-alice cannot read /root"),
        "{}",
        text(&out)
    );
    let inside = alice.write(
        &proj.join("inside.yaml"),
        &format!("image: host\ngpus: 0\nmounts: ['{}:/opt/x']\n", proj.display()),
    );
    let out = e.gantry_user(&alice, &["submit", inside.to_str().unwrap()]);
    assert!(
        !out.status.success() && text(&out).contains("inside this machine's system folders"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_lab_can_turn_image_less_jobs_off() {
    let cfg = tempfile::tempdir().unwrap();
    let file = cfg.path().join("config.toml");
    std::fs::write(&file, "[containers]\nhost_image = false\n").unwrap();
    let e = Engine::start(&["--config", file.to_str().unwrap()]);
    let spec = e.write_spec("plain.yaml", "command: 'true'\ngpus: 0\n");
    let out = e.gantry(&["submit", spec.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("jobs without an image (`image: host`, this machine's own folders) are turned off here (containers.host_image in"), "{}", text(&out));
    let ok = e.submit_yaml("img", &format!("image: {IMAGE}\ncommand: 'true'\ngpus: 0\n"));
    assert_eq!(e.wait_final(ok)["job"]["state"], "succeeded");
}

#[test]
fn a_shell_without_an_image_is_her_login_shell_in_her_folder_on_the_machines_own_programs() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let proj = alice.private_dir("shell");
    let mut c = alice.command(bin());
    c.arg("--state-dir")
        .arg(&e.state)
        .env("TERM", "xterm")
        .args(["shell", "--gpus", "0", "--for", "10m"])
        .current_dir(&proj);
    let mut p = crate::sessions::Pty::spawn(c, 80, 24);
    let at = p.wait_for("attached to session", 0);
    p.send("echo \"[$(pwd)] [$HOME] [$0]\"; /usr/bin/python3 -c 'print(6*7)'; exit\r");
    let at = p.wait_for(
        &format!("[{}] [{}] [/bin/sh]\r\n", proj.display(), alice.home.display()),
        at,
    );
    p.wait_for("42\r\n", at);
    assert!(p.wait_exit().success(), "{}", p.text());
}

/// Issue 28 item 3: `gantry shell` without an image carries the active venv exactly as `gantry run`
/// does (PATH, VIRTUAL_ENV, the folder), and its shell keeps them: an interactive shell, not a login
/// one whose /etc/profile resets PATH. Before, `command -v python` printed nothing and VIRTUAL_ENV
/// was unset.
#[test]
fn a_shell_without_an_image_carries_her_active_venv_as_gantry_run_does() {
    let e = Engine::start(&[]);
    let alice = user("gantry-alice");
    let proj = alice.private_dir("shell-venv");
    let venv = proj.join("venv");
    let made = alice.sh(&format!("/usr/bin/python3 -m venv --without-pip {}", venv.display()));
    assert!(made.status.success(), "python3 -m venv: {}", text(&made));
    let mut c = alice.command(bin());
    c.arg("--state-dir")
        .arg(&e.state)
        .env("TERM", "xterm")
        .env("PATH", format!("{}/bin:/usr/bin:/bin", venv.display()))
        .env("VIRTUAL_ENV", &venv)
        .args(["shell", "--gpus", "0", "--for", "10m"])
        .current_dir(&proj);
    let mut p = crate::sessions::Pty::spawn(c, 80, 24);
    let at = p.wait_for("attached to session", 0);
    p.send("echo \"[venv $VIRTUAL_ENV]\"; echo \"[python $(command -v python)]\"; exit\r");
    let at = p.wait_for(&format!("[venv {}]\r\n", venv.display()), at);
    p.wait_for(&format!("[python {}/bin/python]\r\n", venv.display()), at);
    assert!(p.wait_exit().success(), "{}", p.text());
    // Issue 28 (smaller): a session says it is one, not "from gantry run".
    assert_eq!(e.show(1)["job"]["source"], "session");
}
