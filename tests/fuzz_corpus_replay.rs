//! Every fuzz target's checked-in corpus (`fuzz/corpus/<target>`) and regressions
//! (`fuzz/regressions/<target>`) replayed through the same code the fuzzer runs
//! (`tests/sim/<target>.rs`), on stable, without libFuzzer: a regression is caught wherever
//! `cargo test` runs. A file that panics is named in the failure.

// White-box hooks (the white-box hooks of tests/sim): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

mod sim;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("read corpus entry").path();
            let hidden = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if path.is_file() && !hidden {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "no corpus for {target}: fuzz/corpus/{target} must be checked in"
    );
    for path in &files {
        let data = match std::fs::read(path) {
            Ok(data) => data,
            // A fuzzer running on this corpus right now replaced the file with a smaller one.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("read {}: {e}", path.display()),
        };
        if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
            eprintln!(
                "fuzz target {target} fails on {} (reproduce: cargo +nightly fuzz run {target} {})",
                path.display(),
                path.display()
            );
            std::panic::resume_unwind(panic);
        }
    }
    println!("{target}: {} inputs replayed", files.len());
}

#[test]
fn record_decode_corpus() {
    replay("record_decode", sim::record_decode::run);
}

#[test]
fn claim_race_corpus() {
    replay("claim_race", sim::claim_race::run);
}

#[test]
fn crash_recovery_corpus() {
    replay("crash_recovery", sim::crash_recovery::run);
}
