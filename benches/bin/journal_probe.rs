//! The journal of issue 36 (docs/design.md, "A journal in front of redb") reduced to its commit
//! path, to measure what the design can reach before it is built: claims decided against redb
//! and a pending set, appended to a preallocated journal with one `fdatasync` per group and
//! acknowledged, then applied to redb by a second thread with non-durable commits, made durable
//! by a checkpoint (a durable commit) every `IDEM_PROBE_CHECKPOINT` claims, off the claimers'
//! path. In the same run, the same writer committing each group to redb durably instead (the
//! design of today's group commit, without idem's other tables). No recovery: a probe, not an
//! engine.
//!
//! ```sh
//! cargo build --release -p idem-benches --bin journal_probe
//! target/release/journal_probe                       # 1,000,000 warm records, 1/8/64 callers
//! IDEM_PROBE_RECORDS=100000 target/release/journal_probe
//! IDEM_PROBE_WORKLOAD=execute IDEM_PROBE_CACHE_MB=64 target/release/journal_probe
//! ```
//!
//! `IDEM_PROBE_WORKLOAD=execute` makes each claim write what `Store::execute` writes (the
//! record, an expiry-index entry after every earlier one, one row of the caller's table under a
//! random key) instead of the record alone, in the pre-fill, the journal, the durable groups and
//! the applier; `IDEM_PROBE_CACHE_MB` sets redb's page cache (default redb's own, 1 GiB; idem's
//! default is 64 MiB).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bench_common::{bench_parent, env_parse, percentile};
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use idem::redb::{self, Database, ReadableDatabase, ReadableTable, TableDefinition};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("probe.records");
/// A claim's stored record: about what idem stores for a small answer.
const VALUE: [u8; 120] = [7; 120];
/// The expiry index (`IDEM_PROBE_WORKLOAD=execute`): idem's key is 52 bytes, ordered by time.
const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("probe.expiry");
/// The caller's table (`IDEM_PROBE_WORKLOAD=execute`): a random 16-character key.
const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("probe.effects");
/// The expiry entries' order: each new one sorts after every earlier one, as a new claim's does.
static EXPIRY_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether a claim writes `execute`'s three rows (else the record alone): read once, not on
/// the writer's path.
fn execute_workload() -> bool {
    static EXECUTE: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        std::env::var("IDEM_PROBE_WORKLOAD").is_ok_and(|w| w == "execute")
    });
    *EXECUTE
}

/// Writes claim `k`'s rows in `txn`: the record, and with `execute` its expiry entry and the
/// caller's row.
fn write_claims(txn: &redb::WriteTransaction, keys: &[[u8; 16]], execute: bool) {
    let mut t = txn.open_table(RECORDS).expect("table");
    for k in keys {
        t.insert(k.as_slice(), VALUE.as_slice()).expect("insert");
    }
    if execute {
        let mut expiry = txn.open_table(EXPIRY).expect("expiry");
        let mut effects = txn.open_table(EFFECTS).expect("effects");
        for k in keys {
            let seq = EXPIRY_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut e = [0u8; 52];
            e[..8].copy_from_slice(&seq.to_be_bytes());
            e[8..24].copy_from_slice(k);
            expiry.insert(e.as_slice(), 0).expect("expiry insert");
            let row = format!(
                "{:016x}",
                u64::from_le_bytes(k[..8].try_into().expect("8 bytes"))
            );
            effects.insert(row.as_bytes(), 1).expect("effects insert");
        }
    }
}
/// The most claims one journal write carries.
const MAX_GROUP: usize = 256;
/// The journal's preallocated size; it wraps after a checkpoint.
const JOURNAL_BYTES: u64 = 256 << 20;

/// A claim and where its answer goes (true: it ran; false: a replay).
type Claim = ([u8; 16], Sender<bool>);

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Journal,
    DurableGroups,
}

fn main() {
    let records: u64 = env_parse("IDEM_PROBE_RECORDS").unwrap_or(1_000_000);
    let seconds: f64 = env_parse("IDEM_PROBE_SECONDS").unwrap_or(3.0);
    let checkpoint: usize = env_parse("IDEM_PROBE_CHECKPOINT").unwrap_or(50_000);
    let cache_mb: Option<usize> = env_parse("IDEM_PROBE_CACHE_MB");
    let dir = tempfile::tempdir_in(bench_parent()).expect("a directory for the probe");
    println!(
        "journal probe: {records} warm records, {seconds} s per row, checkpoint every {checkpoint} claims, workload {}, page cache {}",
        if execute_workload() {
            "execute (record + expiry entry + caller row)"
        } else {
            "record only"
        },
        cache_mb.map_or("redb's default (1 GiB)".to_owned(), |m| format!("{m} MiB"))
    );
    println!(
        "| mode | callers | claims/s | applied/s in the window | p50 ms | p99 ms | max ms | not yet applied at the end |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for callers in [1usize, 8, 64] {
        for mode in [Mode::DurableGroups, Mode::Journal] {
            let path = dir.path().join("probe.redb");
            let _ = std::fs::remove_file(&path);
            let db = Arc::new(prefill(&path, records, cache_mb));
            let journal = preallocated(&dir.path().join("journal"));
            let (ops, mut lat, backlog) = run(mode, callers, seconds, checkpoint, db, journal);
            lat.sort_unstable();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "| {} | {callers} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {backlog} |",
                match mode {
                    Mode::Journal => "journal + non-durable apply",
                    Mode::DurableGroups => "durable redb commit per group",
                },
                ops as f64 / seconds,
                ops.saturating_sub(backlog as u64) as f64 / seconds,
                ms(percentile(&lat, 0.50)),
                ms(percentile(&lat, 0.99)),
                ms(lat.last().copied().unwrap_or_default()),
            );
        }
    }
}

/// A redb file holding `n` claims, made durable.
fn prefill(path: &Path, n: u64, cache_mb: Option<usize>) -> Database {
    let mut builder = Database::builder();
    if let Some(mb) = cache_mb {
        builder.set_cache_size(mb << 20);
    }
    let db = builder.create(path).expect("create");
    let execute = execute_workload();
    let mut done = 0;
    while done < n {
        let mut txn = db.begin_write().expect("write");
        txn.set_durability(redb::Durability::None)
            .expect("durability");
        let keys: Vec<[u8; 16]> = (done..(done + 50_000).min(n)).map(|i| key(i, 0)).collect();
        write_claims(&txn, &keys, execute);
        txn.commit().expect("commit");
        done = (done + 50_000).min(n);
    }
    let txn = db.begin_write().expect("write");
    txn.open_table(RECORDS).expect("table");
    txn.commit().expect("the durable commit");
    db
}

fn key(i: u64, salt: u64) -> [u8; 16] {
    let h = blake3::hash(&[i.to_le_bytes(), salt.to_le_bytes()].concat());
    let mut k = [0u8; 16];
    k.copy_from_slice(&h.as_bytes()[..16]);
    k
}

/// A journal file whose blocks exist, so a sync after a write flushes no allocation metadata.
fn preallocated(path: &Path) -> File {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .expect("journal");
    let zeros = vec![0u8; 1 << 20];
    for i in 0..(JOURNAL_BYTES >> 20) {
        f.write_all_at(&zeros, i << 20).expect("preallocate");
    }
    f.sync_all().expect("sync");
    f
}

/// Claims/s and every acknowledgement's latency for `callers` threads claiming fresh keys.
fn run(
    mode: Mode,
    callers: usize,
    seconds: f64,
    checkpoint: usize,
    db: Arc<Database>,
    journal: File,
) -> (u64, Vec<Duration>, usize) {
    let (tx, rx) = bounded::<Claim>(4096);
    let pending = Arc::new(Mutex::new(HashSet::new()));
    let (apply_tx, apply_rx) = unbounded::<Vec<[u8; 16]>>();
    let writer = {
        let (db, pending) = (db.clone(), pending.clone());
        thread::spawn(move || write_groups(mode, &rx, &db, &journal, &pending, &apply_tx))
    };
    let applier = {
        let (db, pending) = (db.clone(), pending.clone());
        thread::spawn(move || apply(&apply_rx, &db, &pending, checkpoint))
    };
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let clients: Vec<_> = (0..callers)
        .map(|c| {
            let tx = tx.clone();
            thread::spawn(move || {
                let (reply, answer) = bounded(1);
                let mut lat = Vec::new();
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let start = Instant::now();
                    tx.send((key(i, 1 + c as u64), reply.clone()))
                        .expect("send");
                    assert!(answer.recv().expect("answer"), "a fresh key ran");
                    lat.push(start.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    drop(tx);
    let mut lat = Vec::new();
    for c in clients {
        lat.extend(c.join().expect("client"));
    }
    // Acknowledged but not yet applied when the callers stopped: an applier that cannot keep
    // up shows here, not in claims/s.
    let backlog = pending.lock().expect("pending").len();
    writer.join().expect("writer");
    applier.join().expect("applier");
    (lat.len() as u64, lat, backlog)
}

/// The writer: a group of claims, decided, made durable (journal or redb), answered.
fn write_groups(
    mode: Mode,
    rx: &Receiver<Claim>,
    db: &Database,
    journal: &File,
    pending: &Mutex<HashSet<[u8; 16]>>,
    apply_tx: &Sender<Vec<[u8; 16]>>,
) {
    let mut offset = 0u64;
    let mut buf = Vec::with_capacity(MAX_GROUP * 160);
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(c) => group.push(c),
                Err(_) => break,
            }
        }
        // Decide: the pending set first, then a snapshot taken after it (a key applied and
        // removed from the set in between is in the snapshot).
        let mut ran = Vec::with_capacity(group.len());
        {
            let seen: Vec<bool> = {
                let p = pending.lock().expect("pending");
                group.iter().map(|(k, _)| p.contains(k)).collect()
            };
            let read = db.begin_read().expect("read");
            let table = read.open_table(RECORDS).expect("table");
            for ((k, _), seen) in group.iter().zip(seen) {
                ran.push(!seen && table.get(k.as_slice()).expect("get").is_none());
            }
        }
        let keys: Vec<[u8; 16]> = group
            .iter()
            .zip(&ran)
            .filter(|(_, r)| **r)
            .map(|((k, _), _)| *k)
            .collect();
        match mode {
            Mode::Journal => {
                pending
                    .lock()
                    .expect("pending")
                    .extend(keys.iter().copied());
                buf.clear();
                for k in &keys {
                    buf.extend_from_slice(&(k.len() as u32 + VALUE.len() as u32).to_le_bytes());
                    buf.extend_from_slice(k);
                    buf.extend_from_slice(&VALUE);
                    if execute_workload() {
                        // The expiry entry's and the caller row's redo records.
                        buf.extend_from_slice(&[0u8; 52 + 1 + 16 + 8 + 16]);
                    }
                    buf.extend_from_slice(&blake3::hash(k).as_bytes()[..8]);
                }
                let len = (buf.len() as u64).div_ceil(4096) * 4096;
                buf.resize(len as usize, 0);
                if offset + len > JOURNAL_BYTES {
                    offset = 0;
                }
                journal.write_all_at(&buf, offset).expect("append");
                journal.sync_data().expect("fdatasync");
                offset += len;
            }
            Mode::DurableGroups => {
                let txn = db.begin_write().expect("write");
                write_claims(&txn, &keys, execute_workload());
                txn.commit().expect("commit");
            }
        }
        for ((_, reply), r) in group.into_iter().zip(ran) {
            let _ = reply.send(r);
        }
        if mode == Mode::Journal {
            apply_tx.send(keys).expect("applier");
        }
    }
}

/// The applier: acknowledged groups into redb, non-durably; a durable commit every
/// `checkpoint` claims. Only it holds redb's writer in journal mode, so a checkpoint's sync
/// stalls it, never a claimer.
fn apply(
    rx: &Receiver<Vec<[u8; 16]>>,
    db: &Database,
    pending: &Mutex<HashSet<[u8; 16]>>,
    checkpoint: usize,
) {
    let mut since = 0usize;
    while let Ok(first) = rx.recv() {
        let mut keys = first;
        while let Ok(more) = rx.try_recv() {
            keys.extend(more);
        }
        since += keys.len();
        let mut txn = db.begin_write().expect("write");
        if since < checkpoint {
            txn.set_durability(redb::Durability::None)
                .expect("durability");
        } else {
            since = 0;
        }
        write_claims(&txn, &keys, execute_workload());
        txn.commit().expect("commit");
        let mut p = pending.lock().expect("pending");
        for k in &keys {
            p.remove(k);
        }
    }
}
