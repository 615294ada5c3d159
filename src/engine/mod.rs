//! The redb engine: it stores the pure model's values (records, marks) in one redb file and
//! applies the model's rules to them. It imports nothing of messaging or of the faces; the
//! layers above build on it through a few documented hooks: inherent methods on [`Tx`](tx::Tx)
//! and [`Store`](store::Store) defined in their own files, the work-announced signal
//! (`runtime/signal.rs`), and a typed per-store extension slot (`Store::extension`). The
//! group-commit protocol it drives is `runtime/group.rs`.
//!
//! | file | owns |
//! |---|---|
//! | `store/` | the [`Store`](store::Store) and its shared state; flow A (`execute`), the claim half of flow B (`begin`, `begin_wait`), record I/O (`get`, `for_each_record`, `purge`, the read path, the record's load/put/remove), the fail-stop latch, a batch's write transaction, the closure boundary: one file each (`store/mod.rs` has its table) |
//! | `builder.rs` | the settings and their documented defaults ([`StoreBuilder`](builder::StoreBuilder)), [`Durability`](builder::Durability), the three ways to open a file and the checks an open makes |
//! | `create.rs` | a new store file: written beside its path and linked into place once durable; what a cut-short creation left, removed |
//! | `boundary.rs` | the storage boundary: redb's panics on damaged data become `CorruptStore`, a caller's panic stays the caller's; `unlatched` for the places with nothing to latch |
//! | `commit.rs` | group commit on redb: one write transaction and one fsync shared by concurrent writers (`Store::write`); redb's side (`BatchEngine`) of the driver of `runtime/driver.rs` |
//! | `snapshot.rs` | the records table as of the latest commit, shared by the read path's lookups |
//! | `open.rs` | the record tables opened once for a run of batch members (`Open`) |
//! | `tx.rs` | the transaction handle given to closures ([`Tx`](tx::Tx)) and the work it announces |
//! | `typed.rs` | `Store::execute_typed`: flow A answering with a serde value |
//! | `tables.rs` | every table definition, with versioned names, and `open_optional` |
//! | `expiry.rs` | the expiry index (one entry per record or mark), [`Stats`](expiry::Stats), the index check |
//! | `marks.rs` | marks (inbox marks, webhook receipts): their storage, their index entries, their sweep (the value and its byte layout are `model/marks.rs`) |
//! | `sweep.rs` | sweep passes in bounded batches ([`SweepReport`](sweep::SweepReport)) |
//! | `lease.rs` | flow B's fenced [`Lease`](lease::Lease) and [`BeginAnswer`](lease::BeginAnswer) |
//! | `background.rs` | the flusher and the sweeper threads: one shared tick loop |
//! | `maintenance.rs` | [`Metrics`](maintenance::Metrics), `compact`, `check_integrity` |
//! | `read_only.rs` | [`ReadOnlyStore`](read_only::ReadOnlyStore): the same reads, nothing ever written |
//! | `probe.rs` | how a file was left (new, closed cleanly, left by a crash), from a read-only look before the open for writing |
//! | `repair.rs` | a reopen's repair of a file not closed cleanly: [`RepairProgress`](repair::RepairProgress) for the caller's `on_repair` callback, its time |

pub(crate) mod background;
pub(crate) mod boundary;
pub(crate) mod builder;
pub(crate) mod commit;
pub(crate) mod create;
pub(crate) mod expiry;
pub(crate) mod journal;
pub(crate) mod lease;
pub(crate) mod maintenance;
pub(crate) mod marks;
pub(crate) mod open;
pub(crate) mod probe;
pub(crate) mod read_only;
pub(crate) mod repair;
pub(crate) mod snapshot;
pub(crate) mod store;
pub(crate) mod sweep;
pub(crate) mod tables;
pub(crate) mod tx;
pub(crate) mod typed;
