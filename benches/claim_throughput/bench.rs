//! The runner: for each row a fresh target (a new or copied store, a connection path, a file),
//! the per-caller operation count from calibration runs, and the row's runs interleaved with
//! the other rows of its group.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use bench_common::{copy_synced, median, percentile, sync_file};
use idem::Store;
use idem::redb;

use crate::baselines::disk::{BLOCK, DISK_BLOCKS, disk_file};
use crate::baselines::group_writer::GroupWriter;
use crate::baselines::memory::{Memory, memory_claim};
use crate::baselines::naive::{
    Deferred, naive_claim, naive_colocated_claim, naive_create, naive_deferred_claim,
    naive_indexed_claim,
};
use crate::baselines::sqlite::{sqlite_claim, sqlite_conn, sqlite_create, sqlite_lookup};
use crate::data::{SMALL, existing_key, new_key};
use crate::harness::{Commits, Rng, Sample, run_callers};
use crate::idem_ops::{idem_claim, idem_claim_send, idem_lease, idem_replay, open_idem};
use crate::masters::Masters;
use crate::rows::{Fill, Row, System, Work, fill_name};
use crate::settings::Settings;
use crate::written::WriteCounter;

/// The system a run drives, set up for that run.
pub enum Kind {
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
pub struct Target {
    kind: Kind,
    _dir: Option<tempfile::TempDir>,
}

/// A row's runs, summed.
pub struct RowResult {
    pub per_caller: usize,
    pub rates: Vec<f64>,
    pub lat_ns: Vec<u64>,
    pub written: Option<u64>,
    pub ops: usize,
    pub commits: Option<Commits>,
}

/// The run: its settings, its temp dir and masters, and every row's results so far.
pub struct Bench {
    pub cfg: Settings,
    pub counter: WriteCounter,
    pub root: tempfile::TempDir,
    pub masters: Masters,
    pub results: HashMap<Row, RowResult>,
    pub order: Vec<Row>,
    pub counts: HashMap<(System, Work, usize), usize>,
    pub total_rows: usize,
    /// The run's header lines, which head the CSV file as `# ` comments.
    pub csv_header: Vec<String>,
}

impl Bench {
    /// Records the `fill` store holds (the keys replays pick from).
    pub fn existing(&self, fill: Fill) -> usize {
        match fill {
            Fill::Empty => SMALL,
            Fill::Prefilled => self.cfg.prefill,
        }
    }

    /// A fresh directory for one run, inside the bench's temp dir.
    pub fn new_dir(&self) -> tempfile::TempDir {
        tempfile::TempDir::new_in(self.root.path()).expect("run dir")
    }

    /// Sets up one run's target (untimed).
    pub fn prepare(&self, row: Row) -> Target {
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
    pub fn measure(&self, row: Row, target: &Target, tag: usize, per: usize) -> Sample {
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

    /// The calls of one timed run (`measure` without the commit counters).
    pub fn measure_calls(&self, row: Row, target: &Target, tag: usize, per: usize) -> Sample {
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
    pub fn per_caller(&mut self, row: Row) -> usize {
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
    pub fn group(&mut self, rows: &[Row]) {
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

    /// The median ops/s of `r`, if it ran.
    pub fn rate(&self, r: &Row) -> Option<f64> {
        self.results.get(r).map(|x| median(&x.rates))
    }

    /// The `p` percentile of `r`'s call latencies in ns, if it ran.
    pub fn latency(&self, r: &Row, p: f64) -> Option<u64> {
        self.results.get(r).map(|x| {
            let mut v = x.lat_ns.clone();
            v.sort_unstable();
            percentile(&v, p)
        })
    }
}
