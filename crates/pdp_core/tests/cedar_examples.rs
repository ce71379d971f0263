//! Every request in `../shared/data/cedar-examples/*/ALLOW` and `DENY` decides as its folder
//! says, and every example application loads as a bundle directory as it stands.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::{Bundle, Engine, Verdict};
use std::path::PathBuf;

fn examples_dir() -> Option<PathBuf> {
    let root =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/cedar-examples");
    root.is_dir().then_some(root)
}

#[test]
fn every_example_app_loads_and_decides_as_its_folder_says() {
    let Some(root) = examples_dir() else {
        eprintln!("../shared/data/cedar-examples not present; skipping");
        return;
    };
    let mut apps = 0;
    let mut checked = 0;
    for app in std::fs::read_dir(&root).unwrap().flatten() {
        if !app.path().is_dir() {
            continue;
        }
        apps += 1;
        let bundle = Bundle::from_dir(&app.path())
            .unwrap_or_else(|e| panic!("{}: {e}", app.path().display()));
        let engine = Engine::new(bundle);
        for (folder, want) in [("ALLOW", Verdict::Allow), ("DENY", Verdict::Deny)] {
            let dir = app.path().join(folder);
            if !dir.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&dir).unwrap().flatten() {
                let req: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(f.path()).unwrap()).unwrap();
                let d = engine
                    .decide_json(&req)
                    .unwrap_or_else(|e| panic!("{}: {e}", f.path().display()));
                assert_eq!(d.verdict, want, "{}", f.path().display());
                checked += 1;
            }
        }
    }
    assert_eq!(apps, 5);
    assert!(checked >= 20, "only {checked} requests checked");
}
