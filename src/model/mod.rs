//! The pure model: what a request, a record and an answer are, and the rules that decide what to
//! do with them. No storage, no threads, no I/O: every engine (the redb one in [`crate::engine`])
//! stores and loads these values and applies these rules, it never re-derives one.

pub(crate) mod clock;
pub(crate) mod keys;
pub(crate) mod record;
pub(crate) mod response;
pub(crate) mod retention;
pub(crate) mod rules;
pub(crate) mod scope;
