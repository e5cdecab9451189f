//! Fill a Gantry database with N completed runs (for benchmarks of the app's History view).
//! Usage: cargo run --release -p gantry-core --example seed_history -- STATE_DIR N
use gantry_core::spec::{validate_text, Format, Origin};
use gantry_core::store::{EndReason, Ending, JobState, Owner, Store};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, n): (&str, usize) = (&args[1], args[2].parse().expect("N"));
    std::fs::create_dir_all(dir).unwrap();
    let mut st = Store::open(&std::path::Path::new(dir).join("gantry.db")).unwrap();
    let users = ["ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal"];
    let jobs: Vec<_> = (0..20)
        .map(|i| validate_text(&format!("name: exp-{i}\nimage: img{}:1\ngpus: {}\n", i % 5, 1 + i % 4), Format::Yaml, &Origin::default()).unwrap())
        .collect();
    st.bulk(|st| {
        for i in 0..n {
            let o = Owner { uid: 1000 + (i % users.len()) as u32, gid: 1000, name: users[i % users.len()].into() };
            let id = st.insert_job(&jobs[i % jobs.len()], &o, "seed", None, |_, _| None).unwrap();
            let a = st.begin_attempt(id, &[(i % 8) as u32], &[]).unwrap().unwrap();
            let next = if i % 7 == 0 { JobState::Failed } else { JobState::Succeeded };
            st.end_attempt(id, a.id, &Ending { exit_code: Some((i % 7 == 0) as i64), reason: EndReason::Exited, message: None, next, not_before: None }).unwrap();
        }
    })
    .unwrap();
    println!("seeded {n} runs into {dir}/gantry.db");
}
