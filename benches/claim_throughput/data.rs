//! What every system stores: the tables, the keys of each run, idem's record key and the record
//! value bytes the baselines write (idem's own encoding of a completed record).

use std::path::Path;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use bench_common::workload::{OPERATION, TENANT, payload};
use idem::format::{Record, State};
use idem::keys::Fingerprint;
use idem::redb::TableDefinition;
use idem::{Scope, Store, Timestamp};

use crate::idem_ops::idem_claim;

/// The caller's own table: one tiny write per claim, in the claim's transaction.
pub const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("effects");
/// idem's records table (docs/FORMAT.md); naive redb writes the same table, keys and values.
pub const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");
/// The retention the records carry: a day, in ms.
pub const DAY_MS: u64 = 24 * 3600 * 1000;
/// Records in the store that "empty"-store replays and the mixed workload read.
pub const SMALL: usize = 10_000;
/// Threads that pre-fill the stores through the public API.
pub const PREFILL_THREADS: usize = 64;

/// A key present in the pre-filled stores (the small store holds the first `SMALL`).
pub fn existing_key(i: usize) -> String {
    format!("pre-{i:09}")
}

/// A key no store holds before the run; `tag` is the run (or calibration probe) number.
pub fn new_key(tag: usize, caller: usize, i: usize) -> String {
    format!("new-{tag:03}-{caller:02}-{i:08}")
}

/// docs/FORMAT.md, "Record key": `0x01 ‖ u16be len ‖ tenant ‖ u16be len ‖ op ‖ u16be len ‖ key`.
pub fn record_key(key: &str) -> Vec<u8> {
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
pub static TEMPLATE: OnceLock<Record> = OnceLock::new();

/// Makes `TEMPLATE` from one claim on a scratch store in `dir`; before any `record_value`.
pub fn make_template(dir: &Path) {
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
pub fn record_value(key: &str, now_ms: u64) -> Vec<u8> {
    let mut record = TEMPLATE.get().expect("template made first").clone();
    let age = record.expires_at.0.saturating_sub(record.created_at.0);
    record.fingerprint = Fingerprint::of_bytes(&payload(key));
    record.created_at = Timestamp(now_ms);
    record.expires_at = Timestamp(now_ms + age);
    record.encode()
}

/// The wall clock in ms since the Unix epoch, the instants the baselines' records carry.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
