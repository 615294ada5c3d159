//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::*;

/// A small payments service on idem's Idempotency-Key layer, on one embedded store file.
///
/// Exit status: 0 stopped cleanly; 1 could not start; 2 bad command line; 3 the shutdown grace
/// period ran out and requests in flight were cut off.
#[derive(Parser, Debug)]
// The usage names the service as its log lines do, whatever the executable is called.
#[command(name = "edge_service", bin_name = "edge_service")]
pub struct Args {
    /// Directory of the store file DIR/idem.redb (created if missing).
    #[arg(long, value_name = "DIR", default_value = "data")]
    pub data: PathBuf,
    /// Address to listen on; port 0 picks a free one (the address is printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// How long a request cut off by a crash (kill -9) blocks its key before a retry takes it
    /// over, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_ms: u64,
    /// A client must send a request's headers within this many milliseconds (also the limit
    /// for an idle keep-alive connection), or the connection is closed.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,
    /// A request body must arrive completely within this many milliseconds after the headers,
    /// or the request is answered 400 and the connection closed.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,
    /// A request not answered within this many milliseconds is answered 503 + Retry-After (a
    /// payment that had started still completes; a retry with the same key gets its answer).
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,
    /// On SIGTERM or ctrl-c: how many milliseconds requests in flight may take to finish before
    /// they are cut off (exit status 3).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub grace_ms: u64,
    /// Run on this PostgreSQL database instead of the store file (e.g.
    /// postgresql://app@db/payments): every replica started with the same URL and schema shares
    /// the keys, the payments and the outbox. Needs the `postgres` feature.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// With --postgres: the PostgreSQL schema of idem's tables and the service's own.
    #[arg(long, value_name = "NAME", default_value = "edge_service")]
    pub pg_schema: String,
}

impl Args {
    /// The timeouts these flags set.
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            header: Duration::from_millis(self.header_timeout_ms),
            body: Duration::from_millis(self.body_timeout_ms),
            request: Duration::from_millis(self.request_timeout_ms),
            grace: Duration::from_millis(self.grace_ms),
        }
    }
}

/// Exit status when the grace period ran out with requests in flight.
pub const EXIT_GRACE_EXPIRED: u8 = 3;
