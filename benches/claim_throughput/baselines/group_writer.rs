//! The naive group-commit writer, the baseline of the 64-caller goal.

use std::thread;

use idem::redb::{self, ReadableTable};

use crate::data::{EFFECTS, RECORDS, now_ms, record_key, record_value};

/// The simplest group-commit writer: callers send their key down a channel and wait; one writer
/// thread drains whatever is queued into one redb write transaction (the same tables, keys and
/// value bytes as idem: look the record up, insert it and the caller's effect), commits it with
/// an fsync, then answers every caller of the batch. No closures, no isolation between batch
/// members, no re-runs: what idem pays for those is the difference.
pub struct GroupWriter {
    pub requests: Option<crossbeam_channel::Sender<(String, crossbeam_channel::Sender<()>)>>,
    pub writer: Option<thread::JoinHandle<()>>,
}

impl GroupWriter {
    pub fn start(db: redb::Database) -> Self {
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

    pub fn claim(&self, key: &str) {
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
