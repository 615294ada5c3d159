//! An expiry index that disagrees with the records is idem's own inconsistency, not damage to
//! the file: `Store::check_integrity` answers `Error::ExpiryIndexMismatch` (redb's verdict kept,
//! no fail-stop), and `idem check` says `file_integrity ok` and `expiry_index MISMATCH`. Before,
//! both were `Error::CorruptStore` ("file_integrity FAILED"), which the CLI then told apart from
//! real damage only by the missing fail-stop — a test a panic contained inside the index check
//! (no fail-stop either) passed too, letting a write command proceed.

use std::path::Path;

use idem::redb::TableDefinition;
use idem::{Error, Request, Response, Scope, Store};

const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");

/// A closed store with two records, plus an expiry entry no record has (an orphan).
fn store_with_an_orphan_entry(path: &Path) {
    {
        let store = Store::open(path).expect("open");
        for k in ["a", "b"] {
            let req = Request::from_canonical_bytes(Scope::new("t", "op"), k, b"p");
            let outcome = store
                .execute(req, |_| Ok(Response::new(201, "ok")))
                .expect("execute");
            assert!(matches!(outcome, idem::ExecuteAnswer::Ran(_)));
        }
    }
    let db = idem::redb::Database::open(path).expect("open redb file");
    let txn = db.begin_write().expect("write");
    {
        let mut expiry = txn.open_table(EXPIRY).expect("expiry");
        let entry = [
            &7u64.to_be_bytes()[..],
            &[1u8],
            b"\x01\x00\x01t\x00\x02op\x00\x01z",
        ]
        .concat();
        expiry.insert(entry.as_slice(), 1).expect("insert");
    }
    txn.commit().expect("commit");
}

#[test]
fn check_integrity_reports_an_index_mismatch_as_its_own_error_without_fail_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    store_with_an_orphan_entry(&path);
    let mut store = Store::open(&path).expect("open");
    match store.check_integrity() {
        Err(Error::ExpiryIndexMismatch { reason, repaired }) => {
            assert!(reason.contains("orphan"), "{reason}");
            assert!(!repaired, "redb's pages are intact");
        }
        other => panic!("expected ExpiryIndexMismatch, got {other:?}"),
    }
    assert_eq!(store.fail_stop_cause(), None, "a mismatch is no fail-stop");
    // The store keeps working, and the sweep removes the orphan once it is due.
    let report = store.sweep().expect("sweep");
    assert_eq!(report.repaired, 1, "{report:?}");
    assert!(matches!(store.check_integrity(), Ok(true)));
}

#[cfg(feature = "cli")]
#[test]
fn idem_check_says_file_integrity_ok_and_expiry_index_mismatch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    store_with_an_orphan_entry(&path);
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("--file")
            .arg(&path)
            .args(args)
            .output()
            .expect("run idem")
    };
    let o = run(&["check"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("file_integrity ok\n"), "{out}");
    assert!(!out.contains("FAILED"), "{out}");
    assert!(out.contains("records_ok   2\n"), "{out}");
    assert!(out.contains("expiry_index MISMATCH\n"), "{out}");
    assert!(out.contains("orphan"), "{out}");
    // A write command is not refused for it, and `sweep` repairs it.
    let o = run(&["sweep"]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("repaired    1\n"),
        "{o:?}"
    );
    let o = run(&["check"]);
    assert!(o.status.success(), "{o:?}");
}
