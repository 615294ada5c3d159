//! SQLite: the article's flow (`INSERT ... ON CONFLICT DO NOTHING`, load, business write,
//! `UPDATE` to completed, one transaction per claim), its replay lookup, and its pre-fill with
//! the same records as idem's.

use std::path::Path;
use std::time::{Duration, Instant};

use bench_common::sync_file;
use bench_common::workload::{OPERATION, TENANT, payload, response};
use idem::keys::Fingerprint;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::data::{DAY_MS, existing_key, now_ms};

const SQL_SCHEMA: &str = "
CREATE TABLE api_idempotency (
    tenant_id       TEXT    NOT NULL,
    operation       TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    request_hash    TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    status_code     INTEGER,
    response_body   TEXT,
    resource_type   TEXT,
    resource_id     TEXT,
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, operation, idempotency_key)
);
CREATE TABLE effects (k TEXT PRIMARY KEY, n INTEGER NOT NULL);";

const SQL_CLAIM: &str = "INSERT INTO api_idempotency \
    (tenant_id, operation, idempotency_key, request_hash, state, created_at, expires_at) \
    VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6) ON CONFLICT DO NOTHING";
const SQL_LOAD: &str = "SELECT request_hash, state, status_code, response_body, resource_type, \
    resource_id FROM api_idempotency \
    WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3";
const SQL_EFFECT: &str = "INSERT INTO effects (k, n) VALUES (?1, 1)";
const SQL_COMPLETE: &str = "UPDATE api_idempotency SET state = 'completed', status_code = ?4, \
    response_body = ?5, resource_type = ?6, resource_id = ?7 \
    WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3";
const SQL_PREFILL: &str = "INSERT INTO api_idempotency VALUES \
    (?1, ?2, ?3, ?4, 'completed', ?5, ?6, ?7, ?8, ?9, ?10)";

/// The row as loaded; every column is read, as a server replaying it would.
#[allow(dead_code)]
struct SqlRow {
    request_hash: String,
    state: String,
    status_code: Option<i64>,
    response_body: Option<String>,
    resource_type: Option<String>,
    resource_id: Option<String>,
}

fn sql_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SqlRow> {
    Ok(SqlRow {
        request_hash: r.get(0)?,
        state: r.get(1)?,
        status_code: r.get(2)?,
        response_body: r.get(3)?,
        resource_type: r.get(4)?,
        resource_id: r.get(5)?,
    })
}

fn i64_ms(ms: u64) -> i64 {
    i64::try_from(ms).expect("ms fits i64")
}

fn body_text() -> String {
    String::from_utf8(response().body().to_vec()).expect("utf-8 body")
}

pub fn sqlite_create(path: &Path) {
    let conn = Connection::open(path).expect("sqlite create");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .expect("sqlite wal");
    assert_eq!(mode, "wal");
    conn.execute_batch(SQL_SCHEMA).expect("sqlite schema");
}

/// One caller's connection: WAL (persisted in the file), synchronous=FULL, a busy timeout,
/// and a page cache as large as redb's default (1 GiB), so lookups are not I/O-starved.
pub fn sqlite_conn(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("sqlite open");
    conn.busy_timeout(Duration::from_secs(60))
        .expect("busy timeout");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("synchronous");
    conn.pragma_update(None, "cache_size", -1_048_576)
        .expect("cache_size");
    conn
}

/// The common SQL flow (benches/README.md, "Baselines"), one transaction per claim: claim
/// the key (pending) unless present, load the row, check it, do the business write, store the
/// result, commit (one WAL fsync).
pub fn sqlite_claim(conn: &mut Connection, key: &str) {
    let hash = Fingerprint::of_bytes(&payload(key)).to_hex();
    let now = now_ms();
    let resp = response();
    let resource = resp.resource().expect("resource");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("BEGIN IMMEDIATE");
    let inserted = tx
        .prepare_cached(SQL_CLAIM)
        .and_then(|mut s| {
            s.execute(params![
                TENANT,
                OPERATION,
                key,
                hash,
                i64_ms(now),
                i64_ms(now + DAY_MS)
            ])
        })
        .expect("sqlite claim");
    let row = tx
        .prepare_cached(SQL_LOAD)
        .and_then(|mut s| s.query_row(params![TENANT, OPERATION, key], sql_row))
        .expect("sqlite load");
    assert!(
        inserted == 1 && row.request_hash == hash && row.state == "pending",
        "sqlite claim {key}: not a fresh claim"
    );
    tx.prepare_cached(SQL_EFFECT)
        .and_then(|mut s| s.execute(params![key]))
        .expect("sqlite effect");
    tx.prepare_cached(SQL_COMPLETE)
        .and_then(|mut s| {
            s.execute(params![
                TENANT,
                OPERATION,
                key,
                resp.status(),
                body_text(),
                resource.kind,
                resource.id
            ])
        })
        .expect("sqlite complete");
    tx.commit().expect("COMMIT");
}

/// A replay lookup: the prepared SELECT by primary key, then the payload check.
pub fn sqlite_lookup(conn: &Connection, key: &str) {
    let hash = Fingerprint::of_bytes(&payload(key)).to_hex();
    let row = conn
        .prepare_cached(SQL_LOAD)
        .and_then(|mut s| {
            s.query_row(params![TENANT, OPERATION, key], sql_row)
                .optional()
        })
        .expect("sqlite lookup")
        .unwrap_or_else(|| panic!("sqlite lookup {key}: missing"));
    assert!(
        row.request_hash == hash && row.state == "completed",
        "sqlite lookup {key}: wrong row"
    );
}

/// The same `n` records as `prefill_idem` (same keys, hashes, responses, caller rows), in one
/// transaction; then the WAL is checkpointed into the main file and removed.
pub fn prefill_sqlite(path: &Path, n: usize) -> Duration {
    let t = Instant::now();
    sqlite_create(path);
    let mut conn = sqlite_conn(path);
    let now = now_ms();
    let resp = response();
    let resource = resp.resource().expect("resource");
    let body = body_text();
    let tx = conn.transaction().expect("sqlite prefill begin");
    {
        let mut rec = tx.prepare(SQL_PREFILL).expect("prepare prefill");
        let mut eff = tx.prepare(SQL_EFFECT).expect("prepare effect");
        for i in 0..n {
            let key = existing_key(i);
            let hash = Fingerprint::of_bytes(&payload(&key)).to_hex();
            rec.execute(params![
                TENANT,
                OPERATION,
                key,
                hash,
                resp.status(),
                body,
                resource.kind,
                resource.id,
                i64_ms(now),
                i64_ms(now + DAY_MS)
            ])
            .expect("sqlite prefill row");
            eff.execute(params![key]).expect("sqlite prefill effect");
        }
    }
    tx.commit().expect("sqlite prefill commit");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    drop(conn);
    sync_file(path);
    t.elapsed()
}
