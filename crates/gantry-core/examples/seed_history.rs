//! Fill a Gantry database with N completed runs (for benchmarks of the app's History view).
//! Usage: cargo run --release -p gantry-core --example seed_history -- STATE_DIR N
use gantry_core::store::Store;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, n): (&str, usize) = (&args[1], args[2].parse().expect("N"));
    std::fs::create_dir_all(dir).unwrap();
    let mut st = Store::open(&std::path::Path::new(dir).join("gantry.db")).unwrap();
    st.seed_completed_runs(n).unwrap();
    println!("seeded {n} runs into {dir}/gantry.db");
}
