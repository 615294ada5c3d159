//! The commands that only read (`stats`, `get`, `export`, `outbox list`, and
//! `check`, which works on a copy; `--json` and `--body` included) never write the store file: its bytes and its modification
//! time are the same afterwards, on a healthy cleanly closed store, on damaged ones (where they
//! exit non-zero) and on a file left by a crash (which they refuse to recover). The commands that
//! write (`sweep`, `purge`, `compact`, `outbox requeue|discard`) check a copy's integrity first
//! and refuse a damaged file unless `--force`.
//!
//! Before (e693a17): every read command changed the file's bytes even on a healthy store (the
//! open-time commit) and recovered a crashed file in place; on damaged files they exited 0
//! after modifying them; the write commands wrote to damaged files.
#![cfg(feature = "cli")]

use crate::damage;
use crate::idem_cli;
// tests/sim/backend.rs, through `common` (which re-exports it).
use crate::common as sim_backend;

use std::path::Path;
use std::process::Output;
use std::time::SystemTime;

use damage::{BUILT_AT, build_store, key};
use idem::clock::ManualClock;
use idem::{Request, Response, Scope, Store};
use idem_cli::idem;

/// The file's bytes and modification time.
fn snapshot(path: &Path) -> (Vec<u8>, SystemTime) {
    let bytes = std::fs::read(path).expect("read");
    let mtime = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .expect("mtime");
    (bytes, mtime)
}

const GET: [&str; 7] = ["get", "--tenant", "t", "--op", "op", "--key", "key-00003"];
const GET_JSON_BODY: [&str; 9] = [
    "get",
    "--tenant",
    "t",
    "--op",
    "op",
    "--key",
    "key-00003",
    "--json",
    "--body",
];
/// `check` is fifth; the commands after it read like those before it.
const READS: [&[&str]; 7] = [
    &["stats"],
    &GET,
    &["export", "--jsonl"],
    &["outbox", "list"],
    &["check"],
    &["stats", "--json"],
    &GET_JSON_BODY,
];
/// The commands of [`READS`] that open the file itself read-only (all but `check`).
const READ_ONLY_OPENS: [usize; 6] = [0, 1, 2, 3, 5, 6];

/// Runs every read command on `path`; asserts the file is unchanged after each and returns
/// each command's output.
fn read_commands_leave_the_file_as_it_was(path: &Path, what: &str) -> Vec<Output> {
    let mut outputs = Vec::new();
    for args in READS {
        let before = snapshot(path);
        // A modification a moment after the open would still change the mtime: let it tick.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let o = idem(path, args);
        let after = snapshot(path);
        assert!(
            before.0 == after.0,
            "{what}: {args:?} changed the file's bytes"
        );
        assert_eq!(
            before.1, after.1,
            "{what}: {args:?} changed the file's mtime"
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked at"), "{what}: {args:?}: {err}");
        outputs.push(o);
    }
    // `check` removed its copy and the copy's journal: the directory holds the file (and the
    // journal it was written with) alone.
    let dir = path.parent().expect("dir");
    let journal = idem::store::journal_path(path);
    let names: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| *p != journal)
        .collect();
    assert_eq!(names.len(), 1, "{what}: {names:?}");
    outputs
}

#[test]
fn read_commands_never_write_a_healthy_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    build_store(&path, 50);
    for (args, o) in READS
        .iter()
        .zip(read_commands_leave_the_file_as_it_was(&path, "healthy"))
    {
        assert!(o.status.success(), "{args:?}: {o:?}");
    }
}

#[test]
fn read_commands_never_write_a_damaged_store_and_exit_non_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    let image = build_store(&path, 50);

    // redb's super-header: the region geometry (the data page count of a region, bytes 20..24)
    // is invalid, so no open succeeds.
    let mut header = image.clone();
    header[20..24].copy_from_slice(&[0xff; 4]);
    std::fs::write(&path, &header).expect("write");
    for (args, o) in READS.iter().zip(read_commands_leave_the_file_as_it_was(
        &path,
        "damaged header",
    )) {
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("damaged"), "{args:?}: {err}");
    }

    // One record's body changed on disk: the store opens; reading that record fails (its
    // checksum), and the integrity check fails (the page's checksum).
    let needle = damage::body(3);
    let at = image
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .expect("body 3 in the file");
    let mut body = image;
    body[at + 2] ^= 0x20;
    std::fs::write(&path, &body).expect("write");
    let outputs = read_commands_leave_the_file_as_it_was(&path, "damaged record");
    let get = &outputs[1];
    assert_eq!(get.status.code(), Some(1), "{get:?}");
    assert!(String::from_utf8_lossy(&get.stderr).contains("checksum mismatch"));
    let check = &outputs[4];
    assert_eq!(check.status.code(), Some(1), "{check:?}");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(out.contains("file_integrity FAILED"), "{out}");
    assert!(out.contains("temporary copy"), "{out}");
    assert!(out.contains("itself was not modified"), "{out}");
}

#[test]
fn read_commands_refuse_a_file_that_needs_recovery_instead_of_recovering_it() {
    // What a crash leaves: the durable image of a store that was never closed.
    let backend = sim_backend::CrashBackend::default();
    let store = Store::builder()
        .clock(ManualClock::new(BUILT_AT))
        .open_with_backend(backend.clone())
        .expect("open");
    for i in 0..5 {
        let req = Request::from_canonical_bytes(Scope::new("t", "op"), key(i), b"p");
        let outcome = store.execute(req, |_| Ok(Response::new(201, "ok")));
        assert!(
            matches!(outcome, Ok(idem::ExecuteAnswer::Ran(_))),
            "{outcome:?}"
        );
    }
    let crashed = backend.durable_image();
    drop(store);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    std::fs::write(&path, &crashed).expect("write");
    let outputs = read_commands_leave_the_file_as_it_was(&path, "crashed");
    for i in READ_ONLY_OPENS {
        let (args, o) = (READS[i], &outputs[i]);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("needs crash recovery"), "{args:?}: {err}");
        assert!(err.contains("idem check"), "{args:?}: {err}");
    }
    // `check` recovers and checks a copy.
    let check = &outputs[4];
    assert!(check.status.success(), "{check:?}");
    assert!(String::from_utf8_lossy(&check.stdout).contains("records_ok   5"));
    // The repair of the copy is shown while it runs.
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(
        err.contains("repairing a file that was not closed cleanly"),
        "{err}"
    );
    // The library's read-only open says the same, as a typed error, and names the command.
    let r = Store::builder().open_read_only(&path);
    assert!(matches!(r, Err(idem::Error::NeedsRecovery)), "{r:?}");
    assert!(
        r.as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("idem recover")),
        "{r:?}"
    );
    // `idem recover` repairs the file itself; the read commands then work, and a second
    // `recover` finds nothing to do.
    let o = idem(&path, &["recover"]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("recovered"),
        "{o:?}"
    );
    let stats = idem(&path, &["stats"]);
    assert!(stats.status.success(), "{stats:?}");
    let o = idem(&path, &["recover"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nothing to recover"),
        "{o:?}"
    );
}

#[test]
fn write_commands_refuse_a_damaged_file_even_when_forced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    let image = build_store(&path, 50);
    let needle = damage::body(3);
    let at = image
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .expect("body 3 in the file");
    let mut damaged = image.clone();
    damaged[at + 2] ^= 0x20;
    std::fs::write(&path, &damaged).expect("write");
    let purge = [
        "purge",
        "--yes",
        "--tenant",
        "t",
        "--op",
        "op",
        "--key",
        "key-00003",
    ];
    let writes: [&[&str]; 5] = [
        &["sweep"],
        &purge,
        &["compact"],
        &["outbox", "requeue", "0"],
        &["outbox", "discard", "0"],
    ];
    for args in writes {
        let o = idem(&path, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("refused"), "{args:?}: {err}");
        assert!(err.contains("--force"), "{args:?}: {err}");
        assert!(err.contains("Nothing was written"), "{args:?}: {err}");
        assert!(
            std::fs::read(&path).expect("read") == damaged,
            "{args:?} wrote to the damaged file"
        );
    }
    // --force skips the check of a copy, but the open for writing still checks every page
    // (a commit on a damaged page can abort the process): still refused, nothing written.
    let forced = [&purge[..], &["--force"]].concat();
    let o = idem(&path, &forced);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("damaged"), "{err}");
    assert!(
        std::fs::read(&path).expect("read") == damaged,
        "--force wrote to the damaged file"
    );

    // A healthy file: the check passes and the command writes.
    std::fs::write(&path, &image).expect("write");
    let o = idem(&path, &purge);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "purged");
    let journal = idem::store::journal_path(&path);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| *p != journal)
        .collect();
    assert_eq!(names.len(), 1, "the checked copy is removed: {names:?}");
}
