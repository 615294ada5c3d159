//! The conformance suite's [`Engine`] for the PostgreSQL store: a store on a fresh schema
//! (`common::pg::PgHarness`) with the suite's settings; closures get `&mut PgTx` and bump the
//! effect counter in the test's own table `{schema}.effects` with SQL, read back on a direct
//! connection. A restart opens another store on the same schema and clock.

use std::sync::Mutex;
use std::time::Duration;

use idem::clock::ManualClock;
use idem::format::Record;
use idem::inbox::{HighWaterMark, Mark, ProcessAnswer, ReceiveAnswer};
use idem::keys::DownstreamKey;
use idem::outbox::{
    DeadLetter, DispatcherHandle, DispatcherOptions, OutboxMetrics, OutboxStats, Publisher,
    StoredEvent,
};
use idem::postgres::{PgLease, PgStore, PgTx};
use idem::store::{Stats, SweepReport};
use idem::{Abort, BeginAnswer, Claim, Error, ExecuteAnswer, Request, Response, Scope, Timestamp};

use crate::common::pg::PgHarness;
use crate::conformance::{
    Behavior, End, Engine, EngineLease, HORIZON, INBOX_RETENTION, LEASE, RETENTION,
};

/// The PostgreSQL store under test. Fields drop in order: the store and the connection before
/// the harness, which drops the schema.
pub struct PgEngine {
    store: PgStore,
    client: Mutex<postgres::Client>,
    effects: String,
    harness: PgHarness,
}

impl PgEngine {
    /// A fresh store with the suite's settings, or `None` when PostgreSQL tests are skipped
    /// here.
    pub fn open(case: &str) -> Option<Self> {
        let harness = PgHarness::with(case, |b| {
            b.retention(RETENTION)
                .tombstone_horizon(HORIZON)
                .lease_duration(LEASE)
                .inbox_retention(INBOX_RETENTION)
        })?;
        let effects = harness.table("effects");
        let mut client = harness.client();
        client
            .batch_execute(&format!(
                "CREATE TABLE {effects} (label text PRIMARY KEY, n bigint NOT NULL)"
            ))
            .expect("create the effects table");
        Some(PgEngine {
            store: harness.store().clone(),
            client: Mutex::new(client),
            effects,
            harness,
        })
    }
}

/// The closure body of `behavior` on a PostgreSQL transaction.
fn run(tx: &mut PgTx<'_>, b: &Behavior, effects: &str) -> Result<Response, Abort> {
    b.started();
    if let Some((entity, version)) = b.version_to_check() {
        b.note_checked(tx.versions().advance(entity, version)?);
    }
    if let Some(label) = b.effect_label() {
        let bump = format!(
            "INSERT INTO {effects} AS e (label, n) VALUES ($1, 1) \
             ON CONFLICT (label) DO UPDATE SET n = e.n + 1"
        );
        tx.execute(bump.as_str(), &[&label])?;
    }
    for event in b.events() {
        b.note_pushed(tx.outbox().push(event.clone())?);
    }
    match b.end() {
        End::Answer(r) => Ok(r.clone()),
        End::Terminal(r) => Err(Abort::terminal(r.clone())),
        End::Retryable => Err(Abort::retryable("injected: the dependency timed out")),
        End::StoreError => {
            tx.execute("SELECT 1 FROM conformance_no_such_table", &[])?;
            Err(Abort::retryable(
                "unreachable: a query on a missing table succeeded",
            ))
        }
        End::Panic => panic!("injected panic after writing"),
    }
}

impl Engine for PgEngine {
    type Lease = PgEngineLease;

    fn clock(&self) -> &ManualClock {
        &self.harness.clock
    }

    fn execute(&self, request: Request, behavior: &Behavior) -> Result<ExecuteAnswer, Error> {
        self.store
            .execute(request, |tx| run(tx, behavior, &self.effects))
    }

    fn begin(&self, request: Request) -> Result<BeginAnswer<PgEngineLease>, Error> {
        Ok(self.lease(self.store.begin(request)?))
    }

    fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer<PgEngineLease>, Error> {
        Ok(self.lease(self.store.begin_claim(claim)?))
    }

    fn begin_wait(
        &self,
        request: Request,
        max_wait: Duration,
    ) -> Result<BeginAnswer<PgEngineLease>, Error> {
        Ok(self.lease(self.store.begin_wait(request, max_wait)?))
    }

    fn process(
        &self,
        subscriber: &str,
        message_id: &str,
        behavior: &Behavior,
    ) -> Result<ProcessAnswer<Response>, Error> {
        self.store.process(subscriber, message_id, |tx| {
            run(tx, behavior, &self.effects)
        })
    }

    fn receive(
        &self,
        source: &str,
        delivery_id: &str,
        behavior: &Behavior,
    ) -> Result<ReceiveAnswer<Response>, Error> {
        self.store
            .receive(source, delivery_id, |tx| run(tx, behavior, &self.effects))
    }

    fn inbox_mark(&self, subscriber: &str, message_id: &str) -> Result<Option<Mark>, Error> {
        self.store.inbox_mark(subscriber, message_id)
    }

    fn purge_inbox_mark(&self, subscriber: &str, message_id: &str) -> Result<bool, Error> {
        self.store.purge_inbox_mark(subscriber, message_id)
    }

    fn high_water_mark(&self, entity: &str) -> Result<Option<HighWaterMark>, Error> {
        self.store.high_water_mark(entity)
    }

    fn effects(&self, label: &str) -> u64 {
        let q = format!("SELECT n FROM {} WHERE label = $1", self.effects);
        let row = self
            .client
            .lock()
            .expect("client")
            .query_opt(q.as_str(), &[&label])
            .expect("read the effects table");
        row.map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).expect("a count"))
    }

    fn get(&self, scope: &Scope, key: &str) -> Result<Option<Record>, Error> {
        self.store.get(scope, key)
    }

    fn purge(&self, scope: &Scope, key: &str) -> Result<bool, Error> {
        self.store.purge(scope, key)
    }

    fn sweep(&self) -> Result<SweepReport, Error> {
        self.store.sweep()
    }

    fn stats(&self) -> Result<Stats, Error> {
        self.store.stats()
    }

    fn start_dispatcher<P: Publisher>(
        &self,
        publisher: P,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error> {
        self.store.start_dispatcher(publisher, options)
    }

    fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, Error> {
        self.store.pending_events(limit)
    }

    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        self.store.dead_letters(limit)
    }

    fn requeue_dead_letter(&self, seq: u64) -> Result<bool, Error> {
        self.store.requeue_dead_letter(seq)
    }

    fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.store.outbox_stats()
    }

    fn outbox_metrics(&self) -> OutboxMetrics {
        self.store.outbox_metrics()
    }

    fn restart(&mut self) {
        self.store = self.harness.open_another();
    }
}

impl PgEngine {
    fn lease(&self, begin: BeginAnswer<PgLease>) -> BeginAnswer<PgEngineLease> {
        match begin {
            BeginAnswer::Acquired(lease) => BeginAnswer::Acquired(PgEngineLease {
                lease,
                effects: self.effects.clone(),
            }),
            BeginAnswer::Replayed(r) => BeginAnswer::Replayed(r),
            BeginAnswer::InFlight { retry_after } => BeginAnswer::InFlight { retry_after },
            BeginAnswer::Expired(t) => BeginAnswer::Expired(t),
        }
    }
}

/// A [`PgLease`] and the effects table its `complete_with` closures write.
#[derive(Debug)]
pub struct PgEngineLease {
    lease: PgLease,
    effects: String,
}

impl EngineLease for PgEngineLease {
    fn downstream_key(&self) -> DownstreamKey {
        self.lease.downstream_key()
    }

    fn attempt(&self) -> u32 {
        self.lease.attempt()
    }

    fn takeover_of(&self) -> Option<u32> {
        self.lease.takeover_of()
    }

    fn deadline(&self) -> Timestamp {
        self.lease.deadline()
    }

    fn heartbeat(&mut self) -> Result<Timestamp, Error> {
        self.lease.heartbeat()
    }

    fn complete(self, response: Response) -> Result<Response, Error> {
        self.lease.complete(response)
    }

    fn fail(self, response: Response) -> Result<Response, Error> {
        self.lease.fail(response)
    }

    fn complete_with(self, behavior: &Behavior) -> Result<Response, Error> {
        let effects = self.effects;
        self.lease.complete_with(|tx| run(tx, behavior, &effects))
    }

    fn release(self) -> Result<(), Error> {
        self.lease.release()
    }
}
