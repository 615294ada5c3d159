//! Admitting a request (its limits, its record key) and deciding it from the stored record:
//! first on the lock-free read path, then again under the writer, since the read path may be
//! stale.

use crate::engine::open::Open;
use crate::engine::store::Store;
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::record::HolderToken;
use crate::model::rules::answers::{self, Early};
use crate::model::rules::instants::{self, Attempt};
use crate::model::rules::{Decision, decide_among};
use crate::model::scope::{Request, Scope, admit_key, record_key};

impl Store {
    /// The record key of `key` in `scope`, validated like a request's (no payload involved).
    pub(super) fn admit_key(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Vec<u8>, Error> {
        admit_key(&self.inner.config.limits, scope, key)
    }

    pub(super) fn admit(&self, request: &Request) -> Result<Vec<u8>, Error> {
        self.inner.config.limits.check(request)?;
        Ok(record_key(request))
    }

    /// The lock-free path: the answer a read transaction gives `request` (whose claim drew the
    /// holder tokens `own`; none for flow A) without a write, if any — a replay, a mismatch, an
    /// in-flight key. A fail-stopped store answers none: the answer after a failure is
    /// `FailStopped` whatever redb still holds in its cache.
    pub(super) fn read_path(
        &self,
        request: &Request,
        own: &[HolderToken],
        key: &[u8],
    ) -> Result<Option<Early>, Error> {
        self.check_writable()?;
        let stored = self.read_record(key)?;
        let now = self.now();
        Ok(self.early(
            decide_among(
                stored.as_ref(),
                request.fingerprint(),
                own,
                now,
                self.inner.holders,
            ),
            request,
            now,
        ))
    }

    /// What `request` (whose claim drew the holder tokens `own`; none for flow A) may do,
    /// decided from the record read in the write transaction.
    pub(super) fn decide_in(
        &self,
        open: &mut Open<'_>,
        request: &Request,
        own: &[HolderToken],
        key: &[u8],
        now: Timestamp,
    ) -> Result<Claimed, Error> {
        let stored = self.load_open(open, key)?;
        let decision = decide_among(
            stored.as_ref(),
            request.fingerprint(),
            own,
            now,
            self.inner.holders,
        );
        if let Some(early) = self.early(decision.clone(), request, now) {
            return Ok(Claimed::Early(early));
        }
        Ok(Claimed::Free(instants::attempt(
            &decision,
            stored.as_ref(),
            now,
        )))
    }

    /// The answer that needs no claim, if any; `now` is the time the decision was made at.
    fn early(&self, decision: Decision<'_>, request: &Request, now: Timestamp) -> Option<Early> {
        answers::early(decision, request, now, self.inner.config.retry_after_cap)
    }
}

pub(super) enum Claimed {
    Early(Early),
    Free(Attempt),
}
