//! `damaged_file`: a real store image, damaged by the input, then every read path the library
//! and the `idem` CLI use, and the write paths: a typed error or a correct answer, never a panic
//! or an abort, and whatever opens answers consistently.
//!
//! The images are built once per process: a cleanly closed store with completed and failed
//! records, pending leases (left by a process that died holding them), tombstones, inbox marks,
//! outbox events, dead letters and version marks; the durable image of the same workload left
//! by a crash (the store never closed: the open repairs it); and a small cleanly closed store.
//! The input picks an image and a few mutations: bytes xor-ed (at the header page, at page
//! starts, on the pages that hold records, outbox events, inbox marks or version marks, or
//! anywhere), a truncation, garbage appended, one page copied over another.
//!
//! Then, on the damaged bytes:
//! 1. `ReadOnlyStore` on a file (the CLI's `get`, `stats`, `export`, `outbox list`): every read;
//!    the file is unchanged afterwards.
//! 2. A `Store` opened without the open-time check (`verify_on_open(false)`), reads only: such
//!    a store can abort the process at a commit on a damaged file, as documented.
//! 3. A `Store` opened with the default builder (every page checked): every read, the white-box
//!    expiry-index check, then `execute` of the existing keys (replay) and of a new one, `begin`
//!    then `complete`, `process` of a delivered and a new message, `purge`, `sweep` after the clock
//!    moved; closed, and reopened.
//! 4. A copy opened the same way: `check_integrity`, then `compact`, closed and reopened.
//!
//! Invariants:
//! - no panic leaves a call, no panic comes from idem's own code (a contained redb panic is
//!   `CorruptStore`), and the process never aborts;
//! - on a file the checked open accepts, every answer of one open agrees with the others: two
//!   opens that read the same record (or mark, event list, counts) read the same value (on a
//!   file it refuses, the read-only and unchecked opens, which verify no checksum, may read an
//!   older version of a damaged page); an `execute` answers what the rules decide
//!   from the record `get` read (a record that replays replays its stored response, byte for
//!   byte; a record that fails to decode is never run again);
//! - the undamaged images answer exactly what was written;
//! - a file the checked open accepts is whole: it reads exactly what was written (a cleanly
//!   closed image; a crash image may have lost its torn latest commit), every write on it
//!   succeeds and is there after a reopen, `check_integrity` passes and `compact` keeps it.
//!
//! Every store runs on the thread of the input with a `ManualClock`; no background thread.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use super::backend::{CrashBackend, crash_backend_from_image};
use arbitrary::{Arbitrary, Unstructured};
use idem::backend::BackendLease;
use idem::clock::{Clock, ManualClock};
use idem::format::Record;
use idem::inbox::{Mark, ProcessAnswer};
use idem::outbox::{DeadLetter, DispatcherOptions, Event, OutboxStats, StoredEvent};
use idem::rules::{Decision, InboxDecision, decide, inbox_decide};
use idem::store::{ReadOnlyStore, Stats};
use idem::{
    Abort, BeginAnswer, Error, ExecuteAnswer, Request, Response, RetentionPolicy, Scope, Store,
    StoreBuilder, Timestamp,
};

/// redb's page size (the default, which idem uses).
const PAGE: usize = 4096;
/// The clock while the images are built.
const T0: Timestamp = Timestamp(1_700_000_000_000);
/// The short-retention operation's response window: its records are tombstones once the clock
/// moved past it and a sweep ran.
const SHORT_WINDOW: Duration = Duration::from_secs(20);
const SUBSCRIBER: &str = "sub";
const MAX_MUTATIONS: usize = 4;

// ---------------------------------------------------------------------------------------------
// The images

/// A key the checks look up, and what it held when the image was made.
#[derive(Debug, Clone)]
struct Probe {
    scope: Scope,
    key: String,
    record: Option<Record>,
}

/// Every record a walk of the records table read, by key (or why the walk failed).
type AllRecords = BTreeMap<Vec<u8>, Result<Record, String>>;

/// What a store answered: the subject of the comparisons between opens.
#[derive(Debug, Clone, Default)]
struct View {
    records: Vec<Option<Result<Option<Record>, String>>>,
    marks: Vec<Option<Result<Option<Mark>, String>>>,
    versions: Vec<Option<Result<Option<u64>, String>>>,
    all_records: Option<Result<AllRecords, String>>,
    stats: Option<Result<Stats, String>>,
    outbox: Option<Result<OutboxStats, String>>,
    pending: Option<Result<Vec<StoredEvent>, String>>,
    dead: Option<Result<Vec<DeadLetter>, String>>,
}

struct Image {
    name: &'static str,
    bytes: Vec<u8>,
    /// Closed cleanly (else left by a crash: the open repairs it).
    clean: bool,
    /// The clock when it was left.
    now: Timestamp,
    probes: Vec<Probe>,
    messages: Vec<String>,
    entities: Vec<String>,
    /// What the undamaged image answers (through a checked open).
    expected: View,
    /// Pages by what they hold (see [`Where`]).
    pages: BTreeMap<Where, Vec<usize>>,
}

fn body(i: usize) -> String {
    format!("body-{i:04}-{}", "x".repeat(i % 40))
}

fn req(scope: &Scope, key: &str) -> Request {
    Request::from_canonical_bytes(scope.clone(), key, b"p")
}

/// The builder every open uses (on a clock at `now`).
fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .lease_duration(Duration::from_secs(10))
        .retention_policy_for(
            "s",
            RetentionPolicy::new()
                .client_retry(SHORT_WINDOW)
                .tombstone_horizon(Duration::from_secs(30 * 24 * 3600)),
        )
}

/// Fills a store: `n` records (every seventh a failure), `n / 10` leases left pending, `n / 6`
/// short-retention records shrunk to tombstones, `n / 4` inbox messages each with an outbox
/// event and a version mark, and `n / 20 + 1` dead letters. Returns the probes, messages and
/// entities.
fn fill(store: &Store, clock: &ManualClock, n: usize) -> (Vec<Probe>, Vec<String>, Vec<String>) {
    let ops = Scope::new("t", "op");
    let leases = Scope::new("t", "lease");
    let short = Scope::new("t", "s");
    let mut probes = Vec::new();
    let mut probe = |scope: &Scope, key: String| {
        probes.push(Probe {
            scope: scope.clone(),
            key,
            record: None,
        })
    };
    // Dead letters first: a dispatcher whose publisher always fails, one attempt each. One
    // event at a time, so that the commits (a push, then its move to the dead letters) and so
    // the file's layout are the same on every run.
    let dispatcher = store
        .start_dispatcher(
            |_: &StoredEvent| -> Result<(), idem::error::BoxError> { Err("broker down".into()) },
            DispatcherOptions::new()
                .max_attempts(1)
                .backoff(Duration::from_millis(1), Duration::from_millis(2)),
        )
        .expect("start a dispatcher");
    for i in 0..n / 20 + 1 {
        let out = store
            .execute(req(&ops, &format!("dead-{i}")), |tx| {
                tx.outbox()
                    .push(Event::new("topic", format!("dead-{i}")).ordering_key(format!("d{i}")))?;
                Ok(Response::new(202, "queued"))
            })
            .expect("push a doomed event");
        assert!(matches!(out, ExecuteAnswer::Ran(_)), "{out:?}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while store.dead_letters(usize::MAX).expect("dead letters").len() <= i {
            assert!(Instant::now() < deadline, "the event was not dead-lettered");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    dispatcher.shutdown().expect("stop the dispatcher");

    for i in 0..n {
        let key = format!("key-{i:04}");
        let out = store.execute(req(&ops, &key), |_| {
            if i % 7 == 0 {
                Err(Abort::terminal(Response::new(402, body(i))))
            } else {
                Ok(Response::new(201, body(i)).with_resource("thing", key.clone()))
            }
        });
        assert!(matches!(out, Ok(ExecuteAnswer::Ran(_))), "{out:?}");
        probe(&ops, key);
    }
    for i in 0..n / 10 {
        let key = format!("lease-{i:03}");
        match store.begin(req(&leases, &key)).expect("begin") {
            BeginAnswer::Acquired(mut lease) => {
                // The holder dies: its lease stays in the file.
                lease.lapse_on_drop(true);
            }
            other => panic!("{key}: {other:?}"),
        }
        probe(&leases, key);
    }
    for i in 0..n / 6 {
        let key = format!("short-{i:03}");
        let out = store.execute(req(&short, &key), |_| Ok(Response::new(200, body(i))));
        assert!(matches!(out, Ok(ExecuteAnswer::Ran(_))), "{out:?}");
        probe(&short, key);
    }
    clock.advance(SHORT_WINDOW + Duration::from_secs(1));
    store
        .sweep()
        .expect("sweep: the short records become tombstones");
    let (mut messages, mut entities) = (Vec::new(), Vec::new());
    for i in 0..n / 4 {
        let id = format!("msg-{i:04}");
        let entity = format!("entity-{i:04}");
        let processed = store.process(SUBSCRIBER, &id, |tx| -> Result<(), Abort> {
            tx.outbox().push(
                Event::new("topic", format!("evt-{i:04}").into_bytes())
                    .ordering_key(format!("k{}", i % 5)),
            )?;
            tx.versions().advance(&entity, i as u64 + 1)?;
            Ok(())
        });
        assert!(
            matches!(processed, Ok(ProcessAnswer::Ran(()))),
            "{processed:?}"
        );
        messages.push(id);
        entities.push(entity);
    }
    // One more probe key that was never written, and one more message.
    probe(&ops, "never-written".into());
    messages.push("msg-never".into());
    entities.push("entity-never".into());
    (probes, messages, entities)
}

/// A built image: the store filled on a fresh in-memory disk, then left cleanly (closed) or by
/// a crash (the durable bytes while it was still open, after its last commit).
fn build(name: &'static str, n: usize, clean: bool) -> Image {
    let clock = ManualClock::new(T0);
    let disk = CrashBackend::default();
    let store = builder(&clock)
        .open_with_backend(disk.clone())
        .expect("open a new store");
    let (probes, messages, entities) = fill(&store, &clock, n);
    let crash = disk.durable_image();
    drop(store);
    let bytes = if clean { disk.live_image() } else { crash };
    let mut image = Image {
        name,
        bytes,
        clean,
        now: clock.now(),
        probes,
        messages,
        entities,
        expected: View::default(),
        pages: BTreeMap::new(),
    };
    image.pages = classify(&image.bytes);
    if std::env::var_os("IDEM_DAMAGED_FILE_TRACE").is_some() {
        eprintln!(
            "{name} image: {} bytes, pages {:?}",
            image.bytes.len(),
            image.pages
        );
    }
    // What it answers undamaged, read through the checked open of a copy.
    let clock = ManualClock::new(image.now);
    let store = builder(&clock)
        .open_with_backend(crash_backend_from_image(image.bytes.clone()))
        .unwrap_or_else(|e| panic!("{name}: the undamaged image does not open: {e}"));
    image.expected = read_store(&store, &image, true);
    for (probe, got) in image.probes.iter_mut().zip(&image.expected.records) {
        probe.record = match got {
            Some(Ok(record)) => record.clone(),
            other => panic!("{name}: {}: {other:?}", probe.key),
        };
    }
    image
}

fn images() -> &'static [Image] {
    static IMAGES: OnceLock<Vec<Image>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        vec![
            build("clean", 120, true),
            build("crash", 120, false),
            build("small", 12, true),
        ]
    })
}

// ---------------------------------------------------------------------------------------------
// Damage

/// Where a mutation lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Arbitrary)]
enum Where {
    /// Page 0: redb's super-header and its two commit slots.
    Header,
    /// A page holding record keys or bodies (the records table, the expiry index).
    Records,
    /// A page holding outbox payloads.
    Outbox,
    /// A page holding inbox message ids (the marks).
    Inbox,
    /// A page holding version marks.
    Versions,
    /// A page holding none of these (branch pages, the table tree, the allocator state, free
    /// pages).
    Other,
    /// Any page.
    Any,
}

/// The pages of `image` by what they hold, found by the bytes the workload wrote.
fn classify(image: &[u8]) -> BTreeMap<Where, Vec<usize>> {
    let holds = |page: &[u8], marker: &[u8]| page.windows(marker.len()).any(|w| w == marker);
    let mut pages: BTreeMap<Where, Vec<usize>> = BTreeMap::new();
    let count = image.len() / PAGE;
    for p in 0..count {
        let page = &image[p * PAGE..(p + 1) * PAGE];
        let mut any = false;
        for (w, marker) in [
            (Where::Records, &b"key-"[..]),
            (Where::Records, b"body-"),
            (Where::Outbox, b"evt-"),
            (Where::Inbox, b"msg-"),
            (Where::Versions, b"entity-"),
        ] {
            if p > 0 && holds(page, marker) {
                pages.entry(w).or_default().push(p);
                any = true;
            }
        }
        if p > 0 && !any {
            pages.entry(Where::Other).or_default().push(p);
        }
        pages.entry(Where::Any).or_default().push(p);
    }
    pages.insert(Where::Header, vec![0]);
    for list in pages.values_mut() {
        list.dedup();
    }
    pages
}

#[derive(Debug, Clone, Arbitrary)]
enum Mutation {
    /// `mask`'s bytes (a zero byte counts as 1) xor-ed at `offset` of a page; with `head`, within
    /// its first 64 bytes (a B-tree page's header and first offsets; for page 0 the header and
    /// the first commit slot).
    Xor {
        at: Where,
        page: u16,
        offset: u16,
        head: bool,
        mask: [u8; 4],
        len: u8,
    },
    /// The file cut to `pages` pages (modulo its length) plus `bytes`.
    Truncate { pages: u16, bytes: u16 },
    /// Garbage appended: `pages` pages and `bytes` more of `fill`.
    Extend { pages: u8, bytes: u16, fill: u8 },
    /// One page copied over another.
    CopyPage {
        from: Where,
        from_page: u16,
        to: Where,
        to_page: u16,
    },
}

fn page_of(image: &Image, at: Where, pick: u16, len: usize) -> Option<usize> {
    let pages = image.pages.get(&at).filter(|p| !p.is_empty())?;
    let p = pages[usize::from(pick) % pages.len()];
    (p * PAGE < len).then_some(p)
}

fn mutate(image: &Image, mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = image.bytes.clone();
    for m in mutations {
        match *m {
            Mutation::Xor {
                at,
                page,
                offset,
                head,
                mask,
                len,
            } => {
                let Some(p) = page_of(image, at, page, bytes.len()) else {
                    continue;
                };
                let within = if head {
                    usize::from(offset) % 64
                } else {
                    usize::from(offset) % PAGE
                };
                let start = p * PAGE + within;
                for (i, b) in mask.iter().take(1 + usize::from(len) % 4).enumerate() {
                    if let Some(byte) = bytes.get_mut(start + i) {
                        *byte ^= (*b).max(1);
                    }
                }
            }
            Mutation::Truncate {
                pages,
                bytes: extra,
            } => {
                let count = bytes.len() / PAGE;
                let len = (usize::from(pages) % count.max(1)) * PAGE + usize::from(extra) % PAGE;
                bytes.truncate(len);
            }
            Mutation::Extend {
                pages,
                bytes: extra,
                fill,
            } => {
                let len = usize::from(pages % 8) * PAGE + usize::from(extra) % PAGE;
                bytes.extend((0..len).map(|i| fill.wrapping_add((i % 251) as u8)));
            }
            Mutation::CopyPage {
                from,
                from_page,
                to,
                to_page,
            } => {
                let (Some(a), Some(b)) = (
                    page_of(image, from, from_page, bytes.len()),
                    page_of(image, to, to_page, bytes.len()),
                ) else {
                    continue;
                };
                if a != b && (a + 1) * PAGE <= bytes.len() && (b + 1) * PAGE <= bytes.len() {
                    let page = bytes[a * PAGE..(a + 1) * PAGE].to_vec();
                    bytes[b * PAGE..(b + 1) * PAGE].copy_from_slice(&page);
                }
            }
        }
    }
    bytes
}

// ---------------------------------------------------------------------------------------------
// Panics: contained ones are silent and noted; none may come from idem's own code

/// Set while an input runs: panics are noted in [`PANICS`] instead of reported (contained redb
/// panics are expected on damaged pages).
static CAPTURE: AtomicBool = AtomicBool::new(false);
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CAPTURE.load(Ordering::SeqCst) {
                let place = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let message = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                if std::env::var_os("IDEM_DAMAGED_FILE_TRACE").is_some() {
                    let trace = std::backtrace::Backtrace::force_capture();
                    eprintln!("contained? panic at {place}: {message}\n{trace}");
                }
                PANICS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("{place}: {message}"));
            } else {
                previous(info);
            }
        }));
    });
}

/// Whether a panic location is in idem's own source (not redb, std, or this harness).
fn in_idem(note: &str) -> bool {
    let file = note.split(':').next().unwrap_or_default();
    // A workspace build names idem's files `src/...`; a path dependency (the fuzz crate) by
    // their absolute path, outside cargo's registry and the standard library (`/rustc/...`).
    let absolute = file.contains("/src/")
        && !file.contains("/registry/")
        && !file.contains("/rustc/")
        && !file.contains("/tests/");
    file.starts_with("src/") || absolute
}

/// The panics noted since the last call: none may come from idem's own code.
fn no_panic_in_idem(ctx: &str) {
    let noted = std::mem::take(&mut *PANICS.lock().unwrap_or_else(|e| e.into_inner()));
    for note in &noted {
        assert!(
            !in_idem(note),
            "{ctx}: idem's own code panicked on a damaged file: {note}"
        );
    }
}

/// Runs one call of the library: a panic out of it fails the input.
fn call<T>(ctx: &str, what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            panic!("{ctx}: {what} panicked out of the library: {message}")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

fn text(e: &Error) -> String {
    e.to_string()
}

/// Every read the store answers (`whole`: also the record walk and the counts, which a store
/// opened without its check reads from damaged pages as the read-only store does).
fn read_store(store: &Store, image: &Image, whole: bool) -> View {
    let ctx = image.name;
    let mut v = View::default();
    for p in &image.probes {
        let got = call(ctx, "get", || store.get(&p.scope, &p.key));
        v.records.push(Some(got.map_err(|e| text(&e))));
    }
    for m in &image.messages {
        let got = call(ctx, "inbox_mark", || store.inbox_mark(SUBSCRIBER, m));
        v.marks.push(Some(got.map_err(|e| text(&e))));
    }
    for e in &image.entities {
        let got = call(ctx, "high_water_mark", || store.high_water_mark(e));
        v.versions.push(Some(
            got.map(|m| m.map(|m| m.version)).map_err(|e| text(&e)),
        ));
    }
    if whole {
        v.all_records = Some(call(ctx, "for_each_record", || {
            walk(|f| store.for_each_record(f))
        }));
        v.stats = Some(call(ctx, "stats", || store.stats()).map_err(|e| text(&e)));
    }
    v.outbox = Some(call(ctx, "outbox_stats", || store.outbox_stats()).map_err(|e| text(&e)));
    v.pending = Some(
        call(ctx, "pending_events", || store.pending_events(usize::MAX)).map_err(|e| text(&e)),
    );
    v.dead =
        Some(call(ctx, "dead_letters", || store.dead_letters(usize::MAX)).map_err(|e| text(&e)));
    v
}

fn read_only(store: &ReadOnlyStore, image: &Image) -> View {
    let ctx = image.name;
    let mut v = View::default();
    for p in &image.probes {
        let got = call(ctx, "ReadOnlyStore::get", || store.get(&p.scope, &p.key));
        v.records.push(Some(got.map_err(|e| text(&e))));
    }
    v.all_records = Some(call(ctx, "ReadOnlyStore::for_each_record", || {
        walk(|f| store.for_each_record(f))
    }));
    v.stats = Some(call(ctx, "ReadOnlyStore::stats", || store.stats()).map_err(|e| text(&e)));
    v.outbox = Some(
        call(ctx, "ReadOnlyStore::outbox_stats", || store.outbox_stats()).map_err(|e| text(&e)),
    );
    v.pending = Some(
        call(ctx, "ReadOnlyStore::pending_events", || {
            store.pending_events(usize::MAX)
        })
        .map_err(|e| text(&e)),
    );
    v.dead = Some(
        call(ctx, "ReadOnlyStore::dead_letters", || {
            store.dead_letters(usize::MAX)
        })
        .map_err(|e| text(&e)),
    );
    v
}

type Walked = Result<BTreeMap<Vec<u8>, Result<Record, String>>, String>;

/// Every record a walk visits, by key (a damaged tree may visit a key twice: the last visit
/// counts, and another open's walk of the same file must have met the same).
fn walk(
    run: impl FnOnce(
        &mut dyn FnMut(&[u8], Result<Record, Error>) -> ControlFlow<()>,
    ) -> Result<(), Error>,
) -> Walked {
    let mut seen = BTreeMap::new();
    let mut visit = |key: &[u8], record: Result<Record, Error>| {
        seen.insert(key.to_vec(), record.map_err(|e| text(&e)));
        ControlFlow::Continue(())
    };
    run(&mut visit).map(|()| seen).map_err(|e| text(&e))
}

/// Two answers to the same read agree wherever both are `Ok`.
fn agree<T: PartialEq + std::fmt::Debug>(
    ctx: &str,
    what: &str,
    a: &Option<Result<T, String>>,
    b: &Option<Result<T, String>>,
) {
    if let (Some(Ok(a)), Some(Ok(b))) = (a, b) {
        assert_eq!(a, b, "{ctx}: {what} differs between two opens of one file");
    }
}

fn agree_views(ctx: &str, image: &Image, a: &View, b: &View) {
    for (i, p) in image.probes.iter().enumerate() {
        agree(
            ctx,
            &format!("get {}/{}", p.scope.operation(), p.key),
            a.records.get(i).unwrap_or(&None),
            b.records.get(i).unwrap_or(&None),
        );
    }
    for (i, m) in image.messages.iter().enumerate() {
        agree(
            ctx,
            &format!("inbox_mark {m}"),
            a.marks.get(i).unwrap_or(&None),
            b.marks.get(i).unwrap_or(&None),
        );
    }
    for (i, e) in image.entities.iter().enumerate() {
        agree(
            ctx,
            &format!("high_water_mark {e}"),
            a.versions.get(i).unwrap_or(&None),
            b.versions.get(i).unwrap_or(&None),
        );
    }
    agree(ctx, "for_each_record", &a.all_records, &b.all_records);
    agree(ctx, "stats", &a.stats, &b.stats);
    agree(ctx, "outbox_stats", &a.outbox, &b.outbox);
    agree(ctx, "pending_events", &a.pending, &b.pending);
    agree(ctx, "dead_letters", &a.dead, &b.dead);
}

/// Every read of `got` is `Ok` and equal to the undamaged image's answer.
fn exactly(ctx: &str, image: &Image, got: &View) {
    let error = first_error(got);
    assert!(
        error.is_empty(),
        "{ctx}: a read failed on a file that must read as written: {error}"
    );
    agree_views(ctx, image, &image.expected, got);
}

fn first_error(v: &View) -> String {
    let records = v.records.iter().flatten().filter_map(|r| r.as_ref().err());
    let marks = v.marks.iter().flatten().filter_map(|r| r.as_ref().err());
    let versions = v.versions.iter().flatten().filter_map(|r| r.as_ref().err());
    let rest = [
        v.all_records.as_ref().and_then(|r| r.as_ref().err()),
        v.stats.as_ref().and_then(|r| r.as_ref().err()),
        v.outbox.as_ref().and_then(|r| r.as_ref().err()),
        v.pending.as_ref().and_then(|r| r.as_ref().err()),
        v.dead.as_ref().and_then(|r| r.as_ref().err()),
    ];
    records
        .chain(marks)
        .chain(versions)
        .chain(rest.into_iter().flatten())
        .next()
        .cloned()
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The phases

/// A directory for the read-only store's files: a tmpfs when there is one.
fn scratch() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        let b = tempfile::Builder::new()
            .prefix("idem-damaged-file-")
            .tempdir_in(shm);
        b.or_else(|_| tempfile::tempdir())
            .expect("a scratch directory")
    })
}

/// 1. The read-only store (the CLI's read commands) on a file holding `bytes`.
fn phase_read_only(ctx: &str, image: &Image, bytes: &[u8]) -> Option<View> {
    static N: AtomicU64 = AtomicU64::new(0);
    let path: PathBuf = scratch()
        .path()
        .join(format!("ro-{}.redb", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, bytes).expect("write the damaged file");
    let clock = ManualClock::new(image.now);
    let opened = call(ctx, "open_read_only", || {
        builder(&clock).open_read_only(&path)
    });
    let view = match opened {
        Ok(store) => {
            let view = read_only(&store, image);
            call(ctx, "dropping the read-only store", || drop(store));
            Some(view)
        }
        Err(e) => {
            assert!(
                !(image.clean && bytes == image.bytes),
                "{ctx}: the undamaged clean image does not open read-only: {e}"
            );
            if !image.clean && bytes == image.bytes {
                assert!(matches!(e, Error::NeedsRecovery), "{ctx}: {e}");
            }
            None
        }
    };
    let after = std::fs::read(&path).expect("read the file back");
    assert!(
        after == bytes,
        "{ctx}: the read-only store wrote to the file"
    );
    let _ = std::fs::remove_file(&path);
    view
}

/// 2. A store opened without the open-time check: reads only.
fn phase_unchecked(ctx: &str, image: &Image, bytes: &[u8]) -> Option<View> {
    let clock = ManualClock::new(image.now);
    let backend = crash_backend_from_image(bytes.to_vec());
    let gone = backend.gone.clone();
    let opened = call(ctx, "open (unchecked)", || {
        builder(&clock)
            .verify_on_open(false)
            .open_with_backend(backend)
    });
    let store = opened.ok()?;
    let view = read_store(&store, image, true);
    call(ctx, "the expiry-index check (unchecked)", || {
        store.check_expiry_index()
    })
    .ok();
    // redb commits when the last handle drops (it saves its allocator state), and a commit on a
    // damaged page can abort the process: the documented risk of `verify_on_open(false)`
    // (fuzz/regressions/damaged_file/an-unchecked-store-aborts-at-its-close-commit). This
    // phase is about the reads, so the disk goes away first and that commit fails cleanly.
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    call(ctx, "dropping the unchecked store", || drop(store));
    Some(view)
}

/// What `execute` of `probe` answered, against what the rules decide from the record `get` read
/// just before.
fn execute_agrees(ctx: &str, store: &Store, probe: &Probe, read: &Result<Option<Record>, String>) {
    let request = req(&probe.scope, &probe.key);
    let fingerprint = *request.fingerprint();
    let ran = Response::new(299, "ran now");
    let out = call(ctx, "execute", || {
        store.execute(request, |_| Ok(ran.clone()))
    });
    let now = store.now();
    let what = format!("{ctx}: execute {}/{}", probe.scope.operation(), probe.key);
    let (read, out) = match (read, out) {
        (_, Err(_)) => return,
        (Err(e), Ok(out)) => panic!("{what}: get failed ({e}) but execute answered {out:?}"),
        (Ok(read), Ok(out)) => (read, out),
    };
    match (decide(read.as_ref(), &fingerprint, now), &out) {
        (Decision::Claim | Decision::Takeover { .. }, ExecuteAnswer::Ran(r)) => {
            assert_eq!(r, &ran, "{what}")
        }
        // A lease of an earlier process is taken over at once (the restart rule).
        (Decision::InFlight { .. }, ExecuteAnswer::InFlight { .. } | ExecuteAnswer::Ran(_)) => {}
        (Decision::Replay(stored), ExecuteAnswer::Replayed(r)) => {
            assert_eq!(
                r, stored,
                "{what}: replayed another response than the stored one"
            )
        }
        (d @ Decision::Expired { .. }, ExecuteAnswer::Expired(t)) => {
            assert_eq!(Some(t), d.tombstone().as_ref(), "{what}")
        }
        (d, out) => panic!("{what}: the record {read:?} decides {d:?}, execute answered {out:?}"),
    }
}

/// What `process` of `message` answered, against the mark `inbox_mark` read just before.
fn process_agrees(ctx: &str, store: &Store, message: &str, read: &Result<Option<Mark>, String>) {
    let out = call(ctx, "process", || {
        store.process(SUBSCRIBER, message, |_| -> Result<(), Abort> { Ok(()) })
    });
    let what = format!("{ctx}: process {message}");
    match (read, out) {
        (_, Err(_)) => {}
        (Err(e), Ok(out)) => panic!("{what}: inbox_mark failed ({e}) but process answered {out:?}"),
        (Ok(mark), Ok(out)) => match (inbox_decide(mark.as_ref(), store.now()), &out) {
            (InboxDecision::Process, ProcessAnswer::Ran(())) => {}
            (
                InboxDecision::Duplicate { processed_at },
                ProcessAnswer::Duplicate {
                    processed_at: p, ..
                },
            ) if processed_at == *p => {}
            (d, out) => panic!("{what}: the mark {mark:?} decides {d:?}, process answered {out:?}"),
        },
    }
}

/// 3. The checked open: every read, the write paths, a reopen. Returns whether it opened.
fn phase_checked(
    ctx: &str,
    image: &Image,
    bytes: &[u8],
    step: Duration,
    others: &[&Option<View>],
) -> bool {
    let clock = ManualClock::new(image.now);
    let disk = crash_backend_from_image(bytes.to_vec());
    let opened = call(ctx, "open", || {
        builder(&clock).open_with_backend(disk.clone())
    });
    let store = match opened {
        Ok(store) => store,
        Err(e) => {
            assert!(
                bytes != image.bytes,
                "{ctx}: the undamaged image does not open: {e}"
            );
            return false;
        }
    };
    let view = read_store(&store, image, true);
    // A file the check accepted reads what was written (a crash image: its last commits may
    // be gone only if damaged, so only the undamaged one is compared). An empty file is a new
    // store, as documented (`StoreBuilder::open`).
    if bytes.is_empty() {
        let error = first_error(&view);
        assert!(error.is_empty(), "{ctx}: a read of a new store: {error}");
        assert!(
            view.records.iter().all(|r| matches!(r, Some(Ok(None)))),
            "{ctx}: an empty file opened as a store with records"
        );
    } else if image.clean || bytes == image.bytes {
        exactly(ctx, image, &view);
    }
    for other in others.iter().copied().flatten() {
        agree_views(ctx, image, &view, other);
    }
    let index = call(ctx, "check_expiry_index", || store.check_expiry_index());
    assert!(
        index.is_ok(),
        "{ctx}: the expiry index of an accepted file: {index:?}"
    );

    // Each existing key and message again, through the write path's read.
    for (probe, read) in image.probes.iter().zip(&view.records) {
        if let Some(read) = read {
            execute_agrees(ctx, &store, probe, read);
        }
    }
    for (message, read) in image.messages.iter().zip(&view.marks) {
        if let Some(read) = read {
            process_agrees(ctx, &store, message, read);
        }
    }
    // New work: each must succeed on an accepted file.
    let scope = Scope::new("t", "fresh");
    let fresh = Response::new(201, "fresh");
    let executed = call(ctx, "execute (new key)", || {
        store.execute(req(&scope, "fresh-1"), |tx| {
            tx.outbox().push(Event::new("topic", "fresh"))?;
            Ok(fresh.clone())
        })
    });
    assert!(
        matches!(&executed, Ok(ExecuteAnswer::Ran(r)) if *r == fresh),
        "{ctx}: a new key on an accepted file: {executed:?}"
    );
    let leased = call(ctx, "begin + complete", || {
        match store.begin(req(&scope, "fresh-2")) {
            Ok(BeginAnswer::Acquired(lease)) => {
                lease.complete(Response::new(201, "leased")).map(|_| ())
            }
            Ok(other) => panic!("{ctx}: begin of a new key: {other:?}"),
            Err(e) => Err(e),
        }
    });
    assert!(
        leased.is_ok(),
        "{ctx}: a lease on an accepted file: {leased:?}"
    );
    let processed = call(ctx, "process (new message)", || {
        store.process(SUBSCRIBER, "fresh-msg", |_| -> Result<(), Abort> { Ok(()) })
    });
    assert!(
        matches!(processed, Ok(ProcessAnswer::Ran(()))),
        "{ctx}: a new message on an accepted file: {processed:?}"
    );
    if let Some(p) = image.probes.first() {
        let purged = call(ctx, "purge", || store.purge(&p.scope, &p.key));
        assert!(
            purged.is_ok(),
            "{ctx}: purge on an accepted file: {purged:?}"
        );
        let after = call(ctx, "get after purge", || store.get(&p.scope, &p.key));
        assert!(
            matches!(after, Ok(None)),
            "{ctx}: {}: after purge {after:?}",
            p.key
        );
    }
    clock.advance(step);
    let swept = call(ctx, "sweep", || store.sweep());
    assert!(swept.is_ok(), "{ctx}: sweep on an accepted file: {swept:?}");
    let index = call(ctx, "check_expiry_index after the writes", || {
        store.check_expiry_index()
    });
    assert!(
        index.is_ok(),
        "{ctx}: the expiry index after the writes: {index:?}"
    );
    assert_eq!(
        store.fail_stop_cause(),
        None,
        "{ctx}: latched on an accepted file"
    );
    let fresh_record = call(ctx, "get (new key)", || store.get(&scope, "fresh-1"));
    call(ctx, "closing the store", || drop(store));

    // Reopened: what was written is there.
    let reopened = call(ctx, "reopen", || {
        builder(&clock).open_with_backend(crash_backend_from_image(disk.live_image()))
    });
    let store = reopened.unwrap_or_else(|e| panic!("{ctx}: the written file does not reopen: {e}"));
    let again = call(ctx, "get after the reopen", || store.get(&scope, "fresh-1"));
    assert_eq!(
        again.map_err(|e| text(&e)),
        fresh_record.map_err(|e| text(&e)),
        "{ctx}: the new key after a reopen"
    );
    call(ctx, "closing the reopened store", || drop(store));
    true
}

/// 4. `check_integrity` and `compact` on a copy, then a reopen.
fn phase_maintenance(ctx: &str, image: &Image, bytes: &[u8]) {
    let clock = ManualClock::new(image.now);
    let disk = crash_backend_from_image(bytes.to_vec());
    let opened = call(ctx, "open (copy)", || {
        builder(&clock).open_with_backend(disk.clone())
    });
    let Ok(mut store) = opened else {
        return;
    };
    let before = read_store(&store, image, true);
    let checked = call(ctx, "check_integrity", || store.check_integrity());
    assert!(
        matches!(checked, Ok(true)),
        "{ctx}: check_integrity of a file the checked open accepted: {checked:?}"
    );
    let compacted = call(ctx, "compact", || store.compact());
    assert!(compacted.is_ok(), "{ctx}: compact: {compacted:?}");
    call(ctx, "closing the compacted store", || drop(store));
    let reopened = call(ctx, "reopen after compact", || {
        builder(&clock).open_with_backend(crash_backend_from_image(disk.live_image()))
    });
    let store =
        reopened.unwrap_or_else(|e| panic!("{ctx}: the compacted file does not reopen: {e}"));
    let after = read_store(&store, image, true);
    assert!(
        first_error(&after).is_empty(),
        "{ctx}: a read after compact: {}",
        first_error(&after)
    );
    agree_views(ctx, image, &before, &after);
    call(ctx, "closing", || drop(store));
}

// ---------------------------------------------------------------------------------------------
// The input

#[derive(Debug)]
struct Input {
    image: usize,
    mutations: Vec<Mutation>,
    /// How far the clock moves before the sweep.
    step: Duration,
}

fn decode(data: &[u8]) -> arbitrary::Result<Input> {
    let mut u = Unstructured::new(data);
    let image = usize::from(u.int_in_range(0..=2u8)?);
    let step = match u.int_in_range(0..=3u8)? {
        0 => Duration::ZERO,
        1 => SHORT_WINDOW,
        2 => Duration::from_secs(3600),
        _ => Duration::from_secs(40 * 24 * 3600),
    };
    let n = u.int_in_range(0..=MAX_MUTATIONS)?;
    let mut mutations = Vec::with_capacity(n);
    for _ in 0..n {
        mutations.push(u.arbitrary()?);
    }
    Ok(Input {
        image,
        mutations,
        step,
    })
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(input) = decode(data) else {
        return;
    };
    install_panic_hook();
    let image = &images()[input.image];
    let bytes = mutate(image, &input.mutations);
    let ctx = format!("{} image, {:?}", image.name, input.mutations);
    CAPTURE.store(true, Ordering::SeqCst);
    let checked = catch_unwind(AssertUnwindSafe(|| {
        let ro = phase_read_only(&ctx, image, &bytes);
        if let Some(ro) = &ro
            && image.clean
            && bytes == image.bytes
        {
            exactly(&ctx, image, ro);
        }
        no_panic_in_idem(&ctx);
        // The read-only and the unchecked opens verify no checksum: on a damaged file either
        // may read an older version of a page without an error, so they are held to agree
        // only on a file the checked open accepts (`phase_checked`; docs/RELIABILITY.md,
        // fuzz/regressions/damaged_file/a-read-only-open-reads-an-old-page-without-an-error).
        let unchecked = phase_unchecked(&ctx, image, &bytes);
        no_panic_in_idem(&ctx);
        let accepted = phase_checked(&ctx, image, &bytes, input.step, &[&ro, &unchecked]);
        if accepted {
            phase_maintenance(&ctx, image, &bytes);
        }
        no_panic_in_idem(&ctx);
        if std::env::var_os("IDEM_DAMAGED_FILE_TRACE").is_some() {
            let summary = |v: &Option<View>| match v {
                None => "refused".to_owned(),
                Some(v) => match first_error(v) {
                    e if e.is_empty() => "all ok".to_owned(),
                    e => format!("errors, first: {e}"),
                },
            };
            eprintln!(
                "{ctx} ({} of {} bytes changed): read-only {}; unchecked {}; checked {}",
                bytes
                    .iter()
                    .zip(&image.bytes)
                    .filter(|(a, b)| a != b)
                    .count()
                    + bytes.len().abs_diff(image.bytes.len()),
                image.bytes.len(),
                summary(&ro),
                summary(&unchecked),
                if accepted { "accepted" } else { "refused" }
            );
        }
    }));
    CAPTURE.store(false, Ordering::SeqCst);
    if let Err(payload) = checked {
        // The hook was silent: say what failed before the fuzzer (or the test) reports it.
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!("damaged_file: {message}");
        resume_unwind(payload);
    }
}
