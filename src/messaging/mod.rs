//! Messaging on top of the engine: the inbox (processed-message tracking), the transactional
//! outbox and its dispatcher, per-entity version marks, and webhook receipts. It builds on the
//! engine only (its store, transaction handle, tables and marks), never the other way round:
//! `Tx::outbox` and `Tx::versions` are defined here, outbox pushes announce work on the `Tx`
//! (the engine wakes the dispatcher after the commit), and the outbox's counters live in the
//! store's typed extension slot.
//!
//! | file | owns |
//! |---|---|
//! | `inbox.rs` | `Store::process` and `Store::receive` (at most once per message or delivery), the mark keys (namespace, subscriber or source, id), purging a mark |
//! | `outbox.rs` | the transactional outbox on redb (`Tx::outbox`: a push stores the model's event row under the next sequence number), its inspection and dead-letter operations, its counters (`Store::outbox_metrics`); the events, their ids, layout and retry backoff are the model's (`model/outbox.rs`) |
//! | `dispatch.rs` | the dispatcher thread that publishes committed events, in order per key, at least once (the `Publisher` contract and its options are the model's) |
//! | `order.rs` | per-entity version high-water marks (`Tx::versions`) |
//! | `webhook.rs` | webhook signature verification (feature `webhooks`) |

pub(crate) mod dispatch;
pub(crate) mod inbox;
pub(crate) mod order;
pub(crate) mod outbox;
#[cfg(feature = "webhooks")]
pub mod webhook;
