//! idem's own tables ("idem." prefix) cannot be opened through the transaction handle, and an
//! execute that tries writes nothing at all.

use crate::common;

use std::cell::Cell;

use common::*;
use idem::format::RESERVED_PREFIX;
use idem::redb::{MultimapTableDefinition, TableDefinition};
use idem::{Error, Response, Scope, Store};

#[track_caller]
fn assert_reserved<T: std::fmt::Debug>(result: Result<T, Error>, expected_name: &str) {
    match result {
        Err(Error::ReservedTable { name, prefix }) => {
            assert_eq!(name, expected_name);
            assert_eq!(prefix, "idem.");
        }
        other => panic!("expected ReservedTable {expected_name:?}, got {other:?}"),
    }
}

/// Runs an execute whose closure first writes an effect, then opens `open` with `?`.
fn try_reserved(
    store: &Store,
    key: &str,
    open: impl Fn(&idem::Tx<'_>) -> Result<(), Error>,
) -> Result<idem::ExecuteAnswer, Error> {
    store.execute(req("t", "op", key, b"p"), |tx| {
        bump(tx, "attempts")?;
        open(tx)?;
        Ok(Response::new(200, "should not commit"))
    })
}

#[test]
fn opening_idems_record_table_is_refused_and_the_execute_writes_nothing() {
    let h = Harness::new();
    let store = h.store();
    // An existing record that a malicious or buggy closure might try to rewrite.
    executed(store.execute(req("t", "op", "existing", b"p"), |_| {
        Ok(Response::new(201, "original"))
    }));
    let before = store
        .get(&Scope::new("t", "op"), "existing")
        .expect("get")
        .expect("record");

    let r = try_reserved(store, "k", |tx| {
        let mut records = tx.open_table(RECORDS)?;
        records
            .insert(
                record_key("t", "op", b"existing").as_slice(),
                b"junk".as_slice(),
            )
            .map_err(|e| Error::Storage {
                source: idem::error::StorageError::new(e),
            })?;
        Ok(())
    });
    assert_reserved(r, "idem.records.v1");
    assert_eq!(store.get(&Scope::new("t", "op"), "k").expect("get"), None);
    assert_eq!(
        effects(store, "attempts"),
        0,
        "the write before the refusal rolled back"
    );
    assert_eq!(
        store.get(&Scope::new("t", "op"), "existing").expect("get"),
        Some(before)
    );
}

#[test]
fn every_idem_prefixed_name_is_refused_whatever_its_types() {
    let h = Harness::new();
    let store = h.store();
    const META_AS_DEFINED: TableDefinition<&str, &[u8]> = TableDefinition::new("idem.meta.v1");
    const RECORDS_WRONG_TYPES: TableDefinition<u64, u64> = TableDefinition::new("idem.records.v1");
    const FUTURE: TableDefinition<&str, u64> = TableDefinition::new("idem.records.v2");
    const BARE_PREFIX: TableDefinition<&str, u64> = TableDefinition::new("idem.");
    const MULTI: MultimapTableDefinition<&str, u64> = MultimapTableDefinition::new("idem.index");

    assert_eq!(RESERVED_PREFIX, "idem.");
    assert_reserved(
        try_reserved(store, "a", |tx| tx.open_table(META_AS_DEFINED).map(drop)),
        "idem.meta.v1",
    );
    assert_reserved(
        try_reserved(store, "b", |tx| {
            tx.open_table(RECORDS_WRONG_TYPES).map(drop)
        }),
        "idem.records.v1",
    );
    assert_reserved(
        try_reserved(store, "c", |tx| tx.open_table(FUTURE).map(drop)),
        "idem.records.v2",
    );
    assert_reserved(
        try_reserved(store, "d", |tx| tx.open_table(BARE_PREFIX).map(drop)),
        "idem.",
    );
    assert_reserved(
        try_reserved(store, "e", |tx| tx.open_multimap_table(MULTI).map(drop)),
        "idem.index",
    );
    for key in ["a", "b", "c", "d", "e"] {
        assert_eq!(store.get(&Scope::new("t", "op"), key).expect("get"), None);
    }
    assert_eq!(effects(store, "attempts"), 0);
}

#[test]
fn names_that_merely_resemble_the_prefix_are_allowed() {
    let h = Harness::new();
    let store = h.store();
    const NO_DOT: TableDefinition<&str, u64> = TableDefinition::new("idem");
    const OTHER: TableDefinition<&str, u64> = TableDefinition::new("idempotency.keys");
    const INNER: TableDefinition<&str, u64> = TableDefinition::new("app.idem.records");
    let ran = Cell::new(0u32);
    executed(store.execute(req("t", "op", "k", b"p"), |tx| {
        for def in [NO_DOT, OTHER, INNER] {
            tx.open_table(def)?.insert("x", 1)?;
            ran.set(ran.get() + 1);
        }
        Ok(Response::new(200, "ok"))
    }));
    assert_eq!(ran.get(), 3);
}

#[test]
fn complete_with_refuses_reserved_tables_and_writes_nothing() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(req("t", "charge", "k", b"p")));
    let result = lease.complete_with(|tx| {
        bump(tx, "attempts")?;
        tx.open_table(RECORDS)?;
        Ok(Response::new(200, "should not commit"))
    });
    assert_reserved(result, "idem.records.v1");
    assert_eq!(effects(store, "attempts"), 0);
    // The failed completion released the lease (it is not LeaseLost), per Lease's docs.
    assert_eq!(
        store.get(&Scope::new("t", "charge"), "k").expect("get"),
        None,
        "the lease is released on drop after a non-LeaseLost error"
    );
}
