//! `http_layer`: sequences of HTTP requests through [`IdempotencyLayer`] (feature `http`) around
//! an axum router whose handler counts what it does, on one thread, against a reference model
//! written from docs/HTTP.md and docs/FORMAT.md (it calls nothing of `src/http` to predict).
//!
//! The input is a schedule for three clients: send a request (method, route, query,
//! `Idempotency-Key` field lines — one or two, quoted, bare, with whitespace, a list,
//! parameters, too long, any bytes —, tenant field lines, `Content-Type` lines — JSON labels in
//! odd casing and with parameters, other types, none, two —, a body — JSON spelled several
//! ways, a member name twice, numbers a double cannot hold, not UTF-8, cut short, empty, over
//! 64 KiB, over the layer's body limit, any bytes —, delivered whole, in chunks with a pending
//! poll before each, failing part way, with a declared length), poll a client's response
//! future, drop it (a client that goes away, at any poll), let a parked handler answer, and
//! move the clock (by fixed amounts, or to a record's lease deadline, end of its response window
//! or forget instant, give or take 1 ms). The handler's answer is part of the schedule too:
//! status, body (small, empty, over the store's 64 KiB answer cap), `Content-Type`, `Location`,
//! whether it waits for the schedule to let it go, and how it ends (plain, panic, a response
//! body that fails, or [`IdempotencyHandle::complete_with`] with an effect written in its
//! transaction: ok, terminal, retryable, panic). The layer's own settings come from the input
//! too: how bodies compare (by label, raw, canonical JSON) and what a missing key gets.
//!
//! Invariants, each checked as it happens:
//! - **the handler runs at most once per (tenant, operation, key) while the record lives**: a
//!   handler may start only for the request that holds the key's claim, and only once; the
//!   model forgets a key when its record's window ends (a finished answer after the tombstone
//!   horizon, a claim or lease at its forget instant) or when the key is released (503, a
//!   rolled-back `complete_with`, a request dropped before its handler started);
//! - **a replay is byte-identical** to the first answer: status, the replayed headers
//!   (`Content-Type`, `Location`; nothing else but `Idempotent-Replayed`), body; an answer
//!   over the cap replays status and `Location` with an empty body and
//!   `Idempotent-Body-Omitted`; after the response window, status and `Location` only;
//! - **a different request under a live key is 422** `key-reused-with-different-request`;
//! - **every refusal the layer makes is `application/problem+json`** with the documented
//!   `type`, `status`, `title` and `detail` (and `Retry-After` on 409 and 503), and any
//!   problem answer anyone sends carries one of the documented types;
//! - the first answer a client gets is the handler's, as it returned it; a running handler's
//!   lease is never lapsed after a step (heartbeats, docs/HTTP.md, "Handlers longer than the
//!   lease"); a recorded answer's windows are the documented ones (retention from the finish,
//!   tombstone horizon); an effect written through `complete_with` commits exactly when its
//!   answer is recorded; no request is left unanswered once every handler is let go;
//! - no panic anywhere but the handler's own, which the layer must catch.
//!
//! Time. The store runs on a [`ManualClock`]; the runtime is tokio's current-thread runtime
//! with its clock paused, and every clock move of the schedule moves both by the same amount,
//! so the layer's heartbeats (every third of the lease, on tokio's clock) land where they
//! would. Blocking calls run on a pool of one thread. Each poll of a client's future runs
//! while a job of the harness holds that thread, so whatever the poll hands to the pool (a
//! store call) cannot finish inside the poll, and each step ends with a *settle*: a 1 ms sleep
//! on the paused clock, which tokio completes only once no task can run and no blocking call
//! is in flight. So a poll point is always the same point of the layer's flow and a run is a
//! function of its input. (A settle moves tokio's clock 1 ms ahead of the manual clock, so
//! heartbeats come a little early, never late.)
//!
//! Where the docs are silent, the model decides, as stated here:
//! - a request with a bad key *and* a bad tenant may be refused for either (the docs list both
//!   refusals but not their order); both come before the body, which is documented;
//! - the body part of the fingerprint follows docs/FORMAT.md: a body labelled JSON that has a
//!   canonical form compares by it (`idem-http-v1+jcs`), every other body by its bytes
//!   (`idem-http-v1`), so the same bytes without a canonical form are one request whether
//!   labelled JSON or not. Bodies the fuzzer writes itself may or may not be JSON: their
//!   comparison with another body is unknown to the model unless the bytes say it, and then
//!   either answer is accepted (a replay still must be byte-identical);
//! - a request dropped after its claim and before its handler started leaves the key free
//!   ("before the handler runs, nothing happened");
//! - a request whose claim lapsed and was taken over (or forgotten) while its future waited to
//!   be polled must not run its handler: it gets `409 request-in-flight`;
//! - heartbeat timing is the layer's: the model does not predict when a heartbeat lands, it
//!   reads a pending record's deadline and forget instant from the store after each step and
//!   requires the deadline to be ahead of the clock while the handler runs. A clock move past
//!   a pending record's forget instant ends the record (its lease is lost, its answer is not
//!   recorded, the key runs again), as it ends any record.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use arbitrary::Unstructured;
use axum::Router;
use axum::body::Body;
use axum::routing::any;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body::Frame;
use idem::clock::{Clock, ManualClock};
use idem::format::{HolderToken, Record, State};
use idem::http::{
    IDEMPOTENT_BODY_OMITTED, IDEMPOTENT_REPLAYED, IdempotencyHandle, IdempotencyLayer, MissingKey,
    PROBLEM_JSON, Recorded, problem,
};
use idem::{Abort, Scope, Store, Timestamp, Tx};
use tower::ServiceExt;

use super::effects::{all_effects, bump};

const T0: Timestamp = Timestamp(1_700_000_000_000);
const LEASE: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(600);
const HORIZON: Duration = Duration::from_secs(1200);
/// The store's answer cap (its default, stated).
const MAX_RESPONSE: usize = 64 * 1024;
/// The layer's request body limit: some generated bodies are over it.
const BODY_LIMIT: usize = 96 * 1024;
/// A handler's big answer: over the cap, so recorded without its body.
const BIG_ANSWER: usize = 70 * 1024;
const CLIENTS: usize = 3;
const MAX_STEPS: usize = 48;
/// How far tokio's paused clock moves to settle a step.
const SETTLE: Duration = Duration::from_millis(1);
/// Clock moves, in milliseconds: around a heartbeat interval, the lease, the response window
/// and the horizon.
const FORWARD_MS: [u64; 16] = [
    1, 1_000, 19_999, 20_000, 20_001, 59_999, 60_000, 60_001, 300_000, 599_999, 600_000, 600_001,
    1_199_999, 1_200_000, 1_200_001, 3_600_000,
];
const TENANT_HEADER: &str = "x-tenant-id";
const KEY_HEADER: &str = "idempotency-key";
/// The request's id in the schedule: how the handler finds what it is to do (not part of the
/// fingerprint, like any header not named in `fingerprint_headers`).
const REQ_HEADER: &str = "x-sim-req";
/// On every handler answer, never replayed (not in the default replay set).
const RUN_HEADER: &str = "x-run";
/// The documented problem types (docs/HTTP.md, "Answers").
const PROBLEM_TYPES: [&str; 12] = [
    problem::MISSING_KEY,
    problem::INVALID_KEY,
    problem::MISSING_TENANT,
    problem::INVALID_TENANT,
    problem::INVALID_OPERATION,
    problem::UNREADABLE_BODY,
    problem::BODY_TOO_LARGE,
    problem::IN_FLIGHT,
    problem::KEY_REUSED,
    problem::RETRY,
    problem::MISCONFIGURED,
    problem::STORE_FAILED,
];

/// JSON values with several spellings each (members in another order, other whitespace, other
/// notations of one number, escapes): every spelling of a value has the same RFC 8785 form,
/// and no two values share one.
const VALUES: &[&[&str]] = &[
    &[
        r#"{"amount":100,"currency":"EUR"}"#,
        r#"{"currency":"EUR","amount":100}"#,
        r#"{ "amount" : 100.0 , "currency" : "EUR" }"#,
        r#"{"amount":1e2,"currency":"\u0045UR"}"#,
        "\n{\"currency\":\"EUR\",\n\t\"amount\":10E1}\r\n",
    ],
    &[
        r#"{"amount":100,"currency":"USD"}"#,
        r#"{"currency":"USD","amount":100.00}"#,
    ],
    &[
        r#"{"amount":101,"currency":"EUR"}"#,
        r#"{"currency":"EUR","amount":1.01e2}"#,
    ],
    &[
        r#"{"items":[1,2,3],"note":"café/"}"#,
        r#"{"note":"caf\u00e9\/","items":[1.0,2,3e0]}"#,
    ],
    &[r#"{"items":[3,2,1],"note":"café/"}"#],
    &[
        r#"{"n":0}"#,
        r#"{"n":-0}"#,
        r#"{"n":0.0}"#,
        r#"{"n":-0.0e5}"#,
    ],
    &["{}", " { } "],
    &["[]", "[ ]"],
    &[r#""x""#, r#""\u0078""#],
    &[r#"{"Amount":100,"currency":"EUR"}"#],
    &[
        r#"{"nested":{"b":true,"a":null}}"#,
        r#"{"nested":{"a":null,"b":true}}"#,
    ],
    &[r#"{"amount":"100","currency":"EUR"}"#],
    &[r#"{"n":1e21}"#, r#"{"n":1000000000000000000000}"#],
    &[r#"{"n":9007199254740992}"#],
];

/// JSON the canonical form would blur, and text that is no JSON: compared by its bytes.
const NOT_CANONICAL: &[&[u8]] = &[
    br#"{"amount":100,"amount":100,"currency":"EUR"}"#,
    br#"{"a":1,"\u0061":2}"#,
    br#"[{"x":{"y":1,"y":2}}]"#,
    br#"{"amount":9007199254740993,"currency":"EUR"}"#,
    br#"{"amount":1e-400}"#,
    br#"{"amount":0.10000000000000000001}"#,
    br#"{"amount":18446744073709551617}"#,
    br#"{"amount":1e400}"#,
    br#"{"amount":9007199254740992.5}"#,
    b"{\"note\":\"\xff\"}",
    b"\xff\xfe",
    b"{\"note\":\"caf\xe9\"}",
    b"",
    b"1 2",
    b"{'a':1}",
    br#"{"a":1,}"#,
    b"\xef\xbb\xbf{}",
    b"NaN",
];

/// `Idempotency-Key` values from docs/HTTP.md's table, and a few more.
const KEY_POOL: &[&[u8]] = &[
    b"8e03978e-40d5-43e8-bc93-6894a57f9324",
    b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
    b"\"a key \\\"quoted\\\"\"",
    b"\"a,b;c\"",
    b"?1",
    b":YQ==:",
    b"a-b_c.d~",
    b"*/+=!#$%",
    b"A, B",
    b"A,B",
    b"\"A\", \"B\"",
    b"\"A\" \"B\"",
    b"\"abc\";p=1",
    b"\"abc\";p",
    b"abc;p=1",
    b"\"abc",
    b"abc\"",
    b"\"abc\\\"",
    b"\"abc\"x",
    b"\"abc\",",
    b"a b",
    b"a\tb",
    b"a\\b",
    b"\"a\\tb\"",
    b"\"a\tb\"",
    "\"café\"".as_bytes(),
    "café".as_bytes(),
    b"\"\"",
    b"",
    b"\t",
    b"\"",
    b" \"k0\" ",
    b"\t\"k1\"\t",
    b"\"\\\\\"",
    b"abc",
    b"\"abc\"",
];

const TENANT_POOL: &[&[u8]] = &[
    b" t1 ",
    b"\tt2",
    b"t1, t2",
    b"t1,t2",
    b"",
    b" ",
    b"t 1",
    "Ť1".as_bytes(),
    b"\"t1\"",
    b"T1",
];

const CONTENT_TYPES: &[&[u8]] = &[
    b"application/json",
    b"application/x+json; charset=utf-8",
    b"APPLICATION/JSON",
    b"Application/Json ; charset=UTF-8",
    b"application/merge-patch+json",
    b"application/json;",
    b" application/json\t",
    b"application/problem+JSON",
    b"text/plain",
    b"text/json",
    b"application/json-seq",
    b"application/+json",
    b"application/jsonx",
    b"application /json",
    b"application/json, text/plain",
    b"multipart/form-data; boundary=x",
    b"",
    "application/js\u{f6}n".as_bytes(),
];

const STATUSES: [u16; 16] = [
    200, 201, 201, 200, 202, 204, 302, 400, 404, 409, 422, 500, 503, 201, 200, 418,
];

const IDS: [&str; 4] = ["1", "2", "abc", "%C3%A9"];

/// Runs one input.
pub fn run(data: &[u8]) {
    quiet_sim_panics();
    let mut u = Unstructured::new(data);
    let mut sim = Sim::new(&mut u);
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        if sim.step(&mut u).is_err() {
            break;
        }
    }
    sim.close();
}

/// `IDEM_SIM_TRACE=1` prints each step and each answer to stderr (to read a reproducer).
fn trace(what: impl FnOnce() -> String) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("IDEM_SIM_TRACE").is_some()) {
        eprintln!("http_layer: {}", what());
    }
}

/// The payload of the handler's deliberate panics: the layer must catch them.
struct SimPanic;

/// Deliberate handler panics are not reported (libFuzzer's hook would abort on them); every
/// other panic goes to the hook in place before.
fn quiet_sim_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<SimPanic>() {
                previous(info);
            }
        }));
    });
}

// ---------------------------------------------------------------------------------------------
// What a request is made of.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyMode {
    ByContentType,
    Raw,
    CanonicalJson,
}

/// What the model knows of a body's JSON: a value with a canonical form (its name), none, or
/// not known (bytes the fuzzer wrote).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Class {
    Canon(String),
    NotCanon,
    Unknown,
}

/// The body part of a fingerprint as the model sees it (docs/FORMAT.md, "Request fingerprint").
#[derive(Clone, Debug, PartialEq, Eq)]
enum BodyId {
    /// `idem-http-v1+jcs` of this value.
    Canon(String),
    /// `idem-http-v1` of these bytes.
    Raw(Vec<u8>),
    /// Compared as JSON, but the model does not know whether it has a canonical form.
    Unknown(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Fp {
    method: Method,
    target: String,
    body: BodyId,
}

/// Whether two requests of one scope have the same fingerprint; `None`: the model cannot tell.
fn same_request(a: &Fp, b: &Fp) -> Option<bool> {
    if a.method != b.method || a.target != b.target {
        return Some(false);
    }
    use BodyId::{Canon, Raw, Unknown};
    match (&a.body, &b.body) {
        (Canon(x), Canon(y)) => Some(x == y),
        (Raw(x), Raw(y)) => Some(x == y),
        (Canon(_), Raw(_)) | (Raw(_), Canon(_)) => Some(false),
        (Unknown(x), Unknown(y)) => (x == y).then_some(true),
        // Unknown bytes are their canonical form (a tag `Raw` never has) or themselves.
        (Unknown(x), Raw(y)) | (Raw(y), Unknown(x)) => (x != y).then_some(false),
        (Unknown(_), Canon(_)) | (Canon(_), Unknown(_)) => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Orders,
    Order(&'static str),
    Refund(&'static str),
    Unrouted,
}

impl Route {
    fn template(self) -> Option<&'static str> {
        match self {
            Route::Orders => Some("/v1/orders"),
            Route::Order(_) => Some("/v1/orders/{id}"),
            Route::Refund(_) => Some("/v1/orders/{id}/refund"),
            Route::Unrouted => None,
        }
    }

    fn path(self) -> String {
        match self {
            Route::Orders => "/v1/orders".into(),
            Route::Order(id) => format!("/v1/orders/{id}"),
            Route::Refund(id) => format!("/v1/orders/{id}/refund"),
            Route::Unrouted => "/v2/orders".into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CwEnd {
    Ok,
    Terminal,
    Retryable,
    Panic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Panic,
    BodyError,
    Cw(CwEnd),
}

#[derive(Clone, Copy, Debug)]
enum AnswerBody {
    Small,
    Empty,
    Big,
}

/// What the handler does for one request.
#[derive(Clone, Copy, Debug)]
struct HandlerSpec {
    status: u16,
    body: AnswerBody,
    content_type: Option<&'static str>,
    location: bool,
    mode: Mode,
    park: bool,
}

impl HandlerSpec {
    fn answer(&self, id: u64, run: u64) -> (StatusCode, HeaderMap, Bytes) {
        let status = StatusCode::from_u16(self.status).expect("a valid status");
        let mut headers = HeaderMap::new();
        if let Some(ct) = self.content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        if self.location {
            let loc = format!("/v1/orders/r{run}");
            headers.insert(LOCATION, HeaderValue::from_str(&loc).expect("a location"));
        }
        headers.insert(RUN_HEADER, HeaderValue::from(run));
        let body = match self.body {
            AnswerBody::Small => {
                format!("{{\"req\":{id},\"run\":{run},\"status\":{}}}", self.status).into_bytes()
            }
            AnswerBody::Empty => Vec::new(),
            AnswerBody::Big => {
                let mut b = format!("run {run}:").into_bytes();
                b.resize(BIG_ANSWER, b'x');
                b
            }
        };
        (status, headers, Bytes::from(body))
    }
}

/// How the request body is delivered.
#[derive(Clone, Copy, Debug)]
struct Delivery {
    chunks: usize,
    yields: bool,
    /// The chunk replaced by an error.
    fail_at: Option<usize>,
    /// `Content-Length` is sent (the true length).
    declared: bool,
}

#[derive(Clone, Debug)]
struct ReqSpec {
    method: Method,
    route: Route,
    query: Option<u8>,
    key_lines: Vec<Vec<u8>>,
    tenant_lines: Vec<Vec<u8>>,
    ct_lines: Vec<Vec<u8>>,
    body: Vec<u8>,
    class: Class,
    delivery: Delivery,
    handler: HandlerSpec,
}

/// Bytes a header value may hold (`HeaderValue::from_bytes`): the others are dropped.
fn header_bytes(raw: &[u8]) -> Vec<u8> {
    raw.iter()
        .copied()
        .filter(|&b| b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80)
        .collect()
}

fn raw_bytes(u: &mut Unstructured, max: usize) -> arbitrary::Result<Vec<u8>> {
    let n = u.int_in_range(0..=max)?;
    Ok(u.bytes(n.min(u.len()))?.to_vec())
}

fn pick<'a, T>(u: &mut Unstructured, items: &'a [T]) -> arbitrary::Result<&'a T> {
    let i = u.int_in_range(0..=items.len() - 1)?;
    Ok(&items[i])
}

fn simple_key(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let id = u.int_in_range(0..=2u8)?;
    let k = format!("k{id}");
    Ok(match u.int_in_range(0..=4u8)? {
        0 => k,
        1 => format!("\"{k}\""),
        2 => format!(" {k} "),
        3 => format!("\t{k}"),
        _ => format!(" \"{k}\"\t"),
    }
    .into_bytes())
}

fn key_lines(u: &mut Unstructured) -> arbitrary::Result<Vec<Vec<u8>>> {
    Ok(match u.int_in_range(0..=15u8)? {
        0..=9 => vec![simple_key(u)?],
        10 => vec![],
        11 | 12 => vec![pick(u, KEY_POOL)?.to_vec()],
        13 => {
            let n = 250 + usize::from(u.int_in_range(0..=9u8)?);
            let k = "x".repeat(n);
            vec![
                if u.arbitrary::<bool>()? {
                    format!("\"{k}\"")
                } else {
                    k
                }
                .into_bytes(),
            ]
        }
        14 => vec![simple_key(u)?, simple_key(u)?],
        _ => vec![header_bytes(&raw_bytes(u, 300)?)],
    })
}

fn tenant_lines(u: &mut Unstructured) -> arbitrary::Result<Vec<Vec<u8>>> {
    Ok(match u.int_in_range(0..=15u8)? {
        0..=5 => vec![b"t1".to_vec()],
        6..=9 => vec![b"t2".to_vec()],
        10 => vec![],
        11 => vec![pick(u, TENANT_POOL)?.to_vec()],
        12 => vec![vec![b'x'; 127 + usize::from(u.int_in_range(0..=2u8)?)]],
        13 => vec![b"t1".to_vec(), pick(u, &[&b"t1"[..], b"t2"])?.to_vec()],
        _ => vec![header_bytes(&raw_bytes(u, 140)?)],
    })
}

fn ct_lines(u: &mut Unstructured) -> arbitrary::Result<Vec<Vec<u8>>> {
    Ok(match u.int_in_range(0..=11u8)? {
        0..=3 => vec![b"application/json".to_vec()],
        4 => vec![b"application/x+json; charset=utf-8".to_vec()],
        5 => vec![b"aPPlication/JSON".to_vec()],
        6 => vec![],
        7 => vec![b"text/plain".to_vec()],
        8 => vec![
            b"application/json".to_vec(),
            pick(u, CONTENT_TYPES)?.to_vec(),
        ],
        9 | 10 => vec![pick(u, CONTENT_TYPES)?.to_vec()],
        _ => vec![header_bytes(&raw_bytes(u, 60)?)],
    })
}

fn json_spelling(u: &mut Unstructured) -> arbitrary::Result<(usize, &'static str)> {
    let v = u.int_in_range(0..=VALUES.len() - 1)?;
    Ok((v, pick(u, VALUES[v])?))
}

fn body(u: &mut Unstructured) -> arbitrary::Result<(Vec<u8>, Class)> {
    Ok(match u.int_in_range(0..=15u8)? {
        0..=6 => {
            let (v, s) = json_spelling(u)?;
            (s.as_bytes().to_vec(), Class::Canon(format!("v{v}")))
        }
        7..=9 => (pick(u, NOT_CANONICAL)?.to_vec(), Class::NotCanon),
        10 => {
            // Cut before the last significant byte: never a JSON text.
            let (_, s) = json_spelling(u)?;
            let last = s.trim_end().len() - 1;
            let cut = usize::from(u.arbitrary::<u8>()?) % last.max(1);
            (s.as_bytes()[..cut.min(last)].to_vec(), Class::NotCanon)
        }
        11 => {
            let (_, s) = json_spelling(u)?;
            let mut b = b"\xef\xbb\xbf".to_vec();
            b.extend_from_slice(s.as_bytes());
            (b, Class::NotCanon)
        }
        12 | 13 => {
            // 60 to 107 KiB of JSON: over the answer cap, some over the body limit.
            let n = (60 + usize::from(u.int_in_range(0..=47u8)?)) * 1024;
            let fill = *pick(u, b"ab")?;
            let mut b = br#"{"pad":""#.to_vec();
            b.resize(b.len() + n, fill);
            b.extend_from_slice(br#""}"#);
            (b, Class::Canon(format!("big:{n}:{fill}")))
        }
        _ => (raw_bytes(u, 512)?, Class::Unknown),
    })
}

fn delivery(u: &mut Unstructured) -> arbitrary::Result<Delivery> {
    let whole = Delivery {
        chunks: 1,
        yields: false,
        fail_at: None,
        declared: false,
    };
    Ok(match u.int_in_range(0..=7u8)? {
        0..=3 => whole,
        4 => Delivery {
            chunks: u.int_in_range(2..=4)?,
            yields: true,
            ..whole
        },
        5 => {
            let chunks = u.int_in_range(1..=3)?;
            Delivery {
                chunks,
                yields: u.arbitrary()?,
                fail_at: Some(u.int_in_range(0..=chunks - 1)?),
                declared: false,
            }
        }
        6 => Delivery {
            declared: true,
            ..whole
        },
        _ => Delivery {
            chunks: u.int_in_range(1..=2)?,
            yields: true,
            fail_at: None,
            declared: true,
        },
    })
}

fn handler_spec(u: &mut Unstructured) -> arbitrary::Result<HandlerSpec> {
    let status = *pick(u, &STATUSES)?;
    let body = match u.int_in_range(0..=7u8)? {
        0..=5 => AnswerBody::Small,
        6 => AnswerBody::Empty,
        _ => AnswerBody::Big,
    };
    let content_type = *pick(
        u,
        &[
            Some("application/json"),
            Some("application/json"),
            Some("text/plain; charset=utf-8"),
            None,
        ],
    )?;
    let location = u.arbitrary()?;
    let mode = match u.int_in_range(0..=15u8)? {
        0..=7 | 15 => Mode::Plain,
        8 => Mode::Panic,
        9 => Mode::BodyError,
        10 | 11 => Mode::Cw(CwEnd::Ok),
        12 => Mode::Cw(CwEnd::Terminal),
        13 => Mode::Cw(CwEnd::Retryable),
        _ => Mode::Cw(CwEnd::Panic),
    };
    let park = u.ratio(1u8, 4)?;
    Ok(HandlerSpec {
        status,
        body,
        content_type,
        location,
        mode,
        park,
    })
}

fn req_spec(u: &mut Unstructured) -> arbitrary::Result<ReqSpec> {
    let method = pick(
        u,
        &[
            Method::POST,
            Method::POST,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::GET,
            Method::POST,
        ],
    )?
    .clone();
    let route = match u.int_in_range(0..=7u8)? {
        0..=3 => Route::Orders,
        4 | 5 => Route::Order(pick(u, &IDS)?),
        6 => Route::Refund(pick(u, &IDS)?),
        _ => Route::Unrouted,
    };
    let query = if u.ratio(1u8, 4)? {
        Some(u.int_in_range(0..=2)?)
    } else {
        None
    };
    let key_lines = key_lines(u)?;
    let tenant_lines = tenant_lines(u)?;
    let ct_lines = ct_lines(u)?;
    let (body, class) = body(u)?;
    let delivery = delivery(u)?;
    let handler = handler_spec(u)?;
    Ok(ReqSpec {
        method,
        route,
        query,
        key_lines,
        tenant_lines,
        ct_lines,
        body,
        class,
        delivery,
        handler,
    })
}

// ---------------------------------------------------------------------------------------------
// The reference rules (docs/HTTP.md), written from the docs.

enum Named {
    Missing,
    Invalid,
    Valid(String),
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = v.iter().position(|b| !is_ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !is_ows(b)).map_or(start, |e| e + 1);
    &v[start..end]
}

/// docs/HTTP.md, "The key grammar".
fn reference_key(lines: &[Vec<u8>]) -> Named {
    let line = match lines {
        [] => return Named::Missing,
        [one] => one,
        _ => return Named::Invalid,
    };
    let v = trim_ows(line);
    let key = if v.first() == Some(&b'"') {
        let mut out = Vec::new();
        let mut i = 1;
        loop {
            let Some(&c) = v.get(i) else {
                return Named::Invalid;
            };
            i += 1;
            match c {
                b'\\' => match v.get(i) {
                    Some(&e @ (b'"' | b'\\')) => {
                        out.push(e);
                        i += 1;
                    }
                    _ => return Named::Invalid,
                },
                b'"' => break,
                0x20..=0x7e => out.push(c),
                _ => return Named::Invalid,
            }
        }
        if i != v.len() {
            return Named::Invalid;
        }
        out
    } else {
        if v.iter()
            .any(|&b| !(0x21..=0x7e).contains(&b) || b"\",;\\".contains(&b))
        {
            return Named::Invalid;
        }
        v.to_vec()
    };
    match String::from_utf8(key) {
        Ok(k) if !k.is_empty() && k.len() <= 255 => Named::Valid(k),
        _ => Named::Invalid,
    }
}

/// docs/HTTP.md, "The tenant".
fn reference_tenant(lines: &[Vec<u8>]) -> Named {
    let line = match lines {
        [] => return Named::Missing,
        [one] => one,
        _ => return Named::Invalid,
    };
    let v = trim_ows(line);
    if v.is_empty() || v.len() > 128 || v.iter().any(|&b| !(0x21..=0x7e).contains(&b) || b == b',')
    {
        return Named::Invalid;
    }
    Named::Valid(String::from_utf8(v.to_vec()).expect("visible ASCII"))
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// docs/HTTP.md, "How a body compares": labelled JSON.
fn reference_labelled_json(lines: &[Vec<u8>]) -> bool {
    let [line] = lines else {
        return false;
    };
    let essence = line.split(|&b| b == b';').next().unwrap_or_default();
    let essence = trim_ows(essence);
    let Some(slash) = essence.iter().position(|&b| b == b'/') else {
        return false;
    };
    let (kind, subtype) = (&essence[..slash], &essence[slash + 1..]);
    is_token(kind)
        && is_token(subtype)
        && kind.eq_ignore_ascii_case(b"application")
        && (subtype.eq_ignore_ascii_case(b"json")
            || (subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case(b"+json")))
}

fn body_id(mode: BodyMode, labelled: bool, body: &[u8], class: &Class) -> BodyId {
    let as_json = match mode {
        BodyMode::ByContentType => labelled,
        BodyMode::CanonicalJson => true,
        BodyMode::Raw => false,
    };
    match (as_json, class) {
        (true, Class::Canon(v)) => BodyId::Canon(v.clone()),
        (true, Class::Unknown) => BodyId::Unknown(body.to_vec()),
        _ => BodyId::Raw(body.to_vec()),
    }
}

fn chunks_of(body: &[u8], n: usize) -> Vec<Bytes> {
    let size = body.len().div_ceil(n).max(1);
    let mut out: Vec<Bytes> = body.chunks(size).map(Bytes::copy_from_slice).collect();
    out.resize(n, Bytes::new());
    out
}

/// The refusal the body gets, if any (docs/HTTP.md: over the limit 413, unreadable 400).
fn body_refusal(body: &[u8], d: &Delivery) -> Option<(u16, &'static str)> {
    if d.declared && body.len() > BODY_LIMIT {
        return Some((413, problem::BODY_TOO_LARGE));
    }
    let mut total = 0;
    for (i, chunk) in chunks_of(body, d.chunks).iter().enumerate() {
        if d.fail_at == Some(i) {
            return Some((400, problem::UNREADABLE_BODY));
        }
        total += chunk.len();
        if total > BODY_LIMIT {
            return Some((413, problem::BODY_TOO_LARGE));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Bodies.

/// A request body: its chunks, each after one pending poll when `yields`, an error in place of
/// chunk `fail_at`; `consumed` is set when its end was read.
struct SimBody {
    chunks: VecDeque<Bytes>,
    yields: bool,
    yielded: bool,
    fail_at: Option<usize>,
    sent: usize,
    consumed: Arc<AtomicBool>,
}

impl http_body::Body for SimBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if this.yields && !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.yielded = false;
        if this.fail_at == Some(this.sent) {
            return Poll::Ready(Some(Err(std::io::Error::other(
                "sim: the client's body failed",
            ))));
        }
        match this.chunks.pop_front() {
            Some(chunk) => {
                this.sent += 1;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            None => {
                this.consumed.store(true, Ordering::SeqCst);
                Poll::Ready(None)
            }
        }
    }
}

/// A response body that fails after its first chunk.
struct FailBody(bool);

impl http_body::Body for FailBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if this.0 {
            return Poll::Ready(Some(Err(std::io::Error::other(
                "sim: the handler's body failed",
            ))));
        }
        this.0 = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"partial")))))
    }
}

// ---------------------------------------------------------------------------------------------
// Answers.

/// An HTTP answer as bytes: status, header lines sorted by name (values in order), body.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    fn replayed(&self) -> bool {
        self.header(IDEMPOTENT_REPLAYED) == Some(b"true")
    }

    fn into_response(self) -> http::Response<Body> {
        let mut resp = http::Response::new(Body::from(self.body));
        *resp.status_mut() = StatusCode::from_u16(self.status).expect("a status");
        for (n, v) in self.headers {
            resp.headers_mut().append(
                HeaderName::from_bytes(n.as_bytes()).expect("a name"),
                HeaderValue::from_bytes(&v).expect("a value"),
            );
        }
        resp
    }
}

fn header_lines(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut lines: Vec<_> = map
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    lines.sort_by(|a, b| a.0.cmp(&b.0));
    lines
}

/// What [`answer_of`] reads as the body of an answer whose body failed mid-stream: only a
/// handler's own answer that the layer passes through unrecorded (a `503` whose body fails).
const BODY_FAILED: &[u8] = b"\0sim: the answer's body failed while the client read it\0";

async fn answer_of(resp: http::Response<Body>) -> Answer {
    let (parts, body) = resp.into_parts();
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(body) => body.to_vec(),
        Err(_) => BODY_FAILED.to_vec(),
    };
    // axum's routing adds `Content-Length` to any answer of known size (framing, not the
    // handler's or the layer's): kept only when it is not the body's length.
    let length = body.len().to_string().into_bytes();
    let mut headers = header_lines(&parts.headers);
    headers.retain(|(n, v)| n != "content-length" || *v != length);
    Answer {
        status: parts.status.as_u16(),
        headers,
        body,
    }
}

/// What a record keeps of an answer (docs/HTTP.md, "Answers"; "What is recorded").
#[derive(Clone, Debug)]
enum Stored {
    Answer {
        status: u16,
        content_type: Option<Vec<u8>>,
        location: Option<Vec<u8>>,
        body: Vec<u8>,
        omitted: bool,
    },
    /// The layer's terminal 500 `handler-failed`, its bytes once seen.
    HandlerFailed,
}

fn stored_of(a: &Answer) -> Stored {
    Stored::Answer {
        status: a.status,
        content_type: a.header("content-type").map(<[u8]>::to_vec),
        location: a.header("location").map(<[u8]>::to_vec),
        body: a.body.clone(),
        // Answers are a few hundred bytes or 70 KiB: the cap is between.
        omitted: a.body.len() > MAX_RESPONSE,
    }
}

/// The problem an answer carries, checked against RFC 9457 and the documented types.
fn check_problem(got: &Answer, status: u16, kind: &str, what: &str) {
    assert_eq!(
        (got.status, got.header("content-type")),
        (status, Some(PROBLEM_JSON.as_bytes())),
        "{what}: expected a {status} {kind} problem, got {got:?}"
    );
    let v: serde_json::Value = serde_json::from_slice(&got.body)
        .unwrap_or_else(|e| panic!("{what}: a problem body that is not JSON ({e}): {got:?}"));
    assert_eq!(
        v["type"].as_str(),
        Some(kind),
        "{what}: problem type, in {got:?}"
    );
    assert_eq!(
        v["status"].as_u64(),
        Some(u64::from(status)),
        "{what}: problem status"
    );
    assert!(
        v["title"].is_string() && v["detail"].is_string(),
        "{what}: a problem has a title and a detail: {v}"
    );
    if status == 409 || kind == problem::RETRY {
        let after = got
            .header("retry-after")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<u64>().ok());
        assert!(
            after.is_some_and(|s| s >= 1),
            "{what}: {status} needs Retry-After in whole seconds: {got:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The handler.

#[derive(Default)]
struct Shared {
    inner: Mutex<SharedInner>,
}

#[derive(Default)]
struct SharedInner {
    specs: BTreeMap<u64, HandlerSpec>,
    log: Vec<Event>,
    parked: Vec<(u64, tokio::sync::oneshot::Sender<()>)>,
    runs: u64,
}

enum Event {
    Entry(u64),
    /// The handler ended: what it returned (`None`: it panicked or its body fails).
    Exit(u64, Option<Answer>),
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, SharedInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enter(&self, id: u64) -> (HandlerSpec, u64) {
        let mut s = self.lock();
        s.runs += 1;
        s.log.push(Event::Entry(id));
        let spec = *s
            .specs
            .get(&id)
            .expect("every request's handler spec is known");
        (spec, s.runs)
    }

    fn exit(&self, id: u64, answer: Option<Answer>) {
        self.lock().log.push(Event::Exit(id, answer));
    }
}

/// The effect label of a scope key in the caller's table.
fn label(tenant: &str, operation: &str, key: &str) -> String {
    format!("{tenant}\u{1f}{operation}\u{1f}{key}")
}

async fn handler(shared: Arc<Shared>, req: Request<Body>) -> http::Response<Body> {
    let id = req
        .headers()
        .get(REQ_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("every request carries its id");
    let handle = req.extensions().get::<IdempotencyHandle>().cloned();
    let (spec, run) = shared.enter(id);
    // A handler reads its body.
    let _ = axum::body::to_bytes(req.into_body(), usize::MAX).await;
    if spec.park {
        let (tx, rx) = tokio::sync::oneshot::channel();
        shared.lock().parked.push((id, tx));
        let _ = rx.await;
    }
    let (status, headers, body) = spec.answer(id, run);
    // Without the layer's handle (not covered) the handler is a plain one.
    let mode = if handle.is_some() {
        spec.mode
    } else {
        Mode::Plain
    };
    match (mode, handle) {
        (Mode::Panic, _) => {
            shared.exit(id, None);
            std::panic::panic_any(SimPanic)
        }
        (Mode::BodyError, _) => {
            shared.exit(id, None);
            let mut resp = http::Response::new(Body::new(FailBody(false)));
            *resp.status_mut() = status;
            *resp.headers_mut() = headers;
            resp
        }
        (Mode::Cw(end), Some(handle)) => {
            let request = handle.request();
            let label = label(
                request.scope().tenant(),
                request.scope().operation(),
                &String::from_utf8_lossy(request.key()),
            );
            let location = headers
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let resp = handle
                .complete_with(move |tx: &Tx<'_>| {
                    bump(tx, &label)?;
                    match end {
                        CwEnd::Ok => Ok(Recorded {
                            status,
                            headers: headers.clone(),
                            body: body.clone(),
                        }),
                        CwEnd::Terminal => {
                            let r = idem::Response::new(status.as_u16(), body.to_vec());
                            Err(Abort::Terminal(match &location {
                                Some(l) => r.with_resource("location", l.clone()),
                                None => r,
                            }))
                        }
                        CwEnd::Retryable => Err(Abort::retryable("sim: the handler asks again")),
                        CwEnd::Panic => std::panic::panic_any(SimPanic),
                    }
                })
                .await;
            let answer = answer_of(resp).await;
            shared.exit(id, Some(answer.clone()));
            answer.into_response()
        }
        _ => {
            let answer = Answer {
                status: status.as_u16(),
                headers: header_lines(&headers),
                body: body.to_vec(),
            };
            shared.exit(id, Some(answer.clone()));
            answer.into_response()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model.

/// (tenant, operation, key).
type Key = (String, String, String);

/// What the model holds for a key with a live record (a key without one is free).
#[derive(Clone, Debug)]
enum KState {
    /// Request `by` holds the claim; its handler has not started (its future was not polled
    /// since), so nothing heartbeats the lease.
    Claimed {
        by: u64,
        fp: Fp,
        holder: HolderToken,
        deadline: Timestamp,
        forget: Timestamp,
    },
    /// Request `by`'s handler started; `deadline` and `forget` as last read from the store.
    Running {
        by: u64,
        fp: Fp,
        holder: HolderToken,
        deadline: Timestamp,
        forget: Timestamp,
    },
    /// Request `by`'s answer was recorded at `finished` (as a terminal failure if `failed`).
    Done {
        by: u64,
        fp: Fp,
        finished: Timestamp,
        failed: bool,
        stored: Stored,
        /// The first answer of a `HandlerFailed` record, once seen.
        first: Option<Answer>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Admission {
    /// No route: the router answers 404, the layer is not involved.
    NotRouted,
    /// Not covered (method, or a missing key under `MissingKey::PassThrough`).
    Passthrough,
    /// Refused before the store, with one of these (status, type).
    Refused(Vec<(u16, &'static str)>),
    /// Reaches the store once its body is read.
    Begin,
}

/// What the store's read path may answer a request, other than a claim.
#[derive(Clone, Debug)]
enum Early {
    /// A replay of the record the decision saw.
    Replay(Seen),
    /// The tombstone answer of the record the decision saw.
    Expired(Seen),
    InFlight,
    Mismatch,
}

/// A finished record as a decision saw it: the answer is checked against it even if the
/// record ended (and another took its place) before the client read the answer.
#[derive(Clone, Debug)]
struct Seen {
    by: u64,
    stored: Stored,
    first: Option<Answer>,
}

#[derive(Clone, Debug)]
enum Decision {
    /// It claimed the key.
    Acquire,
    /// One of these.
    Answer(Vec<Early>),
}

struct Req {
    admission: Admission,
    key: Option<Key>,
    fp: Option<Fp>,
    spec: HandlerSpec,
    decision: Option<Decision>,
    entered: bool,
    /// What its handler returned (`Some(None)`: it panicked, or its body fails).
    returned: Option<Option<Answer>>,
    consumed: Arc<AtomicBool>,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

struct Client {
    id: u64,
    fut: ResponseFuture,
}

/// Holds the runtime's one blocking thread while a client's future is polled.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

struct Sim {
    rt: tokio::runtime::Runtime,
    clock: ManualClock,
    store: Store,
    layer: IdempotencyLayer,
    app: Router,
    shared: Arc<Shared>,
    mode: BodyMode,
    missing: MissingKey,
    clients: Vec<Option<Client>>,
    reqs: BTreeMap<u64, Req>,
    keys: BTreeMap<Key, KState>,
    /// The `complete_with` effects the caller's table must hold, per label.
    cw_effects: BTreeMap<String, u64>,
    next_id: u64,
}

fn scope_of(k: &Key) -> Scope {
    Scope::new(k.0.clone(), k.1.clone())
}

impl Sim {
    fn new(u: &mut Unstructured) -> Self {
        let mode = match u.int_in_range(0..=5u8).unwrap_or(0) {
            0..=3 => BodyMode::ByContentType,
            4 => BodyMode::Raw,
            _ => BodyMode::CanonicalJson,
        };
        let missing = if u.ratio(1u8, 4).unwrap_or(false) {
            MissingKey::PassThrough
        } else {
            MissingKey::Reject
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .max_blocking_threads(1)
            .build()
            .expect("a runtime");
        let clock = ManualClock::new(T0);
        let store = Store::builder()
            .clock(clock.clone())
            .lease_duration(LEASE)
            .retention(RETENTION)
            .tombstone_horizon(HORIZON)
            .max_response_bytes(MAX_RESPONSE)
            .open_with_backend(idem::redb::backends::InMemoryBackend::new())
            .unwrap_or_else(|e| panic!("the store must open: {e}"));
        let mut layer = IdempotencyLayer::tenant_header(store.clone(), TENANT_HEADER)
            .body_limit(BODY_LIMIT)
            .missing_key(missing);
        layer = match mode {
            BodyMode::ByContentType => layer,
            BodyMode::Raw => layer.raw_body(),
            BodyMode::CanonicalJson => layer.canonical_json_body(),
        };
        let shared = Arc::new(Shared::default());
        let h = {
            let shared = Arc::clone(&shared);
            move |req: Request<Body>| {
                let shared = Arc::clone(&shared);
                async move { handler(shared, req).await }
            }
        };
        let app = Router::new()
            .route("/v1/orders", any(h.clone()))
            .route("/v1/orders/{id}", any(h.clone()))
            .route("/v1/orders/{id}/refund", any(h))
            .route_layer(layer.clone());
        Sim {
            rt,
            clock,
            store,
            layer,
            app,
            shared,
            mode,
            missing,
            clients: (0..CLIENTS).map(|_| None).collect(),
            reqs: BTreeMap::new(),
            keys: BTreeMap::new(),
            cw_effects: BTreeMap::new(),
            next_id: 0,
        }
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn step(&mut self, u: &mut Unstructured) -> arbitrary::Result<()> {
        let client = |u: &mut Unstructured| u.int_in_range(0..=CLIENTS - 1);
        match u.int_in_range(0..=15u8)? {
            0..=5 => {
                let c = client(u)?;
                let spec = req_spec(u)?;
                self.send(c, spec);
            }
            6..=9 => {
                let c = client(u)?;
                for _ in 0..u.int_in_range(1..=4u8)? {
                    self.poll(c);
                }
            }
            10 => {
                let c = client(u)?;
                self.disconnect(c);
            }
            11 | 12 => {
                let g = usize::from(u.arbitrary::<u8>()?);
                self.open(g);
            }
            13 => {
                let ms = *pick(u, &FORWARD_MS)?;
                self.advance(Duration::from_millis(ms));
            }
            14 => {
                let slot = usize::from(u.arbitrary::<u8>()?);
                let second = u.arbitrary::<bool>()?;
                let off = *pick(u, &[-1, 0, 1])?;
                self.advance_to_edge(slot, second, off);
            }
            _ => {
                for c in 0..CLIENTS {
                    self.poll(c);
                }
            }
        }
        Ok(())
    }

    // ----- driving the runtime

    /// Runs every task and blocking call that can make progress, until none can (tokio's
    /// paused clock advances only then).
    fn settle(&mut self) {
        // Created inside the runtime: a timer needs its context.
        self.rt.block_on(async { tokio::time::sleep(SETTLE).await });
        self.process_log();
    }

    fn send(&mut self, c: usize, spec: ReqSpec) {
        self.disconnect(c);
        self.next_id += 1;
        let id = self.next_id;
        let consumed = Arc::new(AtomicBool::new(false));
        let target = match spec.query {
            Some(q) => format!("{}?q={q}", spec.route.path()),
            None => spec.route.path(),
        };
        let mut req = Request::builder()
            .method(spec.method.clone())
            .uri(&target)
            .body(SimBody {
                chunks: chunks_of(&spec.body, spec.delivery.chunks).into(),
                yields: spec.delivery.yields,
                yielded: false,
                fail_at: spec.delivery.fail_at,
                sent: 0,
                consumed: Arc::clone(&consumed),
            })
            .expect("a request");
        let headers = req.headers_mut();
        headers.insert(REQ_HEADER, HeaderValue::from(id));
        let lines = [
            (KEY_HEADER, &spec.key_lines),
            (TENANT_HEADER, &spec.tenant_lines),
            (CONTENT_TYPE.as_str(), &spec.ct_lines),
        ];
        for (name, values) in lines {
            for v in values {
                headers.append(
                    HeaderName::from_static(name),
                    HeaderValue::from_bytes(v).expect("header bytes were filtered"),
                );
            }
        }
        if spec.delivery.declared {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(spec.body.len()));
        }

        // The model's view of it.
        let covered = matches!(
            spec.method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        let mut key = None;
        let mut fp = None;
        let admission = match spec.route.template() {
            None => Admission::NotRouted,
            Some(_) if !covered => Admission::Passthrough,
            Some(template) => {
                let k = reference_key(&spec.key_lines);
                let t = reference_tenant(&spec.tenant_lines);
                let mut refusals = Vec::new();
                match k {
                    Named::Missing if self.missing == MissingKey::PassThrough => {}
                    Named::Missing => refusals.push((400, problem::MISSING_KEY)),
                    Named::Invalid => refusals.push((400, problem::INVALID_KEY)),
                    Named::Valid(_) => {}
                }
                match t {
                    Named::Missing => refusals.push((400, problem::MISSING_TENANT)),
                    Named::Invalid => refusals.push((400, problem::INVALID_TENANT)),
                    Named::Valid(_) => {}
                }
                match (k, t) {
                    (Named::Missing, _) if self.missing == MissingKey::PassThrough => {
                        Admission::Passthrough
                    }
                    _ if !refusals.is_empty() => Admission::Refused(refusals),
                    (Named::Valid(k), Named::Valid(t)) => {
                        match body_refusal(&spec.body, &spec.delivery) {
                            Some(r) => Admission::Refused(vec![r]),
                            None => {
                                let operation = format!("{} {template}", spec.method);
                                let labelled = reference_labelled_json(&spec.ct_lines);
                                key = Some((t, operation, k));
                                fp = Some(Fp {
                                    method: spec.method.clone(),
                                    target: target.clone(),
                                    body: body_id(self.mode, labelled, &spec.body, &spec.class),
                                });
                                Admission::Begin
                            }
                        }
                    }
                    _ => unreachable!("a refusal for every key or tenant that is not valid"),
                }
            }
        };
        self.shared.lock().specs.insert(id, spec.handler);
        self.reqs.insert(
            id,
            Req {
                admission,
                key,
                fp,
                spec: spec.handler,
                decision: None,
                entered: false,
                returned: None,
                consumed,
            },
        );
        trace(|| {
            format!(
                "client {c} sends #{id} {} {target} key {:?} tenant {:?} type {:?} body {:?} ({} bytes, {:?}) {:?} -> {:?} {:?}",
                spec.method,
                spec.key_lines
                    .iter()
                    .map(|l| String::from_utf8_lossy(l))
                    .collect::<Vec<_>>(),
                spec.tenant_lines
                    .iter()
                    .map(|l| String::from_utf8_lossy(l))
                    .collect::<Vec<_>>(),
                spec.ct_lines
                    .iter()
                    .map(|l| String::from_utf8_lossy(l))
                    .collect::<Vec<_>>(),
                String::from_utf8_lossy(&spec.body[..spec.body.len().min(60)]),
                spec.body.len(),
                spec.delivery,
                spec.handler,
                self.reqs[&id].admission,
                self.reqs[&id].key,
            )
        });
        let fut: ResponseFuture = Box::pin(self.app.clone().oneshot(req));
        self.clients[c] = Some(Client { id, fut });
        self.poll(c);
    }

    /// Polls client `c`'s response future once, then settles.
    fn poll(&mut self, c: usize) {
        let Some(client) = self.clients[c].as_mut() else {
            return;
        };
        let id = client.id;
        let gate = Arc::new(Gate::default());
        let held = {
            let gate = Arc::clone(&gate);
            self.rt.spawn_blocking(move || gate.wait())
        };
        let polled = self.rt.block_on(std::future::poll_fn(|cx| {
            Poll::Ready(client.fut.as_mut().poll(cx))
        }));
        gate.open();
        drop(held);
        match polled {
            Poll::Pending => {
                self.settle();
                self.maybe_decided(id);
            }
            Poll::Ready(result) => {
                self.clients[c] = None;
                let resp = match result {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                };
                let got = self.rt.block_on(answer_of(resp));
                trace(|| {
                    format!(
                        "client {c}'s #{id} answered {} {:?} {}",
                        got.status,
                        got.headers
                            .iter()
                            .map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v)))
                            .collect::<Vec<_>>(),
                        String::from_utf8_lossy(&got.body[..got.body.len().min(120)])
                    )
                });
                self.settle();
                self.check_answer(id, &got);
            }
        }
        self.check_records();
    }

    /// Client `c` goes away: its response future is dropped wherever it stands.
    fn disconnect(&mut self, c: usize) {
        let Some(client) = self.clients[c].take() else {
            return;
        };
        trace(|| format!("client {c} drops #{}", client.id));
        {
            let _rt = self.rt.enter();
            drop(client.fut);
        }
        // A claim whose handler has not started is given back ("before the handler runs,
        // nothing happened").
        let id = client.id;
        let req = &self.reqs[&id];
        if matches!(req.decision, Some(Decision::Acquire)) && !req.entered {
            let k = req.key.clone().expect("a claim has a key");
            if matches!(self.keys.get(&k), Some(KState::Claimed { by, .. }) if *by == id) {
                self.keys.remove(&k);
                let rec = self.record(&k);
                assert!(
                    rec.as_ref().is_none_or(|r| self.now() >= r.forget_at),
                    "request {id} was dropped before its handler started: the key {k:?} must be \
                     free, the store holds {rec:?}"
                );
            }
        }
        self.settle();
        self.check_records();
    }

    /// Lets the `g`-th parked handler answer.
    fn open(&mut self, g: usize) {
        let sender = {
            let mut s = self.shared.lock();
            if s.parked.is_empty() {
                return;
            }
            let i = g % s.parked.len();
            let (id, tx) = s.parked.remove(i);
            trace(|| format!("#{id}'s handler is let go"));
            tx
        };
        let _ = sender.send(());
        self.settle();
        self.check_records();
    }

    fn advance(&mut self, d: Duration) {
        self.clock.advance(d);
        trace(|| format!("clock +{d:?} (T0 + {} ms)", self.now().0 - T0.0));
        self.forget_ended_records();
        self.rt.block_on(async { tokio::time::advance(d).await });
        self.settle();
        self.check_records();
    }

    /// Moves the clock to an instant of the `slot`-th key's record, give or take 1 ms.
    fn advance_to_edge(&mut self, slot: usize, second: bool, off: i8) {
        if self.keys.is_empty() {
            return;
        }
        let state = self
            .keys
            .values()
            .nth(slot % self.keys.len())
            .expect("a key");
        let edge = match (state, second) {
            (KState::Claimed { deadline, .. } | KState::Running { deadline, .. }, false) => {
                *deadline
            }
            (KState::Claimed { forget, .. } | KState::Running { forget, .. }, true) => *forget,
            (KState::Done { finished, .. }, false) => finished.saturating_add(RETENTION),
            (KState::Done { finished, .. }, true) => finished.saturating_add(HORIZON),
        };
        let target = match off {
            -1 => Timestamp(edge.0.saturating_sub(1)),
            1 => Timestamp(edge.0.saturating_add(1)),
            _ => edge,
        };
        if target > self.now() {
            self.advance(Duration::from_millis(target.0 - self.now().0));
        }
    }

    fn close(&mut self) {
        for _ in 0..64 {
            let parked: Vec<_> = std::mem::take(&mut self.shared.lock().parked);
            for (_, tx) in parked {
                let _ = tx.send(());
            }
            if self.clients.iter().all(Option::is_none) {
                break;
            }
            self.settle();
            for c in 0..CLIENTS {
                self.poll(c);
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            if let Some(client) = client {
                panic!(
                    "client {c}'s request {} never got an answer with every handler let go",
                    client.id
                );
            }
        }
        self.settle();
        assert!(
            self.shared.lock().parked.is_empty(),
            "a handler is still waiting"
        );
        self.check_effects();
        assert_eq!(
            self.layer.metrics().overloaded,
            0,
            "no request here meets the in-flight limit"
        );
    }

    // ----- the model's bookkeeping

    fn record(&self, k: &Key) -> Option<Record> {
        self.store
            .get(&scope_of(k), k.2.as_bytes())
            .unwrap_or_else(|e| panic!("reading the record of {k:?}: {e}"))
    }

    /// Ends the records whose window is over at `now`: a finished answer past its horizon, a
    /// claim or a running handler's lease past its forget instant (that handler's answer will
    /// not be recorded).
    fn forget_ended_records(&mut self) {
        let now = self.now();
        self.keys.retain(|_, state| match state {
            KState::Claimed { forget, .. } | KState::Running { forget, .. } => now < *forget,
            KState::Done { finished, .. } => now < finished.saturating_add(HORIZON),
        });
    }

    /// Handler starts and ends, in order.
    fn process_log(&mut self) {
        let events = std::mem::take(&mut self.shared.lock().log);
        for event in events {
            match event {
                Event::Entry(id) => self.entered(id),
                Event::Exit(id, answer) => self.exited(id, answer),
            }
        }
    }

    fn entered(&mut self, id: u64) {
        trace(|| format!("#{id}'s handler starts at {:?}", self.now()));
        let req = self.reqs.get_mut(&id).expect("a known request");
        assert!(!req.entered, "request {id}'s handler started twice");
        req.entered = true;
        match req.admission {
            Admission::Passthrough => {}
            Admission::Begin => {
                let k = req.key.clone().expect("a key");
                let state = self.keys.remove(&k);
                match state {
                    Some(KState::Claimed {
                        by,
                        fp,
                        holder,
                        deadline,
                        forget,
                    }) if by == id => {
                        self.keys.insert(
                            k,
                            KState::Running {
                                by,
                                fp,
                                holder,
                                deadline,
                                forget,
                            },
                        );
                    }
                    other => panic!(
                        "the handler ran for request {id} on {k:?} without holding its claim \
                         (a second run while the record lives): the key is {other:?}"
                    ),
                }
            }
            ref other => panic!("the handler ran for request {id}, which was {other:?}"),
        }
    }

    fn exited(&mut self, id: u64, answer: Option<Answer>) {
        let req = self.reqs.get_mut(&id).expect("a known request");
        req.returned = Some(answer.clone());
        if req.admission != Admission::Begin {
            return;
        }
        let spec = req.spec;
        let k = req.key.clone().expect("a key");
        let Some(KState::Running { by, fp, .. }) = self.keys.get(&k) else {
            return; // Its record ended under it: nothing is recorded.
        };
        if *by != id {
            return;
        }
        let fp = fp.clone();
        let now = self.now();
        let status = spec.status;
        let returned = || answer.as_ref().expect("the handler returned an answer");
        let recorded = match spec.mode {
            // A 503 releases the key whatever its body does (docs/HTTP.md): nothing recorded.
            Mode::Plain | Mode::Cw(CwEnd::Ok) | Mode::BodyError if status == 503 => None,
            Mode::Plain | Mode::Cw(CwEnd::Ok | CwEnd::Terminal) => Some(stored_of(returned())),
            Mode::Panic | Mode::BodyError => Some(Stored::HandlerFailed),
            Mode::Cw(CwEnd::Retryable) => None,
            Mode::Cw(CwEnd::Panic) => {
                check_problem(
                    returned(),
                    500,
                    problem::HANDLER_FAILED,
                    "a complete_with that panicked",
                );
                Some(stored_of(returned()))
            }
        };
        // Recorded as a terminal failure: a 4xx or 5xx, a handler that failed, and whatever a
        // `complete_with` ends with `Abort::Terminal`.
        let failed = match spec.mode {
            Mode::Plain | Mode::Cw(CwEnd::Ok) => status >= 400,
            _ => true,
        };
        if matches!(spec.mode, Mode::Cw(CwEnd::Ok | CwEnd::Terminal)) && recorded.is_some() {
            *self.cw_effects.entry(label(&k.0, &k.1, &k.2)).or_default() += 1;
        }
        match recorded {
            None => {
                self.keys.remove(&k);
            }
            Some(stored) => {
                self.keys.insert(
                    k,
                    KState::Done {
                        by: id,
                        fp,
                        finished: now,
                        failed,
                        stored,
                        first: None,
                    },
                );
            }
        }
    }

    /// After a poll left request `id` pending: if its body was read, the store's read path ran
    /// in the settle that followed (the layer asks the store right after the body).
    fn maybe_decided(&mut self, id: u64) {
        let req = &self.reqs[&id];
        if req.admission != Admission::Begin
            || req.decision.is_some()
            || !req.consumed.load(Ordering::SeqCst)
        {
            return;
        }
        let k = req.key.clone().expect("a key");
        let fp = req.fp.clone().expect("a fingerprint");
        let now = self.now();
        self.forget_ended_records();
        let mut early = Vec::new();
        let mut may_claim = false;
        let mut previous = None;
        match self.keys.get(&k) {
            None => may_claim = true,
            Some(KState::Claimed {
                fp: f,
                deadline,
                holder,
                ..
            }) => {
                let lapsed = now >= *deadline;
                match same_request(&fp, f) {
                    Some(true) if lapsed => may_claim = true,
                    Some(true) => early.push(Early::InFlight),
                    Some(false) => early.push(Early::Mismatch),
                    None if lapsed => {
                        may_claim = true;
                        early.push(Early::Mismatch);
                    }
                    None => early.extend([Early::InFlight, Early::Mismatch]),
                }
                previous = Some(*holder);
            }
            Some(KState::Running { fp: f, .. }) => match same_request(&fp, f) {
                Some(true) => early.push(Early::InFlight),
                Some(false) => early.push(Early::Mismatch),
                None => early.extend([Early::InFlight, Early::Mismatch]),
            },
            Some(KState::Done {
                fp: f,
                finished,
                by,
                stored,
                first,
                ..
            }) => {
                let seen = Seen {
                    by: *by,
                    stored: stored.clone(),
                    first: first.clone(),
                };
                let answer = if now < finished.saturating_add(RETENTION) {
                    Early::Replay(seen)
                } else {
                    Early::Expired(seen)
                };
                match same_request(&fp, f) {
                    Some(true) => early.push(answer),
                    Some(false) => early.push(Early::Mismatch),
                    None => early.extend([answer, Early::Mismatch]),
                }
            }
        }
        let decision = if may_claim {
            let rec = self.record(&k);
            let claimed = match &rec {
                Some(Record {
                    state: State::Pending { holder, .. },
                    forget_at,
                    ..
                }) => now < *forget_at && Some(*holder) != previous,
                _ => false,
            };
            if claimed {
                let rec = rec.expect("a record");
                let State::Pending {
                    holder,
                    lease_deadline,
                    ..
                } = rec.state
                else {
                    unreachable!()
                };
                let deadline = now.saturating_add(LEASE);
                let forget = now.saturating_add(RETENTION.max(LEASE));
                assert_eq!(
                    (lease_deadline, rec.forget_at),
                    (deadline, forget),
                    "a claim of {k:?} at {now:?}: its lease deadline and forget instant"
                );
                self.keys.insert(
                    k.clone(),
                    KState::Claimed {
                        by: id,
                        fp,
                        holder,
                        deadline,
                        forget,
                    },
                );
                Decision::Acquire
            } else {
                assert!(
                    !early.is_empty(),
                    "request {id} must claim {k:?} (the key is free or its claim lapsed), the \
                     store holds {rec:?}"
                );
                Decision::Answer(early)
            }
        } else {
            Decision::Answer(early)
        };
        trace(|| format!("#{id} on {k:?}: {decision:?}"));
        self.reqs.get_mut(&id).expect("a request").decision = Some(decision);
    }

    /// After every settle: each claim and running lease is the store's live Pending record
    /// with its holder; a running handler's lease is ahead of the clock; a finished record has
    /// the documented windows.
    fn check_records(&mut self) {
        let now = self.now();
        let keys: Vec<Key> = self.keys.keys().cloned().collect();
        for k in keys {
            let rec = self.record(&k);
            let state = self.keys.get_mut(&k).expect("a key");
            match state {
                KState::Claimed {
                    holder,
                    deadline,
                    forget,
                    ..
                } => {
                    // Nothing heartbeats it, but the layer may renew it before the handler
                    // starts (docs/HTTP.md): its instants only ever move later.
                    match &rec {
                        Some(Record {
                            state:
                                State::Pending {
                                    holder: h,
                                    lease_deadline,
                                    ..
                                },
                            forget_at,
                            ..
                        }) if h == holder && lease_deadline >= deadline && forget_at >= forget => {
                            *deadline = *lease_deadline;
                            *forget = *forget_at;
                        }
                        other => panic!(
                            "the claim of {k:?} (holder {holder:?}, deadline {deadline:?}) is not \
                             in the store: {other:?}"
                        ),
                    }
                }
                KState::Running {
                    by,
                    holder,
                    deadline,
                    forget,
                    ..
                } => match &rec {
                    Some(Record {
                        state:
                            State::Pending {
                                holder: h,
                                lease_deadline,
                                ..
                            },
                        forget_at,
                        ..
                    }) if h == holder && now < *forget_at => {
                        assert!(
                            *lease_deadline > now,
                            "the lease of request {by}'s running handler on {k:?} lapsed \
                             (deadline {lease_deadline:?}, now {now:?}): heartbeats must keep it \
                             ahead of the clock"
                        );
                        if *deadline != *lease_deadline {
                            trace(|| {
                                format!("#{by}'s lease on {k:?} now ends at {lease_deadline:?}")
                            });
                        }
                        *deadline = *lease_deadline;
                        *forget = *forget_at;
                    }
                    other => panic!(
                        "request {by}'s handler runs on {k:?}, but its lease is not the store's \
                         live record: {other:?}"
                    ),
                },
                KState::Done {
                    finished,
                    failed,
                    stored,
                    ..
                } => {
                    let failed = *failed;
                    let ok = matches!(&rec, Some(r)
                        if r.expires_at == finished.saturating_add(RETENTION)
                            && r.forget_at == finished.saturating_add(HORIZON)
                            && matches!((&r.state, failed), (State::Completed(_), false) | (State::Failed(_), true)));
                    assert!(
                        ok,
                        "{k:?} finished at {finished:?} ({stored:?}): the record must be {} with \
                         the documented windows, the store holds {rec:?}",
                        if failed { "Failed" } else { "Completed" }
                    );
                }
            }
        }
    }

    fn check_effects(&self) {
        let table: BTreeMap<String, u64> = all_effects(&self.store).into_iter().collect();
        assert_eq!(
            table, self.cw_effects,
            "complete_with effects must commit exactly with their recorded answers"
        );
    }

    // ----- answers

    fn check_answer(&mut self, id: u64, got: &Answer) {
        // Any problem anyone sends is a documented one.
        if got.header("content-type") == Some(PROBLEM_JSON.as_bytes()) {
            let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap_or_default();
            let kind = v["type"].as_str().unwrap_or_default();
            assert!(
                PROBLEM_TYPES.contains(&kind) || kind == problem::HANDLER_FAILED,
                "request {id}: an undocumented problem type: {got:?}"
            );
        }
        let req = &self.reqs[&id];
        let what = format!("request {id} ({:?})", req.key);
        match &req.admission {
            Admission::NotRouted => {
                assert!(!req.entered, "{what}: no route, but the handler ran");
                assert_eq!(got.status, 404, "{what}: no route: {got:?}");
            }
            Admission::Refused(options) => {
                assert!(!req.entered, "{what}: refused, but the handler ran");
                let (status, kind) = options
                    .iter()
                    .find(|(s, _)| *s == got.status)
                    .unwrap_or_else(|| panic!("{what}: expected one of {options:?}, got {got:?}"));
                check_problem(got, *status, kind, &what);
            }
            Admission::Passthrough => {
                assert!(req.entered, "{what}: not covered, the handler must run");
                let returned = req.returned.clone().flatten();
                assert_eq!(
                    Some(got),
                    returned.as_ref(),
                    "{what}: not covered, the handler's answer passes through"
                );
            }
            Admission::Begin => match req.decision.clone() {
                None => panic!("{what}: answered before the store was asked: {got:?}"),
                Some(Decision::Acquire) => self.check_first_answer(id, got, &what),
                Some(Decision::Answer(options)) => {
                    assert!(
                        !req.entered,
                        "{what}: the handler ran, but the key was not claimed"
                    );
                    self.check_early(id, got, &options, &what);
                }
            },
        }
    }

    /// The answer of a request that claimed its key.
    fn check_first_answer(&mut self, id: u64, got: &Answer, what: &str) {
        let req = &self.reqs[&id];
        if !req.entered {
            // Its claim lapsed and was taken over (or forgotten) before its handler started.
            let k = req.key.clone().expect("a key");
            let held = matches!(self.keys.get(&k), Some(KState::Claimed { by, .. }) if *by == id);
            assert!(
                !held,
                "{what}: answered without running its handler although it holds the claim: {got:?}"
            );
            check_problem(got, 409, problem::IN_FLIGHT, what);
            return;
        }
        assert!(
            !got.replayed(),
            "{what}: a first answer is not a replay: {got:?}"
        );
        let returned = req.returned.clone().expect("the handler ended");
        match (req.spec.mode, returned) {
            // Released, and passed through as the handler answered: its body fails.
            (Mode::BodyError, _) if req.spec.status == 503 => {
                assert_eq!(got.status, 503, "{what}: {got:?}");
                assert_eq!(got.body, BODY_FAILED, "{what}: {got:?}");
            }
            (Mode::Panic | Mode::BodyError, _) => {
                check_problem(got, 500, problem::HANDLER_FAILED, what);
                let k = req.key.clone().expect("a key");
                if let Some(KState::Done { by, first, .. }) = self.keys.get_mut(&k)
                    && *by == id
                {
                    first.get_or_insert_with(|| got.clone());
                }
            }
            (_, Some(returned)) => {
                assert_eq!(got, &returned, "{what}: the first answer is the handler's");
            }
            (mode, None) => panic!("{what}: {mode:?} returned nothing"),
        }
    }

    /// The answer of a request the store's read path answered.
    fn check_early(&mut self, id: u64, got: &Answer, options: &[Early], what: &str) {
        let k = self.reqs[&id].key.clone().expect("a key");
        let kind = if got.status == 422 && !got.replayed() {
            check_problem(got, 422, problem::KEY_REUSED, what);
            "mismatch"
        } else if got.status == 409 && !got.replayed() {
            check_problem(got, 409, problem::IN_FLIGHT, what);
            "in flight"
        } else {
            assert!(
                got.replayed(),
                "{what}: expected one of {options:?}, got {got:?}"
            );
            "replay"
        };
        let allowed = options.iter().find(|o| {
            matches!(
                (o, kind),
                (Early::Mismatch, "mismatch")
                    | (Early::InFlight, "in flight")
                    | (Early::Replay(_) | Early::Expired(_), "replay")
            )
        });
        let Some(option) = allowed else {
            panic!("{what}: expected one of {options:?}, got a {kind}: {got:?}");
        };
        let (seen, full) = match option {
            Early::Replay(seen) => (seen.clone(), true),
            Early::Expired(seen) => (seen.clone(), false),
            _ => return,
        };
        let by = seen.by;
        // The first answer of a `HandlerFailed` record is learnt once seen: from the key's
        // record if it is still the one the decision saw.
        let current = match self.keys.get_mut(&k) {
            Some(KState::Done { by: b, first, .. }) if *b == by => Some(first),
            _ => None,
        };
        let mut first = seen.first.clone();
        if let Some(known) = current.as_ref().and_then(|f| (**f).clone()) {
            first = Some(known);
        }
        let stored = &seen.stored;
        let (status, content_type, location, body, omitted) = match stored {
            Stored::Answer {
                status,
                content_type,
                location,
                body,
                omitted,
            } => (
                *status,
                content_type.clone(),
                location.clone(),
                body.clone(),
                *omitted,
            ),
            Stored::HandlerFailed => {
                if full {
                    check_problem(got, 500, problem::HANDLER_FAILED, what);
                    let first = first.get_or_insert_with(|| {
                        let mut a = got.clone();
                        a.headers.retain(|(n, _)| n != IDEMPOTENT_REPLAYED);
                        a
                    });
                    (
                        500,
                        Some(PROBLEM_JSON.into()),
                        None,
                        first.body.clone(),
                        false,
                    )
                } else {
                    (500, None, None, Vec::new(), false)
                }
            }
        };
        if let Some(slot) = current
            && slot.is_none()
        {
            slot.clone_from(&first);
        }
        let mut headers = vec![(IDEMPOTENT_REPLAYED.to_owned(), b"true".to_vec())];
        if let Some(l) = location {
            headers.push(("location".into(), l));
        }
        let body = if !full {
            Vec::new()
        } else if omitted {
            headers.push((IDEMPOTENT_BODY_OMITTED.to_owned(), b"true".to_vec()));
            Vec::new()
        } else {
            if let Some(ct) = content_type {
                headers.push(("content-type".into(), ct));
            }
            body
        };
        headers.sort_by(|a, b| a.0.cmp(&b.0));
        let expected = Answer {
            status,
            headers,
            body,
        };
        assert_eq!(
            got,
            &expected,
            "{what}: {} of request {by}'s answer must be byte-identical",
            if full {
                "a replay"
            } else {
                "the tombstone answer"
            }
        );
    }
}
