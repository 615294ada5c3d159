//! The folders of `src/` are the layers, and imports point one way only:
//! faces (`http/`, `bin/`) → `messaging/` → `engine/` → `runtime/` → `model/` (and the shared
//! `error.rs`).
//!
//! - `src/model` is pure: it never names redb, the engine, messaging or a face, not even through
//!   the crate root's re-exports (`crate::Store` is the engine's store).
//! - `src/runtime` (the thread machinery engines run on: the group-commit protocol, signals)
//!   never names a storage engine, messaging or a face.
//! - `src/engine` never names messaging or a face (a second engine must not need them either).
//! - `src/postgres`, the second engine, reaches neither the redb engine's internals nor redb,
//!   messaging or a face: it builds on the model and the runtime only (its docs may link the
//!   file store's public items, `crate::Store`, for comparison).
//! - `src/messaging` never names a face.
//! - `src/error.rs`, below every layer, imports nothing of the crate and no redb type: a storage
//!   engine's error travels in it as an engine-neutral `StorageError`.
//!
//! The check reads the source text, so it also catches paths in doc links and comments: a
//! layer's docs should not send a reader upwards either.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("src/ is readable in the test checkout") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Lines of the files under `src/<layer>` that contain one of `forbidden`, as a whole path
/// (`crate::Store` does not match `crate::StoreBuilder`; each is listed on its own).
fn violations(layer: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(layer);
    assert!(root.is_dir(), "src/{layer} exists");
    let mut found = Vec::new();
    for file in rust_files(&root) {
        let text = std::fs::read_to_string(&file).expect("source files are UTF-8");
        for (n, line) in text.lines().enumerate() {
            for needle in forbidden {
                if contains_path(line, needle) {
                    found.push(format!(
                        "{}:{}: names `{needle}`: {}",
                        file.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

/// `needle` occurs in `line` and is not the prefix of a longer identifier.
fn contains_path(line: &str, needle: &str) -> bool {
    line.match_indices(needle).any(|(i, _)| {
        let next = line[i + needle.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Paths (through the folders or the crate root) that reach messaging items.
const MESSAGING: &[&str] = &[
    "crate::messaging",
    "crate::outbox",
    "crate::inbox",
    "crate::webhook",
    "crate::Outbox",
    "crate::Versions",
    "crate::DispatcherHandle",
    "crate::Publisher",
];

/// Paths that reach a face.
const FACES: &[&str] = &["crate::http"];

/// Paths that reach the redb engine.
const ENGINE: &[&str] = &[
    "redb",
    "crate::engine",
    "crate::Store",
    "crate::StoreBuilder",
    "crate::ReadOnlyStore",
    "crate::Lease",
    "crate::BeginAnswer",
    "crate::Tx",
    "crate::Durability",
];

#[test]
fn the_model_names_no_storage_no_messaging_and_no_face() {
    let forbidden: Vec<&str> = ENGINE
        .iter()
        .chain(MESSAGING)
        .chain(FACES)
        .copied()
        .collect();
    let found = violations("model", &forbidden);
    assert!(
        found.is_empty(),
        "src/model must stay pure:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_runtime_names_no_storage_no_messaging_and_no_face() {
    let forbidden: Vec<&str> = ENGINE
        .iter()
        .chain(MESSAGING)
        .chain(FACES)
        .copied()
        .collect();
    let found = violations("runtime", &forbidden);
    assert!(
        found.is_empty(),
        "src/runtime must not name a storage engine or a layer above it:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_engine_names_no_messaging_and_no_face() {
    let forbidden: Vec<&str> = MESSAGING.iter().chain(FACES).copied().collect();
    let found = violations("engine", &forbidden);
    assert!(
        found.is_empty(),
        "src/engine must not reach up:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_postgres_engine_builds_on_the_model_and_the_runtime_only() {
    let forbidden: Vec<&str> = ["redb::", "crate::engine", "crate::messaging"]
        .iter()
        .chain(FACES)
        .copied()
        .collect();
    let found = violations("postgres", &forbidden);
    assert!(
        found.is_empty(),
        "src/postgres must not reach the redb engine, messaging or a face:\n{}",
        found.join("\n")
    );
}

#[test]
fn messaging_names_no_face() {
    let found = violations("messaging", FACES);
    assert!(
        found.is_empty(),
        "src/messaging must not reach a face:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_error_type_imports_no_layer_and_no_storage_engine() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join("error.rs");
    let text = std::fs::read_to_string(&path).expect("src/error.rs is readable");
    let found: Vec<String> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.trim_start();
            !code.starts_with("//")
                && (code.contains("use crate")
                    || code.contains("crate::")
                    || code.contains("redb::"))
        })
        .map(|(n, line)| format!("src/error.rs:{}: {}", n + 1, line.trim()))
        .collect();
    assert!(
        found.is_empty(),
        "src/error.rs must stay a leaf:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_a_violation_when_there_is_one() {
    assert!(contains_path(
        "use crate::engine::store::Store;",
        "crate::engine"
    ));
    assert!(contains_path(
        "see [`crate::Store::execute`]",
        "crate::Store"
    ));
    assert!(!contains_path(
        "see crate::StoreBuilderish",
        "crate::StoreBuilder"
    ));
    assert!(contains_path("use redb::Table;", "redb"));
}
