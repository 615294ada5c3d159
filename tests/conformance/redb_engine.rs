//! The conformance suite's [`Engine`] for the redb file store: a store on a temp file
//! (`common::Harness`) with the suite's settings; closures get `&Tx` and bump the effect
//! counter in the caller's redb table `test.effects`, read back through `read_transaction`.

use std::time::Duration;

use idem::clock::ManualClock;
use idem::format::Record;
use idem::inbox::{HighWaterMark, Mark, ProcessAnswer, ReceiveAnswer};
use idem::keys::DownstreamKey;
use idem::outbox::{
    DeadLetter, DispatcherHandle, DispatcherOptions, OutboxMetrics, OutboxStats, Publisher,
    StoredEvent,
};
use idem::redb::TableDefinition;
use idem::store::{Stats, SweepReport};
use idem::{
    Abort, BeginAnswer, Claim, Error, ExecuteAnswer, Lease, Request, Response, Scope, Timestamp, Tx,
};

use crate::common::{Harness, bump, effects};
use crate::conformance::{
    Behavior, End, Engine, EngineLease, HORIZON, INBOX_RETENTION, LEASE, RETENTION,
};

/// The effects table opened with the wrong value type: opening it fails (a real redb error).
const MISTYPED: TableDefinition<&str, &str> = TableDefinition::new("test.effects");

/// The redb store under test.
pub struct RedbEngine {
    h: Harness,
}

impl RedbEngine {
    /// A fresh store with the suite's settings (always available).
    pub fn open(_case: &str) -> Option<Self> {
        Some(RedbEngine {
            h: Harness::with(|b| {
                b.retention(RETENTION)
                    .tombstone_horizon(HORIZON)
                    .lease_duration(LEASE)
                    .inbox_retention(INBOX_RETENTION)
            }),
        })
    }
}

/// The closure body of `behavior` on a redb transaction.
fn run(tx: &Tx<'_>, b: &Behavior) -> Result<Response, Abort> {
    b.started();
    if let Some((entity, version)) = b.version_to_check() {
        b.note_checked(tx.versions().advance(entity, version)?);
    }
    if let Some(label) = b.effect_label() {
        bump(tx, label)?;
    }
    for event in b.events() {
        b.note_pushed(tx.outbox().push(event.clone())?);
    }
    match b.end() {
        End::Answer(r) => Ok(r.clone()),
        End::Terminal(r) => Err(Abort::terminal(r.clone())),
        End::Retryable => Err(Abort::retryable("injected: the dependency timed out")),
        End::StoreError => {
            bump(tx, "store-error-probe")?; // the table exists, with its real types
            tx.open_table(MISTYPED)?;
            Err(Abort::retryable(
                "unreachable: opening a mistyped table succeeded",
            ))
        }
        End::Panic => panic!("injected panic after writing"),
    }
}

impl Engine for RedbEngine {
    type Lease = Lease;

    fn clock(&self) -> &ManualClock {
        &self.h.clock
    }

    fn execute(&self, request: Request, behavior: &Behavior) -> Result<ExecuteAnswer, Error> {
        self.h.store().execute(request, |tx| run(tx, behavior))
    }

    fn begin(&self, request: Request) -> Result<BeginAnswer<Lease>, Error> {
        self.h.store().begin(request)
    }

    fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer<Lease>, Error> {
        self.h.store().begin_claim(claim)
    }

    fn begin_wait(
        &self,
        request: Request,
        max_wait: Duration,
    ) -> Result<BeginAnswer<Lease>, Error> {
        self.h.store().begin_wait(request, max_wait)
    }

    fn process(
        &self,
        subscriber: &str,
        message_id: &str,
        behavior: &Behavior,
    ) -> Result<ProcessAnswer<Response>, Error> {
        self.h
            .store()
            .process(subscriber, message_id, |tx| run(tx, behavior))
    }

    fn receive(
        &self,
        source: &str,
        delivery_id: &str,
        behavior: &Behavior,
    ) -> Result<ReceiveAnswer<Response>, Error> {
        self.h
            .store()
            .receive(source, delivery_id, |tx| run(tx, behavior))
    }

    fn inbox_mark(&self, subscriber: &str, message_id: &str) -> Result<Option<Mark>, Error> {
        self.h.store().inbox_mark(subscriber, message_id)
    }

    fn purge_inbox_mark(&self, subscriber: &str, message_id: &str) -> Result<bool, Error> {
        self.h.store().purge_inbox_mark(subscriber, message_id)
    }

    fn high_water_mark(&self, entity: &str) -> Result<Option<HighWaterMark>, Error> {
        self.h.store().high_water_mark(entity)
    }

    fn effects(&self, label: &str) -> u64 {
        effects(self.h.store(), label)
    }

    fn get(&self, scope: &Scope, key: &str) -> Result<Option<Record>, Error> {
        self.h.store().get(scope, key)
    }

    fn purge(&self, scope: &Scope, key: &str) -> Result<bool, Error> {
        self.h.store().purge(scope, key)
    }

    fn sweep(&self) -> Result<SweepReport, Error> {
        self.h.store().sweep()
    }

    fn stats(&self) -> Result<Stats, Error> {
        self.h.store().stats()
    }

    fn start_dispatcher<P: Publisher>(
        &self,
        publisher: P,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error> {
        self.h.store().start_dispatcher(publisher, options)
    }

    fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, Error> {
        self.h.store().pending_events(limit)
    }

    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        self.h.store().dead_letters(limit)
    }

    fn requeue_dead_letter(&self, seq: u64) -> Result<bool, Error> {
        self.h.store().requeue_dead_letter(seq)
    }

    fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.h.store().outbox_stats()
    }

    fn outbox_metrics(&self) -> OutboxMetrics {
        self.h.store().outbox_metrics()
    }

    fn restart(&mut self) {
        self.h.reopen();
    }
}

impl EngineLease for Lease {
    fn downstream_key(&self) -> DownstreamKey {
        Lease::downstream_key(self)
    }

    fn attempt(&self) -> u32 {
        Lease::attempt(self)
    }

    fn takeover_of(&self) -> Option<u32> {
        Lease::takeover_of(self)
    }

    fn deadline(&self) -> Timestamp {
        Lease::deadline(self)
    }

    fn heartbeat(&mut self) -> Result<Timestamp, Error> {
        Lease::heartbeat(self)
    }

    fn complete(self, response: Response) -> Result<Response, Error> {
        Lease::complete(self, response)
    }

    fn fail(self, response: Response) -> Result<Response, Error> {
        Lease::fail(self, response)
    }

    fn complete_with(self, behavior: &Behavior) -> Result<Response, Error> {
        Lease::complete_with(self, |tx| run(tx, behavior))
    }

    fn release(self) -> Result<(), Error> {
        Lease::release(self)
    }
}
