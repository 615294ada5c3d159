//! The PostgreSQL engine under the schedule language (`lockstep.rs`'s [`Engine`]): a
//! [`PgStore`] on a schema of its own ([`PgDatabase`]), deciding at the shared manual clock
//! (`PgStoreBuilder::clock`) instead of the server's. Effects are counted in the caller's table
//! `{schema}.effects`, bumped with SQL in the store's transaction and read on a direct
//! connection.
//!
//! A reopen is a new `PgStore` on the same schema, as another process would open it. A crash:
//! every commit the dying store still attempts is lost (the white-box commit hook terminates the
//! backend before its `COMMIT` runs), so dropping its leases releases nothing; then a new store
//! opens on what was committed, which is everything acknowledged (the server owns durability).

use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem::clock::ManualClock;
use idem::format::{Record, State};
use idem::postgres::{CommitLoss, PgLease, PgStore, PgStoreBuilder, PgTx};
use idem::{Abort, Error, Request, Response};

use super::lockstep::{Answer, Engine, Observed};
use super::schedule::{
    CLIENTS, End, FORGET_MS, INTENTS, LEASE_MS, RESPONSE_MS, RETRY_AFTER_CAP, SWEEP_BATCH, T0, key,
    label, scope,
};

/// The test server's URL, or `None` (after saying why) when this machine has none and
/// PostgreSQL tests are not required: the convention of `tests/common/pg.rs` (`IDEM_REQUIRE_PG`
/// or `CI` set makes a missing URL a failure).
pub fn pg_url(what: &str) -> Option<String> {
    match std::env::var("IDEM_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required =
                std::env::var_os("IDEM_REQUIRE_PG").is_some() || std::env::var_os("CI").is_some();
            assert!(
                !required,
                "{what}: IDEM_PG_URL is not set but PostgreSQL tests are required here (IDEM_REQUIRE_PG or CI): \
                 start a server with `eval \"$(scripts/pg-test-cluster start)\"`"
            );
            eprintln!(
                "{what}: skipped: IDEM_PG_URL is not set; run `eval \"$(scripts/pg-test-cluster start)\"` to run it"
            );
            None
        }
    }
}

/// `url` with `synchronous_commit` off for every connection made with it: a commit returns
/// before its WAL record is flushed. The server sees and orders every commit exactly as with
/// the flush (visibility, locks and conflicts are unchanged); only a crash of the server itself
/// could lose the last commits, and this harness never crashes the server. Without the flush a
/// commit takes a tenth of a millisecond instead of several (the flush was most of an input's
/// time).
fn without_commit_wait(url: &str) -> String {
    const OPTION: &str = "-c synchronous_commit=off";
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}options=-c%20synchronous_commit%3Doff")
    } else {
        format!("{url} options='{OPTION}'")
    }
}

/// Schemas of this harness are named `{PREFIX}{pid}`.
const PREFIX: &str = "fz_engines_agree_";

/// One schema of the test server for this process's inputs, emptied before each input, a
/// direct connection to it, and the store instances on it that no input is using. The
/// connection's `application_name` is the schema's name: a schema of this harness that no
/// connection names belongs to a process that is gone (a fuzzer stopped or crashed), and is
/// dropped when the next process starts.
///
/// Every store is opened with the process's one clock ([`PgDatabase::clock`]), which each input
/// sets back to its start. A store an input is done with (at a reopen, a crash, or the end) is
/// kept, and the next store an input opens is one of those kept if there is one: opening a
/// `PgStore` (connecting, checking the schema, connecting its pool) costs more than the rest of
/// a reopen step. Nothing of a store's use reaches its next: no lease of it is left (they are
/// dropped first), its token counter goes on (tokens stay unique), a crash's commit hook is
/// removed, and the rules decide from the rows alone; for the server it is another session
/// like a new process's.
pub struct PgDatabase {
    url: String,
    schema: String,
    client: Mutex<postgres::Client>,
    clock: ManualClock,
    /// The schema and its tables exist.
    created: AtomicBool,
    /// Stores on the schema no input is using.
    idle: Mutex<Vec<PgStore>>,
}

impl PgDatabase {
    /// Connects to `url`; a server that does not answer fails.
    pub fn connect(url: String) -> PgDatabase {
        let url = without_commit_wait(&url);
        let schema = format!("{PREFIX}{}", std::process::id());
        let mut config = postgres::Config::from_str(&url)
            .unwrap_or_else(|e| panic!("IDEM_PG_URL does not parse: {e}"));
        config.application_name(&schema);
        let mut client = config
            .connect(postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to the test PostgreSQL server: {e}"));
        let stale = client
            .query(
                "SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, $1) \
                 AND nspname NOT IN (SELECT application_name FROM pg_stat_activity \
                                     WHERE application_name IS NOT NULL)",
                &[&PREFIX],
            )
            .expect("list this harness's schemas");
        for row in stale {
            let name: String = row.get(0);
            // Another process starting at once may drop it first.
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
        }
        PgDatabase {
            url,
            schema,
            client: Mutex::new(client),
            clock: ManualClock::new(T0),
            created: AtomicBool::new(false),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The clock of every store of this database.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<PgStore>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A store on the schema that no input is using (one kept, or a new one).
    fn take(&self) -> PgStore {
        let kept = self.idle().pop();
        kept.unwrap_or_else(|| {
            self.builder()
                .open()
                .unwrap_or_else(|e| panic!("the store must open: {e}"))
        })
    }

    /// Keeps `store`, none of whose leases is left, for a later [`PgDatabase::take`].
    fn retire(&self, store: PgStore) {
        store.on_commit(|_| None);
        self.idle().push(store);
    }

    fn client(&self) -> std::sync::MutexGuard<'_, postgres::Client> {
        // A poisoned lock only means an input panicked; the connection is still usable.
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn effects_table(&self) -> String {
        format!("{}.effects", self.schema)
    }

    /// The store settings of the schedule language, on this schema, at the process's clock.
    fn builder(&self) -> PgStoreBuilder {
        PgStore::builder(&self.url)
            .schema(&self.schema)
            .clock(self.clock.clone())
            // The schedule is single-threaded: one writer lane, one connection for it.
            .writers(1)
            .lease_duration(Duration::from_millis(LEASE_MS))
            .retention(Duration::from_millis(RESPONSE_MS))
            .tombstone_horizon(Duration::from_millis(FORGET_MS))
            .retry_after_cap(RETRY_AFTER_CAP)
            .sweep_batch(SWEEP_BATCH)
    }

    /// Empties every table of the schema (creating it first if needed): an input starts on a
    /// database that holds nothing.
    pub fn empty(&self) {
        if !self.created.load(Ordering::SeqCst) {
            let creator = self
                .builder()
                .open()
                .unwrap_or_else(|e| panic!("create the schema {}: {e}", self.schema));
            self.retire(creator);
            self.client()
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {} (label text PRIMARY KEY, n bigint NOT NULL)",
                    self.effects_table()
                ))
                .expect("create the effects table");
            self.created.store(true, Ordering::SeqCst);
        }
        let s = &self.schema;
        self.client()
            .batch_execute(&format!(
                "DELETE FROM {s}.records_v1; DELETE FROM {s}.marks_v1; DELETE FROM {s}.outbox_v1;
                 DELETE FROM {s}.outbox_keys_v1; DELETE FROM {s}.outbox_dead_v1;
                 DELETE FROM {s}.versions_v1; DELETE FROM {s}.effects;"
            ))
            .expect("empty the schema");
    }

    /// Drops the schema (a later [`PgDatabase::empty`] creates it again).
    pub fn drop_schema(&self) {
        self.idle().clear();
        self.client()
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .expect("drop the schema");
        self.created.store(false, Ordering::SeqCst);
    }
}

pub struct PgEngine {
    db: &'static PgDatabase,
    /// `None` only inside `reopen`/`crash`.
    store: Option<PgStore>,
    leases: Vec<Option<PgLease>>,
    /// The statement that bumps one effect counter.
    bump: String,
}

impl PgEngine {
    /// A store on `db`'s schema, which must be empty ([`PgDatabase::empty`]), at `db`'s clock.
    pub fn open(db: &'static PgDatabase) -> PgEngine {
        let bump = format!(
            "INSERT INTO {} AS e (label, n) VALUES ($1, 1) \
             ON CONFLICT (label) DO UPDATE SET n = e.n + 1",
            db.effects_table()
        );
        PgEngine {
            db,
            store: Some(db.take()),
            leases: (0..CLIENTS).map(|_| None).collect(),
            bump,
        }
    }

    fn store(&self) -> &PgStore {
        self.store.as_ref().expect("store is open between steps")
    }

    fn lease(&mut self, client: usize) -> PgLease {
        self.leases[client]
            .take()
            .expect("the runner gives a lease call only to a client holding one")
    }
}

/// Bumps `label` in the caller's table, in the store's transaction.
fn bump(tx: &mut PgTx<'_>, sql: &str, label: &str) -> Result<(), Abort> {
    let statement = tx.prepare(sql)?;
    tx.execute(&statement, &[&label])?;
    Ok(())
}

/// The closure of `execute` and `complete_with`: bumps `label`, then ends as `end` says.
fn closure<'a>(
    sql: &'a str,
    label: &'a str,
    end: End,
    response: &'a Response,
    runs: &'a mut u32,
) -> impl for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort> + 'a {
    move |tx| {
        *runs += 1;
        match end {
            End::Ok => {
                bump(tx, sql, label)?;
                Ok(response.clone())
            }
            End::Terminal => Err(Abort::Terminal(response.clone())),
            End::Retryable => Err(Abort::retryable("sim: try again")),
        }
    }
}

/// The rows of each statement of `query`, in one round trip (the simple query protocol: text
/// values).
fn results(client: &mut postgres::Client, query: &str) -> Vec<Vec<postgres::SimpleQueryRow>> {
    let mut results = vec![Vec::new()];
    for message in client
        .simple_query(query)
        .unwrap_or_else(|e| panic!("{query}: {e}"))
    {
        match message {
            postgres::SimpleQueryMessage::Row(row) => {
                results.last_mut().expect("a result").push(row)
            }
            postgres::SimpleQueryMessage::CommandComplete(_) => results.push(Vec::new()),
            _ => {}
        }
    }
    results.pop();
    results
}

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The derived state column of `records_v1` (docs/POSTGRES.md, "Tables").
fn state_code(state: &State) -> i16 {
    match state {
        State::Pending { .. } => 0,
        State::Completed(_) => 1,
        State::Failed(_) => 2,
        State::Tombstone(_) => 3,
    }
}

impl Engine for PgEngine {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn execute(
        &mut self,
        request: Request,
        label: &str,
        end: End,
        response: &Response,
    ) -> (Answer, u32) {
        let mut runs = 0;
        let result = self.store().execute(
            request,
            closure(&self.bump, label, end, response, &mut runs),
        );
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
        let result = lease.complete_with(closure(&self.bump, label, end, response, &mut runs));
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

    /// Another store instance on the schema (taken before this one is kept: never itself).
    fn reopen(&mut self) {
        assert!(self.leases.iter().all(Option::is_none), "leases dropped");
        let next = self.db.take();
        let done = self
            .store
            .replace(next)
            .expect("store is open between steps");
        self.db.retire(done);
    }

    fn crash(&mut self) {
        let next = self.db.take();
        let dying = self
            .store
            .replace(next)
            .expect("store is open between steps");
        // Nothing the dying process still tries to commit lands: the leases' drop tries to
        // release them, and fails quietly.
        dying.on_commit(|_| Some(CommitLoss::BeforeItRuns));
        for slot in &mut self.leases {
            drop(slot.take());
        }
        self.db.retire(dying);
    }

    fn crash_in_closure(&mut self, request: Request, label: &str) -> (Answer, u32) {
        let store = self.store().clone();
        let sql = &self.bump;
        let mut runs = 0;
        let result = store.execute(request, |tx| {
            runs += 1;
            bump(tx, sql, label)?;
            // The process dies before the transaction's COMMIT runs.
            store.on_commit(|_| Some(CommitLoss::BeforeItRuns));
            Ok(Response::new(201, "never acknowledged"))
        });
        match result {
            // The connection failed while the commit was in flight (docs/POSTGRES.md).
            Err(Error::OutcomeUnknown { .. }) => (Answer::Unacknowledged, runs),
            other => (Answer::of_outcome(other), runs),
        }
    }

    /// Besides the records and effects: the derived columns of every record row are the
    /// record's own (state, the sweep's `due` instant, the Pending holder), and no row exists but
    /// the intents' records. The effects and the rows are read in one round trip.
    fn observe(&self) -> Observed {
        let store = self.store();
        let records: Vec<Option<Record>> = (0..INTENTS.len())
            .map(|i| {
                store
                    .get(&scope(i), key(i))
                    .unwrap_or_else(|e| panic!("get {}: {e}", label(i)))
            })
            .collect();
        let q = format!(
            "SELECT label, n::text FROM {}; \
             SELECT state::text, due::text, encode(holder, 'hex'), encode(record, 'hex') FROM {}.records_v1",
            self.db.effects_table(),
            self.db.schema
        );
        let results = results(&mut self.db.client(), &q);
        let [effects, rows] = &results[..] else {
            panic!("two statements give two results: {}", results.len());
        };
        let effects = effects
            .iter()
            .map(|row| {
                let n = row.get(1).and_then(|n| n.parse().ok()).expect("a count");
                (row.get(0).expect("a label").to_owned(), n)
            })
            .collect();
        for row in rows {
            let bytes = row.get(3).map(from_hex).expect("a record");
            let record = Record::decode(&bytes).expect("a stored record decodes");
            let state: Option<i16> = row.get(0).and_then(|s| s.parse().ok());
            let due: Option<u64> = row.get(1).and_then(|s| s.parse().ok());
            assert_eq!(
                state,
                Some(state_code(&record.state)),
                "state column of {record:?}"
            );
            assert_eq!(
                due,
                Some(idem::rules::sweep_due(&record).0),
                "due column of {record:?}"
            );
            let pending = match &record.state {
                State::Pending { holder, .. } => Some(holder.0.to_vec()),
                _ => None,
            };
            assert_eq!(
                row.get(2).map(from_hex),
                pending,
                "holder column of {record:?}"
            );
        }
        let stored = records.iter().flatten().count();
        assert_eq!(rows.len(), stored, "rows of records_v1");
        Observed { records, effects }
    }

    fn close(self: Box<Self>) {
        let PgEngine {
            db, store, leases, ..
        } = *self;
        drop(leases);
        db.retire(store.expect("store is open"));
    }
}
