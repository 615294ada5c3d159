//! Torn tails of the journal (docs/design.md, "### Tests", "Torn tails"; docs/FORMAT.md,
//! "Reading the journal"): recovery stops exactly where the valid chain of frames ends.
//!
//! - The last frames of a workload, cut at every byte and at every 512-byte sector boundary,
//!   with zeros or garbage after the cut: every claim whose frame (up to its checksum) lies
//!   wholly before the cut replays, none after it is present, and the reopened store continues
//!   at the tail (a claim after the reopen survives another crash).
//! - The stale successor: a valid frame carrying the next LSN that does not continue the chain
//!   is a tail, never replayed: one from an earlier pass over the circular area (the journal
//!   wrapped twice), and one an earlier process wrote after a torn frame, which the reopened
//!   store then rewrote.

// White-box hooks (`idem::__journal`, `StoreBuilder::__break_journal`, `check_expiry_index`):
// compiled only with the internal feature, which this repository's own tests always have.
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use common::*;
use idem::__journal::BrokenJournal;
use idem::__journal::format::{self as jf, KIND_ENTRY};
use idem::{ExecuteAnswer, Response, Store, StoreBuilder};

const CAPACITY: u64 = 64 << 10;

fn journaled(b: StoreBuilder) -> StoreBuilder {
    b.journal(true)
        .journal_table(EFFECTS)
        .journal_capacity(CAPACITY)
        .checkpoint_bytes(32 << 10)
}

fn journaled_checkpoints(b: StoreBuilder) -> StoreBuilder {
    journaled(b).checkpoint_bytes(16 << 10)
}

fn journaled_unchained(b: StoreBuilder) -> StoreBuilder {
    journaled(b).__break_journal(BrokenJournal::UnchainedFrames)
}

fn open(
    settings: fn(StoreBuilder) -> StoreBuilder,
    store: impl idem::redb::StorageBackend,
    journal: impl idem::redb::StorageBackend,
) -> Store {
    settings(Store::builder())
        .open_with_backends(store, journal)
        .expect("the images open")
}

fn open_images(settings: fn(StoreBuilder) -> StoreBuilder, store: &[u8], journal: &[u8]) -> Store {
    open(
        settings,
        crash_backend_from_image(store.to_vec()),
        crash_backend_from_image(journal.to_vec()),
    )
}

/// A claim that also bumps `seq`, the count of claims: replaying an older entry again would
/// set it back.
fn claim(store: &Store, key: &str) {
    let r = store.execute(req("t", "op", key, b"p"), |tx| {
        bump(tx, key)?;
        bump(tx, "seq")?;
        Ok(Response::new(201, key.to_owned()))
    });
    assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{key}: {r:?}");
}

/// A frame as the pair's write log holds it.
struct Written {
    at: u64,
    bytes: Vec<u8>,
}

impl Written {
    fn kind(&self) -> u8 {
        self.bytes[5]
    }
    fn lsn(&self) -> u64 {
        u64::from_be_bytes(self.bytes[12..20].try_into().expect("8 bytes"))
    }
    fn body_len(&self) -> usize {
        u32::from_be_bytes(self.bytes[8..12].try_into().expect("4 bytes")) as usize
    }
    /// Where the bytes the checksum covers, and the checksum, end.
    fn covered_end(&self) -> u64 {
        self.at + (jf::FRAME_HEAD + self.body_len() + jf::CHECKSUM_LEN) as u64
    }
    fn end(&self) -> u64 {
        self.at + self.bytes.len() as u64
    }
    fn body(&self) -> &[u8] {
        &self.bytes[jf::FRAME_HEAD..jf::FRAME_HEAD + self.body_len()]
    }
}

fn frames(pair: &CountingPair) -> Vec<Written> {
    pair.journal_writes()
        .into_iter()
        .map(|(at, bytes)| Written { at, bytes })
        .collect()
}

fn store_id(journal: &[u8]) -> jf::StoreId {
    journal[20..36].try_into().expect("16 bytes")
}

/// The effects a store holds, without `seq`.
fn claimed(store: &Store) -> Vec<String> {
    all_effects(store)
        .into_iter()
        .filter(|(k, _)| k != "seq")
        .map(|(k, n)| {
            assert_eq!(n, 1, "{k} ran {n} times");
            k
        })
        .collect()
}

fn seq(store: &Store) -> u64 {
    effects(store, "seq")
}

/// The journal's last frames cut at every byte (and at every sector boundary), with zeros or
/// garbage after the cut: recovery stops exactly at the cut.
#[test]
fn journal_torn_tails_stop_recovery_exactly_at_the_cut() {
    const N: usize = 12;
    let pair = CountingPair::new();
    let store = open(journaled, pair.store.clone(), pair.journal.clone());
    let keys: Vec<String> = (0..N).map(|i| format!("t{i:02}")).collect();
    for key in &keys {
        claim(&store, key);
    }
    // Unsynced frames included: the cut decides what reached the disk.
    let journal = pair.journal.inner.live_image();
    let store_image = pair.store.inner.durable_image();
    drop(store);
    let written = frames(&pair);
    assert_eq!(written.len(), N, "one frame per claim, no wrap");
    for (i, f) in written.iter().enumerate() {
        assert_eq!((f.kind(), f.lsn()), (KIND_ENTRY, i as u64 + 1));
    }
    let first_cut = written[N - 3].at;
    let last = written[N - 1].end();
    let mut cuts: Vec<u64> = (first_cut..=last).collect();
    cuts.extend((jf::HEADER_LEN..=last + 512).step_by(512));
    let mut garbage_state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut reopens = 0;
    for &cut in &cuts {
        for garbage in [false, true] {
            let mut image = journal.clone();
            let tail = &mut image[cut as usize..];
            if garbage {
                // Every byte changed (random bits, never none): garbage that happened to equal
                // the bytes it replaces would not be a cut (a 1-byte tail matched 1 time in 256).
                let noise = random_bytes(&mut garbage_state, tail.len());
                for (b, n) in tail.iter_mut().zip(noise) {
                    *b ^= n | 1;
                }
            } else {
                tail.fill(0);
            }
            // The frames the cut left whole: wholly before it, or (zeros over zero bytes) not
            // changed by it; recovery stops at the first one it changed.
            let whole: Vec<String> = written
                .iter()
                .zip(&keys)
                .take_while(|(f, _)| {
                    let end = f.covered_end() as usize;
                    f.covered_end() <= cut || image[..end] == journal[..end]
                })
                .map(|(_, k)| k.clone())
                .collect();
            let ctx = format!(
                "cut at {cut}, {}",
                if garbage { "garbage" } else { "zeros" }
            );
            let reopened = open_images(journaled, &store_image, &image);
            reopens += 1;
            assert_eq!(claimed(&reopened), whole, "{ctx}");
            assert_eq!(seq(&reopened), whole.len() as u64, "{ctx}");
            assert_eq!(record_rows(&reopened), whole.len() as u64, "{ctx}");
            // Every 16th cut: the reopened store continues at the tail, durably.
            if cut % 16 == 0 {
                let live = (
                    crash_backend_from_image(store_image.clone()),
                    crash_backend_from_image(image),
                );
                let continued = open(journaled, live.0.clone(), live.1.clone());
                claim(&continued, "after");
                let again = open(journaled, live.0.crash(), live.1.crash());
                reopens += 2;
                let mut expected = whole.clone();
                expected.insert(0, "after".to_owned());
                assert_eq!(claimed(&again), expected, "{ctx}, a claim after the reopen");
                drop(continued);
            }
        }
    }
    eprintln!(
        "torn tails: {} cuts (every byte of the last 3 frames, {} bytes, and every sector) x zeros/garbage: {reopens} reopens",
        cuts.len(),
        last - first_cut
    );
}

/// Fills a journal until it wrapped `passes` times and ends with a framed entry; returns the
/// pair, the store, the claimed keys.
fn wrapped(passes: usize) -> (CountingPair, Store, Vec<String>) {
    let pair = CountingPair::new();
    let store = open(
        journaled_checkpoints,
        pair.store.clone(),
        pair.journal.clone(),
    );
    let mut keys = Vec::new();
    loop {
        let key = format!("s{:04}", keys.len());
        let before = pair.journal_writes().len();
        claim(&store, &key);
        keys.push(key);
        let framed = pair.journal_writes().len() > before;
        // A pass ends where the next frame goes back to the area's start (after a wrap frame,
        // or after a frame that ended at the area's end).
        let written = frames(&pair);
        let wraps = written.windows(2).filter(|w| w[1].at < w[0].at).count();
        if wraps >= passes && framed {
            return (pair, store, keys);
        }
        assert!(
            keys.len() < 5_000,
            "the journal never wrapped: {:?}",
            frames(&pair)
                .iter()
                .rev()
                .take(20)
                .map(|f| (f.at, f.bytes.len(), f.kind(), f.lsn()))
                .collect::<Vec<_>>()
        );
    }
}

/// The stale successor from an earlier pass: the journal wrapped twice; at the tail, a frame
/// of the first pass (the first claim's, with its own chain value, as that pass wrote it)
/// carrying the next LSN. It is a valid frame in its own chain but not the successor of the
/// last one recovery accepted: a tail. Replayed, it would set `seq` back to 1.
fn stale_successor_from_an_earlier_pass(last_open: fn(StoreBuilder) -> StoreBuilder) {
    let (pair, store, keys) = wrapped(2);
    let written = frames(&pair);
    let last = written.last().expect("frames");
    let next_lsn = last.lsn() + 1;
    let tail = last.end();
    let first = &written[0];
    assert_eq!(
        (first.at, first.lsn()),
        (jf::HEADER_LEN, 1),
        "the first pass's first frame"
    );
    let mut journal = pair.journal.inner.durable_image();
    let (stale, _) = jf::encode_frame(
        &store_id(&journal),
        &[0; 8],
        KIND_ENTRY,
        next_lsn,
        first.body(),
    );
    assert!(
        tail + stale.len() as u64 <= CAPACITY,
        "the stale frame fits at the tail"
    );
    journal[tail as usize..tail as usize + stale.len()].copy_from_slice(&stale);
    let store_image = pair.store.inner.durable_image();
    drop(store);
    let reopened = open_images(last_open, &store_image, &journal);
    assert_eq!(
        seq(&reopened),
        keys.len() as u64,
        "the stale successor from an earlier pass (LSN {next_lsn} at {tail}) was replayed"
    );
    assert_eq!(claimed(&reopened), keys);
}

/// The stale successor an earlier process wrote after a torn frame: process 1's frame n is torn
/// (its second half never reached the disk) and frame n + 1 after it did. Process 2 recovers up
/// to n − 1, claims a new key whose frame n has the same length, written over the torn one, so
/// process 1's frame n + 1 sits exactly where frame n + 1 goes, carrying LSN n + 1, and crashes.
/// Process 3's recovery must stop there: that frame chains to the torn frame, not to process
/// 2's.
fn stale_successor_after_a_torn_frame(last_open: fn(StoreBuilder) -> StoreBuilder) {
    const N: usize = 10;
    let pair = CountingPair::new();
    let store = open(journaled, pair.store.clone(), pair.journal.clone());
    let keys: Vec<String> = (0..N + 2).map(|i| format!("k{i:02}")).collect();
    for key in &keys {
        claim(&store, key);
    }
    let written = frames(&pair);
    let (torn, after) = (&written[N], &written[N + 1]);
    let mut journal = pair.journal.inner.live_image();
    let store_image = pair.store.inner.durable_image();
    drop(store);
    let half = (torn.at + torn.bytes.len() as u64 / 2) as usize;
    journal[half..torn.end() as usize].fill(0);
    // Process 2: recovers k00..k09, rewrites frame N+1 (LSN N+1) at the torn frame's place.
    let live = (
        crash_backend_from_image(store_image),
        crash_backend_from_image(journal),
    );
    let second = open(journaled, live.0.clone(), live.1.clone());
    assert_eq!(claimed(&second), keys[..N].to_vec(), "process 2's recovery");
    claim(&second, "kXX");
    let (store2, journal2) = (live.0.crash(), live.1.crash());
    drop(second);
    let image2 = journal2.durable_image();
    let rewritten = &image2[torn.at as usize..torn.end() as usize];
    assert_eq!(
        u64::from_be_bytes(rewritten[12..20].try_into().expect("8 bytes")),
        torn.lsn(),
        "process 2 wrote its frame where the torn one was"
    );
    assert_ne!(rewritten, &torn.bytes[..], "a different frame");
    assert_eq!(
        &image2[after.at as usize..after.end() as usize],
        &after.bytes[..],
        "process 1's frame after the torn one is still there"
    );
    assert_eq!(after.lsn(), torn.lsn() + 1, "carrying the next LSN");
    assert_ne!(after.bytes[..20], [0; 20]);
    // Process 3.
    let third = open(last_open, store2, journal2);
    let mut expected = keys[..N].to_vec();
    expected.push("kXX".to_owned());
    assert_eq!(
        claimed(&third),
        expected,
        "process 1's frame written after its torn frame (LSN {}) was replayed",
        after.lsn()
    );
    assert_eq!(seq(&third), N as u64 + 1);
}

#[test]
fn journal_stale_successor_from_an_earlier_pass_is_a_tail() {
    stale_successor_from_an_earlier_pass(journaled_checkpoints);
}

#[test]
fn journal_stale_successor_after_a_torn_frame_is_a_tail() {
    stale_successor_after_a_torn_frame(journaled);
}

/// `BrokenJournal::UnchainedFrames` (recovery accepts frames by their LSN alone) is caught by
/// both stale-successor tests: the stale frame is replayed (`seq` goes back; process 1's
/// unacknowledged claim appears).
#[test]
fn a_broken_recovery_is_caught_when_journal_frames_are_not_chained() {
    fn unchained_checkpoints(b: StoreBuilder) -> StoreBuilder {
        journaled_checkpoints(b).__break_journal(BrokenJournal::UnchainedFrames)
    }
    let why = crate::crash_point_enumeration::caught("UnchainedFrames, earlier pass", || {
        stale_successor_from_an_earlier_pass(unchained_checkpoints)
    });
    assert!(
        why.contains("the stale successor from an earlier pass"),
        "caught for another reason: {why}"
    );
    let why = crate::crash_point_enumeration::caught("UnchainedFrames, after a torn frame", || {
        stale_successor_after_a_torn_frame(journaled_unchained)
    });
    assert!(
        why.contains("written after its torn frame"),
        "caught for another reason: {why}"
    );
}
