//! The storage boundary: a panic redb raises on damaged data is [`Error::CorruptStore`], a
//! panic of caller code stays the caller's, and a redb error converted where nothing can be
//! latched says so ([`unlatched`]).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

#[cfg(doc)]
use crate::engine::read_only::ReadOnlyStore;
#[cfg(doc)]
use crate::engine::store::Store;
use crate::error::{Error, StorageError};

// ---- The storage boundary: panics from redb on damaged data ----
//
// redb (5.0, as 4.6) trusts the bytes of its pages: a damaged length or offset in a page can make it index
// out of bounds or unwrap a decoding error (e.g. a table name that is not UTF-8) instead of
// returning `StorageError::Corrupted`. idem runs every redb call on stored data — the open, every
// read path, the work of every write batch, the commit protocol's steps, the integrity check,
// compaction — inside `catch_unwind`, and turns such a panic into `Error::CorruptStore`
// (latching fail-stop when it happened inside a write). Caller code that runs inside those
// sections (a closure, the `Clock`, a progress callback) runs through `caller_code`, which wraps
// a panic unwinding out of it in `CallerPanic`; the boundary unwraps it and resumes the caller's
// own payload, exactly as it was. The mark travels with the panic itself, so a panic the caller
// caught inside its own code leaves nothing behind that could misclassify a later one.

/// The payload of a panic that unwound out of caller code inside a storage section: the caller's
/// own payload, carried to the boundary, which resumes it unchanged.
struct CallerPanic(Box<dyn Any + Send>);

/// Runs caller-supplied code (a closure, the clock, a callback) inside a storage section: a panic
/// from it is marked as the caller's, so the boundary lets it continue. Only ever called inside a
/// storage section (`catch_storage_panic`), which unwraps the mark: outside one, the caller would
/// see the wrapper instead of its own payload.
pub(crate) fn caller_code<T>(f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        if payload.is::<CallerPanic>() {
            // Already marked (caller code nested in caller code): one mark is enough.
            std::panic::resume_unwind(payload)
        }
        std::panic::resume_unwind(Box::new(CallerPanic(payload)))
    })
}

/// A panic caught at the storage boundary.
pub(crate) enum Panicked {
    /// It unwound out of caller code: the caller's own payload, to be resumed as it is.
    Caller(Box<dyn Any + Send>),
    /// It came from redb (or the storage backend, or idem's own code) reading the file: its
    /// message.
    Storage(String),
}

impl Panicked {
    /// What the caller gets: a storage panic is [`Error::CorruptStore`] (`while` says what idem
    /// was doing); a caller's panic continues unwinding.
    pub(crate) fn into_error(self, while_: &str) -> Error {
        match self {
            Panicked::Caller(payload) => std::panic::resume_unwind(payload),
            Panicked::Storage(message) => damaged(while_, &message),
        }
    }
}

/// The [`Error::CorruptStore`] of a storage panic. The boundary cannot tell a damaged page from
/// a bug in redb or idem, so the message names both, and the way to tell them apart. It warns
/// against the usual remedy for a damaged file: an older copy of an idempotency store re-opens
/// every key completed since it was taken.
pub(crate) fn damaged(while_: &str, message: &str) -> Error {
    Error::CorruptStore {
        reason: format!(
            "redb or idem panicked while {while_} (a damaged page, or a bug): {message}; run `idem check` on a copy: if it passes, this is a bug — report it, and do not restore an older copy of the store (every intent completed since then would run again)"
        ),
    }
}

/// A read path at the storage boundary: a panic redb raises on damaged data while `f` runs is
/// [`Error::CorruptStore`] (reads change nothing, so no fail-stop); a panic in caller code inside
/// `f` (run through [`caller_code`]) continues unwinding.
pub(crate) fn contained<T>(while_: &str, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_storage_panic(f).unwrap_or_else(|p| Err(p.into_error(while_)))
}

/// Runs `f` (idem code calling redb) and catches a panic, telling the caller's apart: it is the
/// caller's exactly when it unwound out of [`caller_code`].
pub(crate) fn catch_storage_panic<T>(f: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| match payload.downcast::<CallerPanic>() {
        Ok(caller) => Panicked::Caller(caller.0),
        Err(payload) => Panicked::Storage(panic_message(payload.as_ref())),
    })
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "no message".to_owned(),
    }
}
/// A redb error as [`Error::Storage`], **without** latching fail-stop here. For the three
/// places where nothing latches at the conversion: opening a file (no store exists yet, nothing
/// was acknowledged), the [`ReadOnlyStore`] (it never writes), and the read functions run by
/// [`Store::read`] (shared with the read-only store), whose every error `Store::read` observes.
/// Anywhere else — a write's work above all, whose errors may be answered without reaching
/// the write's own `observe` — use [`Store::storage`].
pub(crate) fn unlatched(e: impl Into<redb::Error>) -> Error {
    Error::Storage {
        source: redb_error(e),
    }
}

/// A redb error as the engine-neutral [`StorageError`] that [`Error`] carries.
pub(crate) fn redb_error(e: impl Into<redb::Error>) -> StorageError {
    StorageError::new(e.into())
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind, panic_any};

    use super::*;

    /// The text of a caller's panic as the boundary hands it back (`None`: a storage panic).
    fn caller_payload<T>(r: Result<T, Panicked>) -> Option<String> {
        match r {
            Ok(_) => panic!("nothing panicked"),
            Err(Panicked::Caller(payload)) => Some(panic_message(payload.as_ref())),
            Err(Panicked::Storage(_)) => None,
        }
    }

    #[test]
    fn a_panic_out_of_caller_code_is_the_callers_with_its_own_payload() {
        let r = catch_storage_panic(|| caller_code(|| panic_any("mine")));
        assert_eq!(caller_payload(r).as_deref(), Some("mine"));
    }

    #[test]
    fn a_panic_outside_caller_code_is_a_storage_panic() {
        let r = catch_storage_panic(|| {
            caller_code(|| 1);
            panic_any("redb")
        });
        assert_eq!(caller_payload(r), None);
    }

    /// The case a thread-local flag got wrong: caller code whose panic the caller caught itself,
    /// then a storage panic in the same section.
    #[test]
    fn a_storage_panic_after_a_caller_panic_the_caller_caught_is_a_storage_panic() {
        let r = catch_storage_panic(|| {
            caller_code(|| {
                let caught = catch_unwind(|| caller_code(|| panic_any("caught by the caller")));
                assert!(caught.is_err());
            });
            let caught = catch_unwind(|| caller_code(|| panic_any("caught by idem's caller")));
            assert!(caught.is_err());
            panic_any("redb")
        });
        assert!(
            matches!(&r, Err(Panicked::Storage(m)) if m == "redb"),
            "{:?}",
            caller_payload(r)
        );
    }

    /// Caller code → a store call (its own section) → caller code: the innermost panic reaches
    /// the outer caller's code as it was, and from there the outer caller.
    #[test]
    fn a_caller_panic_crosses_nested_sections_unchanged() {
        let mut seen_inside = None;
        let r = catch_storage_panic(|| {
            caller_code(|| {
                let inner = catch_unwind(AssertUnwindSafe(|| {
                    contained("reading", || -> Result<(), Error> {
                        caller_code(|| panic_any("deep"))
                    })
                }));
                let payload = inner.expect_err("the inner caller panic continues");
                seen_inside = Some(panic_message(payload.as_ref()));
                std::panic::resume_unwind(payload)
            })
        });
        assert_eq!(seen_inside.as_deref(), Some("deep"));
        assert_eq!(caller_payload(r).as_deref(), Some("deep"));
        // A storage panic in the nested section is its CorruptStore, inside the caller's code.
        let r = catch_storage_panic(|| {
            caller_code(|| contained("reading", || -> Result<(), Error> { panic_any("redb") }))
        });
        assert!(matches!(r, Ok(Err(Error::CorruptStore { .. }))));
    }
}
