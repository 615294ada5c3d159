//! A replay returns the response as it was when the intent finished, not a fresh view of the
//! resource: after the resource changed (or vanished) through another operation, the original
//! retry still gets the first answer byte for byte, and nothing runs again.

use crate::common;

use std::cell::Cell;

use common::*;
use idem::redb::{ReadableTable, TableDefinition};
use idem::{Request, Response, Store};

const PAYMENTS: TableDefinition<&str, &str> = TableDefinition::new("test.payments");

fn create_request() -> Request {
    req("t1", "create_payment", "create-key", b"amount=100")
}

fn status_body(id: &str, status: &str) -> String {
    format!("{{\"id\":\"{id}\",\"status\":\"{status}\"}}")
}

/// Creates payment `pay-1` as "captured"; the response body describes the new payment.
fn create(store: &Store, runs: &Cell<u32>) -> Result<idem::ExecuteAnswer, idem::Error> {
    store.execute(create_request(), |tx| {
        runs.set(runs.get() + 1);
        let mut payments = tx.open_table(PAYMENTS)?;
        payments.insert("pay-1", "captured")?;
        Ok(Response::new(201, status_body("pay-1", "captured")).with_resource("payment", "pay-1"))
    })
}

/// Reads the payment's current status from a read snapshot.
fn current_status(store: &Store) -> Option<String> {
    let read = store.read_transaction().expect("read txn");
    let payments = read.open_table(PAYMENTS).expect("payments table");
    payments
        .get("pay-1")
        .expect("read payment")
        .map(|v| v.value().to_owned())
}

#[test]
fn retry_after_a_refund_still_replays_the_original_creation() {
    let h = Harness::new();
    let store = h.store();
    let runs = Cell::new(0u32);
    let first = executed(create(store, &runs));

    // The payment changes through a different operation and key.
    let refund = executed(
        store.execute(req("t1", "refund", "refund-key", b"pay-1"), |tx| {
            let mut payments = tx.open_table(PAYMENTS)?;
            payments.insert("pay-1", "refunded")?;
            Ok(Response::new(200, status_body("pay-1", "refunded")))
        }),
    );
    assert_eq!(refund.body(), status_body("pay-1", "refunded").as_bytes());
    assert_eq!(current_status(store).as_deref(), Some("refunded"));

    // The lost-response retry of the creation gets the creation's answer, unchanged.
    let again = replayed(create(store, &runs));
    assert_eq!(again, first);
    assert_eq!(again.body(), status_body("pay-1", "captured").as_bytes());
    assert_eq!(runs.get(), 1, "the creation did not run again");
    assert_eq!(
        current_status(store).as_deref(),
        Some("refunded"),
        "the replay did not overwrite the refunded state"
    );
}

#[test]
fn retry_after_the_resource_was_deleted_still_replays() {
    let h = Harness::new();
    let store = h.store();
    let runs = Cell::new(0u32);
    let first = executed(create(store, &runs));
    executed(
        store.execute(req("t1", "delete", "del-key", b"pay-1"), |tx| {
            let mut payments = tx.open_table(PAYMENTS)?;
            payments.remove("pay-1")?;
            Ok(Response::new(204, ""))
        }),
    );
    assert_eq!(current_status(store), None);

    let again = replayed(create(store, &runs));
    assert_eq!(again, first);
    assert_eq!(runs.get(), 1);
    assert_eq!(
        current_status(store),
        None,
        "the deleted payment was not recreated"
    );
}

#[test]
fn flow_b_result_replays_after_the_resource_changed() {
    let mut h = Harness::new();
    let lease = acquired(h.store().begin(create_request()));
    let first = lease
        .complete_with(|tx| {
            tx.open_table(PAYMENTS)?.insert("pay-1", "captured")?;
            Ok(Response::new(201, status_body("pay-1", "captured")))
        })
        .expect("complete");
    executed(
        h.store()
            .execute(req("t1", "refund", "refund-key", b"pay-1"), |tx| {
                tx.open_table(PAYMENTS)?.insert("pay-1", "refunded")?;
                Ok(Response::new(200, "refunded"))
            }),
    );
    h.reopen();
    assert_eq!(begin_replayed(h.store().begin(create_request())), first);
    assert_eq!(current_status(h.store()).as_deref(), Some("refunded"));
}
