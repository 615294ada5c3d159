//! What an open makes of journal files it did not write (docs/FORMAT.md, "Journal"): a header,
//! frame or row of another version behind a right checksum is `UnsupportedJournal`, never a
//! tail; another store's journal, a cut one, or a missing one that may hold answers is
//! `CorruptStore`; a journal missing after a clean close is recreated; a read-only open needs a
//! clean close. Real files in a tempdir; checksummed bytes are made with the documented keyed
//! hashing (`journal_format::keyed`), frames at the live position the checkpoint row names.

// White-box hooks (`idem::__journal`, `StoreBuilder::__break_journal`, `check_expiry_index`):
// compiled only with the internal feature, which this repository's own tests always have.
#![cfg(feature = "__internal_whitebox")]

use crate::common;
use crate::journal_format::{FRAME_CONTEXT, HEADER_CONTEXT, keyed};

use std::path::{Path, PathBuf};

use common::*;
use idem::__journal::format::{EntryBuilder, KIND_ENTRY, OP_PUT, Row, TABLE_PLAIN, encode_frame};
use idem::redb::{ReadableDatabase, ReadableTable};
use idem::store::journal_path;
use idem::{Error, Response, Scope, Store, StoreBuilder};

/// Journal mode with the tests' effect table and the smallest journal.
fn journaled() -> StoreBuilder {
    Store::builder()
        .journal(true)
        .journal_table(EFFECTS)
        .journal_capacity(64 << 10)
        .checkpoint_bytes(16 << 10)
}

fn claim(store: &Store, key: &str) -> Response {
    executed(store.execute(req("t", "pay", key, key.as_bytes()), |tx| {
        bump(tx, key)?;
        Ok(Response::new(201, key.to_owned()))
    }))
}

/// A journal-mode store in `dir` with one claim, closed cleanly.
fn closed_store(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let store = journaled().open(&path).expect("open");
    claim(&store, "k1");
    drop(store);
    path
}

/// The checkpoint row in a closed store file.
fn row(path: &Path) -> Row {
    let db = idem::redb::ReadOnlyDatabase::open(path).expect("the file reads");
    let read = db.begin_read().expect("read");
    let meta = read.open_table(META).expect("meta");
    let v = meta.get("journal").expect("get").expect("a row");
    Row::decode(v.value()).expect("a valid row")
}

fn files(path: &Path) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(path).expect("store file"),
        std::fs::read(journal_path(path)).expect("journal file"),
    )
}

fn write_at(path: &Path, at: u64, bytes: &[u8]) {
    let mut j = std::fs::read(path).expect("read");
    j[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, j).expect("write");
}

/// A frame as docs/FORMAT.md lays it out, with any version and kind, sealed with the
/// documented checksum as the successor of `row`.
fn frame(row: &Row, version: u8, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = b"IDJF".to_vec();
    f.extend([version, kind, 0, 0]);
    f.extend((body.len() as u32).to_be_bytes());
    f.extend((row.lsn + 1).to_be_bytes());
    f.extend(body);
    let sum = keyed(FRAME_CONTEXT, &[&row.store_id, &row.chain, &f]);
    f.extend(sum);
    f.resize(f.len().div_ceil(32) * 32, 0);
    f
}

/// An entry putting `key` → `value` (raw bytes) into the effect table.
fn effects_entry(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut e = EntryBuilder::default();
    let t = e.table("test.effects", TABLE_PLAIN, "&str", "u64");
    e.record(OP_PUT, t, key, Some(value));
    e.finish().expect("a small entry")
}

#[track_caller]
fn assert_unsupported(opened: Result<Store, Error>, version: u8) {
    match opened {
        Err(Error::UnsupportedJournal { found, supported }) => {
            assert_eq!((found, supported), (version, 1));
        }
        other => panic!("expected UnsupportedJournal {{ found: {version} }}, got {other:?}"),
    }
}

#[track_caller]
fn corrupt_reason(opened: Result<Store, Error>) -> String {
    match opened {
        Err(Error::CorruptStore { reason }) => reason,
        other => panic!("expected CorruptStore, got {other:?}"),
    }
}

/// The store `name` in `dir`, closed cleanly, with its journal's header rewritten to
/// `version` behind a right checksum.
fn header_of_version(dir: &Path, name: &str, version: u8) -> PathBuf {
    let path = closed_store(dir, name);
    let j = journal_path(&path);
    let mut header = std::fs::read(&j).expect("journal")[..44].to_vec();
    header[8] = version;
    let sum = keyed(HEADER_CONTEXT, &[&header[..36]]);
    header[36..44].copy_from_slice(&sum);
    write_at(&j, 0, &header);
    path
}

#[test]
fn a_header_of_another_version_behind_a_right_checksum_is_unsupported_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    for version in [0u8, 2] {
        let path = header_of_version(dir.path(), &format!("v{version}.redb"), version);
        let (_, journal) = files(&path);
        let before = row(&path);
        assert_unsupported(journaled().open(&path), version);
        assert!(
            files(&path).1 == journal,
            "version {version}: the refused open changed the journal"
        );
        assert_eq!(row(&path), before, "version {version}: the row changed");
        // Refused again, the same way: nothing was taken for a tail and written over.
        assert_unsupported(journaled().open(&path), version);
    }
}

#[test]
fn a_refused_journal_leaves_the_store_file_byte_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = header_of_version(dir.path(), "v2.redb", 2);
    let (store, _) = files(&path);
    assert_unsupported(journaled().open(&path), 2);
    assert!(
        files(&path).0 == store,
        "the refused open changed the store file"
    );
}

#[test]
fn a_frame_written_from_the_format_at_the_live_position_is_replayed() {
    // The premise of the tests below: a frame made from docs/FORMAT.md at the row's position
    // is read as the next entry.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path(), "s.redb");
    let row = row(&path);
    assert!(row.clean, "a clean close");
    let f = frame(
        &row,
        1,
        KIND_ENTRY,
        &effects_entry(b"crafted", &41u64.to_le_bytes()),
    );
    write_at(&journal_path(&path), row.position, &f);
    let store = journaled().open(&path).expect("replays");
    assert_eq!(effects(&store, "crafted"), 41);
    assert_eq!(effects(&store, "k1"), 1);
}

#[test]
fn a_frame_of_another_version_behind_a_right_checksum_is_unsupported_and_an_unknown_kind_corrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, version, kind) in [("v2", 2u8, KIND_ENTRY), ("kind3", 1, 0x03)] {
        let path = closed_store(dir.path(), &format!("{name}.redb"));
        let row = row(&path);
        let body = effects_entry(b"crafted", &41u64.to_le_bytes());
        write_at(
            &journal_path(&path),
            row.position,
            &frame(&row, version, kind, &body),
        );
        let journal = std::fs::read(journal_path(&path)).expect("journal");
        let opened = journaled().open(&path);
        if version == 2 {
            assert_unsupported(opened, 2);
        } else {
            let reason = corrupt_reason(opened);
            assert!(
                reason.contains("kind 0x03, which frame version 1 does not have"),
                "{reason}"
            );
        }
        assert!(
            std::fs::read(journal_path(&path)).expect("journal") == journal,
            "{name}: the refused open changed the journal"
        );
    }
}

#[test]
fn another_stores_journal_is_corrupt_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = closed_store(dir.path(), "a.redb");
    let b = closed_store(dir.path(), "b.redb");
    std::fs::copy(journal_path(&a), journal_path(&b)).expect("copy a's journal over b's");
    let reason = corrupt_reason(journaled().open(&b));
    assert!(reason.contains("another store"), "{reason}");
}

#[test]
fn a_journal_missing_after_a_clean_close_is_recreated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path(), "s.redb");
    std::fs::remove_file(journal_path(&path)).expect("remove the journal");
    let store = journaled()
        .open(&path)
        .expect("the open recreates the journal");
    assert!(journal_path(&path).exists());
    assert_eq!(
        replayed(store.execute(req("t", "pay", "k1", b"k1"), |_| unreachable!())).body(),
        b"k1"
    );
    claim(&store, "k2");
    drop(store);
    let store = journaled().open(&path).expect("reopen");
    assert_eq!(effects(&store, "k1"), 1);
    assert_eq!(effects(&store, "k2"), 1);
}

/// A copy at `to` of the store file of a journal-mode store that is still open (not closed
/// cleanly), without its journal.
fn unclean_copy(dir: &Path, to: &str) -> PathBuf {
    let path = dir.join("open.redb");
    let store = journaled().open(&path).expect("open");
    claim(&store, "k1");
    let copy = dir.join(to);
    std::fs::copy(&path, &copy).expect("copy the store file while it is open");
    drop(store);
    copy
}

#[test]
fn a_journal_missing_when_the_store_was_not_closed_cleanly_is_corrupt_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = unclean_copy(dir.path(), "copy.redb");
    assert!(!journal_path(&copy).exists());
    let reason = corrupt_reason(journaled().open(&copy));
    assert!(
        reason.contains("journal file is missing") && reason.contains(".journal"),
        "{reason}"
    );
    assert!(
        !journal_path(&copy).exists(),
        "the refused open made no journal"
    );
}

#[test]
fn a_journal_shorter_than_its_capacity_is_corrupt_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path(), "s.redb");
    let j = std::fs::OpenOptions::new()
        .write(true)
        .open(journal_path(&path))
        .expect("journal");
    j.set_len((64 << 10) - 4096).expect("cut the journal");
    drop(j);
    let reason = corrupt_reason(journaled().open(&path));
    assert!(reason.contains("capacity"), "{reason}");
}

#[test]
fn a_read_only_open_needs_a_clean_close() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = unclean_copy(dir.path(), "copy.redb");
    match Store::builder().open_read_only(&copy) {
        Err(Error::NeedsRecovery) => {}
        other => panic!("expected NeedsRecovery, got {other:?}"),
    }
    let path = closed_store(dir.path(), "s.redb");
    let read = Store::builder()
        .open_read_only(&path)
        .expect("a cleanly closed journal-mode store opens read-only");
    assert!(
        read.get(&Scope::new("t", "pay"), "k1")
            .expect("get")
            .is_some()
    );
}

#[test]
fn an_entry_for_a_table_the_open_does_not_know_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path(), "s.redb");
    let row = row(&path);
    // A compound key type: tables of redb's leaf types need no registration.
    let mut e = EntryBuilder::default();
    let t = e.table("test.notes", TABLE_PLAIN, "(&str,u64)", "u64");
    e.record(OP_PUT, t, b"crafted", Some(&41u64.to_le_bytes()));
    let f = frame(&row, 1, KIND_ENTRY, &e.finish().expect("a small entry"));
    write_at(&journal_path(&path), row.position, &f);
    match Store::builder().journal(true).open(&path) {
        Err(Error::Config { reason }) => assert!(reason.contains("test.notes"), "{reason}"),
        other => panic!("expected Config naming the table, got {other:?}"),
    }
}

#[test]
fn a_key_or_value_that_is_not_of_its_type_is_corrupt_store_without_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, key, value) in [
        ("a u64 of 3 bytes", &b"crafted"[..], &[1u8, 2, 3][..]),
        (
            "a &str key that is not UTF-8",
            &[0xffu8, 0xfe][..],
            &[0u8; 8][..],
        ),
    ] {
        let path = closed_store(dir.path(), &format!("{}.redb", name.len()));
        let row = row(&path);
        let f = frame(&row, 1, KIND_ENTRY, &effects_entry(key, value));
        write_at(&journal_path(&path), row.position, &f);
        let reason = corrupt_reason(journaled().open(&path));
        assert!(
            !reason.contains("panicked"),
            "{name}: the open panicked: {reason}"
        );
    }
}

#[test]
fn a_frame_encoded_by_idem_and_by_the_documented_layout_are_the_same_bytes() {
    // `frame` (this file's) and idem's encoder agree, so the tests above use real frames.
    let row = Row {
        store_id: [7; 16],
        lsn: 4,
        position: 4096 + 64,
        chain: [9; 8],
        clean: false,
    };
    let body = effects_entry(b"k", &1u64.to_le_bytes());
    let (ours, _) = encode_frame(&row.store_id, &row.chain, KIND_ENTRY, 5, &body);
    assert_eq!(frame(&row, 1, KIND_ENTRY, &body), ours);
}
