//! Deterministic damage to the pages of a store file, shared by the damaged-file tests
//! (`damaged_pages_never_panic`, `cli_damaged_file_never_panics`, `cli_read_commands_never_write`).
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use idem::clock::ManualClock;
use idem::{Abort, Durability, Request, Response, Scope, Store, Timestamp};

/// redb's page size (the default, which idem uses).
pub const PAGE: usize = 4096;

/// The store's clock while it is built: a fixed instant, so the file's layout is the same on
/// every run.
pub const BUILT_AT: Timestamp = Timestamp(1_700_000_000_000);

/// A deterministic generator (splitmix64): the same seed damages the same bytes on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Seed `seed`'s damage: 8 bytes xor-ed with non-zero values inside one page. Every fifth seed
/// hits the header page (redb's super-header and commit slots); odd seeds the first 64 bytes of a
/// page (a B-tree page's header and its first offsets); the others anywhere in a page. Returns
/// the damaged image and the offset of the first damaged byte.
pub fn damage(image: &[u8], seed: u64) -> (Vec<u8>, usize) {
    let mut rng = Rng(seed);
    let pages = image.len() / PAGE;
    let page = if seed.is_multiple_of(5) {
        0
    } else {
        1 + rng.below(pages - 1)
    };
    let within = if seed % 2 == 1 {
        rng.below(64)
    } else {
        rng.below(PAGE - 8)
    };
    let at = page * PAGE + within;
    let mut damaged = image.to_vec();
    for b in &mut damaged[at..at + 8] {
        *b ^= 1 + rng.below(255) as u8;
    }
    (damaged, at)
}

/// The body stored for record `i` (unique in the file: tests find its page by it).
pub fn body(i: usize) -> String {
    format!("body-{i:05}-{}", "x".repeat(i % 60))
}

/// The key of record `i` (tenant "t", operation "op").
pub fn key(i: usize) -> String {
    format!("key-{i:05}")
}

/// A cleanly closed store at `path` with what `fill` wrote (clock at [`BUILT_AT`]); its bytes.
fn build(path: &Path, fill: impl FnOnce(&Store)) -> Vec<u8> {
    // No fsync per commit: the file is made durable when the store is closed, at the end.
    let store = Store::builder()
        .clock(ManualClock::new(BUILT_AT))
        .durability(Durability::Periodic(Duration::from_secs(3600)))
        .open(path)
        .expect("open");
    fill(&store);
    drop(store);
    std::fs::read(path).expect("read")
}

/// Writes a cleanly closed store with `n` records at `path` (completed and failed answers with
/// bodies of varied length, every seventh a failure) and returns its bytes.
pub fn build_store(path: &Path, n: usize) -> Vec<u8> {
    build(path, |store| {
        for i in 0..n {
            let req = Request::from_canonical_bytes(Scope::new("t", "op"), key(i), b"p");
            let outcome = store.execute(req, |_| {
                if i % 7 == 0 {
                    Err(Abort::terminal(Response::new(402, body(i))))
                } else {
                    Ok(Response::new(201, body(i)).with_resource("thing", key(i)))
                }
            });
            assert!(
                matches!(outcome, Ok(idem::ExecuteAnswer::Ran(_))),
                "{outcome:?}"
            );
        }
    })
}

/// Writes a cleanly closed store whose file also holds the messaging tables: `n` inbox
/// messages, each marking its mark, pushing one outbox event and advancing a version
/// high-water mark (`entity-{i}` to version `i`); returns its bytes.
pub fn build_messaging_store(path: &Path, n: usize) -> Vec<u8> {
    build(path, |store| {
        for i in 0..n {
            let processed = store.process("sub", key(i), |tx| -> Result<(), Abort> {
                tx.outbox().push(
                    idem::outbox::Event::new("topic", body(i).into_bytes())
                        .ordering_key(format!("k{}", i % 9)),
                )?;
                tx.versions().advance(format!("entity-{i:05}"), i as u64)?;
                Ok(())
            });
            assert!(
                matches!(processed, Ok(idem::inbox::ProcessAnswer::Ran(()))),
                "{processed:?}"
            );
        }
    })
}
