//! idem's rows: `Store::execute` on a fresh key, whose closure writes one row to the caller's
//! own table in the claim's transaction (benches/claim_throughput/idem_ops.rs, `idem_claim`):
//! one record, its expiry entry and the caller's row, answered once durable.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use idem::redb::TableDefinition;
use idem::redb::backends::{FileBackend, InMemoryBackend};
use idem::{ExecuteAnswer, Request, Response, Scope, Store, StoreBuilder};

use super::{Row, RowSpec};
use crate::harness::Keys;

/// The caller's own table: one tiny write per claim, in the claim's transaction.
const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("effects");
/// The scope's tenant (benches/common/workload.rs).
const TENANT: &str = "tenant-0042";
/// The scope's operation (benches/common/workload.rs).
const OPERATION: &str = "create_order";
/// Threads that pre-fill the store through `execute` (benches/claim_throughput/data.rs).
const PREFILL_THREADS: usize = 64;

/// One idem row: its label, its description and the builder its store is opened with.
pub struct IdemMode {
    /// The row's label.
    pub label: &'static str,
    /// What differs from the other idem rows.
    pub what: &'static str,
    /// The store's builder (`Store::builder` is idem's defaults).
    pub builder: fn() -> StoreBuilder,
    /// Claims through `execute_on_writer` (the closure is `Send` and the batch's thread runs
    /// it) instead of `execute`.
    pub on_writer: bool,
    /// redb on an in-memory backend, the journal a file in the row's directory
    /// (`open_with_backends`). What it gains over the same row on disk is what the redb file's
    /// page writes and checkpoint syncs cost; a crash loses what was checkpointed.
    pub redb_in_memory: bool,
}

/// The idem rows. To measure another idem setting beside the default, add one entry here, e.g.
/// `IdemMode { label: "idem …", what: "…", builder: || Store::builder().…, on_writer: false },`.
pub const MODES: &[IdemMode] = &[
    IdemMode {
        label: "idem execute",
        what: "idem `Store::execute`, default builder (journal mode, Durability::Immediate, 64 MiB page cache): a batch decides against redb's published snapshot plus the entries not yet applied, appends its writes (record, expiry entry, caller row) to the journal and answers after its fdatasync (one per group of batches); one thread applies durable entries to redb with non-durable commits and checkpoints every 8 MiB of journal",
        builder: Store::builder,
        on_writer: false,
        redb_in_memory: false,
    },
    IdemMode {
        label: "idem execute_on_writer",
        what: "the default builder through `execute_on_writer` (a `Send` closure the batch's thread runs: no thread hand-off per claim)",
        builder: Store::builder,
        on_writer: true,
        redb_in_memory: false,
    },
    IdemMode {
        label: "idem direct",
        what: "direct mode (`journal(false)`, as `multi_process` runs): record + expiry entry + caller row, one durable redb commit per batch (group commit batches concurrent callers)",
        builder: || Store::builder().journal(false),
        on_writer: false,
        redb_in_memory: false,
    },
];

/// Diagnostic rows, run only when `--only` names them: journal mode with redb's file in memory
/// and the journal on disk, and with a page cache that holds the whole store.
pub const DIAGNOSTIC_MODES: &[IdemMode] = &[
    IdemMode {
        label: "idem journal 64MiB",
        what: "diagnostic: the default builder with a 64 MiB journal (`journal_capacity`) instead of 16 MiB, checkpoints every 8 MiB as by default: what a larger journal buys",
        builder: || Store::builder().journal_capacity(64 << 20),
        on_writer: false,
        redb_in_memory: false,
    },
    IdemMode {
        label: "idem journal checkpoint 32MiB",
        what: "diagnostic: the default builder with a 64 MiB journal and `checkpoint_bytes(32 MiB)` (the most it allows) instead of 16 MiB and 8 MiB: a quarter of the durable redb commits, and an open after a crash replays up to four times more",
        builder: || {
            Store::builder()
                .journal_capacity(64 << 20)
                .checkpoint_bytes(32 << 20)
        },
        on_writer: false,
        redb_in_memory: false,
    },
    IdemMode {
        label: "idem journal redb in memory",
        what: "diagnostic, not durable across a crash: `idem execute` with redb on an in-memory backend and the journal a file on disk (each claim still waits for the journal's fdatasync); the difference from `idem execute` is what the redb file's page writes and checkpoint syncs cost; its bytes on disk are the journal's only",
        builder: || Store::builder(),
        on_writer: false,
        redb_in_memory: true,
    },
    IdemMode {
        label: "idem journal on_writer redb in memory",
        what: "diagnostic, not durable across a crash: `idem execute_on_writer` with redb in memory, as above",
        builder: || Store::builder(),
        on_writer: true,
        redb_in_memory: true,
    },
    IdemMode {
        label: "idem journal cache 1GiB",
        what: "diagnostic: `idem execute` with a 1 GiB page cache (`cache_size`) instead of 64 MiB, which holds the whole pre-filled store: what reads of pages outside redb's cache cost",
        builder: || {
            Store::builder().cache_size(1 << 30)
        },
        on_writer: false,
        redb_in_memory: false,
    },
    IdemMode {
        label: "idem journal on_writer cache 1GiB",
        what: "diagnostic: `idem execute_on_writer` with a 1 GiB page cache",
        builder: || {
            Store::builder().cache_size(1 << 30)
        },
        on_writer: true,
        redb_in_memory: false,
    },
];

/// The request for `key` (benches/common/workload.rs): tenant/operation scope, a small payload.
fn request(key: &str) -> Request {
    let payload = format!("sku=sku-1&qty=2&ref={key}");
    Request::from_canonical_bytes(Scope::new(TENANT, OPERATION), key, payload.as_bytes())
}

/// The answer every claim records: 201, `{"ok":true}`, resource `("order", "o1")`.
fn response() -> Response {
    Response::new(201, r#"{"ok":true}"#).with_resource("order", "o1")
}

/// An open idem store, and whether it claims through `execute_on_writer`.
pub struct IdemRow(Store, bool);

impl Row for IdemRow {
    fn claim(&self, key: &[u8]) {
        let key = std::str::from_utf8(key).expect("ASCII key");
        let outcome = if self.1 {
            let owned = key.to_owned();
            self.0.execute_on_writer(request(key), move |tx| {
                let mut effects = tx.open_table(EFFECTS)?;
                effects.insert(owned.as_bytes(), 1)?;
                Ok(response())
            })
        } else {
            self.0.execute(request(key), |tx| {
                let mut effects = tx.open_table(EFFECTS)?;
                effects.insert(key.as_bytes(), 1)?;
                Ok(response())
            })
        }
        .unwrap_or_else(|e| panic!("idem claim {key}: {e}"));
        assert!(
            matches!(outcome, ExecuteAnswer::Ran(_)),
            "idem claim {key}: {outcome:?}"
        );
    }
}

/// The row of `MODES` or `DIAGNOSTIC_MODES` (`diagnostic`) entry `mode`: its store is
/// `idem.redb` in the row's directory (or in memory), pre-filled
/// through `execute` on `PREFILL_THREADS` threads (as benches/claim_throughput pre-fills).
pub fn spec(mode: &IdemMode, diagnostic: bool) -> RowSpec {
    let &IdemMode {
        label,
        what,
        builder,
        on_writer,
        redb_in_memory,
    } = mode;
    RowSpec {
        label,
        what,
        diagnostic,
        open: Box::new(move |dir: &Path, records: usize| {
            let store = if redb_in_memory {
                let journal = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(dir.join("idem.journal"))
                    .expect("create the journal file");
                builder()
                    .open_with_backends(InMemoryBackend::new(), FileBackend::new(journal))
                    .expect("open idem store")
            } else {
                builder()
                    .open(dir.join("idem.redb"))
                    .expect("open idem store")
            };
            let row = IdemRow(store, on_writer);
            let took = prefill(&row, records);
            (Box::new(row) as Box<dyn Row>, took)
        }),
    }
}

/// `records` claims of fresh random keys through `execute` on `PREFILL_THREADS` threads.
fn prefill(row: &IdemRow, records: usize) -> Duration {
    let t = Instant::now();
    thread::scope(|s| {
        for p in 0..PREFILL_THREADS {
            s.spawn(move || {
                let mut keys = Keys::new(0xF111 + p as u64);
                for _ in (p..records).step_by(PREFILL_THREADS) {
                    row.claim(&keys.next_key());
                }
            });
        }
    });
    t.elapsed()
}
