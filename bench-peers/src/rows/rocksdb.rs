//! The RocksDB rows, on Debian's librocksdb 7.8 (linked through `ROCKSDB_LIB_DIR`), default
//! options: a `TransactionDB` whose transactions lock the key (`get_for_update`) and commit with
//! `sync = true`, and a plain `DB` whose claims hold a striped mutex across `get` and a synced
//! `write`. RocksDB's write path groups concurrent writers: one WAL sync can cover several.

use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rocksdb::{
    DB, Options, TransactionDB, TransactionDBOptions, TransactionOptions, WriteBatch, WriteOptions,
};

use super::{PREFILL_BATCH, Row, RowSpec, value_for};
use crate::harness::Keys;

/// The plain row's lock stripes (key hash modulo this).
const STRIPES: usize = 64;

fn options() -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts
}

fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

/// Pre-fills `records` fresh random keys at `path` through a plain `DB` in batches of
/// `PREFILL_BATCH` (WAL written, not synced per batch), then syncs the WAL, flushes the memtable
/// to SST files and closes; both rows then open the same on-disk layout.
fn prefill(path: &Path, records: usize, seed: u64) -> Duration {
    let t = Instant::now();
    let db = DB::open(&options(), path).expect("open rocksdb for pre-fill");
    let mut keys = Keys::new(seed);
    let mut left = records;
    while left > 0 {
        let n = left.min(PREFILL_BATCH);
        let mut batch = WriteBatch::default();
        for _ in 0..n {
            let key = keys.next_key();
            batch.put(key, value_for(&key));
        }
        db.write(batch).expect("rocksdb pre-fill batch");
        left -= n;
    }
    db.flush_wal(true).expect("rocksdb pre-fill wal sync");
    db.flush().expect("rocksdb pre-fill flush");
    drop(db);
    t.elapsed()
}

/// The `TransactionDB` row.
pub struct TxnRow {
    db: TransactionDB,
    write: WriteOptions,
    txn: TransactionOptions,
}

impl Row for TxnRow {
    fn claim(&self, key: &[u8]) {
        let txn = self.db.transaction_opt(&self.write, &self.txn);
        let old = txn
            .get_for_update(key, true)
            .expect("rocksdb get_for_update");
        assert!(old.is_none(), "rocksdb txn: key present");
        txn.put(key, value_for(key)).expect("rocksdb txn put");
        txn.commit().expect("rocksdb txn commit");
    }
}

/// RocksDB `TransactionDB`: `transaction_opt` with `sync = true`, `get_for_update(key, true)`,
/// `put`, `commit`.
pub fn txn_spec() -> RowSpec {
    RowSpec {
        label: "rocksdb txn",
        what: "RocksDB TransactionDB (pessimistic): get_for_update(key, exclusive) + put + commit, WriteOptions::set_sync(true)",
        diagnostic: false,
        open: Box::new(|dir: &Path, records: usize| {
            let path = dir.join("rocksdb-txn");
            let took = prefill(&path, records, 0xA001);
            let db = TransactionDB::open(&options(), &TransactionDBOptions::default(), &path)
                .expect("open TransactionDB");
            let row = TxnRow {
                db,
                write: synced(),
                txn: TransactionOptions::default(),
            };
            (Box::new(row) as Box<dyn Row>, took)
        }),
    }
}

/// The plain `DB` row.
pub struct PlainRow {
    db: DB,
    write: WriteOptions,
    stripes: Vec<Mutex<()>>,
    hasher: RandomState,
}

impl Row for PlainRow {
    fn claim(&self, key: &[u8]) {
        let stripe = self.hasher.hash_one(key) as usize % STRIPES;
        let _guard = self.stripes[stripe].lock().expect("stripe lock");
        let old = self.db.get(key).expect("rocksdb get");
        assert!(old.is_none(), "rocksdb plain: key present");
        let mut batch = WriteBatch::default();
        batch.put(key, value_for(key));
        self.db
            .write_opt(batch, &self.write)
            .expect("rocksdb write");
    }
}

/// RocksDB `DB`: a striped mutex held across `get`, a one-put `WriteBatch` and a synced
/// `write_opt`.
pub fn plain_spec() -> RowSpec {
    RowSpec {
        label: "rocksdb plain",
        what: "RocksDB DB: striped mutex (64, by key hash) held across get + WriteBatch put + write_opt with set_sync(true)",
        diagnostic: false,
        open: Box::new(|dir: &Path, records: usize| {
            let path = dir.join("rocksdb-plain");
            let took = prefill(&path, records, 0xA002);
            let db = DB::open(&options(), &path).expect("open rocksdb");
            let row = PlainRow {
                db,
                write: synced(),
                stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
                hasher: RandomState::new(),
            };
            (Box::new(row) as Box<dyn Row>, took)
        }),
    }
}
