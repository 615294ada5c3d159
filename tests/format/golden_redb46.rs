//! A journal-mode store written by redb 4.6, left with a live journal, opens with the current
//! code: every claim it answered replays its first answer, and the caller table holds what its
//! closures wrote.
//!
//! The golden files (`tests/format/golden/journal-live.redb46` and its `.journal`) were made by
//! [`generate`] on a commit that depended on redb 4.6: a child process opens a store in journal
//! mode (a 64 KiB journal), makes the claims of [`BEFORE_CLOSE`], closes it cleanly (they reach
//! redb's file), opens it again, makes the claims of [`LIVE`] and is SIGKILLed once it has
//! printed their answers: those are in the journal only, as after a crash. The files are not
//! named `*.redb`, which Cargo.toml leaves out of the package; the tests copy them to a temp dir
//! as `idem.redb` and `idem.redb.journal`.
//!
//! To regenerate (only on a commit whose redb is 4.6, else the files are no longer what their
//! name says), from the repository's root:
//! `IDEM_GOLDEN_OUT=tests/format/golden cargo test --test format -- --ignored --exact golden_redb46::generate`

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::T0;
use idem::clock::ManualClock;
use idem::redb::{ReadableTable, TableDefinition};
use idem::{Abort, ExecuteAnswer, Request, Response, Scope, Store, StoreBuilder};

/// The golden files, beside this file.
const GOLDEN_STORE: &str = "tests/format/golden/journal-live.redb46";
const GOLDEN_JOURNAL: &str = "tests/format/golden/journal-live.redb46.journal";

/// The caller's table the closures write: label → amount.
const LEDGER: TableDefinition<&str, u64> = TableDefinition::new("golden.ledger");

/// How a claim's closure ends.
#[derive(Clone, Copy)]
enum Ends {
    /// `Ok(Response)`, with a resource pointer `(kind, id)` if any.
    Completed(Option<(&'static str, &'static str)>),
    /// `Abort::Terminal(Response)`.
    Terminal,
}

/// One claim the generator made and the answer it got.
struct Claim {
    tenant: &'static str,
    operation: &'static str,
    key: &'static str,
    payload: &'static [u8],
    status: u16,
    body: &'static str,
    ends: Ends,
    /// The closure adds this to the ledger row `<tenant>/<key>` and to the row `total`.
    ledger: Option<u64>,
}

/// Claims made before the clean close: in redb's file.
const BEFORE_CLOSE: &[Claim] = &[
    Claim {
        tenant: "acme",
        operation: "charge",
        key: "c-1",
        payload: b"{\"amount\":1250}",
        status: 201,
        body: "charged 12.50",
        ends: Ends::Completed(Some(("charge", "ch_1"))),
        ledger: Some(1250),
    },
    Claim {
        tenant: "acme",
        operation: "refund",
        key: "r-1",
        payload: b"{\"charge\":\"ch_0\"}",
        status: 402,
        body: "card declined",
        ends: Ends::Terminal,
        ledger: None,
    },
    Claim {
        tenant: "globex",
        operation: "ship",
        key: "s-1",
        payload: b"{\"parcel\":7}",
        status: 200,
        body: "shipped",
        ends: Ends::Completed(None),
        ledger: None,
    },
];

/// Claims made after the reopen: in the journal only when the child is killed.
const LIVE: &[Claim] = &[
    Claim {
        tenant: "globex",
        operation: "charge",
        key: "c-2",
        payload: b"{\"amount\":990}",
        status: 201,
        body: "charged 9.90",
        ends: Ends::Completed(Some(("charge", "ch_2"))),
        ledger: Some(990),
    },
    Claim {
        tenant: "initech",
        operation: "refund",
        key: "r-2",
        payload: b"{\"charge\":\"ch_1\"}",
        status: 409,
        body: "already refunded",
        ends: Ends::Terminal,
        ledger: None,
    },
    Claim {
        tenant: "acme",
        operation: "charge",
        key: "c-3",
        payload: b"{\"amount\":42}",
        status: 201,
        body: "charged 0.42",
        ends: Ends::Completed(Some(("charge", "ch_3"))),
        ledger: Some(42),
    },
    Claim {
        tenant: "globex",
        operation: "ship",
        key: "s-2",
        payload: b"{\"parcel\":8}",
        status: 202,
        body: "queued",
        ends: Ends::Completed(Some(("shipment", "shp_8"))),
        ledger: None,
    },
];

/// The ledger's rows once every claim ran: (label, amount).
const LEDGER_ROWS: &[(&str, u64)] = &[
    ("acme/c-1", 1250),
    ("acme/c-3", 42),
    ("globex/c-2", 990),
    ("total", 1250 + 990 + 42),
];

impl Claim {
    fn request(&self) -> Request {
        Request::from_canonical_bytes(
            Scope::new(self.tenant, self.operation),
            self.key,
            self.payload,
        )
    }

    fn response(&self) -> Response {
        let r = Response::new(self.status, self.body);
        match self.ends {
            Ends::Completed(Some((kind, id))) => r.with_resource(kind, id),
            Ends::Completed(None) | Ends::Terminal => r,
        }
    }

    /// Claims it on `store`: the closure runs and its answer is the claim's.
    fn run(&self, store: &Store) {
        let answer = store
            .execute(self.request(), |tx| {
                if let Some(amount) = self.ledger {
                    let mut ledger = tx.open_table(LEDGER)?;
                    for label in [format!("{}/{}", self.tenant, self.key), "total".to_owned()] {
                        let n = ledger.get(label.as_str())?.map_or(0, |v| v.value());
                        ledger.insert(label.as_str(), n + amount)?;
                    }
                }
                match self.ends {
                    Ends::Completed(_) => Ok(self.response()),
                    Ends::Terminal => Err(Abort::terminal(self.response())),
                }
            })
            .expect("execute");
        match answer {
            ExecuteAnswer::Ran(r) => self.check(&r),
            other => panic!("{}: expected Ran, got {other:?}", self.key),
        }
    }

    /// Claims it again on `store`: the first answer replays, the closure does not run.
    fn replays(&self, store: &Store) {
        let answer = store
            .execute(self.request(), |_| {
                panic!(
                    "{}/{}: answered before, yet runs again",
                    self.tenant, self.key
                )
            })
            .unwrap_or_else(|e| panic!("{}/{}: {e}", self.tenant, self.key));
        match answer {
            ExecuteAnswer::Replayed(r) => self.check(&r),
            other => panic!(
                "{}/{}: expected a replay, got {other:?}",
                self.tenant, self.key
            ),
        }
    }

    fn check(&self, r: &Response) {
        let what = format!("{}/{}/{}", self.tenant, self.operation, self.key);
        assert_eq!(r.status(), self.status, "{what}");
        assert_eq!(r.body(), self.body.as_bytes(), "{what}");
        let resource = r.resource().map(|r| (r.kind.as_str(), r.id.as_str()));
        let expected = match self.ends {
            Ends::Completed(resource) => resource,
            Ends::Terminal => None,
        };
        assert_eq!(resource, expected, "{what}");
        assert_eq!(
            r.is_failure(),
            matches!(self.ends, Ends::Terminal),
            "{what}"
        );
    }
}

/// The generator's settings: journal mode with the smallest journal, a clock fixed at [`T0`]
/// (the tests use the same, so no record's window is over when they read it).
fn generator_builder() -> StoreBuilder {
    Store::builder()
        .journal(true)
        .journal_capacity(64 << 10)
        .checkpoint_bytes(32 << 10)
        .clock(ManualClock::new(T0))
}

/// The golden files copied to a temp dir as a store and its journal.
fn golden_copy() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    std::fs::copy(root.join(GOLDEN_STORE), &path).expect("copy the golden store");
    std::fs::copy(root.join(GOLDEN_JOURNAL), idem::store::journal_path(&path))
        .expect("copy the golden journal");
    (dir, path)
}

/// Every claim replays its first answer, the ledger holds what the closures wrote, and there
/// is nothing else.
fn check_store(store: &Store) {
    for claim in BEFORE_CLOSE.iter().chain(LIVE) {
        claim.replays(store);
    }
    let stats = store.stats().expect("stats");
    assert_eq!(
        stats.records,
        (BEFORE_CLOSE.len() + LIVE.len()) as u64,
        "{stats:?}"
    );
    let read = store.read_transaction().expect("read transaction");
    let ledger = read.open_table(LEDGER).expect("the ledger table");
    let rows: Vec<(String, u64)> = ledger
        .iter()
        .expect("iter")
        .map(|row| {
            let (k, v) = row.expect("ledger row");
            (k.value().to_owned(), v.value())
        })
        .collect();
    let expected: Vec<(String, u64)> = LEDGER_ROWS
        .iter()
        .map(|&(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(rows, expected);
}

#[test]
fn a_redb_46_store_with_a_live_journal_opens_in_journal_mode() {
    let (_dir, path) = golden_copy();
    let store = Store::builder()
        .journal(true)
        .clock(ManualClock::new(T0))
        .open(&path)
        .expect("open the golden store in journal mode");
    // Each live claim's entry, from the journal: none of them was in redb's file.
    assert_eq!(store.metrics().journal.replayed, LIVE.len() as u64);
    check_store(&store);
    drop(store);
    // And again after a clean close, in the default mode.
    let store = Store::builder()
        .clock(ManualClock::new(T0))
        .open(&path)
        .expect("reopen");
    check_store(&store);
}

#[test]
fn a_redb_46_store_with_a_live_journal_opens_without_journal_mode() {
    let (_dir, path) = golden_copy();
    let store = Store::builder()
        .journal(false)
        .clock(ManualClock::new(T0))
        .open(&path)
        .expect("open the golden store without journal mode");
    check_store(&store);
}

// ---- the generator ----

const OUT_ENV: &str = "IDEM_GOLDEN_OUT";
const CHILD_ENV: &str = "IDEM_GOLDEN_CHILD";
/// The line the child prints once the live claims are answered.
const DONE: &str = "golden: answered";

/// Writes the golden files into `$IDEM_GOLDEN_OUT` (see the module's doc); does nothing
/// without it.
#[test]
#[ignore = "generates the golden files: IDEM_GOLDEN_OUT=<dir>"]
fn generate() {
    let Some(out) = std::env::var_os(OUT_ENV) else {
        println!("{OUT_ENV} is not set: nothing generated");
        return;
    };
    let out = Path::new(&out);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    let exe = std::env::current_exe().expect("test binary");
    let child = common::test_name(module_path!(), "generate_child");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            &child,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, &path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let stdout = BufReader::new(child.stdout.take().expect("child stdout"));
    let mut answered = false;
    for line in stdout.lines() {
        if line.expect("child stdout").trim() == DONE {
            answered = true;
            break;
        }
    }
    // SIGKILL on Unix: no destructor runs, the journal stays live.
    child.kill().expect("kill the child");
    let status = child.wait().expect("reap the child");
    assert!(answered, "the child ended without answering: {status}");
    std::fs::create_dir_all(out).expect("the output dir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (from, to) in [
        (path.clone(), GOLDEN_STORE),
        (idem::store::journal_path(&path), GOLDEN_JOURNAL),
    ] {
        let name = Path::new(to).file_name().expect("a file name");
        std::fs::copy(&from, out.join(name)).expect("copy a golden file");
        println!(
            "wrote {} ({} bytes; the tests read {})",
            out.join(name).display(),
            std::fs::metadata(&from).expect("metadata").len(),
            root.join(to).display()
        );
    }
}

/// The generator's child process; does nothing when run directly.
#[test]
#[ignore = "entry point of the golden generator's child process"]
fn generate_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let store = generator_builder().open(&path).expect("open");
    for claim in BEFORE_CLOSE {
        claim.run(&store);
    }
    drop(store);
    let store = generator_builder().open(&path).expect("reopen");
    // A replay reads redb's file.
    BEFORE_CLOSE[0].replays(&store);
    for claim in LIVE {
        claim.run(&store);
    }
    // On a line of its own: libtest's `test ... ` has no newline yet.
    println!("\n{DONE}");
    let began = Instant::now();
    // Killed here by the parent; never outlives it by long.
    while began.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::process::exit(3);
}
