//! The transaction handle given to the caller's closure on PostgreSQL: [`PgTx`].

use std::cell::{Cell, RefCell};

use postgres::types::ToSql;
use postgres::{Row, Statement, ToStatement};

use crate::error::{Error, StorageError};
use crate::model::clock::Timestamp;
use crate::model::outbox::Origin;
use crate::model::response::Abort;
use crate::postgres::conn::{Conn, Failure, classify};
use crate::postgres::schema::Sql;

/// The open PostgreSQL transaction that will also commit the idempotency record. Run your own
/// statements through it: their writes and the record commit together or not at all.
///
/// It offers the statement methods of `postgres::Client` (`execute`, `query`, `query_one`,
/// `query_opt`, `batch_execute`, `prepare`) but no way to commit or roll back: the
/// store ends the transaction. A statement that fails makes the server refuse the rest of the
/// transaction: return its error (`?` turns a `postgres::Error` into [`Abort::Store`]); if the
/// closure swallows it and returns `Ok` anyway, nothing is recorded and the call fails with
/// that error, so an intent never counts as done with part of its writes missing. Do not issue
/// `COMMIT`, `ROLLBACK` or `SAVEPOINT` yourself.
///
/// idem's own tables live in their own PostgreSQL schema (`idem` by default): do not write them
/// through this handle.
pub struct PgTx<'t> {
    conn: &'t mut Conn,
    sql: &'t Sql,
    now: Timestamp,
    origin: Origin<'t>,
    state: &'t TxState,
}

/// What a closure's run did, kept outside the handle so the engine reads it after the closure
/// returned.
#[derive(Default)]
pub(crate) struct TxState {
    /// Work announced (outbox pushes), numbered within this run.
    announced: Cell<u32>,
    /// The first statement that failed in this run.
    failed: RefCell<Option<Error>>,
}

impl TxState {
    /// The failure of the run's first failed statement, if any.
    pub(crate) fn take_failure(&self) -> Option<Error> {
        self.failed.borrow_mut().take()
    }

    /// Whether the run announced work.
    pub(crate) fn announced(&self) -> bool {
        self.announced.get() > 0
    }
}

impl<'t> PgTx<'t> {
    pub(crate) fn new(
        conn: &'t mut Conn,
        sql: &'t Sql,
        now: Timestamp,
        origin: Origin<'t>,
        state: &'t TxState,
    ) -> Self {
        PgTx {
            conn,
            sql,
            now,
            origin,
            state,
        }
    }

    /// The store's time at which this transaction decided to run (the database server's).
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// Executes a statement, returning the number of rows modified (see
    /// `postgres::Client::execute`).
    pub fn execute<T>(
        &mut self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        let r = self.conn.client.execute(statement, params);
        self.note(r)
    }

    /// Executes a statement, returning its rows.
    pub fn query<T>(
        &mut self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        let r = self.conn.client.query(statement, params);
        self.note(r)
    }

    /// Executes a statement that returns exactly one row.
    pub fn query_one<T>(
        &mut self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        let r = self.conn.client.query_one(statement, params);
        self.note(r)
    }

    /// Executes a statement that returns zero or one row.
    pub fn query_opt<T>(
        &mut self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        let r = self.conn.client.query_opt(statement, params);
        self.note(r)
    }

    /// Executes statements given as one text, with no parameters (see
    /// `postgres::Client::batch_execute`).
    pub fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error> {
        let r = self.conn.client.batch_execute(sql);
        self.note(r)
    }

    /// A prepared statement for `query`, prepared once per pooled connection and reused (the
    /// round trip of preparing is paid once).
    pub fn prepare(&mut self, query: &str) -> Result<Statement, postgres::Error> {
        let r = self.conn.prepared(query);
        self.note(r)
    }

    /// Records a failed statement: the transaction is now refused by the server.
    fn note<T>(&mut self, r: Result<T, postgres::Error>) -> Result<T, postgres::Error> {
        if let Err(e) = &r {
            self.failed(e);
        }
        r
    }

    fn failed(&mut self, e: &postgres::Error) {
        self.conn.saw(e);
        let mut failed = self.state.failed.borrow_mut();
        if failed.is_none() {
            *failed = Some(statement_failed(e));
        }
    }

    // ---- for the layers built on the engine (the outbox, version marks) ----

    pub(crate) fn sql(&self) -> &Sql {
        self.sql
    }

    pub(crate) fn origin(&self) -> Origin<'t> {
        self.origin
    }

    /// Announces one piece of work (an outbox event) and numbers it within this run.
    pub(crate) fn announce(&self) -> u32 {
        let n = self.state.announced.get();
        self.state.announced.set(n.saturating_add(1));
        n
    }

    /// Runs one of idem's own statements in this transaction: a failure is this run's failure
    /// like a caller's statement.
    pub(crate) fn own<T>(
        &mut self,
        run: impl FnOnce(&mut Conn) -> Result<T, postgres::Error>,
    ) -> Result<T, Error> {
        let r = run(self.conn);
        match r {
            Ok(v) => Ok(v),
            Err(e) => {
                self.failed(&e);
                Err(statement_failed(&e))
            }
        }
    }
}

/// The error a run fails with after statement `e` failed: the server's own error, whose code
/// says whether a re-run helps (a serialization failure or a deadlock is retried inside).
fn statement_failed(e: &postgres::Error) -> Error {
    // postgres::Error is not Clone: keep its text and code where they matter.
    let retry = classify(e) == Failure::Retry;
    Error::Storage {
        source: StorageError::new(StatementFailed {
            message: describe(e),
            retry,
        }),
    }
}

/// A client error with the server's own words (`postgres::Error`'s display is only "db error"):
/// severity, message and SQLSTATE, and the detail on a second line.
pub(crate) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut text = format!(
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            );
            // On a line of its own: a detail may quote row values, which a redacted display
            // (the observability warnings) leaves out by keeping the first line only.
            if let Some(detail) = db.detail() {
                text.push_str("\nDETAIL: ");
                text.push_str(detail);
            }
            text
        }
        None => e.to_string(),
    }
}

/// A statement of a closure's transaction that failed.
#[derive(Debug)]
pub(crate) struct StatementFailed {
    message: String,
    /// A re-run fixes it (serialization failure, deadlock).
    pub(crate) retry: bool,
}

impl std::fmt::Display for StatementFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a statement in the transaction failed, so the server refused the rest of it: {}",
            self.message
        )
    }
}

impl std::error::Error for StatementFailed {}

/// `?` on a `postgres::Error` in a caller's closure gives [`Abort::Store`]: nothing of the run
/// is kept (a serialization failure or deadlock re-runs it inside the store).
impl From<postgres::Error> for Abort {
    fn from(e: postgres::Error) -> Self {
        Abort::Store(statement_failed(&e))
    }
}
