//! The redb engine under the schedule language (`lockstep.rs`'s [`Engine`]): a [`Store`] on
//! an in-memory [`CrashBackend`] (and, in journal mode, its journal on a second one). A crash
//! fails every later write, drops the leases (their release fails on the dead disk) and the
//! store, and reopens the durable image(s); effects are counted in the caller's table in the
//! same file (`effects.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem::clock::ManualClock;
use idem::{Abort, Error, Lease, Request, Response, Store};

use super::backend::{AloneOnFile, CrashBackend};
use super::effects::{all_effects, bump};
use super::lockstep::{Answer, Engine, Observed};
use super::schedule::{
    CLIENTS, End, FORGET_MS, INTENTS, LEASE_MS, RESPONSE_MS, RETRY_AFTER_CAP, SWEEP_BATCH, key,
    label, scope,
};

pub struct RedbEngine {
    clock: ManualClock,
    /// `StoreBuilder::multi_process`: other processes may share the file, so no holder is known
    /// dead (the model's `View::Any`); off, a reopen frees the leases of the dead.
    multi_process: bool,
    backend: CrashBackend,
    /// Journal mode (`StoreBuilder::journal`): the journal's disk.
    journal: Option<CrashBackend>,
    /// `None` only inside `reopen`/`crash`.
    store: Option<Store>,
    leases: Vec<Option<Lease>>,
}

impl RedbEngine {
    pub fn open(clock: &ManualClock, multi_process: bool) -> Self {
        Self::opened(clock, multi_process, None)
    }

    /// In journal mode, with a small journal that wraps and checkpoints often: an applier
    /// thread applies the journal's entries to redb behind the answers.
    pub fn open_journaled(clock: &ManualClock) -> Self {
        Self::opened(clock, false, Some(CrashBackend::default()))
    }

    fn opened(clock: &ManualClock, multi_process: bool, journal: Option<CrashBackend>) -> Self {
        let backend = CrashBackend::default();
        let store = open(&backend, journal.as_ref(), clock, multi_process);
        RedbEngine {
            clock: clock.clone(),
            multi_process,
            backend,
            journal,
            store: Some(store),
            leases: (0..CLIENTS).map(|_| None).collect(),
        }
    }

    fn reopened(&self) -> Store {
        open(
            &self.backend,
            self.journal.as_ref(),
            &self.clock,
            self.multi_process,
        )
    }

    /// Both disks fail from now on.
    fn fail_disks(&self) {
        self.backend.failing.store(true, Ordering::SeqCst);
        if let Some(j) = &self.journal {
            j.failing.store(true, Ordering::SeqCst);
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("store is open between steps")
    }

    fn lease(&mut self, client: usize) -> Lease {
        self.leases[client]
            .take()
            .expect("the runner gives a lease call only to a client holding one")
    }
}

fn open(
    backend: &CrashBackend,
    journal: Option<&CrashBackend>,
    clock: &ManualClock,
    multi_process: bool,
) -> Store {
    let builder = Store::builder()
        .clock(clock.clone())
        .lease_duration(Duration::from_millis(LEASE_MS))
        .retention(Duration::from_millis(RESPONSE_MS))
        .tombstone_horizon(Duration::from_millis(FORGET_MS))
        .retry_after_cap(RETRY_AFTER_CAP)
        .sweep_batch(SWEEP_BATCH);
    let opened = if let Some(journal) = journal {
        builder
            .journal(true)
            .journal_capacity(64 << 10)
            .checkpoint_bytes(8 << 10)
            .open_with_backends(backend.clone(), journal.clone())
    } else if multi_process {
        builder
            .multi_process(true)
            .open_with_backend(AloneOnFile(backend.clone()))
    } else {
        builder.open_with_backend(backend.clone())
    };
    opened.unwrap_or_else(|e| panic!("the store must open: {e}"))
}

/// The closure of `execute` and `complete_with`: bumps `label`, then ends as `end` says.
fn closure<'a>(
    label: &'a str,
    end: End,
    response: &'a Response,
    runs: &'a mut u32,
) -> impl FnMut(&idem::Tx<'_>) -> Result<Response, Abort> + 'a {
    move |tx| {
        *runs += 1;
        match end {
            End::Ok => {
                bump(tx, label)?;
                Ok(response.clone())
            }
            End::Terminal => Err(Abort::Terminal(response.clone())),
            End::Retryable => Err(Abort::retryable("sim: try again")),
        }
    }
}

impl Engine for RedbEngine {
    fn name(&self) -> &'static str {
        if self.multi_process {
            "redb (multi_process)"
        } else if self.journal.is_some() {
            "redb (journal)"
        } else {
            "redb"
        }
    }

    fn execute(
        &mut self,
        request: Request,
        label: &str,
        end: End,
        response: &Response,
    ) -> (Answer, u32) {
        let mut runs = 0;
        let result = self
            .store()
            .execute(request, closure(label, end, response, &mut runs));
        (Answer::of_outcome(result), runs)
    }

    fn begin(&mut self, client: usize, request: Request) -> Answer {
        assert!(self.leases[client].is_none(), "the client's slot is empty");
        let result = self.store().begin(request);
        Answer::of_begin(result, |lease| {
            let answer = Answer::Acquired {
                attempt: lease.attempt(),
                deadline: lease.deadline(),
                downstream: lease.downstream_key(),
                holder: lease.holder(),
            };
            self.leases[client] = Some(lease);
            answer
        })
    }

    fn complete(
        &mut self,
        client: usize,
        label: &str,
        end: End,
        response: &Response,
    ) -> (Answer, u32) {
        let lease = self.lease(client);
        let mut runs = 0;
        let result = lease.complete_with(closure(label, end, response, &mut runs));
        (Answer::of_finish(result), runs)
    }

    fn heartbeat(&mut self, client: usize) -> Answer {
        let lease = self.leases[client]
            .as_mut()
            .expect("the runner gives a lease call only to a client holding one");
        match lease.heartbeat() {
            Ok(answered) => Answer::Extended {
                answered,
                lease_deadline: lease.deadline(),
            },
            Err(e) => Answer::of_error(e),
        }
    }

    fn release(&mut self, client: usize) -> Answer {
        match self.lease(client).release() {
            Ok(()) => Answer::Released,
            Err(e) => Answer::of_error(e),
        }
    }

    fn drop_lease(&mut self, client: usize) {
        drop(self.leases[client].take());
    }

    fn purge(&mut self, intent: usize) -> Answer {
        match self.store().purge(&scope(intent), key(intent)) {
            Ok(existed) => Answer::Purged(existed),
            Err(e) => Answer::of_error(e),
        }
    }

    fn sweep(&mut self) -> Answer {
        match self.store().sweep() {
            Ok(r) => Answer::Swept {
                deleted: r.deleted,
                tombstoned: r.tombstoned,
                repaired: r.repaired,
            },
            Err(e) => Answer::of_error(e),
        }
    }

    fn reopen(&mut self) {
        assert!(self.leases.iter().all(Option::is_none), "leases dropped");
        self.store = None;
        self.store = Some(self.reopened());
    }

    fn crash(&mut self) {
        self.fail_disks();
        // The leases' drop tries to release through the dead backend: it must fail quietly.
        for slot in &mut self.leases {
            drop(slot.take());
        }
        self.store = None;
        // No store runs any more: both images are of one instant.
        self.journal = self.journal.as_ref().map(CrashBackend::crash);
        self.backend = self.backend.crash();
        self.store = Some(self.reopened());
    }

    fn crash_in_closure(&mut self, request: Request, label: &str) -> (Answer, u32) {
        let (backend, journal) = (self.backend.clone(), self.journal.clone());
        let mut runs = 0;
        let result = self.store().execute(request, |tx| {
            runs += 1;
            bump(tx, label)?;
            backend.failing.store(true, Ordering::SeqCst);
            if let Some(j) = &journal {
                j.failing.store(true, Ordering::SeqCst);
            }
            Ok(Response::new(201, "never acknowledged"))
        });
        match result {
            // The disk may fail on a write inside the transaction (redb growing the file:
            // Storage, rolled back; or FailStopped naming it, when a later step of the same
            // call met the failure again) or at the commit (OutcomeUnknown). Either way
            // nothing was acknowledged, and the store latched.
            Err(
                Error::OutcomeUnknown { .. } | Error::Storage { .. } | Error::FailStopped { .. },
            ) => {
                assert!(
                    self.store().fail_stop_cause().is_some(),
                    "the failure must latch"
                );
                (Answer::Unacknowledged, runs)
            }
            other => (Answer::of_outcome(other), runs),
        }
    }

    fn observe(&self) -> Observed {
        let store = self.store();
        let effects = all_effects(store);
        let records = (0..INTENTS.len())
            .map(|i| {
                store
                    .get(&scope(i), key(i))
                    .unwrap_or_else(|e| panic!("get {}: {e}", label(i)))
            })
            .collect();
        store
            .check_expiry_index()
            .unwrap_or_else(|e| panic!("expiry index: {e}"));
        assert!(
            store.fail_stop_cause().is_none(),
            "the store latched: {:?}",
            store.fail_stop_cause()
        );
        Observed { records, effects }
    }

    fn close(self: Box<Self>) {
        let RedbEngine { store, leases, .. } = *self;
        drop(leases);
        let mut store = store.expect("store is open");
        assert_eq!(store.check_integrity().ok(), Some(true), "redb integrity");
    }
}
