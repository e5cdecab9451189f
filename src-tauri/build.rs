fn main() {
    // tauri.conf.json lives at the repository root (design card); capabilities stay in src-tauri/.
    tauri_build::try_build(tauri_build::Attributes::new().config_path("../tauri.conf.json"))
        .expect("tauri build script");
}
