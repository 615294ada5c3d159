//! `idem` never panics on its own output, and says what a permission error
//! is. Output into a closed pipe (`idem stats | head -1` once `head` has exited) ends quietly
//! with exit status 0: the reader wanted no more. Output into a full disk (`/dev/full`) is a
//! message and exit status 1. A file the user may not read, or a directory where `check` may
//! not create its temporary copy, is reported as a permission problem, not as "free some
//! space".
//!
//! Before (e693a17): both output cases panicked ("failed printing to stdout", exit 101), and
//! `check` answered a permission error with "free some space, or pass --in-place".
#![cfg(all(feature = "cli", unix))]

use crate::damage;
use crate::idem_cli;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use idem_cli::command;

fn store(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("idem.redb");
    damage::build_store(&path, 200);
    path
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store(dir.path());
    for args in [&["stats"][..], &["export", "--jsonl"], &["check"]] {
        // The reading end is closed before idem writes: every write fails with EPIPE.
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let o = command(&path, args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run idem");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

#[test]
fn output_into_a_full_disk_is_a_message_and_a_failure() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        eprintln!("skipped: no /dev/full on this system");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store(dir.path());
    for args in [&["stats"][..], &["export", "--jsonl"]] {
        let stdout = std::fs::OpenOptions::new()
            .write(true)
            .open(full)
            .expect("open /dev/full");
        let o = command(&path, args)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .output()
            .expect("run idem");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("cannot write the output"), "{args:?}: {err}");
        assert!(err.contains("No space left on device"), "{args:?}: {err}");
        assert!(!err.contains("panicked at"), "{args:?}: {err}");
    }
}

/// Whether this process runs as root (Linux: /proc; elsewhere assumed not).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|ids| ids.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Runs idem as a user the permissions apply to: root reads and writes any file whatever its
/// mode, so as root the command runs as `nobody` (uid and gid 65534). `None` if that user
/// cannot run the binary (its path is not readable by others).
fn run_unprivileged(mut c: Command) -> Option<Output> {
    if is_root() {
        c.uid(65_534).gid(65_534);
    }
    match c.output() {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => None,
        o => Some(o.expect("run idem")),
    }
}

#[test]
fn a_permission_error_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store(dir.path());
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };

    // The file may not be read (its directory may be entered).
    set(dir.path(), 0o755);
    set(&path, 0o000);
    let Some(o) = run_unprivileged(command(&path, &["stats"])) else {
        set(&path, 0o644);
        eprintln!("skipped: the unprivileged user cannot run the idem binary here");
        return;
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(!err.contains("free some space"), "{err}");

    // `check` may read the file but not create its copy in the directory.
    set(&path, 0o644);
    set(dir.path(), 0o555);
    let o = run_unprivileged(command(&path, &["check"])).expect("ran above");
    set(dir.path(), 0o755);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write a temporary copy"), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(err.contains("may create files"), "{err}");
    assert!(err.contains("itself was not modified"), "{err}");
    assert!(!err.contains("free some space"), "{err}");
}
