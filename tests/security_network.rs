//! One user's job cannot reach another user's ports (issue 18 item 12): each user's jobs are on
//! their own Docker bridge network (`gantry-u<uid>`, made on demand), so bob's job cannot connect to
//! alice's server by its container IP while alice's own second job can; outbound traffic is kept.

use crate::dl_defaults::{container_of, docker_inspect, submit_as};
use crate::helpers::*;

/// Alice's server: a file only she wrote, served on port 8080 from her job's HOME.
const SERVER: &str =
    "cd \"$HOME\" && echo secret-of-alice > index.html && exec /bin/busybox httpd -f -p 8080 -h \"$HOME\"";

/// A job that asks `IP:8080` for `/index.html` (busybox `nc`, 5 s timeout; its static `wget`
/// crashes in a bare image) and says what it got.
fn client(ip: &str) -> String {
    format!(
        "image: {IMAGE}\ngpus: 0\ncommand: |\n  if printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 5 {ip} 8080 | /bin/busybox grep -q secret-of-alice; \
         then echo REACHED secret-of-alice; else echo UNREACHABLE; fi\n"
    )
}

/// The network a container is on, and its IP there.
fn network_and_ip(cid: &str) -> (String, String) {
    let c = docker_inspect(cid);
    let nets = c["NetworkSettings"]["Networks"].as_object().unwrap().clone();
    assert_eq!(nets.len(), 1, "one network per job: {nets:?}");
    let (name, n) = nets.into_iter().next().unwrap();
    (name, n["IPAddress"].as_str().unwrap().to_string())
}

#[test]
fn a_users_jobs_reach_each_other_but_no_other_users_job() {
    let alice = user("gantry-alice");
    let bob = user("gantry-bob");
    // alice's server runs while the clients run: two CPU-only jobs at once.
    let e = Engine::start_unbounded_cpu_only(&[]);
    let server = submit_as(&e, &alice, &format!("image: {IMAGE}\ngpus: 0\ncommand: '{SERVER}'\n")).unwrap();
    let cid = container_of(&e, server);
    let (net, ip) = network_and_ip(&cid);
    assert_eq!(
        net,
        format!("gantry-u{}", alice.uid),
        "alice's job is on her own network"
    );
    let labels = String::from_utf8_lossy(
        &std::process::Command::new("docker")
            .args(["network", "inspect", "-f", "{{json .Labels}}", &net])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(
        labels.contains(&format!("\"dev.gantry.network-uid\":\"{}\"", alice.uid)),
        "{labels}"
    );
    e.wait_until("alice's server to listen", || {
        let out = std::process::Command::new("docker")
            .args(["exec", &cid, "/bin/busybox", "netstat", "-ltn"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).contains(":8080")
    });

    let bobs = submit_as(&e, &bob, &client(&ip)).unwrap();
    assert_eq!(e.wait_final(bobs)["job"]["state"], "succeeded", "{}", e.logs(bobs));
    let out = e.logs(bobs);
    assert!(
        out.contains("UNREACHABLE") && !out.contains("secret-of-alice"),
        "bob's job reached alice's server at {ip}:\n{out}"
    );

    let hers = submit_as(&e, &alice, &client(&ip)).unwrap();
    assert_eq!(e.wait_final(hers)["job"]["state"], "succeeded", "{}", e.logs(hers));
    let out = e.logs(hers);
    assert!(
        out.contains("secret-of-alice") && out.contains("REACHED"),
        "alice's second job could not reach her own server at {ip}:\n{out}"
    );

    assert!(e.gantry(&["cancel", &server.to_string()]).status.success());
    assert_eq!(e.wait_final(server)["job"]["state"], "cancelled");
    e.wait_until("alice's server container to be gone", || e.our_containers().is_empty());
}

/// The machine-wide lock root's engines take around a user's network lives where only root can make
/// it (`/run`): a local user who creates and holds the old shared one in `/tmp` delays nothing (the
/// engine used to wait 10 s for it at every job's create and remove, and said so in its log).
#[test]
fn a_user_holding_a_lock_file_in_tmp_does_not_delay_roots_engine() {
    let carol = user("gantry-carol");
    let mut holder = carol
        .command("flock")
        .args(["/tmp/.gantry-networks.lock", "sleep", "300"])
        .spawn()
        .unwrap();
    let e = Engine::start(&[]);
    // Give the holder time to take it (it waits for nobody: nobody else takes it any more).
    std::thread::sleep(std::time::Duration::from_secs(1));
    let id = e.submit_yaml(
        "job.yaml",
        &format!("image: {IMAGE}\ngpus: 0\ncommand: echo on my network\n"),
    );
    assert_eq!(e.wait_final(id)["job"]["state"], "succeeded", "{}", e.logs(id));
    e.wait_until("the job's container to be gone", || e.our_containers().is_empty());
    let _ = holder.kill();
    let _ = holder.wait();
    let log = e.daemon_log();
    assert!(
        !log.contains("stayed locked"),
        "root's engine waited for a lock carol holds:\n{log}"
    );
}
