//! The project's documents, as rustdoc pages: the same markdown files as in the repository's
//! `docs/` folder, included word for word, so docs.rs shows them next to the API they describe.
//!
//! | page | what it says |
//! |---|---|
//! | [`design`] | the layers, the tables, a record's lifecycle, the decisions and their invariants, group commit, crash safety operation by operation |
//! | [`format`](mod@format) | every stored byte: tables, record keys and values, checksums, marks, outbox event ids, the HTTP layer's formats, and the compatibility rules |
//! | [`http`] | the HTTP contract of `idem::http::IdempotencyLayer` (feature `http`): which requests are covered, the key grammar, every answer, what is recorded |
//! | [`postgres`] | the PostgreSQL engine (feature `postgres`): what was tested, its tables and schema versions, the fleet's clock, group commit and its invariants, failures, crash safety per operation, settings, what is not guaranteed |
//! | [`reliability`] | every guarantee with the tests that hold it, what is not guaranteed, the fault model, each invariant with the test that checks it, the bad-input index, the figures and how to reproduce them |
//! | [`guide`] | the caller's API beyond the two flows: what a closure's result stores, `execute_on_writer`, flow B's lease calls, every answer and error with what to do, payload fingerprints, inbox, outbox, webhooks, async callers |
//! | [`configuration`] | every `StoreBuilder` setting with its default, and the ways to open a file |
//! | [`observability`] | the store's counters, the `tracing` spans and events, the `metrics` metrics |
//! | [`operations`] | deployment topologies, starting and stopping, crash recovery, retention and space, damaged files, backups |
//! | [`cli`] | the `idem` operator binary (feature `cli`): its commands, exit statuses and JSON fields |
//!
//! These modules hold no items: they are documentation only. Their code blocks are examples of
//! formats and commands (`text`, `sh`), sketches marked `ignore`, or (in [`guide`] and
//! [`configuration`]) runnable examples, which run as doctests; the items' own examples are on
//! the items themselves (start at the [crate root](crate)).
// Links between the documents: on GitHub a document links its neighbour as a relative file
// (`[FORMAT.md][format]` with `[format]: FORMAT.md` at its end). Here, a definition of the
// same label comes first, pointing at the neighbour's page: in markdown the first definition of
// a label wins, so the link goes to the page on docs.rs and to the file on GitHub.

/// The design: layers, tables, a record's lifecycle, decisions, invariants, group commit, crash
/// safety (`docs/design.md`).
///
/// [format]: crate::docs::format
#[doc = ""]
#[doc = include_str!("../docs/design.md")]
pub mod design {}

/// The storage format: every byte idem stores (`docs/FORMAT.md`).
///
#[doc = include_str!("../docs/FORMAT.md")]
pub mod format {}

/// The HTTP contract of the `Idempotency-Key` layer (`docs/HTTP.md`).
///
#[doc = include_str!("../docs/HTTP.md")]
pub mod http {}

/// The PostgreSQL engine: tables, the fleet's clock, group commit, failures, crash safety
/// (`docs/POSTGRES.md`).
///
#[doc = include_str!("../docs/POSTGRES.md")]
pub mod postgres {}

/// Reliability: what is tested, how, and the figures (`docs/RELIABILITY.md`).
///
#[doc = include_str!("../docs/RELIABILITY.md")]
pub mod reliability {}

/// Using idem: what a closure's result stores, `execute_on_writer`, flow B's lease calls, every
/// answer and error, payload fingerprints, inbox, outbox, webhooks, async callers
/// (`docs/GUIDE.md`).
///
#[doc = include_str!("../docs/GUIDE.md")]
pub mod guide {}

/// Configuration: every `StoreBuilder` setting with its default (`docs/CONFIGURATION.md`).
///
#[doc = include_str!("../docs/CONFIGURATION.md")]
pub mod configuration {}

/// Observability: counters, `tracing` spans and events, metrics (`docs/OBSERVABILITY.md`).
///
#[doc = include_str!("../docs/OBSERVABILITY.md")]
pub mod observability {}

/// Operations: deployment, restarts, crash recovery, space, damaged files, backups
/// (`docs/OPERATIONS.md`).
///
#[doc = include_str!("../docs/OPERATIONS.md")]
pub mod operations {}

/// The `idem` CLI (feature `cli`): commands, exit statuses, JSON fields (`docs/CLI.md`).
///
#[doc = include_str!("../docs/CLI.md")]
pub mod cli {}
