//! Connections: the pool's connection manager (one `postgres::Client` per connection, with a
//! statement cache), what a failure of the server or of the connection means for the caller
//! ([`Failure`]), and the literals the batched statements inline.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement};

use crate::error::{Error, StorageError};

/// One pooled connection: the client and the statements prepared on it.
pub(crate) struct Conn {
    pub(crate) client: OwnedClient,
    statements: HashMap<String, Statement>,
    /// A connection-level failure was seen on it: the pool discards it instead of reusing it.
    broken: bool,
}

impl Conn {
    /// The statement for `sql`, prepared once per connection.
    pub(crate) fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Notes a failure met on this connection; a connection-level one retires it.
    pub(crate) fn saw(&mut self, e: &postgres::Error) {
        if matches!(classify(e), Failure::Connection) {
            self.broken = true;
        }
    }

    /// Retires this connection (the pool opens a new one).
    pub(crate) fn retire(&mut self) {
        self.broken = true;
    }

    /// Whether this connection is retired or closed.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken || self.client.is_closed()
    }
}

/// The pool's connection manager: connects with the configured settings and sets the session
/// up (hex bytea output, which the batched statements parse; an application name for
/// `pg_stat_activity`).
#[derive(Debug)]
pub(crate) struct Manager {
    pub(crate) config: postgres::Config,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Conn, postgres::Error> {
        let mut client = self.config.connect(NoTls)?;
        client.batch_execute("SET bytea_output = 'hex'; SET application_name = 'idem'")?;
        Ok(Conn {
            client: OwnedClient(Some(client)),
            statements: HashMap::new(),
            broken: false,
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), postgres::Error> {
        conn.client.simple_query("").map(|_| ())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.is_broken()
    }
}

/// A `postgres::Client` that is closed on a thread of its own when dropped. The synchronous
/// client runs a runtime of its own and blocks on it to close: dropped inside an async task (a
/// store dropped by a tokio handler, at shutdown) that would panic ("cannot start a runtime from
/// within a runtime"), so the close never runs on the dropping thread.
pub(crate) struct OwnedClient(Option<Client>);

impl std::ops::Deref for OwnedClient {
    type Target = Client;

    #[allow(clippy::expect_used)]
    fn deref(&self) -> &Client {
        // Invariant: the client is `Some` from construction until `drop` takes it.
        self.0
            .as_ref()
            .expect("the client is present until dropped")
    }
}

impl std::ops::DerefMut for OwnedClient {
    #[allow(clippy::expect_used)]
    fn deref_mut(&mut self) -> &mut Client {
        // Invariant: the client is `Some` from construction until `drop` takes it.
        self.0
            .as_mut()
            .expect("the client is present until dropped")
    }
}

impl Drop for OwnedClient {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            // If no thread can be started, the client closes here (outside an async task that
            // is harmless; inside one, losing the close beats a panic in a destructor).
            let _ = std::thread::Builder::new()
                .name("idem-pg-close".into())
                .spawn(move || drop(client));
        }
    }
}

/// What a failed statement means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The server refused the transaction in a way a re-run fixes: a serialization failure
    /// (40001), a deadlock (40P01), a lock that could not be taken (55P03), or a row another
    /// transaction inserted first (23505 on idem's own tables: the re-run reads it).
    Retry,
    /// The connection failed (closed, broken, the server shutting down or terminating the
    /// backend): whatever was sent last may or may not have happened.
    Connection,
    /// Any other error the server answered: the statement did not happen.
    Refused,
}

/// Classifies a client error.
pub(crate) fn classify(e: &postgres::Error) -> Failure {
    if e.is_closed() {
        return Failure::Connection;
    }
    let Some(db) = e.as_db_error() else {
        // I/O, protocol, a closed connection (or a client-side conversion, which never reached
        // the server): treat the connection as gone; retiring a healthy one costs a reconnect.
        return Failure::Connection;
    };
    let code = db.code();
    let class = &code.code()[..2];
    if matches!(db.severity(), "FATAL" | "PANIC") || class == "08" || class == "57" {
        return Failure::Connection;
    }
    if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || (*code == SqlState::UNIQUE_VIOLATION && db.table().is_some_and(is_idem_table))
        || db.message().contains(FENCE_MARK)
    {
        return Failure::Retry;
    }
    Failure::Refused
}

/// Whether a table name is one of idem's (every one ends in its layout version).
fn is_idem_table(table: &str) -> bool {
    matches!(
        table,
        "records_v1"
            | "marks_v1"
            | "outbox_v1"
            | "outbox_keys_v1"
            | "outbox_dead_v1"
            | "versions_v1"
    )
}

/// The text of the error the batched commit raises when a fenced write did not match the rows
/// it locked: it makes the server refuse the transaction before its `COMMIT` runs.
pub(crate) const FENCE_MARK: &str = "idem: a fenced write did not match its locked rows";

/// A client error as the crate's storage error.
pub(crate) fn storage(e: postgres::Error) -> Error {
    Error::Storage {
        source: StorageError::new(e),
    }
}

/// A client error at the commit: an unknown outcome if the connection failed, a plain storage
/// error (nothing committed) if the server answered.
pub(crate) fn at_commit(e: postgres::Error) -> Error {
    match classify(&e) {
        Failure::Connection => Error::OutcomeUnknown {
            source: StorageError::new(e),
        },
        Failure::Retry | Failure::Refused => storage(e),
    }
}

/// A pool that could not give a connection in time.
pub(crate) fn no_connection(e: r2d2::Error, waited: Duration) -> Error {
    Error::Storage {
        source: StorageError::new(PoolError(format!(
            "no PostgreSQL connection within {waited:?} ({e}): the server is unreachable or every pooled connection is busy; check the server, or raise the pool size"
        ))),
    }
}

/// Why the pool gave no connection.
#[derive(Debug)]
pub(crate) struct PoolError(pub(crate) String);

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PoolError {}

/// `bytes` as a PostgreSQL bytea literal (`'\x0a1b…'::bytea`): hex digits only, so nothing a
/// caller supplies can end the literal.
pub(crate) fn bytea(out: &mut String, bytes: &[u8]) {
    out.push_str("'\\x");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push_str("'::bytea");
}

/// Decodes a bytea value in PostgreSQL's hex output format (`\x0a1b…`).
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.strip_prefix("\\x")?;
    if digits.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    digits
        .as_bytes()
        .chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// The server's current time in milliseconds since the Unix epoch, as SQL.
pub(crate) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::int8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytea_literals_round_trip_and_contain_only_hex() {
        for bytes in [&b""[..], b"\x00\xff'\\", b"idem"] {
            let mut lit = String::new();
            bytea(&mut lit, bytes);
            assert!(lit.starts_with("'\\x") && lit.ends_with("'::bytea"));
            let inner = &lit[3..lit.len() - 8];
            assert!(inner.bytes().all(|c| c.is_ascii_hexdigit()));
            assert_eq!(unhex(&format!("\\x{inner}")).unwrap(), bytes);
        }
        assert_eq!(unhex("\\x0"), None);
        assert_eq!(unhex("\\xzz"), None);
        assert_eq!(unhex("0a"), None);
    }
}
