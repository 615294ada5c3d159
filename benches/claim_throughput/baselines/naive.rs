//! Naive redb: the obvious redb implementation of a claim (one `Durability::Immediate` write
//! transaction per claim, idem's tables, keys and value bytes), and the variants that add idem's
//! expiry-index entry to it: in its own table, in the records tree, or deferred.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bench_common::{copy_synced, sync_file};
use idem::redb::{self, ReadableTable, TableDefinition};

use crate::data::{DAY_MS, EFFECTS, RECORDS, now_ms, record_key, record_value};

/// One redb write transaction per claim, `Durability::Immediate`: look the record key up, then
/// write idem's record bytes and the caller write, then commit (one fsync).
pub fn naive_claim(db: &redb::Database, key: &str) {
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
pub fn naive_indexed_claim(db: &redb::Database, key: &str) {
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
pub struct Deferred {
    pub entries: Vec<Vec<u8>>,
    pub flushed: Instant,
}

/// Naive redb with the expiry-index entries held in memory and written by the first claim
/// after each [`DEFERRED_FLUSH`], all in that claim's transaction: the ceiling of a deferred
/// index (issue 14's single-caller goal: 1 caller ≥ 0.95× naive redb). It is not crash-safe as an index: a crash loses the entries of
/// up to the last 100 ms of commits, and their records would never be swept unless an open
/// after a crash scanned every record to find them.
pub fn naive_deferred_claim(db: &redb::Database, deferred: &Mutex<Deferred>, key: &str) {
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
pub fn naive_colocated_claim(db: &redb::Database, key: &str) {
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
pub fn colocate_copy(from: &Path, to: &Path) {
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

/// A new store with naive redb's tables.
pub fn naive_create(path: &Path) -> redb::Database {
    let db = redb::Database::create(path).expect("naive create");
    let txn = db.begin_write().expect("naive setup");
    txn.open_table(RECORDS).expect("naive records");
    txn.open_table(EFFECTS).expect("naive effects");
    txn.commit().expect("naive setup commit");
    db
}
