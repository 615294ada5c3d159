//! A small payments service on the `Idempotency-Key` layer, on one embedded store file, or
//! (`--postgres URL`) on a PostgreSQL database shared by several replicas.
//!
//! ```text
//! cargo run --release -p edge-service [-- --help]
//! cargo run --release -p edge-service --features metrics,tracing,postgres
//! ```
//!
//! Flags (`--help` lists them): `--data DIR` (default `./data`, the store is `DIR/idem.redb`),
//! or `--postgres URL` (feature `postgres`: a fleet of replicas on one database, in schema
//! `--pg-schema`, default `edge_service`),
//! `--listen ADDR` (default `127.0.0.1:8080`), `--lease-ms` (default 30000: how long a request
//! cut off by a crash blocks its key), `--header-timeout-ms` (10000), `--body-timeout-ms`
//! (10000), `--request-timeout-ms` (30000) and `--grace-ms` (10000), see [`Timeouts`].
//! Exit status: 0 after a clean stop, 1 when it cannot start (e.g. a busy port: the message names
//! the flag to change), 2 for a bad command line, 3 when the shutdown grace period ran out.
//!
//! - `POST /v1/payments` (`X-Tenant-Id`, `Idempotency-Key`, JSON `{"account", "amount",
//!   "currency"}`; `amount` in minor units, from 1 to [`MAX_AMOUNT`]) → 201 with the payment;
//! - `GET /v1/payments/{id}` → 200 with the payment as it is now (e.g. refunded), 404 if absent;
//! - `POST /v1/payments/{id}/refund` (`Idempotency-Key`) → 200, marks it refunded;
//! - `GET /v1/ledger` → 200 `{"entries", "total"}` for the tenant, so a client can count effects;
//! - `GET /v1/outbox` → 200 `{"pending", "dead", "delivered", "truncated"}` for the tenant:
//!   its events not yet delivered, its dead letters, and its events this process delivered
//!   since it started;
//! - `GET /v1/health` → 200 `{"status": "ok"}`, or 503 problem+json once the store stopped
//!   after an I/O failure (the service also logs that failure once, on stderr).
//!
//! Every request except the health check names its tenant (`X-Tenant-Id`) and sees only that tenant's data. Every error
//! the service answers is an RFC 9457 `application/problem+json` document with `type`,
//! `title`, `status` and `detail`: the layer's (`urn:idem:problem:*`) and the service's own
//! ([`problem`]), including unknown routes, wrong methods and timeouts. (hyper's automatic
//! answers to requests that are not HTTP at all, e.g. a malformed request line, have no body.)
//!
//! **Why the POST handlers record their own answer.** The layer claims the key with a lease
//! before the handler runs; a handler that wrote in a transaction of its own would leave a gap
//! where a crash after its write and before the layer recorded the answer lets a retry book the
//! payment twice. So both POST handlers write the payment row and its ledger entry *inside*
//! the transaction that records the answer
//! ([`IdempotencyHandle::complete_with`](idem::http::IdempotencyHandle::complete_with)), together with an
//! outbox event (topic `payments`, ordering key = the payment id, payload = the payment JSON,
//! headers `type` = `payment.captured` / `payment.refunded` and `tenant`): a kill -9 at any
//! moment either leaves the effect, its event and the answer, or none of them (the lease lapses
//! and the retry runs once, pushing the event once). The layer still does everything else: key
//! and tenant extraction, the fingerprint, 400/409/413/422 problems, replays with
//! `Idempotent-Replayed: true`.
//!
//! **Money.** Amounts are `i64` minor units; one payment is 1 to [`MAX_AMOUNT`], and every sum
//! is checked: a booking that would take the tenant's running total ([`LEDGER_TOTALS`]) out of
//! `i64` is refused with 422, and `GET /v1/ledger` answers a problem rather than a wrong
//! (saturated or wrapped) total.
//!
//! `main` also starts the outbox dispatcher ([`start_dispatcher`]); its publisher stands in for
//! a broker and prints each event on stdout (`published seq=… id=… topic=payments tenant=… key=pay_…`).
//! Delivery is at least once: after a kill -9 an event may be printed again, with the same id.

mod args;
mod engine;
mod outbox;
mod payments;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod problem;
mod routes;
mod server;
mod telemetry;

pub use args::*;
pub use engine::*;
pub use outbox::*;
pub use payments::*;
pub use routes::*;
pub use server::*;
pub use telemetry::*;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idem::redb::TableDefinition;

/// Payment id → the payment as JSON (it carries its tenant).
pub const PAYMENTS: TableDefinition<&str, &str> = TableDefinition::new("payments");
/// `"{tenant}\0{entry id}"` → signed amount. One entry per capture and per refund.
pub const LEDGER: TableDefinition<&str, i64> = TableDefinition::new("ledger");
/// Tenant → the sum of its ledger entries, written in the transaction that writes each entry
/// (checked arithmetic: an entry that would take it out of `i64` is refused, never saturated).
pub const LEDGER_TOTALS: TableDefinition<&str, i64> = TableDefinition::new("ledger_totals");

/// The largest amount of one payment, in minor units: 10^12 (ten billion in a currency with
/// cents). Amounts are integers from 1 to this; anything else is answered 422.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

/// At most this many undelivered events, and this many dead letters, are scanned to count a
/// tenant's outbox (`"truncated": true` when there were more).
pub const OUTBOX_SCAN: usize = 10_000;

const TENANT: &str = "x-tenant-id";

/// The service's `main`: parses the command line, starts the runtime, serves until a signal,
/// and maps how it stopped to the exit status (see [`Args`]).
pub fn main() -> ExitCode {
    // `--help` prints usage and exits 0; a bad flag prints clap's error and exits 2.
    let args = Args::parse();
    init_logging();
    let telemetry = match Telemetry::install() {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("edge_service: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("edge_service: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args, telemetry));
    // Tasks still holding store handles (a handler cut off by the grace period) are dropped
    // here, so the store closes (its Drop makes every acknowledged commit durable) before exit.
    // A blocking store call still running after 5 s is left to the OS: redb is crash-safe.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(Stopped::Drained) => {
            eprintln!("edge_service: stopped");
            ExitCode::SUCCESS
        }
        Ok(Stopped::GraceExpired { open }) => {
            eprintln!(
                "edge_service: grace period over with {open} connection(s) still open: cut them \
                 off (a request cut off mid-way either committed with its answer or left nothing; \
                 its client retries with the same key)"
            );
            ExitCode::from(EXIT_GRACE_EXPIRED)
        }
        Err(e) => {
            eprintln!("edge_service: {e}");
            ExitCode::FAILURE
        }
    }
}
