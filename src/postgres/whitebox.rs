//! NOT PUBLIC API (feature `__internal_whitebox`): hooks for idem's own tests of the commit
//! path. A test makes a chosen batch's connection fail at its commit, before or after the
//! `COMMIT` ran on the server, and sees how many callers are queued for the next batch (to form
//! a batch of known members). Hidden from the docs, never stable.

use parking_lot::Mutex;

use crate::postgres::conn::Conn;
use crate::postgres::store::PgStore;

/// Where a commit's connection fails ([`PgStore::on_commit`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitLoss {
    /// The backend is terminated before the commit statement is sent: nothing commits, and the
    /// caller sees the connection fail at the commit.
    BeforeItRuns,
    /// The commit statement runs (and commits); then the backend is terminated and the driver
    /// sees the connection fail instead of the commit's answer.
    AfterItRan,
}

/// The hook: asked before every commit of a batch that wrote, with the batch's size.
pub(crate) type CommitHook = Box<dyn FnMut(usize) -> Option<CommitLoss> + Send>;

/// The store's hook slot.
#[derive(Default)]
pub(crate) struct Hooks {
    commit: Mutex<Option<CommitHook>>,
}

impl PgStore {
    /// NOT PUBLIC API. `hook(members)` is asked before each commit of a batch that wrote
    /// (`members`: the batch's size); `Some(loss)` makes that batch's connection fail there.
    /// Replaces any earlier hook.
    #[doc(hidden)]
    pub fn on_commit(&self, hook: impl FnMut(usize) -> Option<CommitLoss> + Send + 'static) {
        *self.inner.hooks.commit.lock() = Some(Box::new(hook));
    }

    /// NOT PUBLIC API. Callers of this store queued for the next batch right now.
    #[doc(hidden)]
    pub fn queued_for_commit(&self) -> usize {
        self.group().queued()
    }

    /// What the hook says for a commit of `members` members.
    pub(crate) fn commit_loss(&self, members: usize) -> Option<CommitLoss> {
        self.inner
            .hooks
            .commit
            .lock()
            .as_mut()
            .and_then(|hook| hook(members))
    }
}

/// Terminates the connection's own backend and returns the error the client then reports (a
/// `FATAL` of the server, or the closed connection): what a backend killed at that point gives
/// the driver. `None` if the connection kept answering.
pub(crate) fn terminate(conn: &mut Conn) -> Option<postgres::Error> {
    for _ in 0..3 {
        if let Err(e) = conn
            .client
            .simple_query("SELECT pg_terminate_backend(pg_backend_pid())")
        {
            return Some(e);
        }
    }
    None
}
