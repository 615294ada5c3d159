//! An empty (0-byte) file is not a store for the CLI, nor for the library's
//! opens that never create one; `Store::open` keeps treating it as a new store, because a
//! service may create the file before it opens it (`tempfile`, `touch`, a deployment step).
//!
//! Before (e693a17): `: > x.redb; idem --file x.redb stats` exited 0 and grew the file to
//! 72 KiB (an empty store), and `check` said ok. A redb file without idem's marker is refused
//! by `open_existing` without a byte changed (before: redb's open for writing had rewritten its
//! header by the time the marker was checked).

use idem::store::ReadOnlyStore;
use idem::{Error, Scope, Store};

#[cfg(feature = "cli")]
fn idem(file: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--file")
        .arg(file)
        .args(args)
        .output()
        .expect("run idem")
}

#[cfg(feature = "cli")]
const COMMANDS: [&[&str]; 10] = [
    &["stats"],
    &["get", "--tenant", "t", "--op", "op", "--key", "k"],
    &["export", "--jsonl"],
    &["outbox", "list"],
    &["check"],
    &["sweep"],
    &[
        "purge", "--yes", "--tenant", "t", "--op", "op", "--key", "k",
    ],
    &["compact"],
    &["outbox", "requeue", "0"],
    &["sweep", "--force"],
];

#[cfg(feature = "cli")]
#[test]
fn the_cli_says_an_empty_file_is_not_a_store_and_leaves_it_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.redb");
    std::fs::write(&path, b"").expect("create an empty file");
    for args in COMMANDS {
        let o = idem(&path, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(said.contains("not an idem store"), "{args:?}: {said}");
        assert!(!said.contains("panicked at"), "{args:?}: {said}");
        assert_eq!(
            std::fs::metadata(&path).expect("still there").len(),
            0,
            "{args:?} wrote to the empty file"
        );
    }
    let o = idem(&path, &["check"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("file_integrity FAILED"), "{out}");
    let names: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
    assert_eq!(names.len(), 1, "only the empty file: {names:?}");
}

#[cfg(feature = "cli")]
#[test]
fn the_cli_never_creates_a_store_at_a_missing_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("missing.redb");
    for args in COMMANDS {
        let o = idem(&path, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no such store file"), "{args:?}: {err}");
        assert!(!path.exists(), "{args:?} created {}", path.display());
    }
    // A directory is not a store file either.
    let o = idem(dir.path(), &["stats"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("is a directory"));
}

/// The library's choice, documented on `StoreBuilder::open`: an empty file is a new store (as a
/// missing file is); the opens that never create one refuse it, and leave it empty.
#[test]
fn store_open_makes_an_empty_file_a_new_store_and_the_other_opens_refuse_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.redb");
    let not_a_store = |r: Result<(), Error>, what: &str| match r {
        Err(Error::CorruptStore { reason }) => {
            assert!(reason.contains("empty (0 bytes)"), "{what}: {reason}");
            assert!(reason.contains("not an idem store"), "{what}: {reason}");
        }
        other => panic!("{what}: expected CorruptStore, got {other:?}"),
    };
    std::fs::write(&path, b"").expect("create an empty file");
    not_a_store(
        Store::builder().open_read_only(&path).map(|_| ()),
        "open_read_only",
    );
    not_a_store(
        ReadOnlyStore::open(&path).map(|_| ()),
        "ReadOnlyStore::open",
    );
    not_a_store(
        Store::builder().open_existing(&path).map(|_| ()),
        "open_existing",
    );
    assert_eq!(std::fs::metadata(&path).expect("file").len(), 0);

    // A missing file: nothing is created by the opens that never create.
    let missing = dir.path().join("missing.redb");
    let r = Store::builder().open_read_only(&missing);
    assert!(matches!(r, Err(Error::Storage { .. })), "{r:?}");
    let r = Store::builder().open_existing(&missing);
    assert!(matches!(r, Err(Error::Storage { .. })), "{r:?}");
    assert!(!missing.exists());

    // Store::open: the empty file becomes a new, empty store.
    let store = Store::open(&path).expect("an empty file is a new store");
    assert!(
        store
            .get(&Scope::new("t", "op"), "k")
            .expect("get")
            .is_none()
    );
    drop(store);
    assert!(std::fs::metadata(&path).expect("file").len() > 0);
    // ... which the other opens now accept.
    let ro = ReadOnlyStore::open(&path).expect("a store now");
    assert_eq!(ro.stats().expect("stats").records, 0);
    drop(ro);
    Store::builder().open_existing(&path).expect("a store now");
}

/// A redb database without idem's tables is not an idem store for the opens that never create
/// one (`Store::open` would make it one, as it always did).
#[test]
fn a_redb_file_without_the_format_marker_is_not_an_idem_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("plain.redb");
    drop(idem::redb::Database::create(&path).expect("a plain redb file"));
    for (what, r) in [
        (
            "open_read_only",
            Store::builder().open_read_only(&path).map(|_| ()),
        ),
        (
            "open_existing",
            Store::builder().open_existing(&path).map(|_| ()),
        ),
    ] {
        match r {
            Err(Error::CorruptStore { reason }) => {
                assert!(reason.contains("not an idem store"), "{what}: {reason}")
            }
            other => panic!("{what}: expected CorruptStore, got {other:?}"),
        }
    }
}

/// `open_existing` refuses a redb file without idem's marker before it writes anything: the file
/// stays byte for byte as it was (redb's open for writing would rewrite its header first).
#[test]
fn a_refused_open_existing_leaves_a_plain_redb_file_byte_identical() {
    use idem::redb::TableDefinition;
    const THEIRS: TableDefinition<&str, u64> = TableDefinition::new("theirs");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("plain.redb");
    {
        let db = idem::redb::Database::create(&path).expect("a plain redb file");
        let txn = db.begin_write().expect("write");
        txn.open_table(THEIRS)
            .expect("table")
            .insert("k", 1)
            .expect("insert");
        txn.commit().expect("commit");
    }
    let before = std::fs::read(&path).expect("read");
    let r = Store::builder().open_existing(&path).map(|_| ());
    assert!(
        matches!(&r, Err(Error::CorruptStore { reason }) if reason.contains("not an idem store")),
        "{r:?}"
    );
    assert!(
        std::fs::read(&path).expect("read") == before,
        "the refused file was written"
    );
    // Also in multi-process mode.
    let r = Store::builder()
        .multi_process(true)
        .open_existing(&path)
        .map(|_| ());
    assert!(matches!(r, Err(Error::CorruptStore { .. })), "{r:?}");
    assert!(
        std::fs::read(&path).expect("read") == before,
        "the refused file was written (multi-process)"
    );
}
