//! Both flows on an embedded store file, printing what happens.
//!
//! ```text
//! cargo run --release --example quickstart [-- PATH]     # default PATH: ./data/quickstart.redb
//! ```
//!
//! Run it twice: the second run replays the first run's answers from the file.

use std::collections::HashMap;
use std::time::Duration;

use idem::redb::{ReadableTableMetadata, TableDefinition};
use idem::{Abort, BeginAnswer, Error, ExecuteAnswer, Request, Response, Scope, Store};

/// The caller's own table: order id → quantity. It lives in the same file as idem's records.
const ORDERS: TableDefinition<&str, u32> = TableDefinition::new("orders");

#[derive(serde::Serialize)]
struct CreateOrder<'a> {
    sku: &'a str,
    quantity: u32,
}

/// A stand-in for an external payment provider that honours idempotency keys: the same key
/// always yields the same charge, never a second one.
#[derive(Default)]
struct Provider {
    charges: HashMap<String, String>,
}

impl Provider {
    fn charge(&mut self, idempotency_key: &str) -> String {
        let next = format!("ch_{}", self.charges.len() + 1);
        self.charges
            .entry(idempotency_key.to_owned())
            .or_insert(next)
            .clone()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "data/quickstart.redb".to_owned());
    if let Some(dir) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let store = Store::builder()
        .lease_duration(Duration::from_millis(300))
        .open(&path)?;
    println!("store: {path}\n");

    println!("== Flow A: the order row and the idempotency record commit in one transaction");
    let scope = Scope::new("tenant-42", "create_order");
    let create = |key: &str, quantity: u32| -> Result<ExecuteAnswer, Error> {
        let payload = CreateOrder {
            sku: "sku-1",
            quantity,
        };
        let request = Request::new(scope.clone(), key, &payload)?;
        store.execute(request, |tx| {
            let mut orders = tx.open_table(ORDERS)?;
            let id = format!("ord-{key}");
            orders.insert(id.as_str(), quantity)?;
            let body = format!(r#"{{"id":"{id}","quantity":{quantity}}}"#);
            Ok(Response::new(201, body).with_resource("order", id))
        })
    };
    show("first call", &create("order-123", 2));
    show("retry after a lost response", &create("order-123", 2));
    show("same key, different payload", &create("order-123", 5));
    let other_tenant = Request::new(
        Scope::new("tenant-7", "create_order"),
        "order-123",
        &CreateOrder {
            sku: "sku-1",
            quantity: 2,
        },
    )?;
    show(
        "same key, another tenant",
        &store.execute(other_tenant, |_| {
            Ok(Response::new(201, "tenant-7's own order"))
        }),
    );
    let declined = Request::from_canonical_bytes(scope.clone(), "order-999", b"qty=1000000");
    show(
        "terminal failure (stored, replayed)",
        &store.execute(declined.clone(), |_| {
            Err(Abort::terminal(Response::new(409, "out of stock")))
        }),
    );
    show(
        "retry of the terminal failure",
        &store.execute(declined, |_| Ok(Response::new(201, "never runs"))),
    );
    let flaky = Request::from_canonical_bytes(scope.clone(), "order-500", b"qty=1");
    show(
        "retryable error (nothing stored)",
        &store.execute(flaky.clone(), |_| {
            Err(Abort::retryable("inventory service timed out"))
        }),
    );
    show(
        "retry of the retryable error",
        &store.execute(flaky, |_| Ok(Response::new(201, "created on the retry"))),
    );

    println!("\n== Flow B: a fenced lease around an external call");
    let mut provider = Provider::default();
    let charge = Request::from_canonical_bytes(
        Scope::new("tenant-42", "charge_card"),
        "checkout-77",
        b"amount=4200",
    );
    match store.begin(charge.clone())? {
        BeginAnswer::Acquired(stalled) => {
            let key = stalled.downstream_key().to_hex();
            let charge_id = provider.charge(&key);
            println!(
                "  worker 1 holds attempt {} and charged {charge_id} with downstream key {}…, then stalls",
                stalled.attempt(),
                &key[..16]
            );
            std::thread::sleep(Duration::from_millis(350));
            println!("  worker 1's lease lapsed (300 ms)");
            match store.begin(charge.clone())? {
                BeginAnswer::Acquired(worker2) => {
                    let key2 = worker2.downstream_key().to_hex();
                    let charge_id = provider.charge(&key2);
                    println!(
                        "  worker 2 took over as attempt {} with the same downstream key: {} (provider holds {} charge)",
                        worker2.attempt(),
                        key == key2,
                        provider.charges.len()
                    );
                    worker2.complete(
                        Response::new(201, format!(r#"{{"charge":"{charge_id}"}}"#))
                            .with_resource("charge", charge_id),
                    )?;
                    println!("  worker 2 recorded the charge");
                }
                other => println!("  worker 2: {other:?}"),
            }
            match stalled.complete(Response::new(201, "stale")) {
                Err(e @ Error::LeaseLost { .. }) => println!("  worker 1 wakes up: refused ({e})"),
                other => println!("  worker 1 wakes up: {other:?}"),
            }
        }
        BeginAnswer::Replayed(r) => println!("  already charged earlier: {}", text(&r)),
        BeginAnswer::InFlight { retry_after } => {
            println!("  in flight, retry after {retry_after:?}")
        }
        BeginAnswer::Expired(t) => println!("  charged long ago (status {})", t.status()),
    }
    match store.begin(charge)? {
        BeginAnswer::Replayed(r) => {
            println!("  a client retry replays: {} {}", r.status(), text(&r))
        }
        other => println!("  a client retry: {other:?}"),
    }

    // Reads of your own tables go through a read transaction on the same file.
    let orders = store.read_transaction()?.open_table(ORDERS)?.len()?;
    println!("\norders table rows: {orders} (one per intent, however often it was retried)");
    Ok(())
}

fn text(r: &Response) -> String {
    String::from_utf8_lossy(r.body()).into_owned()
}

fn show(what: &str, result: &Result<ExecuteAnswer, Error>) {
    match result {
        Ok(ExecuteAnswer::Ran(r)) if r.is_failure() => {
            println!(
                "  {what:<38} -> Ran (failed)       {} {}",
                r.status(),
                text(r)
            )
        }
        Ok(ExecuteAnswer::Ran(r)) => println!(
            "  {what:<38} -> Ran                {} {}",
            r.status(),
            text(r)
        ),
        Ok(ExecuteAnswer::Replayed(r)) => println!(
            "  {what:<38} -> Replayed           {} {}",
            r.status(),
            text(r)
        ),
        Ok(ExecuteAnswer::InFlight { retry_after }) => {
            println!("  {what:<38} -> InFlight, retry after {retry_after:?}")
        }
        Ok(ExecuteAnswer::Expired(t)) => println!(
            "  {what:<38} -> Expired            {} (done long ago; the body is gone)",
            t.status()
        ),
        Err(e) => println!("  {what:<38} -> Err: {e}"),
    }
}
