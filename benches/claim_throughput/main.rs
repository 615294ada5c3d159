//! Multi-caller claim throughput: idem side by side with its baselines, in one run, on one
//! machine, with the same keys — naive redb (one durable write transaction per claim, same
//! key/value layout), SQLite (the common SQL flow, `INSERT ... ON CONFLICT DO NOTHING` then
//! `UPDATE`, WAL, `synchronous=FULL`), the disk's own `pwrite` + `fdatasync` rate, and an
//! in-memory `Mutex<HashMap>` (not durable: the CPU ceiling).
//!
//! ```text
//! cargo bench --bench claim_throughput                      # full: 1,000,000-record store, 5 runs
//! IDEM_BENCH_QUICK=1 cargo bench --bench claim_throughput   # quick: 100,000 records, 3 runs
//! ```
//!
//! Optional: `IDEM_BENCH_DIR` (parent of the temp dir; default the system temp dir),
//! `IDEM_BENCH_PREFILL` (records in the pre-filled store), `IDEM_BENCH_RUNS`,
//! `IDEM_BENCH_RUN_SECS` (target seconds per run), `IDEM_BENCH_FILTER` (comma-separated pieces
//! of workload names, e.g. `naive,mutex`: only those rows run), `IDEM_BENCH_CSV` (where the
//! summary's CSV copy goes; default `target/bench-results/claim_throughput.csv`, which
//! `scripts/claims-chart` turns into the chart of BENCHMARKS.md). BENCHMARKS.md and
//! benches/README.md explain every workload and column. A custom harness (std threads, count-bounded runs) because criterion
//! measures one caller at a time.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Barrier, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::format::{Record, State};
use idem::keys::Fingerprint;
use idem::redb::{self, ReadableTable, TableDefinition};
use idem::store::Metrics;
use idem::{Begin, Outcome, Request, Response, Scope, Store, Timestamp};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

// ---- what every system stores -------------------------------------------------------------

const TENANT: &str = "tenant-0042";
const OPERATION: &str = "create_order";
/// The caller's own table: one tiny write per claim, in the claim's transaction.
const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("effects");
/// idem's records table (docs/FORMAT.md); naive redb writes the same table, keys and values.
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");
const DAY_MS: u64 = 24 * 3600 * 1000;
/// Records in the store that "empty"-store replays and the mixed workload read.
const SMALL: usize = 10_000;
/// Threads that pre-fill the stores through the public API.
const PREFILL_THREADS: usize = 64;
const NEW_KEY_CALLERS: [usize; 4] = [1, 2, 8, 64];
const REPLAY_THREADS: [usize; 2] = [1, 2];

/// A key present in the pre-filled stores (the small store holds the first `SMALL`).
fn existing_key(i: usize) -> String {
    format!("pre-{i:09}")
}

/// A key no store holds before the run; `tag` is the run (or calibration probe) number.
fn new_key(tag: usize, caller: usize, i: usize) -> String {
    format!("new-{tag:03}-{caller:02}-{i:08}")
}

/// The request's canonical payload: the same key always comes with the same payload.
fn payload(key: &str) -> Vec<u8> {
    format!("sku=sku-1&qty=2&ref={key}").into_bytes()
}

fn request(key: &str) -> Request {
    Request::from_canonical_bytes(Scope::new(TENANT, OPERATION), key, &payload(key))
}

fn response() -> Response {
    Response::new(201, r#"{"ok":true}"#).with_resource("order", "o1")
}

/// docs/FORMAT.md, "Record key": `0x01 ‖ u16be len ‖ tenant ‖ u16be len ‖ op ‖ u16be len ‖ key`.
fn record_key(key: &str) -> Vec<u8> {
    let mut out = vec![0x01];
    for part in [TENANT.as_bytes(), OPERATION.as_bytes(), key.as_bytes()] {
        let len = u16::try_from(part.len()).expect("field fits u16");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// A completed record as idem writes it, read back from a scratch store at start-up, so the
/// baselines store idem's exact value layout without the bench naming every record field.
static TEMPLATE: OnceLock<Record> = OnceLock::new();

fn make_template(dir: &Path) {
    let store = Store::open(dir.join("template.redb")).expect("template store");
    idem_claim(&store, "template");
    let record = store
        .get(&Scope::new(TENANT, OPERATION), "template")
        .expect("read template")
        .expect("template record");
    assert!(matches!(record.state, State::Completed(_)), "{record:?}");
    let _ = TEMPLATE.set(record);
}

/// The value idem stores for a completed claim of `key` at `now_ms` (idem's own encoder on the
/// template record, with this key's fingerprint and instants).
fn record_value(key: &str, now_ms: u64) -> Vec<u8> {
    let mut record = TEMPLATE.get().expect("template made first").clone();
    let age = record.expires_at.0.saturating_sub(record.created_at.0);
    record.fingerprint = Fingerprint::of_bytes(&payload(key));
    record.created_at = Timestamp(now_ms);
    record.expires_at = Timestamp(now_ms + age);
    record.encode()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

// ---- idem -----------------------------------------------------------------------------------

/// The page cache of every idem store here: redb's default (1 GiB), the cache the naive redb
/// baselines open with and the size SQLite gets, so the rows compare commit paths, not cache
/// sizes. idem's own default is 64 MiB (`idem::store::DEFAULT_CACHE_SIZE`); what that costs is
/// measured by `benches/scale.rs` (benches/results/2026-12-02-0bd18d7-scale-page-cache-sizes.md).
const CACHE: usize = 1 << 30;

fn open_idem(path: &Path) -> Store {
    Store::builder()
        .cache_size(CACHE)
        .open(path)
        .expect("open idem store")
}

fn idem_claim(store: &Store, key: &str) {
    let outcome = store
        .execute(request(key), |tx| {
            let mut effects = tx.open_table(EFFECTS)?;
            effects.insert(key.as_bytes(), 1)?;
            Ok(response())
        })
        .unwrap_or_else(|e| panic!("idem claim {key}: {e}"));
    assert!(
        matches!(outcome, Outcome::Executed(_)),
        "idem claim {key}: {outcome:?}"
    );
}

/// `idem_claim` through `Store::execute_send`: the closure is `Send + 'static` (it owns its
/// key), so the thread holding the batch runs it without a hand-off.
fn idem_claim_send(store: &Store, key: &str) {
    let owned = key.to_owned();
    let outcome = store
        .execute_send(request(key), move |tx| {
            let mut effects = tx.open_table(EFFECTS)?;
            effects.insert(owned.as_bytes(), 1)?;
            Ok(response())
        })
        .unwrap_or_else(|e| panic!("idem claim {key}: {e}"));
    assert!(
        matches!(outcome, Outcome::Executed(_)),
        "idem claim {key}: {outcome:?}"
    );
}

fn idem_replay(store: &Store, key: &str) {
    let outcome = store
        .execute(request(key), |_| {
            unreachable!("a replay never runs the closure")
        })
        .unwrap_or_else(|e| panic!("idem replay {key}: {e}"));
    assert!(outcome.is_replay(), "idem replay {key}: {outcome:?}");
}

fn idem_lease(store: &Store, key: &str) {
    match store.begin(request(key)) {
        Ok(Begin::Acquired(lease)) => {
            lease
                .complete(response())
                .unwrap_or_else(|e| panic!("idem complete {key}: {e}"));
        }
        other => panic!("idem begin {key}: expected a lease, got {other:?}"),
    }
}

/// Writes `n` completed records (`existing_key(0..n)`, each with its caller write) through
/// `Store::execute` on `PREFILL_THREADS` threads: the default store (`Durability::Immediate`),
/// so group commit batches the callers and the file is laid out as a busy durable store's is.
fn prefill_idem(path: &Path, n: usize) -> Duration {
    let t = Instant::now();
    let store = open_idem(path);
    thread::scope(|s| {
        for t in 0..PREFILL_THREADS {
            let store = &store;
            s.spawn(move || {
                for i in (t..n).step_by(PREFILL_THREADS) {
                    idem_claim(store, &existing_key(i));
                }
            });
        }
    });
    drop(store);
    sync_file(path);
    t.elapsed()
}

// ---- naive redb ---------------------------------------------------------------------------

/// One redb write transaction per claim, `Durability::Immediate`: look the record key up, then
/// write idem's record bytes and the caller write, then commit (one fsync).
fn naive_claim(db: &redb::Database, key: &str) {
    let record_key = record_key(key);
    let value = record_value(key, now_ms());
    let mut txn = db.begin_write().expect("naive begin_write");
    txn.set_durability(redb::Durability::Immediate)
        .expect("naive durability");
    {
        let mut records = txn.open_table(RECORDS).expect("naive records");
        let existing = records.get(record_key.as_slice()).expect("naive get");
        assert!(existing.is_none(), "naive claim {key}: key already present");
        drop(existing);
        records
            .insert(record_key.as_slice(), value.as_slice())
            .expect("naive insert");
        let mut effects = txn.open_table(EFFECTS).expect("naive effects");
        effects.insert(key.as_bytes(), 1).expect("naive effect");
    }
    txn.commit().expect("naive commit");
}

/// idem's expiry index (docs/FORMAT.md): `u64be(due) ‖ kind ‖ record key` → state tag.
const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");

/// Naive redb plus the one thing idem's layout adds to a claim: its expiry-index entry (a
/// third B-tree insert in the same transaction). Set beside naive redb at 1 and 2 callers, it
/// shows how much of idem's single-caller gap that entry is.
fn naive_indexed_claim(db: &redb::Database, key: &str) {
    let record_key = record_key(key);
    let now = now_ms();
    let value = record_value(key, now);
    let mut txn = db.begin_write().expect("indexed begin_write");
    txn.set_durability(redb::Durability::Immediate)
        .expect("indexed durability");
    {
        let mut records = txn.open_table(RECORDS).expect("indexed records");
        let existing = records.get(record_key.as_slice()).expect("indexed get");
        assert!(
            existing.is_none(),
            "indexed claim {key}: key already present"
        );
        drop(existing);
        records
            .insert(record_key.as_slice(), value.as_slice())
            .expect("indexed insert");
        let mut entry = (now + DAY_MS).to_be_bytes().to_vec();
        entry.push(0x01);
        entry.extend_from_slice(&record_key);
        let mut expiry = txn.open_table(EXPIRY).expect("indexed expiry");
        expiry.insert(entry.as_slice(), 1).expect("indexed entry");
        let mut effects = txn.open_table(EFFECTS).expect("indexed effects");
        effects.insert(key.as_bytes(), 1).expect("indexed effect");
    }
    txn.commit().expect("indexed commit");
}

/// How often [`naive_deferred_claim`] writes the expiry entries it has held back.
const DEFERRED_FLUSH: Duration = Duration::from_millis(100);

/// The expiry entries [`naive_deferred_claim`] has held back since its last flush.
struct Deferred {
    entries: Vec<Vec<u8>>,
    flushed: Instant,
}

/// Naive redb with the expiry-index entries held in memory and written by the first claim
/// after each [`DEFERRED_FLUSH`], all in that claim's transaction: the ceiling of a deferred
/// index (issue 14's single-caller goal: 1 caller ≥ 0.95× naive redb). It is not crash-safe as an index: a crash loses the entries of
/// up to the last 100 ms of commits, and their records would never be swept unless an open
/// after a crash scanned every record to find them.
fn naive_deferred_claim(db: &redb::Database, deferred: &Mutex<Deferred>, key: &str) {
    let record_key = record_key(key);
    let now = now_ms();
    let value = record_value(key, now);
    let mut entry = (now + DAY_MS).to_be_bytes().to_vec();
    entry.push(0x01);
    entry.extend_from_slice(&record_key);
    let due = {
        let mut d = deferred.lock().expect("deferred lock");
        d.entries.push(entry);
        if d.flushed.elapsed() >= DEFERRED_FLUSH {
            d.flushed = Instant::now();
            std::mem::take(&mut d.entries)
        } else {
            Vec::new()
        }
    };
    let mut txn = db.begin_write().expect("deferred begin_write");
    txn.set_durability(redb::Durability::Immediate)
        .expect("deferred durability");
    {
        let mut records = txn.open_table(RECORDS).expect("deferred records");
        let existing = records.get(record_key.as_slice()).expect("deferred get");
        assert!(
            existing.is_none(),
            "deferred claim {key}: key already present"
        );
        drop(existing);
        records
            .insert(record_key.as_slice(), value.as_slice())
            .expect("deferred insert");
        if !due.is_empty() {
            let mut expiry = txn.open_table(EXPIRY).expect("deferred expiry");
            for e in &due {
                expiry.insert(e.as_slice(), 1).expect("deferred entry");
            }
        }
        let mut effects = txn.open_table(EFFECTS).expect("deferred effects");
        effects.insert(key.as_bytes(), 1).expect("deferred effect");
    }
    txn.commit().expect("deferred commit");
}

/// First byte of an expiry entry kept in the records tree itself (record keys start with
/// `0x01`, so every such entry sorts after every record and a sweep is still one range scan).
const COLOCATED_EXPIRY: u8 = 0xFF;

/// Naive redb with the expiry-index entry kept in the records tree (`0xFF ‖ u64be(due) ‖ kind ‖
/// record key` → the state tag) instead of a table of its own: the layout experiment of issue
/// 14's single-caller goal (one B-tree and one table root touched per claim instead of two).
fn naive_colocated_claim(db: &redb::Database, key: &str) {
    let record_key = record_key(key);
    let now = now_ms();
    let value = record_value(key, now);
    let mut txn = db.begin_write().expect("colocated begin_write");
    txn.set_durability(redb::Durability::Immediate)
        .expect("colocated durability");
    {
        let mut records = txn.open_table(RECORDS).expect("colocated records");
        let existing = records.get(record_key.as_slice()).expect("colocated get");
        assert!(
            existing.is_none(),
            "colocated claim {key}: key already present"
        );
        drop(existing);
        records
            .insert(record_key.as_slice(), value.as_slice())
            .expect("colocated insert");
        let mut entry = vec![COLOCATED_EXPIRY];
        entry.extend_from_slice(&(now + DAY_MS).to_be_bytes());
        entry.push(0x01);
        entry.extend_from_slice(&record_key);
        records
            .insert(entry.as_slice(), [1u8].as_slice())
            .expect("colocated entry");
        let mut effects = txn.open_table(EFFECTS).expect("colocated effects");
        effects.insert(key.as_bytes(), 1).expect("colocated effect");
    }
    txn.commit().expect("colocated commit");
}

/// A copy of idem's pre-filled store with its expiry index moved into the records tree (the
/// layout [`naive_colocated_claim`] writes), in one transaction and not compacted, like the
/// copies the other baselines run on.
fn colocate_copy(from: &Path, to: &Path) {
    copy_synced(from, to);
    let db = redb::Database::create(to).expect("open colocated copy");
    let txn = db.begin_write().expect("colocate begin_write");
    {
        let expiry = txn.open_table(EXPIRY).expect("colocate expiry");
        let mut records = txn.open_table(RECORDS).expect("colocate records");
        for item in expiry.iter().expect("colocate iter") {
            let (k, v) = item.expect("colocate entry");
            let mut entry = vec![COLOCATED_EXPIRY];
            entry.extend_from_slice(k.value());
            records
                .insert(entry.as_slice(), [v.value()].as_slice())
                .expect("colocate insert");
        }
    }
    txn.delete_table(EXPIRY).expect("colocate delete expiry");
    txn.commit().expect("colocate commit");
    drop(db);
    sync_file(to);
}

fn naive_create(path: &Path) -> redb::Database {
    let db = redb::Database::create(path).expect("naive create");
    let txn = db.begin_write().expect("naive setup");
    txn.open_table(RECORDS).expect("naive records");
    txn.open_table(EFFECTS).expect("naive effects");
    txn.commit().expect("naive setup commit");
    db
}

// ---- naive group-commit writer ------------------------------------------------------------

/// The simplest group-commit writer: callers send their key down a channel and wait; one writer
/// thread drains whatever is queued into one redb write transaction (the same tables, keys and
/// value bytes as idem: look the record up, insert it and the caller's effect), commits it with
/// an fsync, then answers every caller of the batch. No closures, no isolation between batch
/// members, no re-runs: what idem pays for those is the difference.
struct GroupWriter {
    requests: Option<crossbeam_channel::Sender<(String, crossbeam_channel::Sender<()>)>>,
    writer: Option<thread::JoinHandle<()>>,
}

impl GroupWriter {
    fn start(db: redb::Database) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded::<(String, crossbeam_channel::Sender<()>)>();
        let writer = thread::spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                batch.extend(rx.try_iter());
                let now = now_ms();
                let mut txn = db.begin_write().expect("group begin_write");
                txn.set_durability(redb::Durability::Immediate)
                    .expect("group durability");
                {
                    let mut records = txn.open_table(RECORDS).expect("group records");
                    let mut effects = txn.open_table(EFFECTS).expect("group effects");
                    for (key, _) in &batch {
                        let rk = record_key(key);
                        let existing = records.get(rk.as_slice()).expect("group get");
                        assert!(existing.is_none(), "group claim {key}: key already present");
                        drop(existing);
                        records
                            .insert(rk.as_slice(), record_value(key, now).as_slice())
                            .expect("group insert");
                        effects.insert(key.as_bytes(), 1).expect("group effect");
                    }
                }
                txn.commit().expect("group commit");
                for (_, reply) in batch {
                    let _ = reply.send(());
                }
            }
        });
        GroupWriter {
            requests: Some(tx),
            writer: Some(writer),
        }
    }

    fn claim(&self, key: &str) {
        let (reply, done) = crossbeam_channel::bounded(1);
        self.requests
            .as_ref()
            .expect("writer running")
            .send((key.to_owned(), reply))
            .expect("writer alive");
        done.recv().expect("writer answered");
    }
}

impl Drop for GroupWriter {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

// ---- SQLite -------------------------------------------------------------------------------

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

fn sqlite_create(path: &Path) {
    let conn = Connection::open(path).expect("sqlite create");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .expect("sqlite wal");
    assert_eq!(mode, "wal");
    conn.execute_batch(SQL_SCHEMA).expect("sqlite schema");
}

/// One caller's connection: WAL (persisted in the file), synchronous=FULL, a busy timeout,
/// and a page cache as large as redb's default (1 GiB), so lookups are not I/O-starved.
fn sqlite_conn(path: &Path) -> Connection {
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
fn sqlite_claim(conn: &mut Connection, key: &str) {
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
fn sqlite_lookup(conn: &Connection, key: &str) {
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
fn prefill_sqlite(path: &Path, n: usize) -> Duration {
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

// ---- in memory and the disk ---------------------------------------------------------------

#[derive(Default)]
struct Memory {
    records: HashMap<Vec<u8>, Vec<u8>>,
    effects: HashMap<Vec<u8>, u64>,
}

/// The same CPU work as a claim (fingerprint, record encoding) under one mutex; no durability.
fn memory_claim(mem: &Mutex<Memory>, key: &str) {
    let record_key = record_key(key);
    let value = record_value(key, now_ms());
    let mut m = mem.lock().expect("memory lock");
    assert!(!m.records.contains_key(&record_key), "memory claim {key}");
    m.effects.insert(key.as_bytes().to_vec(), 1);
    m.records.insert(record_key, value);
}

const DISK_BLOCKS: u64 = 256;
const BLOCK: usize = 4096;

fn disk_file(path: &Path) -> File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("disk file");
    // Block by block: one large write would put the file in large page-cache folios, and the
    // kernel would then account (and may write back) a whole folio per 4 KiB overwrite.
    for b in 0..DISK_BLOCKS {
        file.write_all_at(&[0u8; BLOCK], b * BLOCK as u64)
            .expect("preallocate");
    }
    file.sync_all().expect("sync");
    file
}

// ---- the runner ---------------------------------------------------------------------------

/// One count-bounded run: `callers` threads, `per_caller` operations each.
struct Sample {
    ops: usize,
    elapsed: Duration,
    lat_ns: Vec<u64>,
    written: Option<u64>,
    /// idem only: the store's commit counters over the run (`Store::metrics` delta).
    commits: Option<Commits>,
}

/// A difference of two `Store::metrics` snapshots.
#[derive(Clone, Copy, Default)]
struct Commits {
    commits: u64,
    requests: u64,
    reruns: u64,
    busy: u64,
}

impl Commits {
    fn between(a: &Metrics, b: &Metrics) -> Self {
        Commits {
            commits: b.commits.saturating_sub(a.commits),
            requests: b.committed_requests.saturating_sub(a.committed_requests),
            reruns: b.reruns.saturating_sub(a.reruns),
            busy: b.busy.saturating_sub(a.busy),
        }
    }

    fn add(self, o: Commits) -> Self {
        Commits {
            commits: self.commits + o.commits,
            requests: self.requests + o.requests,
            reruns: self.reruns + o.reruns,
            busy: self.busy + o.busy,
        }
    }
}

/// Where "bytes written per op" comes from.
enum WriteCounter {
    /// The block device under the temp dir: sectors written × 512 (what reached the disk,
    /// including the filesystem's journal; device-wide, so other processes' writes count too).
    Device {
        name: String,
        stat: PathBuf,
    },
    /// `/proc/self/io` `write_bytes`: bytes this process dirtied in the page cache. Counted per
    /// page-cache folio, so with large folios a 4 KiB overwrite may count as far more.
    Process,
    Unavailable,
}

impl WriteCounter {
    fn detect(dir: &Path) -> Self {
        if let Some((dev, _, _)) = filesystem_of(dir) {
            let dev = Path::new(&dev)
                .canonicalize()
                .unwrap_or_else(|_| PathBuf::from(&dev));
            if let Some(name) = dev.file_name().and_then(|n| n.to_str()) {
                let stat = PathBuf::from(format!("/sys/class/block/{name}/stat"));
                let counter = WriteCounter::Device {
                    name: name.to_owned(),
                    stat,
                };
                if counter.read().is_some() {
                    return counter;
                }
            }
        }
        if (WriteCounter::Process).read().is_some() {
            WriteCounter::Process
        } else {
            WriteCounter::Unavailable
        }
    }

    fn read(&self) -> Option<u64> {
        match self {
            WriteCounter::Device { stat, .. } => {
                let text = std::fs::read_to_string(stat).ok()?;
                let sectors: u64 = text.split_whitespace().nth(6)?.parse().ok()?;
                Some(sectors * 512)
            }
            WriteCounter::Process => {
                let io = std::fs::read_to_string("/proc/self/io").ok()?;
                io.lines()
                    .find_map(|l| l.strip_prefix("write_bytes:"))
                    .and_then(|v| v.trim().parse().ok())
            }
            WriteCounter::Unavailable => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            WriteCounter::Device { name, stat } => format!(
                "device {name} ({} sectors written × 512) ÷ ops: what reached the disk, journal included; device-wide, so writes by other processes during a run count too",
                stat.display()
            ),
            WriteCounter::Process => "/proc/self/io write_bytes ÷ ops (page-cache accounting; may overstate with large folios)".into(),
            WriteCounter::Unavailable => "unavailable (no block-device stat, no /proc/self/io)".into(),
        }
    }
}

/// Runs `callers` threads; each builds its worker with `make(caller)` (untimed), then all start
/// together and call it `per_caller` times. Workers are dropped only after the I/O counter was
/// read, so closing connections is not counted.
fn run_callers<M, W>(counter: &WriteCounter, callers: usize, per_caller: usize, make: M) -> Sample
where
    M: Fn(usize) -> W + Sync,
    W: FnMut(usize) + Send,
{
    let ready = Barrier::new(callers + 1);
    let go = Barrier::new(callers + 1);
    thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|caller| {
                let (make, ready, go) = (&make, &ready, &go);
                s.spawn(move || {
                    let mut work = make(caller);
                    let mut lat = Vec::with_capacity(per_caller);
                    ready.wait();
                    go.wait();
                    // Each caller reads its own start: the main thread may not be scheduled
                    // again until the callers are done (2 cores, CPU-bound callers).
                    let started = Instant::now();
                    for i in 0..per_caller {
                        let t = Instant::now();
                        work(i);
                        lat.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                    }
                    (lat, started, Instant::now(), work)
                })
            })
            .collect();
        ready.wait();
        let io_before = counter.read();
        go.wait();
        let mut start: Option<Instant> = None;
        let mut end: Option<Instant> = None;
        let mut lat_ns = Vec::with_capacity(callers * per_caller);
        let mut workers = Vec::with_capacity(callers);
        for h in handles {
            let (lat, started, done, work) =
                h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            start = Some(start.map_or(started, |s| s.min(started)));
            end = Some(end.map_or(done, |e| e.max(done)));
            lat_ns.extend(lat);
            workers.push(work);
        }
        let io_after = counter.read();
        drop(workers);
        Sample {
            ops: callers * per_caller,
            elapsed: end
                .zip(start)
                .map_or(Duration::ZERO, |(e, s)| e.saturating_duration_since(s))
                .max(Duration::from_nanos(1)),
            lat_ns,
            written: io_before.zip(io_after).map(|(a, b)| b.saturating_sub(a)),
            commits: None,
        }
    })
}

/// splitmix64: a deterministic key picker per (run, caller).
struct Rng(u64);

impl Rng {
    fn new(tag: usize, caller: usize) -> Self {
        Rng(((tag as u64) << 32) ^ (caller as u64) ^ 0x9e37_79b9_7f4a_7c15)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z % n as u64) as usize
    }
}

// ---- workloads ----------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum System {
    Idem,
    IdemSend,
    Naive,
    NaiveIndexed,
    NaiveColocated,
    NaiveDeferred,
    NaiveGroup,
    Sqlite,
    /// SQLite with its writers taking turns on an in-process mutex instead of busy-waiting.
    SqliteSerial,
    Memory,
    Disk,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Work {
    NewKeys,
    Replay,
    Mixed,
    FlowB,
    Fsync,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Fill {
    Empty,
    Prefilled,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Row {
    system: System,
    work: Work,
    fill: Fill,
    callers: usize,
}

impl Row {
    fn label(&self) -> &'static str {
        match (self.system, self.work) {
            (System::Idem, Work::NewKeys) => "idem new keys (flow A execute)",
            (System::IdemSend, _) => "idem new keys (execute_send)",
            (System::Idem, Work::Replay) => "idem replays (execute)",
            (System::Idem, Work::Mixed) => "idem mixed 90% replay / 10% new",
            (System::Idem, Work::FlowB) => "idem flow B begin + complete",
            (System::Naive, _) => "naive redb new keys (1 txn/claim)",
            (System::NaiveGroup, _) => "naive group-commit writer (1 thread)",
            (System::NaiveIndexed, _) => "naive redb + expiry-index entry",
            (System::NaiveColocated, _) => "naive redb + expiry entry in the records tree",
            (System::NaiveDeferred, _) => {
                "naive redb + expiry entries every 100 ms (not crash-safe)"
            }
            (System::Sqlite, Work::Replay) => "SQLite replays (prepared SELECT)",
            (System::Sqlite, _) => "SQLite new keys (article SQL)",
            (System::SqliteSerial, _) => "SQLite new keys, writers behind a Mutex",
            (System::Memory, _) => "Mutex<HashMap> new keys (no disk)",
            (System::Disk, _) => "disk: pwrite 4 KiB + fdatasync",
            _ => "?",
        }
    }
}

impl Row {
    /// The row's stable name in the CSV file (`scripts/claims-chart` reads it).
    fn id(&self) -> &'static str {
        match (self.system, self.work) {
            (System::Idem, Work::NewKeys) => "idem_execute",
            (System::IdemSend, _) => "idem_execute_send",
            (System::Idem, Work::Replay) => "idem_replays",
            (System::Idem, Work::Mixed) => "idem_mixed",
            (System::Idem, Work::FlowB) => "idem_flow_b",
            (System::Naive, _) => "naive_redb",
            (System::NaiveGroup, _) => "naive_group_commit_writer",
            (System::NaiveIndexed, _) => "naive_redb_expiry_index",
            (System::NaiveColocated, _) => "naive_redb_expiry_in_records_tree",
            (System::NaiveDeferred, _) => "naive_redb_deferred_expiry",
            (System::Sqlite, Work::Replay) => "sqlite_replays",
            (System::Sqlite, _) => "sqlite",
            (System::SqliteSerial, _) => "sqlite_mutex",
            (System::Memory, _) => "mutex_hashmap",
            (System::Disk, _) => "disk_fsync",
            _ => "?",
        }
    }
}

enum Kind {
    Idem(Store),
    IdemSend(Store),
    Naive(Box<redb::Database>),
    NaiveIndexed(Box<redb::Database>),
    NaiveColocated(Box<redb::Database>),
    NaiveDeferred(Box<redb::Database>, Mutex<Deferred>),
    NaiveGroup(GroupWriter),
    Sqlite(PathBuf),
    SqliteSerial(PathBuf, Mutex<()>),
    Memory(Mutex<Memory>),
    Disk(File),
}

/// What one run works on. Fields drop in order: the store closes before its directory goes.
struct Target {
    kind: Kind,
    _dir: Option<tempfile::TempDir>,
}

struct Settings {
    quick: bool,
    prefill: usize,
    runs: usize,
    run_secs: f64,
    probe_secs: f64,
    parent: PathBuf,
    /// `IDEM_BENCH_FILTER`: comma-separated, case-insensitive pieces of workload names; only
    /// matching rows run (the disk's rate always does).
    filter: Vec<String>,
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn settings() -> Settings {
    let quick = std::env::var("IDEM_BENCH_QUICK")
        .map(|v| !v.is_empty() && v != "0")
        .unwrap_or(false);
    let prefill =
        env_parse("IDEM_BENCH_PREFILL").unwrap_or(if quick { 100_000 } else { 1_000_000 });
    Settings {
        quick,
        prefill: prefill.max(SMALL),
        runs: env_parse("IDEM_BENCH_RUNS")
            .unwrap_or(if quick { 3 } else { 5 })
            .max(1),
        run_secs: env_parse("IDEM_BENCH_RUN_SECS").unwrap_or(if quick { 0.3 } else { 1.5 }),
        probe_secs: if quick { 0.05 } else { 0.2 },
        parent: std::env::var_os("IDEM_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir),
        filter: std::env::var("IDEM_BENCH_FILTER")
            .unwrap_or_default()
            .split(',')
            .map(|f| f.trim().to_lowercase())
            .filter(|f| !f.is_empty())
            .collect(),
    }
}

struct Masters {
    idem_small: PathBuf,
    idem_large: PathBuf,
    sqlite_small: PathBuf,
    sqlite_large: PathBuf,
    /// Shared read-only copies for the replay workloads (replays write no keys).
    idem_small_replay: PathBuf,
    idem_large_replay: PathBuf,
    /// The pre-filled store with its expiry index inside the records tree (`colocate_copy`).
    colocated_large: PathBuf,
    sqlite_small_replay: PathBuf,
    sqlite_large_replay: PathBuf,
}

struct RowResult {
    per_caller: usize,
    rates: Vec<f64>,
    lat_ns: Vec<u64>,
    written: Option<u64>,
    ops: usize,
    commits: Option<Commits>,
}

struct Bench {
    cfg: Settings,
    counter: WriteCounter,
    root: tempfile::TempDir,
    masters: Masters,
    results: HashMap<Row, RowResult>,
    order: Vec<Row>,
    counts: HashMap<(System, Work, usize), usize>,
    total_rows: usize,
    /// The run's header lines, which head the CSV file as `# ` comments.
    csv_header: Vec<String>,
}

fn sync_file(path: &Path) {
    File::open(path)
        .and_then(|f| f.sync_all())
        .unwrap_or_else(|e| panic!("sync {}: {e}", path.display()));
}

/// Copies a closed store file and syncs the copy, so the run's first fsync does not pay for
/// flushing the copy's dirty pages.
fn copy_synced(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    sync_file(to);
}

impl Bench {
    fn existing(&self, fill: Fill) -> usize {
        match fill {
            Fill::Empty => SMALL,
            Fill::Prefilled => self.cfg.prefill,
        }
    }

    fn new_dir(&self) -> tempfile::TempDir {
        tempfile::TempDir::new_in(self.root.path()).expect("run dir")
    }

    /// Sets up one run's target (untimed).
    fn prepare(&self, row: Row) -> Target {
        let m = &self.masters;
        let dir = self.new_dir();
        let (kind, keep) = match row.system {
            System::Disk => (Kind::Disk(disk_file(&dir.path().join("disk.bin"))), true),
            System::Memory => (Kind::Memory(Mutex::default()), false),
            System::IdemSend => {
                let p = dir.path().join("idem.redb");
                if row.fill == Fill::Prefilled {
                    copy_synced(&m.idem_large, &p);
                }
                (Kind::IdemSend(open_idem(&p)), true)
            }
            System::Idem => {
                let path = match (row.work, row.fill) {
                    (Work::Replay, Fill::Empty) => m.idem_small_replay.clone(),
                    (Work::Replay, Fill::Prefilled) => m.idem_large_replay.clone(),
                    (_, fill) => {
                        let p = dir.path().join("idem.redb");
                        match (row.work, fill) {
                            (Work::Mixed, Fill::Empty) => copy_synced(&m.idem_small, &p),
                            (_, Fill::Prefilled) => copy_synced(&m.idem_large, &p),
                            _ => {}
                        }
                        p
                    }
                };
                (Kind::Idem(open_idem(&path)), true)
            }
            System::Naive => {
                let p = dir.path().join("naive.redb");
                let db = match row.fill {
                    Fill::Empty => naive_create(&p),
                    Fill::Prefilled => {
                        copy_synced(&m.idem_large, &p);
                        redb::Database::create(&p).expect("open naive copy")
                    }
                };
                (Kind::Naive(Box::new(db)), true)
            }
            System::NaiveIndexed => {
                let p = dir.path().join("indexed.redb");
                let db = match row.fill {
                    Fill::Empty => naive_create(&p),
                    Fill::Prefilled => {
                        copy_synced(&m.idem_large, &p);
                        redb::Database::create(&p).expect("open indexed copy")
                    }
                };
                (Kind::NaiveIndexed(Box::new(db)), true)
            }
            System::NaiveColocated => {
                let p = dir.path().join("colocated.redb");
                let db = match row.fill {
                    Fill::Empty => naive_create(&p),
                    Fill::Prefilled => {
                        copy_synced(&m.colocated_large, &p);
                        redb::Database::create(&p).expect("open colocated copy")
                    }
                };
                (Kind::NaiveColocated(Box::new(db)), true)
            }
            System::NaiveDeferred => {
                let p = dir.path().join("deferred.redb");
                let db = match row.fill {
                    Fill::Empty => naive_create(&p),
                    Fill::Prefilled => {
                        copy_synced(&m.idem_large, &p);
                        redb::Database::create(&p).expect("open deferred copy")
                    }
                };
                let deferred = Mutex::new(Deferred {
                    entries: Vec::new(),
                    flushed: Instant::now(),
                });
                (Kind::NaiveDeferred(Box::new(db), deferred), true)
            }
            System::NaiveGroup => {
                let p = dir.path().join("group.redb");
                let db = match row.fill {
                    Fill::Empty => naive_create(&p),
                    Fill::Prefilled => {
                        copy_synced(&m.idem_large, &p);
                        redb::Database::create(&p).expect("open group copy")
                    }
                };
                (Kind::NaiveGroup(GroupWriter::start(db)), true)
            }
            System::Sqlite | System::SqliteSerial => {
                let path = match (row.work, row.fill) {
                    (Work::Replay, Fill::Empty) => m.sqlite_small_replay.clone(),
                    (Work::Replay, Fill::Prefilled) => m.sqlite_large_replay.clone(),
                    (_, Fill::Empty) => {
                        let p = dir.path().join("sqlite.db");
                        sqlite_create(&p);
                        sync_file(&p);
                        p
                    }
                    (_, Fill::Prefilled) => {
                        let p = dir.path().join("sqlite.db");
                        copy_synced(&m.sqlite_large, &p);
                        p
                    }
                };
                if row.system == System::SqliteSerial {
                    (Kind::SqliteSerial(path, Mutex::new(())), true)
                } else {
                    (Kind::Sqlite(path), true)
                }
            }
        };
        Target {
            kind,
            _dir: keep.then_some(dir),
        }
    }

    /// One timed run of `row` on `target`; `tag` makes its new keys unique.
    fn measure(&self, row: Row, target: &Target, tag: usize, per: usize) -> Sample {
        let before = match &target.kind {
            Kind::Idem(store) | Kind::IdemSend(store) => Some(store.metrics()),
            _ => None,
        };
        let mut sample = self.measure_calls(row, target, tag, per);
        if let (Kind::Idem(store) | Kind::IdemSend(store), Some(before)) = (&target.kind, before) {
            sample.commits = Some(Commits::between(&before, &store.metrics()));
        }
        sample
    }

    fn measure_calls(&self, row: Row, target: &Target, tag: usize, per: usize) -> Sample {
        let c = row.callers;
        let n = self.existing(row.fill);
        match (&target.kind, row.work) {
            (Kind::Idem(store), Work::NewKeys) => run_callers(&self.counter, c, per, |caller| {
                move |i| idem_claim(store, &new_key(tag, caller, i))
            }),
            (Kind::IdemSend(store), Work::NewKeys) => {
                run_callers(&self.counter, c, per, |caller| {
                    move |i| idem_claim_send(store, &new_key(tag, caller, i))
                })
            }
            (Kind::Idem(store), Work::Replay) => run_callers(&self.counter, c, per, |caller| {
                let mut rng = Rng::new(tag, caller);
                move |_| idem_replay(store, &existing_key(rng.below(n)))
            }),
            (Kind::Idem(store), Work::Mixed) => run_callers(&self.counter, c, per, |caller| {
                let mut rng = Rng::new(tag, caller);
                move |i| {
                    if i % 10 == 9 {
                        idem_claim(store, &new_key(tag, caller, i));
                    } else {
                        idem_replay(store, &existing_key(rng.below(n)));
                    }
                }
            }),
            (Kind::Idem(store), Work::FlowB) => run_callers(&self.counter, c, per, |caller| {
                move |i| idem_lease(store, &new_key(tag, caller, i))
            }),
            (Kind::Naive(db), Work::NewKeys) => run_callers(&self.counter, c, per, |caller| {
                let db: &redb::Database = db;
                move |i| naive_claim(db, &new_key(tag, caller, i))
            }),
            (Kind::NaiveIndexed(db), Work::NewKeys) => {
                run_callers(&self.counter, c, per, |caller| {
                    let db: &redb::Database = db;
                    move |i| naive_indexed_claim(db, &new_key(tag, caller, i))
                })
            }
            (Kind::NaiveColocated(db), Work::NewKeys) => {
                run_callers(&self.counter, c, per, |caller| {
                    let db: &redb::Database = db;
                    move |i| naive_colocated_claim(db, &new_key(tag, caller, i))
                })
            }
            (Kind::NaiveDeferred(db, deferred), Work::NewKeys) => {
                run_callers(&self.counter, c, per, |caller| {
                    let db: &redb::Database = db;
                    move |i| naive_deferred_claim(db, deferred, &new_key(tag, caller, i))
                })
            }
            (Kind::NaiveGroup(writer), Work::NewKeys) => {
                run_callers(&self.counter, c, per, |caller| {
                    move |i| writer.claim(&new_key(tag, caller, i))
                })
            }
            (Kind::Sqlite(path), Work::NewKeys) => run_callers(&self.counter, c, per, |caller| {
                let mut conn = sqlite_conn(path);
                move |i| sqlite_claim(&mut conn, &new_key(tag, caller, i))
            }),
            (Kind::SqliteSerial(path, writer), Work::NewKeys) => {
                run_callers(&self.counter, c, per, |caller| {
                    let mut conn = sqlite_conn(path);
                    move |i| {
                        let _turn = writer.lock().expect("writer lock");
                        sqlite_claim(&mut conn, &new_key(tag, caller, i));
                    }
                })
            }
            (Kind::Sqlite(path), Work::Replay) => run_callers(&self.counter, c, per, |caller| {
                let conn = sqlite_conn(path);
                let mut rng = Rng::new(tag, caller);
                move |_| sqlite_lookup(&conn, &existing_key(rng.below(n)))
            }),
            (Kind::Memory(mem), Work::NewKeys) => run_callers(&self.counter, c, per, |caller| {
                move |i| memory_claim(mem, &new_key(tag, caller, i))
            }),
            (Kind::Disk(file), Work::Fsync) => run_callers(&self.counter, c, per, |_| {
                let block = [0x5au8; BLOCK];
                move |i| {
                    let offset = (i as u64 % DISK_BLOCKS) * BLOCK as u64;
                    file.write_all_at(&block, offset).expect("pwrite");
                    file.sync_data().expect("fdatasync");
                }
            }),
            _ => unreachable!("no workload {row:?}"),
        }
    }

    /// Operations per caller so a run takes about `run_secs`: probe runs on fresh targets,
    /// growing until one lasts `probe_secs`. Pre-filled rows reuse the empty-store count.
    fn per_caller(&mut self, row: Row) -> usize {
        let id = (row.system, row.work, row.callers);
        if let Some(&n) = self.counts.get(&id) {
            return n;
        }
        let mut per = (64 / row.callers).max(1);
        let mut probe = 0;
        let n = loop {
            let tag = 900 + probe;
            let target = self.prepare(row);
            let s = self.measure(row, &target, tag, per);
            drop(target);
            let secs = s.elapsed.as_secs_f64().max(1e-6);
            if secs >= self.cfg.probe_secs || probe >= 12 {
                let total = s.ops as f64 / secs * self.cfg.run_secs;
                let cap = 20_000_000 / row.callers;
                break ((total / row.callers as f64).ceil() as usize).clamp(1, cap);
            }
            per *= if secs < self.cfg.probe_secs / 16.0 {
                8
            } else {
                2
            };
            probe += 1;
        };
        self.counts.insert(id, n);
        n
    }

    /// Measures a group of rows, interleaving their runs (run 1 of each, then run 2 of each…)
    /// so slow drift of the machine hits every system alike.
    fn group(&mut self, rows: &[Row]) {
        let per: Vec<usize> = rows.iter().map(|&r| self.per_caller(r)).collect();
        for (&row, &per) in rows.iter().zip(&per) {
            self.results.insert(
                row,
                RowResult {
                    per_caller: per,
                    rates: Vec::new(),
                    lat_ns: Vec::new(),
                    written: Some(0),
                    ops: 0,
                    commits: None,
                },
            );
        }
        for run in 0..self.cfg.runs {
            for (&row, &per) in rows.iter().zip(&per) {
                let target = self.prepare(row);
                let s = self.measure(row, &target, run, per);
                drop(target);
                let r = self.results.get_mut(&row).expect("row");
                r.rates.push(s.ops as f64 / s.elapsed.as_secs_f64());
                r.lat_ns.extend(s.lat_ns);
                r.written = r.written.zip(s.written).map(|(a, b)| a + b);
                r.ops += s.ops;
                if let Some(c) = s.commits {
                    r.commits = Some(r.commits.unwrap_or_default().add(c));
                }
            }
        }
        for &row in rows {
            self.order.push(row);
            let r = &self.results[&row];
            eprintln!(
                "[{:>2}/{}] {:<40} {:>2} callers, {:<9} {:>10.0} ops/s ({} × {} ops)",
                self.order.len(),
                self.total_rows,
                row.label(),
                row.callers,
                fill_name(row.fill, self.cfg.prefill),
                median(&r.rates),
                self.cfg.runs,
                r.per_caller * row.callers
            );
        }
    }
}

fn fill_name(fill: Fill, prefill: usize) -> String {
    match fill {
        Fill::Empty => "empty".into(),
        Fill::Prefilled => format!("{}k", prefill / 1000),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn fmt_ns(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us < 1.0 {
        format!("{ns}ns")
    } else if us < 1000.0 {
        format!("{us:.0}µs")
    } else if us < 10_000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else if us < 1_000_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

fn fmt_bytes(b: f64) -> String {
    if b < 10_000.0 {
        format!("{b:.0}")
    } else {
        format!("{:.1}K", b / 1024.0)
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() => format!("{r:.2}×"),
        _ => "-".into(),
    }
}

fn with_commas(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

// ---- machine facts ------------------------------------------------------------------------

/// UTC date and time from the system clock (civil-from-days, no external `date`).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let (h, mi) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02} UTC")
}

/// The mount holding `path`: (device, filesystem type, mount point), from /proc/self/mounts.
fn filesystem_of(path: &Path) -> Option<(String, String, String)> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3).then(|| (f[0].to_owned(), f[2].to_owned(), f[1].to_owned()))
        })
        .filter(|(_, _, mnt)| path.starts_with(mnt))
        .max_by_key(|(_, _, mnt)| mnt.len())
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
}

fn mem_total_gib() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0 / 1024.0)
}

/// The 1, 5 and 15-minute load averages: a busy machine (another build, a test run) shows here.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn kernel() -> String {
    std::process::Command::new("uname")
        .arg("-r")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The redb version idem links, from the Cargo.lock this bench was built with.
fn locked_version(name: &str) -> String {
    let lock = include_str!("../../Cargo.lock");
    let needle = format!("name = \"{name}\"\nversion = \"");
    lock.find(&needle)
        .and_then(|i| lock[i + needle.len()..].split('"').next())
        .unwrap_or("?")
        .to_owned()
}

// ---- main ---------------------------------------------------------------------------------

static ROOT: OnceLock<PathBuf> = OnceLock::new();

fn main() {
    // Any panic (a failed claim, a worker thread) ends the bench at once, removing its files:
    // a stuck barrier must never leave the run hanging.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        if let Some(root) = ROOT.get() {
            let _ = std::fs::remove_dir_all(root);
        }
        std::process::exit(101);
    }));

    let wall = Instant::now();
    let cfg = settings();
    let root = tempfile::Builder::new()
        .prefix("idem-claim-bench-")
        .tempdir_in(&cfg.parent)
        .expect("bench temp dir");
    let _ = ROOT.set(root.path().to_owned());
    let counter = WriteCounter::detect(root.path());
    make_template(root.path());

    println!(
        "idem claim_throughput — {} mode{}",
        if cfg.quick { "quick" } else { "full" },
        if cfg.quick {
            " (IDEM_BENCH_QUICK=1)"
        } else {
            ""
        }
    );
    // The header lines that also head the CSV file (as `# ` comments), so a chart made from it
    // can say which run it shows.
    let mut csv_header = vec![format!(
        "idem claim_throughput — {} mode",
        if cfg.quick { "quick" } else { "full" }
    )];
    let mut head = |line: String| {
        println!("{line}");
        csv_header.push(line);
    };
    head(format!("date        {}", utc_now()));
    head(format!(
        "machine     nproc {}, {}, {:.1} GiB RAM",
        thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model().unwrap_or_else(|| "cpu unknown".into()),
        mem_total_gib().unwrap_or(f64::NAN)
    ));
    head(format!("kernel      {} (uname -r)", kernel()));
    println!(
        "load        {} (1/5/15-min load average at start)",
        loadavg()
    );
    match filesystem_of(root.path()) {
        Some((dev, fs, mnt)) => println!(
            "temp dir    {} — {fs} on {dev} (mounted at {mnt})",
            root.path().display()
        ),
        None => println!("temp dir    {} — filesystem unknown", root.path().display()),
    }
    head(format!(
        "versions    idem {}, redb {}, SQLite {} (rusqlite {}, bundled){}",
        env!("CARGO_PKG_VERSION"),
        locked_version("redb"),
        rusqlite::version(),
        locked_version("rusqlite"),
        if cfg!(debug_assertions) {
            " — DEBUG BUILD, numbers meaningless"
        } else {
            ""
        }
    ));
    println!(
        "page cache  {} MiB for every redb store, idem's included (redb's default; idem's own default is {} MiB: benches/scale.rs); SQLite 1 GiB",
        CACHE >> 20,
        idem::store::DEFAULT_CACHE_SIZE >> 20
    );
    let sample_key = new_key(0, 0, 0);
    println!(
        "record      key {} B, value {} B (a completed record in idem's encoding); caller write: effects[key] = 1",
        record_key(&sample_key).len(),
        record_value(&sample_key, now_ms()).len()
    );
    head(format!(
        "settings    {} runs per workload, ~{:.1} s per run (count-bounded); pre-filled store {} records; \
         'empty' replays and mixed read a {}-record store{}",
        cfg.runs,
        cfg.run_secs,
        with_commas(cfg.prefill as u64),
        with_commas(SMALL as u64),
        if cfg.filter.is_empty() {
            String::new()
        } else {
            format!("; IDEM_BENCH_FILTER={}", cfg.filter.join(","))
        }
    ));
    println!("written     {}", counter.describe());
    println!();

    // Masters: built once, copied for every run that writes.
    let dir = root.path();
    let masters = Masters {
        idem_small: dir.join("master-small.redb"),
        idem_large: dir.join("master-large.redb"),
        sqlite_small: dir.join("master-small.db"),
        sqlite_large: dir.join("master-large.db"),
        idem_small_replay: dir.join("replay-small.redb"),
        idem_large_replay: dir.join("replay-large.redb"),
        colocated_large: dir.join("colocated-large.redb"),
        sqlite_small_replay: dir.join("replay-small.db"),
        sqlite_large_replay: dir.join("replay-large.db"),
    };
    eprintln!("pre-filling the stores ...");
    let t_small = prefill_idem(&masters.idem_small, SMALL);
    let t_idem = prefill_idem(&masters.idem_large, cfg.prefill);
    prefill_sqlite(&masters.sqlite_small, SMALL);
    let t_sqlite = prefill_sqlite(&masters.sqlite_large, cfg.prefill);
    for (from, to) in [
        (&masters.idem_small, &masters.idem_small_replay),
        (&masters.idem_large, &masters.idem_large_replay),
        (&masters.sqlite_small, &masters.sqlite_small_replay),
        (&masters.sqlite_large, &masters.sqlite_large_replay),
    ] {
        copy_synced(from, to);
    }
    colocate_copy(&masters.idem_large, &masters.colocated_large);
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (idem_size, sqlite_size) = (size(&masters.idem_large), size(&masters.sqlite_large));
    println!(
        "prefill     idem: {} records via Store::execute on {PREFILL_THREADS} threads (group commit, fsync per commit) in {:.1} s ({:.0}/s; the {}-record store: {:.1} s)",
        with_commas(cfg.prefill as u64),
        t_idem.as_secs_f64(),
        cfg.prefill as f64 / t_idem.as_secs_f64(),
        with_commas(SMALL as u64),
        t_small.as_secs_f64()
    );
    println!(
        "            SQLite: the same records in one transaction in {:.1} s",
        t_sqlite.as_secs_f64()
    );
    println!(
        "on disk     pre-filled, {} records + their caller rows: redb file {:.1} MiB = {:.0} B/record; \
         SQLite file {:.1} MiB = {:.0} B/record (WAL checkpointed)",
        with_commas(cfg.prefill as u64),
        idem_size as f64 / 1048576.0,
        idem_size as f64 / cfg.prefill as f64,
        sqlite_size as f64 / 1048576.0,
        sqlite_size as f64 / cfg.prefill as f64
    );
    println!();

    // The rows, in groups whose runs interleave.
    let row = |system, work, fill, callers| Row {
        system,
        work,
        fill,
        callers,
    };
    let mut groups: Vec<Vec<Row>> = Vec::new();
    // The in-memory rows run last, in groups of their own: interleaved with the durable rows,
    // the aftermath of their hundreds of MB of small allocations made the naive redb and idem
    // runs that followed them several times slower at 8 and 64 callers.
    let mut memory_groups: Vec<Vec<Row>> = Vec::new();
    for fill in [Fill::Empty, Fill::Prefilled] {
        for c in NEW_KEY_CALLERS {
            let mut g = vec![
                row(System::Idem, Work::NewKeys, fill, c),
                row(System::Naive, Work::NewKeys, fill, c),
                row(System::Sqlite, Work::NewKeys, fill, c),
            ];
            if c <= 2 {
                g.push(row(System::NaiveIndexed, Work::NewKeys, fill, c));
                g.push(row(System::NaiveColocated, Work::NewKeys, fill, c));
                g.push(row(System::NaiveDeferred, Work::NewKeys, fill, c));
            }
            if c > 1 {
                g.push(row(System::IdemSend, Work::NewKeys, fill, c));
                g.push(row(System::NaiveGroup, Work::NewKeys, fill, c));
                g.push(row(System::SqliteSerial, Work::NewKeys, fill, c));
            }
            if fill == Fill::Empty {
                memory_groups.push(vec![row(System::Memory, Work::NewKeys, fill, c)]);
            }
            groups.push(g);
        }
        let mut g: Vec<Row> = REPLAY_THREADS
            .iter()
            .map(|&t| row(System::Idem, Work::Replay, fill, t))
            .collect();
        g.push(row(System::Sqlite, Work::Replay, fill, 1));
        groups.push(g);
        groups.push(vec![row(System::Idem, Work::Mixed, fill, 8)]);
        groups.push(vec![row(System::Idem, Work::FlowB, fill, 8)]);
    }
    let wanted = |r: &Row| {
        let label = r.label().to_lowercase();
        cfg.filter.is_empty() || cfg.filter.iter().any(|f| label.contains(f.as_str()))
    };
    // The summary shows each in-memory row next to the durable rows with its caller count.
    let display: Vec<Row> = groups
        .iter()
        .flat_map(|g| {
            let memory = memory_groups.iter().flatten().find(|m| {
                g.first().is_some_and(|r| {
                    r.work == Work::NewKeys && r.fill == m.fill && r.callers == m.callers
                })
            });
            g.iter().chain(memory).copied().collect::<Vec<_>>()
        })
        .collect();
    let mut groups: Vec<Vec<Row>> = groups
        .into_iter()
        .chain(memory_groups)
        .map(|g| g.into_iter().filter(wanted).collect::<Vec<_>>())
        .filter(|g| !g.is_empty())
        .collect();
    // The disk's rate comes first: every ×fsync ratio divides by it.
    let disk = row(System::Disk, Work::Fsync, Fill::Empty, 1);
    groups.insert(0, vec![disk]);
    let display: Vec<Row> = std::iter::once(disk).chain(display).collect();

    let mut bench = Bench {
        total_rows: groups.iter().map(Vec::len).sum(),
        cfg,
        counter,
        root,
        masters,
        results: HashMap::new(),
        order: Vec::new(),
        counts: HashMap::new(),
        csv_header,
    };
    for g in &groups {
        bench.group(g);
    }
    report(&bench, &display);
    println!();
    println!(
        "wall time {:.0} s (pre-fill, calibration and setup included); load average at the end: {}",
        wall.elapsed().as_secs_f64(),
        loadavg()
    );
    let _ = bench.root.close();
}

/// Where the CSV copy of the summary goes: `IDEM_BENCH_CSV`, or
/// `<target dir>/bench-results/claim_throughput.csv` (the bench binary is
/// `<target dir>/<profile>/deps/claim_throughput-<hash>`).
fn csv_path() -> PathBuf {
    if let Some(path) = std::env::var_os("IDEM_BENCH_CSV") {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")))
        .join("bench-results")
        .join("claim_throughput.csv")
}

/// Prints the summary, rows in `display` order (those that ran), then the targets; writes the
/// summary's rows as CSV too (`csv_path`).
fn report(b: &Bench, display: &[Row]) {
    let disk = median(
        &b.results[&Row {
            system: System::Disk,
            work: Work::Fsync,
            fill: Fill::Empty,
            callers: 1,
        }]
            .rates,
    );
    let rate = |r: &Row| b.results.get(r).map(|x| median(&x.rates));
    let lat = |r: &Row, p: f64| {
        b.results.get(r).map(|x| {
            let mut v = x.lat_ns.clone();
            v.sort_unstable();
            percentile(&v, p)
        })
    };
    let runs = b.cfg.runs;
    println!(
        "SUMMARY — ops/s: median of {runs} runs (min – max); p50/p99/max: latency per call over all runs' calls; \
         written: bytes per op (see 'written' above); batch: idem requests per commit (Store::metrics)"
    );
    println!(
        "ratios: idem ÷ the baseline measured in this run with the same store and callers (replays: ÷ SQLite's 1-thread lookups); \
         ×SQLite-mx: ÷ SQLite with writers behind a Mutex; ×fsync: ÷ the disk's pwrite + fdatasync rate"
    );
    let header = format!(
        "{:<10} {:<40} {:>7} {:>9} {:>21} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8}",
        "store",
        "workload",
        "callers",
        "ops/s",
        "(min – max)",
        "p50",
        "p99",
        "max",
        "written",
        "batch",
        "×naive",
        "×group",
        "×SQLite",
        "×SQLite-mx",
        "×fsync"
    );
    println!("{header}");
    println!("{}", "-".repeat(header.chars().count()));
    // The same rows, machine-readable: `scripts/claims-chart` draws claims/s against callers
    // from it. Latencies in µs, written in bytes per call; an empty field was not measured.
    let mut csv: String = b.csv_header.iter().map(|l| format!("# {l}\n")).collect();
    csv.push_str(
        "store,system,workload,callers,ops_per_s,ops_min,ops_max,p50_us,p99_us,max_us,written_bytes_per_op,batch\n",
    );
    let mut last_fill = None;
    let mut reruns = 0;
    let mut busy = 0;
    for r in display.iter().filter(|r| b.results.contains_key(r)) {
        let res = &b.results[r];
        if r.system != System::Disk && last_fill.is_some() && last_fill != Some(r.fill) {
            println!();
        }
        if r.system != System::Disk {
            last_fill = Some(r.fill);
        }
        let mut sorted = res.rates.clone();
        sorted.sort_by(f64::total_cmp);
        let med = median(&res.rates);
        let mut lat_sorted = res.lat_ns.clone();
        lat_sorted.sort_unstable();
        let written = res
            .written
            .map(|w| fmt_bytes(w as f64 / res.ops as f64))
            .unwrap_or_else(|| "n/a".into());
        let batch = match res.commits {
            Some(c) if c.commits > 0 => format!("{:.1}", c.requests as f64 / c.commits as f64),
            Some(_) => "-".into(),
            None => "".into(),
        };
        if let Some(c) = res.commits {
            reruns += c.reruns;
            busy += c.busy;
        }
        let same = |system| Row {
            system,
            work: Work::NewKeys,
            ..*r
        };
        let (vs_naive, vs_group, vs_sqlite, vs_serial) = match (r.system, r.work) {
            (System::Idem | System::IdemSend, Work::NewKeys) => (
                rate(&same(System::Naive)).map(|x| med / x),
                rate(&same(System::NaiveGroup)).map(|x| med / x),
                rate(&same(System::Sqlite)).map(|x| med / x),
                rate(&same(System::SqliteSerial)).map(|x| med / x),
            ),
            (System::Idem, Work::Replay) => (
                None,
                None,
                rate(&Row {
                    system: System::Sqlite,
                    callers: 1,
                    ..*r
                })
                .map(|x| med / x),
                None,
            ),
            _ => (None, None, None, None),
        };
        let store = match r.system {
            System::Disk => "-".to_owned(),
            System::Memory => "in memory".to_owned(),
            _ => fill_name(r.fill, b.cfg.prefill),
        };
        let us = |ns: u64| ns as f64 / 1000.0;
        csv.push_str(&format!(
            "{store},{},\"{}\",{},{med:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{}\n",
            r.id(),
            r.label(),
            r.callers,
            sorted[0],
            sorted[sorted.len() - 1],
            us(percentile(&lat_sorted, 0.50)),
            us(percentile(&lat_sorted, 0.99)),
            us(lat_sorted.last().copied().unwrap_or(0)),
            res.written
                .map(|w| format!("{:.0}", w as f64 / res.ops as f64))
                .unwrap_or_default(),
            match res.commits {
                Some(c) if c.commits > 0 => format!("{:.1}", c.requests as f64 / c.commits as f64),
                _ => String::new(),
            },
        ));
        println!(
            "{:<10} {:<40} {:>7} {:>9.0} {:>21} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8}",
            store,
            r.label(),
            r.callers,
            med,
            format!("({:.0} – {:.0})", sorted[0], sorted[sorted.len() - 1]),
            fmt_ns(percentile(&lat_sorted, 0.50)),
            fmt_ns(percentile(&lat_sorted, 0.99)),
            fmt_ns(lat_sorted.last().copied().unwrap_or(0)),
            written,
            batch,
            fmt_ratio(vs_naive),
            fmt_ratio(vs_group),
            fmt_ratio(vs_sqlite),
            fmt_ratio(vs_serial),
            fmt_ratio(Some(med / disk)),
        );
    }
    println!();
    println!(
        "store 'empty': new keys start from a new file; replays and mixed read a {}-record store. \
         idem batch re-runs during the runs: {reruns}; Error::Busy: {busy}.",
        with_commas(SMALL as u64)
    );
    let path = csv_path();
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, &csv));
    match written {
        Ok(()) => println!(
            "csv         {} (the chart: scripts/claims-chart {})",
            path.display(),
            path.display()
        ),
        Err(e) => println!("csv         not written to {} ({e})", path.display()),
    }

    // The throughput and latency goals (benches/README.md, "Goals"), on the pre-filled store.
    let fill = Fill::Prefilled;
    let at = |system, work, callers| Row {
        system,
        work,
        fill,
        callers,
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let idem = |c| at(System::Idem, Work::NewKeys, c);
    let idem_send = |c| at(System::IdemSend, Work::NewKeys, c);
    let naive = |c| at(System::Naive, Work::NewKeys, c);
    let group = |c| at(System::NaiveGroup, Work::NewKeys, c);
    let p50_ratio = |c| {
        ratio(
            lat(&idem(c), 0.5).map(|v| v as f64),
            lat(&naive(c), 0.5).map(|v| v as f64),
        )
    };
    struct Check {
        name: &'static str,
        value: Option<f64>,
        at_least: bool,
        target: f64,
        unit: &'static str,
    }
    let check = |name, value, at_least, target, unit| Check {
        name,
        value,
        at_least,
        target,
        unit,
    };
    let lat_ratio =
        |a: Row, b: Row, p: f64| ratio(lat(&a, p).map(|v| v as f64), lat(&b, p).map(|v| v as f64));
    let checks = [
        check(
            "64 callers, new keys: idem ÷ naive group-commit writer",
            ratio(rate(&idem(64)), rate(&group(64))),
            true,
            1.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem execute_send ÷ group-commit writer",
            ratio(rate(&idem_send(64)), rate(&group(64))),
            true,
            1.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem p99 ÷ group-commit writer p99",
            lat_ratio(idem(64), group(64), 0.99),
            false,
            1.2,
            "×",
        ),
        check(
            "64 callers, new keys: idem execute_send p99 ÷ writer p99",
            lat_ratio(idem_send(64), group(64), 0.99),
            false,
            1.2,
            "×",
        ),
        check(
            "64 callers, new keys: idem ÷ naive redb",
            ratio(rate(&idem(64)), rate(&naive(64))),
            true,
            6.0,
            "×",
        ),
        check(
            "8 callers, new keys: idem ÷ naive redb",
            ratio(rate(&idem(8)), rate(&naive(8))),
            true,
            3.0,
            "×",
        ),
        check(
            "1 caller, new keys: idem ÷ naive redb (throughput)",
            ratio(rate(&idem(1)), rate(&naive(1))),
            true,
            0.95,
            "×",
        ),
        check(
            "2 callers, new keys: idem p99 ÷ naive redb p99",
            lat_ratio(idem(2), naive(2), 0.99),
            false,
            1.0,
            "×",
        ),
        check(
            "2 callers, new keys: idem max ÷ naive redb max",
            lat_ratio(idem(2), naive(2), 1.0),
            false,
            1.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem ÷ SQLite (busy timeout)",
            ratio(
                rate(&idem(64)),
                rate(&at(System::Sqlite, Work::NewKeys, 64)),
            ),
            true,
            4.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem ÷ SQLite (writers behind a Mutex)",
            ratio(
                rate(&idem(64)),
                rate(&at(System::SqliteSerial, Work::NewKeys, 64)),
            ),
            true,
            4.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem p99",
            lat(&idem(64), 0.99).map(|v| v as f64 / 1e6),
            false,
            10.0,
            " ms",
        ),
        check(
            "1 caller, new keys: idem p50 ÷ naive redb p50",
            p50_ratio(1),
            false,
            1.3,
            "×",
        ),
        check(
            "replays, 1 thread: idem ÷ SQLite prepared SELECT",
            ratio(
                rate(&at(System::Idem, Work::Replay, 1)),
                rate(&at(System::Sqlite, Work::Replay, 1)),
            ),
            true,
            1.3,
            "×",
        ),
    ];
    println!();
    println!(
        "TARGETS (from the issue), on the pre-filled {}-record store{}:",
        with_commas(b.cfg.prefill as u64),
        if b.cfg.prefill < 1_000_000 {
            " (the issue's store has 1,000,000 records: full mode judges)"
        } else {
            ""
        }
    );
    for c in checks {
        let (shown, verdict) = match c.value {
            Some(v) if v.is_finite() => (
                format!("{v:.2}{}", c.unit),
                if (c.at_least && v >= c.target) || (!c.at_least && v <= c.target) {
                    "met"
                } else {
                    "NOT met"
                },
            ),
            _ => ("?".into(), "not measured"),
        };
        let goal = format!(
            "{} {}{}",
            if c.at_least { "≥" } else { "≤" },
            c.target,
            c.unit
        );
        println!("  {:<62} {shown:>10}   target {goal:<8} {verdict}", c.name);
    }
}
