//! Messaging on top of the engine: the inbox (processed-message tracking), the transactional
//! outbox and its dispatcher, per-entity version marks, and webhook receipts.

pub(crate) mod dispatch;
pub(crate) mod inbox;
pub(crate) mod order;
pub(crate) mod outbox;
#[cfg(feature = "webhooks")]
pub mod webhook;
