//! fjall 3's row: a `SingleWriterTxDatabase` (one write transaction at a time), each claim a
//! write transaction that reads the key, inserts it and commits with `PersistMode::SyncData`
//! (the journal is fdatasync'ed inside the commit, under the writer lock: no group commit).

use std::path::Path;
use std::time::{Duration, Instant};

use fjall::{
    KeyspaceCreateOptions, PersistMode, Readable, SingleWriterTxDatabase, SingleWriterTxKeyspace,
};

use super::{PREFILL_BATCH, Row, RowSpec, value_for};
use crate::harness::Keys;

/// The open fjall database and its one keyspace.
pub struct FjallRow {
    db: SingleWriterTxDatabase,
    items: SingleWriterTxKeyspace,
}

impl Row for FjallRow {
    fn claim(&self, key: &[u8]) {
        let mut tx = self.db.write_tx().durability(Some(PersistMode::SyncData));
        let old = tx.get(&self.items, key).expect("fjall get");
        assert!(old.is_none(), "fjall: key present");
        tx.insert(&self.items, key, value_for(key));
        tx.commit().expect("fjall commit");
    }
}

/// fjall: single-writer transactional database, default options, `SyncData` per commit. The
/// pre-fill writes `PREFILL_BATCH` keys per transaction (buffered journal), then persists with
/// `SyncAll`.
pub fn spec() -> RowSpec {
    RowSpec {
        label: "fjall",
        what: "fjall 3 SingleWriterTxDatabase: write_tx get + insert + commit with durability Some(PersistMode::SyncData)",
        diagnostic: false,
        open: Box::new(|dir: &Path, records: usize| {
            let path = dir.join("fjall");
            let db = SingleWriterTxDatabase::builder(&path)
                .open()
                .expect("open fjall");
            let items = db
                .keyspace("items", KeyspaceCreateOptions::default)
                .expect("fjall keyspace");
            let t = Instant::now();
            let mut keys = Keys::new(0xF7A1);
            let mut left = records;
            while left > 0 {
                let n = left.min(PREFILL_BATCH);
                let mut tx = db.write_tx().durability(None);
                for _ in 0..n {
                    let key = keys.next_key();
                    tx.insert(&items, key, value_for(&key));
                }
                tx.commit().expect("fjall pre-fill commit");
                left -= n;
            }
            db.persist(PersistMode::SyncAll).expect("fjall persist");
            let took: Duration = t.elapsed();
            (Box::new(FjallRow { db, items }) as Box<dyn Row>, took)
        }),
    }
}
