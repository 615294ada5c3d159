//! Every fuzz target's checked-in corpus (`fuzz/corpus/<target>`) and regressions
//! (`fuzz/regressions/<target>`) replayed through the same code the fuzzer runs
//! (`tests/sim/<target>.rs`), on stable, without libFuzzer: a regression is caught wherever
//! `cargo test` runs. A file that panics is named in the failure.
//!
//! In the repository a missing corpus fails the test. A packaged crate (`cargo package`, what
//! crates.io serves) leaves `fuzz/` out (Cargo.toml's `exclude`): there the test says so and
//! passes, so the published crate's `cargo test --all-features` passes too.

// White-box hooks (the white-box hooks of tests/sim): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::sim;

use std::path::{Path, PathBuf};

/// The repository's root, which holds fuzz/ (this package is integration/, one level below).
fn manifest_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Whether `root` is the root of a packaged crate rather than of the repository. `cargo package`
/// always writes `Cargo.toml.orig` (the manifest as written, next to the normalised
/// `Cargo.toml`) into the crate, and no checkout has one (nobody creates it, and a stray one
/// does not hide a missing corpus unless `fuzz/` is gone too, see [`replay_in`]). This holds
/// wherever the crate is unpacked (`~/.cargo/registry/src`, a temp dir inside another
/// checkout), unlike "no `.git` here", which a worktree's `.git` file or a parent repository
/// confuses.
fn is_packaged_crate(root: &Path) -> bool {
    root.join("Cargo.toml.orig").is_file()
}

fn inputs(root: &Path, target: &str) -> Vec<PathBuf> {
    let root = root.join("fuzz");
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

/// Replays `target`'s corpus under `root` (a crate root); returns how many inputs ran, or why
/// there was nothing to run where something must be (an input that fails panics).
fn replay_in(root: &Path, target: &str, run: fn(&[u8])) -> Result<usize, String> {
    if is_packaged_crate(root) && !root.join("fuzz").exists() {
        println!(
            "{target}: nothing to replay: this is a packaged crate (Cargo.toml.orig present), \
             which leaves fuzz/ out; the repository's `cargo test` replays the corpus"
        );
        return Ok(0);
    }
    let files = inputs(root, target);
    if files.is_empty() {
        return Err(format!(
            "no corpus for {target}: fuzz/corpus/{target} must be checked in"
        ));
    }
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
    Ok(files.len())
}

fn replay(target: &str, run: fn(&[u8])) {
    if let Err(e) = replay_in(manifest_dir(), target, run) {
        panic!("{e}");
    }
}

/// The rule `replay_in` follows about a missing `fuzz/`, on crate roots made up in a temp dir.
#[test]
fn a_missing_corpus_fails_in_the_repository_and_is_skipped_in_a_package() {
    fn never(_: &[u8]) {
        panic!("no input should run");
    }
    let checkout = tempfile::tempdir().unwrap();
    std::fs::write(checkout.path().join("Cargo.toml"), "").unwrap();
    let missing = replay_in(checkout.path(), "claim_race", never);
    assert!(
        missing.is_err_and(|e| e.contains("must be checked in")),
        "a checkout without fuzz/ must fail"
    );

    let package = tempfile::tempdir().unwrap();
    std::fs::write(package.path().join("Cargo.toml"), "").unwrap();
    std::fs::write(package.path().join("Cargo.toml.orig"), "").unwrap();
    assert_eq!(replay_in(package.path(), "claim_race", never), Ok(0));

    // A package that does ship fuzz/ must ship its corpus: an empty one still fails.
    std::fs::create_dir_all(package.path().join("fuzz/corpus/claim_race")).unwrap();
    let empty = replay_in(package.path(), "claim_race", never);
    assert!(
        empty.is_err(),
        "a package with an empty fuzz/ corpus must fail"
    );

    // This crate's own root is judged the same way: a checkout has its corpus.
    if !is_packaged_crate(manifest_dir()) {
        assert!(!inputs(manifest_dir(), "claim_race").is_empty());
    }
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

/// Needs the test server (`IDEM_PG_URL`); without it the test says so and passes, unless
/// `IDEM_REQUIRE_PG` or `CI` is set (tests/common/pg.rs's convention).
#[cfg(feature = "postgres")]
#[test]
fn engines_agree_corpus() {
    let Some(db) = sim::engines_agree::database() else {
        return;
    };
    let _drop = sim::engines_agree::DropSchema(db);
    replay("engines_agree", sim::engines_agree::run);
}

#[test]
fn damaged_file_corpus() {
    replay("damaged_file", sim::damaged_file::run);
}

/// Needs the parsers' features (`cargo test --all-features`, as CI runs it).
#[cfg(all(feature = "http", feature = "webhooks"))]
#[test]
fn header_parsers_corpus() {
    replay("header_parsers", sim::header_parsers::run);
}

#[cfg(feature = "http")]
#[test]
fn http_layer_corpus() {
    replay("http_layer", sim::http_layer::run);
}
