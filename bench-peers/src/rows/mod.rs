//! The rows: one store each, pre-filled, then claimed against. Every claim is a fresh key that
//! must be absent, is written, and is durable (synced) before `claim` returns.

pub mod fjall;
pub mod idem;
pub mod rocksdb;

use std::path::Path;
use std::time::Duration;

/// A store under test.
pub trait Row: Sync {
    /// Claims `key` (absent before): reads it, writes it, syncs, and returns once durable.
    /// Panics if the key was present or the store fails.
    fn claim(&self, key: &[u8]);
}

/// Pre-fills `records` records in a new store in the given directory and returns it open, with
/// the time the pre-fill took.
pub type Opener = Box<dyn Fn(&Path, usize) -> (Box<dyn Row>, Duration)>;

/// A row's recipe: its label in the tables and `--only`, and how to pre-fill and open its store.
pub struct RowSpec {
    /// The row's name (`--only` matches it).
    pub label: &'static str,
    /// What one claim does and how durable it is (printed above the table).
    pub what: &'static str,
    /// Pre-fills and opens the row's store.
    pub open: Opener,
    /// A diagnostic row, not a peer: it runs only when `--only` names it.
    pub diagnostic: bool,
}

/// Every row, in the order each rep runs them. The idem rows come from `idem::MODES`: one line
/// there adds an idem row with another builder setting.
pub fn all() -> Vec<RowSpec> {
    let mut rows: Vec<RowSpec> = idem::MODES
        .iter()
        .map(|m| idem::spec(m, false))
        .chain(idem::DIAGNOSTIC_MODES.iter().map(|m| idem::spec(m, true)))
        .collect();
    rows.push(rocksdb::txn_spec());
    rows.push(rocksdb::plain_spec());
    rows.push(fjall::spec());
    rows
}

/// The value the RocksDB and fjall rows store per key: 100 bytes, about an idem record's size,
/// pseudo-random (derived from the key), so block compression (RocksDB's default Snappy, fjall's
/// LZ4) cannot shrink it below what an idem record's hashes and timestamps would take.
pub fn value_for(key: &[u8]) -> Vec<u8> {
    // FNV-1a of the key seeds a xorshift64* stream.
    let mut x = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) | 1;
    let mut v = Vec::with_capacity(104);
    while v.len() < 100 {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(100);
    v
}

/// Records written per batch by the LSM rows' pre-fill.
pub const PREFILL_BATCH: usize = 10_000;
