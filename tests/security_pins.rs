//! Issue 29, hole 0: removing a state folder (the advice after `apt remove gantry`, a test harness
//! ending) must never reach a job's mounted folders. A root engine pins each checked mount under its
//! state dir only from the container's create until its start; after that the container holds its own
//! copy, so a `rm -rf` of the state dir, while jobs run or after the engine died, deletes only
//! Gantry's own files. A user of its own (`gantry-rmrf`): had this regressed, only that throwaway
//! home would be emptied, never a user other tests share.

use std::path::Path;
use std::process::Command;

use crate::helpers::*;

fn must_hold(path: &Path, want: &str) {
    assert_eq!(
        std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{e}>")),
        want,
        "{} was reached by the removal of a state folder",
        path.display()
    );
}

#[test]
fn removing_a_state_folder_never_reaches_the_folders_jobs_mount_while_they_run_or_after_the_engine_died() {
    let dora = user("gantry-rmrf");
    let data = dora.private_dir("pins-data");
    let out = dora.private_dir("pins-out");
    let key = dora.write(&dora.home.join(".pins-key"), "her ssh key\n");
    dora.write(&data.join("set.txt"), "the data set\n");
    dora.write(&out.join("ckpt.txt"), "a checkpoint\n");
    let spec_dir = dora.private_dir("pins-specs");
    let image_job = dora.write(
        &spec_dir.join("image.yaml"),
        &format!(
            "image: {IMAGE}\ngpus: 0\nmounts: ['{}:/data', '{}:/out']\ncommand: 'sleep 300'\n",
            data.display(),
            out.display()
        ),
    );
    // No image: a container of this machine's system folders with her whole home, read-write.
    let host_job = dora.write(&spec_dir.join("host.yaml"), "gpus: 0\ncommand: 'sleep 300'\n");

    for engine_died in [false, true] {
        let mut e = Engine::start(&[]);
        let ids: Vec<i64> = [&image_job, &host_job]
            .iter()
            .map(|f| {
                e.json_as(&dora, &["submit", f.to_str().unwrap()])[0]["job_id"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        for id in &ids {
            e.wait_state(*id, "running");
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let state = e.state.display().to_string();
        let under_state: Vec<&str> = mountinfo
            .lines()
            .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&state)))
            .collect();
        assert!(
            under_state.is_empty(),
            "running jobs leave mounts under the state dir: {under_state:?}"
        );
        if engine_died {
            e.kill9();
        }
        let rm = Command::new("rm").arg("-rf").arg(&e.state).output().unwrap();
        assert!(rm.status.success(), "rm -rf {state}: {rm:?}");
        must_hold(&data.join("set.txt"), "the data set\n");
        must_hold(&out.join("ckpt.txt"), "a checkpoint\n");
        must_hold(&key, "her ssh key\n");
        must_hold(&spec_dir.join("host.yaml"), "gpus: 0\ncommand: 'sleep 300'\n");
    }
}
