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

/// idem's three tables are created in one transaction, so a file that has some of them lost the
/// others to damage (a damaged table tree): every open refuses it, with or without the page
/// check, and none recreates the missing table (a write into a damaged table tree can abort the
/// process in redb).
#[test]
fn a_store_missing_one_of_its_tables_is_damaged_and_never_rebuilt() {
    use idem::redb::{ReadableDatabase, TableHandle};
    for (table, named) in [
        ("idem.records.v1", "records table"),
        ("idem.expiry.v1", "expiry table"),
        ("idem.meta.v1", "meta table"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("partial.redb");
        {
            let store = Store::open(&path).expect("a new store");
            let scope = Scope::new("t", "op");
            let first = store
                .execute(
                    idem::Request::new(scope, "k", b"p").expect("a request"),
                    |_| Ok(idem::Response::new(200, "ok")),
                )
                .expect("execute");
            assert!(first.response().is_some() && !first.is_replay());
        }
        {
            let db = idem::redb::Database::open(&path).expect("the store as a redb file");
            let txn = db.begin_write().expect("write");
            let handle = txn
                .list_tables()
                .expect("list")
                .find(|h| h.name() == table)
                .expect("the store has the table");
            assert!(txn.delete_table(handle).expect("delete"), "{table}");
            txn.commit().expect("commit");
        }
        for verify in [true, false] {
            let r = Store::builder()
                .verify_on_open(verify)
                .open(&path)
                .map(|_| ());
            assert!(
                matches!(&r, Err(Error::CorruptStore { reason }) if reason.contains(named)),
                "{table} deleted, verify_on_open({verify}): {r:?}"
            );
        }
        let db = idem::redb::Database::open(&path).expect("still a redb file");
        let names: Vec<String> = db
            .begin_read()
            .expect("read")
            .list_tables()
            .expect("list")
            .map(|h| h.name().to_string())
            .collect();
        assert!(
            !names.iter().any(|n| n == table),
            "an open recreated {table}: {names:?}"
        );
    }
}

/// With `verify_on_open(false)` an open never makes an existing file a new store: a redb file
/// without idem's tables may be a store whose table tree is damaged (every table hidden), and
/// creating the tables would forget every key. With the page check (the default) it does.
#[test]
fn an_unchecked_open_never_makes_an_existing_file_a_new_store() {
    use idem::redb::{ReadableDatabase, TableDefinition, TableHandle};
    const THEIRS: TableDefinition<&str, u64> = TableDefinition::new("theirs");
    let dir = tempfile::tempdir().expect("tempdir");
    let tables = |path: &std::path::Path| -> Vec<String> {
        let db = idem::redb::Database::open(path).expect("a redb file");
        let read = db.begin_read().expect("read");
        let names = read.list_tables().expect("list");
        names.map(|h| h.name().to_string()).collect()
    };
    // A store whose three tables are all gone, and a redb file that never was a store.
    let gone = dir.path().join("gone.redb");
    drop(Store::open(&gone).expect("a new store"));
    {
        let db = idem::redb::Database::open(&gone).expect("the store as a redb file");
        let txn = db.begin_write().expect("write");
        let handles: Vec<_> = txn.list_tables().expect("list").collect();
        for h in handles {
            txn.delete_table(h).expect("delete");
        }
        txn.commit().expect("commit");
    }
    let theirs = dir.path().join("theirs.redb");
    {
        let db = idem::redb::Database::create(&theirs).expect("a plain redb file");
        let txn = db.begin_write().expect("write");
        txn.open_table(THEIRS)
            .expect("table")
            .insert("k", 1)
            .expect("insert");
        txn.commit().expect("commit");
    }
    for path in [&gone, &theirs] {
        let before = tables(path);
        let bytes = std::fs::read(path).expect("read");
        let r = Store::builder()
            .verify_on_open(false)
            .open(path)
            .map(|_| ());
        // Refused from a read-only look, before an open for writing (whose handle, dropped,
        // would commit): not a byte changed.
        assert!(
            std::fs::read(path).expect("read") == bytes,
            "{}: written",
            path.display()
        );
        assert!(
            matches!(&r, Err(Error::CorruptStore { reason }) if reason.contains("verify_on_open")),
            "{}: {r:?}",
            path.display()
        );
        assert_eq!(
            tables(path),
            before,
            "{}: tables were created",
            path.display()
        );
        // The checked open makes it a store.
        drop(Store::open(path).expect("the checked open"));
        assert!(tables(path).iter().any(|t| t == "idem.records.v1"));
        // A new file is a new store without the check too.
        let new = dir.path().join("new.redb");
        drop(
            Store::builder()
                .verify_on_open(false)
                .open(&new)
                .expect("a new store"),
        );
        std::fs::remove_file(&new).expect("remove");
    }
}
