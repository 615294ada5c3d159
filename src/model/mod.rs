//! The pure model: what a request, a record and an answer are, and the rules that decide what to
//! do with them. No storage, no threads, no I/O: every engine (today the one in src/engine)
//! stores and loads these values and applies these rules, it never re-derives one.
//!
//! - `claim`: a flow-B request whose retries recognise the lease it already took;
//! - `clock`: [`Timestamp`](clock::Timestamp) and the clocks that give it;
//! - `envelope`: the byte layout of the HTTP layer's stored answers (`IDH1` / `IDH2`), read
//!   without HTTP types;
//! - `keys`: the request fingerprint and every key derived from a record key (downstream,
//!   activity, compensation keys);
//! - `marks`: the messaging layer's stored values (inbox marks, version high-water marks) and
//!   their encodings;
//! - `outbox`: outbox events, their stable ids and stored layout, the origin a transaction's
//!   events derive their ids from, retry backoff, and the publisher contract;
//! - `record`: the stored record, its states and its versioned encoding;
//! - `reports`: what a sweep pass did and the records by state;
//! - `response`: the stored response, its tombstone, and the outcome a caller gets;
//! - `retention`: retention policies and the windows a finished intent is kept for;
//! - `rules`: every decision, sweep, inbox and version rule, and the instant rules (what a
//!   claim, a takeover, a heartbeat and a finish write), each with its exhaustive table;
//! - `scope`: scopes, requests and their limits, and the record key;
//! - `typed`: typed answers (`execute_typed`): a serde value stored and decoded on replay;
//! - `settings`: the settings every engine shares, their defaults and checks.

pub(crate) mod claim;
pub(crate) mod clock;
pub(crate) mod envelope;
pub(crate) mod keys;
pub(crate) mod marks;
pub(crate) mod outbox;
pub(crate) mod record;
pub(crate) mod reports;
pub(crate) mod response;
pub(crate) mod retention;
pub(crate) mod rules;
pub(crate) mod scope;
pub(crate) mod settings;
pub(crate) mod typed;
