//! A closure that opens one of its tables with other key or value types than the batch created
//! it with gets redb's own `TableTypeMismatch`, naming both pairs of types, in journal mode (where
//! the table may exist only in the batch's journaled writes, not yet in redb) as without it; the
//! store does not fail-stop for it.

use crate::common;

use common::req;
use idem::redb::{TableDefinition, TableError};
use idem::{Error, Response, Store};

const AS_COUNTS: TableDefinition<&str, u64> = TableDefinition::new("test.mixed");
const AS_TEXT: TableDefinition<&str, &str> = TableDefinition::new("test.mixed");

fn check(journal: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::builder()
        .journal(journal)
        .open(dir.path().join("idem.redb"))
        .expect("open");
    let answer = store.execute(req("t", "op", "k", b"p"), |tx| {
        tx.open_table(AS_COUNTS)?.insert("a", 1)?;
        let err = match tx.open_table(AS_TEXT) {
            Ok(_) => panic!("journal {journal}: the table opened with other types"),
            Err(e) => e,
        };
        let Error::Storage { source } = &err else {
            panic!("journal {journal}: {err:?}");
        };
        let mismatch = match source.downcast_ref::<idem::redb::Error>() {
            Some(idem::redb::Error::TableTypeMismatch(m)) => m,
            _ => match source.downcast_ref::<TableError>() {
                Some(TableError::TableTypeMismatch(m)) => m,
                _ => panic!("journal {journal}: not redb's type mismatch: {err:?}"),
            },
        };
        assert_eq!(mismatch.table(), "test.mixed");
        assert_eq!(mismatch.stored_key().name(), "&str");
        assert_eq!(mismatch.stored_value().name(), "u64");
        assert_eq!(mismatch.requested_value().name(), "&str");
        Err(err.into())
    });
    assert!(
        matches!(answer, Err(Error::Storage { .. })),
        "journal {journal}: {answer:?}"
    );
    assert_eq!(store.fail_stop_cause(), None, "journal {journal}");
    // Nothing of the failed claim was written; the key runs again.
    let again = store.execute(req("t", "op", "k", b"p"), |tx| {
        tx.open_table(AS_COUNTS)?.insert("a", 1)?;
        Ok(Response::new(200, "ok"))
    });
    assert!(
        matches!(again, Ok(idem::ExecuteAnswer::Ran(_))),
        "journal {journal}: {again:?}"
    );
}

#[test]
fn in_journal_mode() {
    check(true);
}

#[test]
fn without_journal_mode() {
    check(false);
}
