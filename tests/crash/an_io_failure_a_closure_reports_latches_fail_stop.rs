//! A closure that meets an I/O failure on its own tables and returns it as
//! `Abort::Store(Error::Storage { .. })` fail-stops the store, whichever redb error type it
//! wrapped in the engine-neutral `StorageError` (redb gives a table call's caller a
//! `StorageError`, `TableError`, `CommitError`, ... rather than a `redb::Error`). A misuse error
//! (e.g. a missing table) does not.

use idem::error::StorageError;
use idem::redb;
use idem::{Abort, Error, Request, Response, Scope, Store};

fn io() -> redb::StorageError {
    redb::StorageError::Io(std::io::Error::other("the disk went away"))
}

/// Runs one intent whose closure fails with `source`; returns whether the store latched.
fn latches(source: StorageError) -> bool {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = Store::open(dir.path().join("idem.redb")).expect("a new store");
    let request = Request::from_canonical_bytes(Scope::new("t", "op"), "k", b"payload");
    let result = store.execute(request, move |_tx| -> Result<Response, Abort> {
        Err(Abort::Store(Error::Storage {
            source: source.clone(),
        }))
    });
    assert!(
        matches!(result, Err(Error::Storage { .. })),
        "the closure's error comes back: {result:?}"
    );
    store.fail_stop_cause().is_some()
}

#[test]
fn an_io_failure_latches_in_every_redb_error_type() {
    let cases: Vec<(&str, StorageError)> = vec![
        (
            "redb::Error",
            StorageError::new(redb::Error::Io(std::io::Error::other("disk"))),
        ),
        ("redb::StorageError", StorageError::new(io())),
        (
            "redb::TableError",
            StorageError::new(redb::TableError::Storage(io())),
        ),
        (
            "redb::TransactionError",
            StorageError::new(redb::TransactionError::Storage(io())),
        ),
        (
            "redb::CommitError",
            StorageError::new(redb::CommitError::Storage(io())),
        ),
        (
            "redb::CommitError::TransactionPoisoned",
            StorageError::new(redb::CommitError::TransactionPoisoned),
        ),
        (
            "redb::DatabaseError",
            StorageError::new(redb::DatabaseError::Storage(io())),
        ),
        (
            "redb::CompactionError",
            StorageError::new(redb::CompactionError::Storage(io())),
        ),
        (
            "redb::SavepointError",
            StorageError::new(redb::SavepointError::Storage(io())),
        ),
        // A storage backend's failure that is not an `io::Error` (`BackendError::Other`).
        (
            "redb::Error::Backend",
            StorageError::new(redb::Error::Backend("the block device failed".into())),
        ),
        (
            "redb::TableError::Storage(Backend)",
            StorageError::new(redb::TableError::Storage(redb::StorageError::Backend(
                "the block device failed".into(),
            ))),
        ),
    ];
    for (what, source) in cases {
        assert!(latches(source), "an I/O failure in a {what} must fail-stop");
    }
}

#[test]
fn a_misuse_error_does_not_latch() {
    let missing = StorageError::new(redb::TableError::TableDoesNotExist("mine".into()));
    assert!(!latches(missing));
    let too_large = StorageError::new(redb::StorageError::ValueTooLarge(1 << 40));
    assert!(!latches(too_large));
}

#[test]
fn the_redb_error_stays_reachable_and_its_message_unchanged() {
    let source = StorageError::new(redb::Error::DatabaseAlreadyOpen);
    assert!(matches!(
        source.downcast_ref::<redb::Error>(),
        Some(redb::Error::DatabaseAlreadyOpen)
    ));
    assert_eq!(
        source.to_string(),
        redb::Error::DatabaseAlreadyOpen.to_string()
    );
}
