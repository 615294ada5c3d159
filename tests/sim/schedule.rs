//! The schedule language of `claim_race` and `engines_agree`: what an input decodes to (a list
//! of [`Op`]s of K logical clients over a few intents), and the fixed settings every store of
//! these targets is opened with. Changing the decoding invalidates both checked-in corpora.

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use idem::{Request, Scope, Timestamp};

pub const T0: Timestamp = Timestamp(1_700_000_000_000);
pub const LEASE_MS: u64 = 10_000;
pub const RESPONSE_MS: u64 = 60_000;
pub const FORGET_MS: u64 = 120_000;
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(1);
pub const SWEEP_BATCH: usize = 2;
pub const CLIENTS: usize = 3;
pub const MAX_STEPS: usize = 64;

/// (tenant, operation, key): two tenants share a key name, two operations share a tenant.
pub const INTENTS: [(&str, &str, &str); 4] = [
    ("t1", "pay", "k1"),
    ("t1", "pay", "k2"),
    ("t2", "pay", "k1"),
    ("t1", "refund", "k1"),
];

/// Clock moves, in milliseconds: around every boundary of the lease, response window and horizon.
pub const FORWARD_MS: [u64; 16] = [
    1, 500, 999, 1_000, 5_000, 9_999, 10_000, 10_001, 30_000, 59_999, 60_000, 60_001, 119_999,
    120_000, 120_001, 200_000,
];
pub const BACKWARD_MS: [u64; 3] = [1, 1_000, 10_000];

/// How a closure ends.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum End {
    Ok,
    Terminal,
    Retryable,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Op {
    Execute {
        client: u8,
        intent: u8,
        payload: bool,
        end: End,
    },
    Begin {
        client: u8,
        intent: u8,
        payload: bool,
    },
    Complete {
        client: u8,
        end: End,
    },
    Fail {
        client: u8,
    },
    Heartbeat {
        client: u8,
    },
    Release {
        client: u8,
    },
    DropLease {
        client: u8,
    },
    Purge {
        intent: u8,
    },
    Forward(u8),
    Backward(u8),
    Sweep,
    Reopen,
    Crash,
    /// The process dies while an executing closure runs: nothing of it may survive.
    CrashInClosure {
        intent: u8,
        payload: bool,
    },
}

/// The schedule an input decodes to: at most [`MAX_STEPS`] ops, up to the first byte string
/// that does not decode.
pub fn ops(data: &[u8]) -> Vec<Op> {
    let mut u = Unstructured::new(data);
    let mut ops = Vec::new();
    while ops.len() < MAX_STEPS && !u.is_empty() {
        let Ok(op) = Op::arbitrary(&mut u) else {
            break;
        };
        ops.push(op);
    }
    ops
}

pub fn client_index(client: u8) -> usize {
    usize::from(client) % CLIENTS
}

pub fn intent_index(intent: u8) -> usize {
    usize::from(intent) % INTENTS.len()
}

pub fn forward(i: u8) -> Duration {
    Duration::from_millis(FORWARD_MS[usize::from(i) % FORWARD_MS.len()])
}

pub fn backward(i: u8) -> u64 {
    BACKWARD_MS[usize::from(i) % BACKWARD_MS.len()]
}

pub fn scope(intent: usize) -> Scope {
    let (tenant, operation, _) = INTENTS[intent];
    Scope::new(tenant, operation)
}

pub fn key(intent: usize) -> &'static str {
    INTENTS[intent].2
}

pub fn request(intent: usize, payload: bool) -> Request {
    Request::from_canonical_bytes(scope(intent), key(intent), &[u8::from(payload)])
}

/// The intent's name, and its effect counter's label.
pub fn label(intent: usize) -> String {
    let (tenant, operation, key) = INTENTS[intent];
    format!("{tenant}/{operation}/{key}")
}

pub fn ts(t: Timestamp, ms: u64) -> Timestamp {
    Timestamp(t.0.saturating_add(ms))
}

/// The `retry_after` an in-flight answer at `now` gives for a lease ending at `deadline`.
pub fn retry_after(deadline: Timestamp, now: Timestamp) -> Duration {
    Duration::from_millis(deadline.0.saturating_sub(now.0))
        .min(RETRY_AFTER_CAP)
        .max(Duration::from_millis(1))
}
