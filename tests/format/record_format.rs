//! Golden tests for the stored format described in `docs/FORMAT.md`.
//!
//! Pins, through the public API only: the exact bytes of a Completed, a Failed, a Pending and a
//! Tombstone record, checksum included; the decoder's behaviour on truncated, mutated (as stored,
//! and resealed with a right checksum), versioned, empty and over-long input;
//! the fingerprint and downstream-key derivations; the table names, record key, expiry-index
//! entry and meta marker as found in a real store file. An independent decoder written from `docs/FORMAT.md`
//! (`walk`) must agree with `Record::decode` on every input tried here, and the annotated hex
//! dumps in `docs/FORMAT.md` must be exactly what `walk` prints for the golden values.
//!
//! To regenerate the dumps after an intended format change:
//! `cargo test --test record_format -- --ignored --nocapture print_format_dumps`.

use crate::common;

use common::dump::{format_md, hex_row, printable};

use std::panic::{AssertUnwindSafe, catch_unwind};

use idem::clock::ManualClock;
use idem::format::{FORMAT_VERSION, HolderToken, Record, State};
use idem::keys::Fingerprint;
use idem::redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use idem::{BeginAnswer, Error, Request, Resource, Response, Scope, Store, Timestamp, Tombstone};

/// 2026-01-01T00:00:00Z in milliseconds since the Unix epoch.
const T0: u64 = 1_767_225_600_000;
const DAY_MS: u64 = 86_400_000;

/// The blake3 key-derivation context of the record checksum (docs/FORMAT.md, "Checksum").
const CHECKSUM_CONTEXT: &str = "idem 2026-11-30 record checksum v2";

/// Runs `write` on a fresh store in `dir` at `T0`, closes it, and reopens the file with redb.
fn written_at_t0(dir: &tempfile::TempDir, write: impl FnOnce(&Store)) -> idem::redb::Database {
    let path = dir.path().join("idem.redb");
    {
        let store = Store::builder()
            .clock(ManualClock::new(Timestamp(T0)))
            .open(&path)
            .expect("open");
        write(&store);
    }
    idem::redb::Database::open(&path).expect("reopen with redb")
}

/// The record checksum of `covered` (the version byte and the postcard body), written from
/// docs/FORMAT.md: the first 8 bytes of `blake3::derive_key(CHECKSUM_CONTEXT, covered)`.
fn checksum(covered: &[u8]) -> [u8; 8] {
    let hash = blake3::derive_key(CHECKSUM_CONTEXT, covered);
    let mut out = [0u8; 8];
    out.copy_from_slice(&hash[..8]);
    out
}

/// `covered` followed by its checksum: a value whose checksum is right, whatever `covered` holds.
fn seal(covered: &[u8]) -> Vec<u8> {
    let mut v = covered.to_vec();
    v.extend_from_slice(&checksum(covered));
    v
}

/// A value without its 8-byte checksum (the bytes the checksum covers).
fn unsealed(value: &[u8]) -> Vec<u8> {
    value[..value.len() - 8].to_vec()
}

/// A fingerprint whose bytes are 0x00, 0x01, …, 0x1f, so the dump shows their order.
fn counting_fingerprint() -> Fingerprint {
    let mut b = [0u8; 32];
    for (i, x) in (0u8..).zip(b.iter_mut()) {
        *x = i;
    }
    Fingerprint(b)
}

fn completed_record() -> Record {
    Record {
        fingerprint: counting_fingerprint(),
        created_at: Timestamp(T0),
        expires_at: Timestamp(T0 + DAY_MS),
        forget_at: Timestamp(T0 + 7 * DAY_MS),
        state: State::Completed(
            Response::new(201, r#"{"id":"ord_1"}"#).with_resource("order", "ord_1"),
        ),
    }
}

fn failed_record() -> Record {
    Record {
        fingerprint: counting_fingerprint(),
        created_at: Timestamp(T0),
        expires_at: Timestamp(T0 + DAY_MS),
        forget_at: Timestamp(T0 + 7 * DAY_MS),
        state: State::Failed(Response::new(402, "card_declined")),
    }
}

/// What a sweep leaves of `completed_record` after its response window.
fn tombstone_record() -> Record {
    Record {
        fingerprint: counting_fingerprint(),
        created_at: Timestamp(T0),
        expires_at: Timestamp(T0 + DAY_MS),
        forget_at: Timestamp(T0 + 7 * DAY_MS),
        state: State::Tombstone(Tombstone::new(
            201,
            Some(Resource {
                kind: "order".into(),
                id: "ord_1".into(),
            }),
            false,
        )),
    }
}

fn pending_record() -> Record {
    Record {
        fingerprint: counting_fingerprint(),
        created_at: Timestamp(T0),
        expires_at: Timestamp(T0 + DAY_MS),
        forget_at: Timestamp(T0 + DAY_MS),
        state: State::Pending {
            // 8 bytes of store-instance id, then the instance's counter, big-endian.
            holder: HolderToken([
                0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6, 0x07, 0x18, 0, 0, 0, 0, 0, 0, 0, 1,
            ]),
            lease_deadline: Timestamp(T0 + 30_000),
            attempt: 1,
        },
    }
}

fn golden_completed() -> Vec<u8> {
    vec![
        0x02, // version
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
        0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d,
        0x1e, 0x1f, // fingerprint
        0x80, 0xd0, 0xea, 0xb6, 0xb7, 0x33, // created_at
        0x80, 0x88, 0x84, 0xe0, 0xb7, 0x33, // expires_at
        0x80, 0xd0, 0x98, 0xf7, 0x01, // forget_after (6 days)
        0x01, // Completed
        0xc9, 0x01, // status 201
        0x0e, 0x7b, 0x22, 0x69, 0x64, 0x22, 0x3a, 0x22, 0x6f, 0x72, 0x64, 0x5f, 0x31, 0x22,
        0x7d, // body
        0x01, // Some(resource)
        0x05, 0x6f, 0x72, 0x64, 0x65, 0x72, // "order"
        0x05, 0x6f, 0x72, 0x64, 0x5f, 0x31, // "ord_1"
        0x0b, 0xad, 0x6b, 0x0e, 0x74, 0xec, 0x93, 0x16, // checksum
    ]
}

fn golden_failed() -> Vec<u8> {
    vec![
        0x02, // version
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
        0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d,
        0x1e, 0x1f, // fingerprint
        0x80, 0xd0, 0xea, 0xb6, 0xb7, 0x33, // created_at
        0x80, 0x88, 0x84, 0xe0, 0xb7, 0x33, // expires_at
        0x80, 0xd0, 0x98, 0xf7, 0x01, // forget_after (6 days)
        0x02, // Failed
        0x92, 0x03, // status 402
        0x0d, 0x63, 0x61, 0x72, 0x64, 0x5f, 0x64, 0x65, 0x63, 0x6c, 0x69, 0x6e, 0x65,
        0x64, // body
        0x00, // None
        0x63, 0x3e, 0x36, 0x33, 0xf1, 0xfe, 0x4c, 0xe3, // checksum
    ]
}

fn golden_pending() -> Vec<u8> {
    vec![
        0x02, // version
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
        0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d,
        0x1e, 0x1f, // fingerprint
        0x80, 0xd0, 0xea, 0xb6, 0xb7, 0x33, // created_at
        0x80, 0x88, 0x84, 0xe0, 0xb7, 0x33, // expires_at
        0x00, // forget_after (none: a lease leaves no tombstone)
        0x00, // Pending
        0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6, 0x07, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, // holder
        0xb0, 0xba, 0xec, 0xb6, 0xb7, 0x33, // lease_deadline
        0x01, // attempt
        0x0c, 0x38, 0x8d, 0xa1, 0x22, 0x2c, 0xb3, 0xab, // checksum
    ]
}

fn golden_tombstone() -> Vec<u8> {
    vec![
        0x02, // version
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
        0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d,
        0x1e, 0x1f, // fingerprint
        0x80, 0xd0, 0xea, 0xb6, 0xb7, 0x33, // created_at
        0x80, 0x88, 0x84, 0xe0, 0xb7, 0x33, // expires_at
        0x80, 0xd0, 0x98, 0xf7, 0x01, // forget_after (6 days)
        0x03, // Tombstone
        0xc9, 0x01, // status 201
        0x00, // failed = false
        0x01, // Some(resource)
        0x05, 0x6f, 0x72, 0x64, 0x65, 0x72, // "order"
        0x05, 0x6f, 0x72, 0x64, 0x5f, 0x31, // "ord_1"
        0x8a, 0x30, 0x4f, 0xb8, 0xfe, 0x84, 0x4d, 0x78, // checksum
    ]
}

/// The record key of tenant "t", operation "op", key "k".
fn golden_record_key() -> Vec<u8> {
    vec![
        0x01, // key layout version
        0x00, 0x01, b't', // tenant
        0x00, 0x02, b'o', b'p', // operation
        0x00, 0x01, b'k', // idempotency key
    ]
}

/// The expiry-index entry of that key's Completed record, due when its response window ends
/// (2026-01-02T00:00:00Z): `u64be(due) ‖ kind 0x01 ‖ record key`.
fn golden_expiry_entry() -> Vec<u8> {
    let mut entry = vec![
        0x00, 0x00, 0x01, 0x9b, 0x7c, 0x01, 0x04, 0x00, // due = T0 + 24 h, big-endian ms
        0x01, // kind: a record of idem.records.v1
    ];
    entry.extend_from_slice(&golden_record_key());
    entry
}

fn goldens() -> [(&'static str, Record, Vec<u8>); 4] {
    [
        ("completed", completed_record(), golden_completed()),
        ("failed", failed_record(), golden_failed()),
        ("pending", pending_record(), golden_pending()),
        ("tombstone", tombstone_record(), golden_tombstone()),
    ]
}

// ---- exact bytes ----

#[test]
fn format_version_is_two() {
    assert_eq!(FORMAT_VERSION, 2);
}

#[test]
fn every_value_ends_with_the_checksum_of_what_precedes_it() {
    for (name, record, golden) in goldens() {
        let value = record.encode();
        let (covered, sum) = value.split_at(value.len() - 8);
        assert_eq!(sum, checksum(covered), "{name}");
        assert_eq!(covered[0], FORMAT_VERSION, "{name}");
        assert_eq!(value, golden, "{name}");
    }
}

#[test]
fn a_checksum_mismatch_is_a_corrupt_record_that_says_so() {
    for (name, _, golden) in goldens() {
        // Damage in the body, in the checksum itself, and a body swapped for another valid one.
        let mut in_body = golden.clone();
        in_body[40] ^= 0x01;
        let mut in_sum = golden.clone();
        *in_sum.last_mut().expect("non-empty") ^= 0x80;
        let mut swapped = unsealed(&golden);
        swapped.extend_from_slice(&checksum(&unsealed(&golden_failed()))[..]);
        for (what, bytes) in [
            ("body", in_body),
            ("checksum", in_sum),
            ("swapped", swapped),
        ] {
            if name == "failed" && what == "swapped" {
                continue;
            }
            match Record::decode(&bytes) {
                Err(e @ Error::CorruptRecord { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains("checksum mismatch"), "{name}/{what}: {msg}");
                    assert!(msg.contains("Store::purge"), "{name}/{what}: {msg}");
                }
                other => panic!("{name}/{what}: {other:?}"),
            }
            assert!(walk(&bytes).is_err(), "{name}/{what}: reference decoder");
        }
    }
}

#[test]
fn a_version_1_value_is_unsupported() {
    // Version 1 (no checksum) was never released and is not read: its version byte decides.
    let mut v1 = unsealed(&golden_completed());
    v1[0] = 1;
    assert!(matches!(
        Record::decode(&v1),
        Err(Error::UnsupportedFormat {
            found: 1,
            supported: 2
        })
    ));
}

#[test]
fn completed_with_resource_encodes_to_golden_bytes() {
    assert_eq!(completed_record().encode(), golden_completed());
}

#[test]
fn failed_encodes_to_golden_bytes() {
    assert_eq!(failed_record().encode(), golden_failed());
}

#[test]
fn pending_encodes_to_golden_bytes() {
    assert_eq!(pending_record().encode(), golden_pending());
}

#[test]
fn tombstone_encodes_to_golden_bytes() {
    assert_eq!(tombstone_record().encode(), golden_tombstone());
}

// ---- round trips ----

#[test]
fn completed_round_trips() {
    let decoded = Record::decode(&golden_completed()).expect("golden value decodes");
    assert_eq!(decoded, completed_record());
    let State::Completed(r) = &decoded.state else {
        panic!("expected Completed, got {:?}", decoded.state)
    };
    assert!(!r.is_failure());
    assert_eq!(decoded.encode(), golden_completed());
}

#[test]
fn failed_round_trips() {
    let decoded = Record::decode(&golden_failed()).expect("golden value decodes");
    let State::Failed(r) = &decoded.state else {
        panic!("expected Failed, got {:?}", decoded.state)
    };
    // The state, not a stored flag, says "failure": a decoded Failed response reports it.
    assert!(r.is_failure());
    assert_eq!(r.status(), 402);
    assert_eq!(r.body(), b"card_declined");
    assert_eq!(r.resource(), None);
    assert_eq!(decoded.fingerprint, failed_record().fingerprint);
    assert_eq!(decoded.created_at, failed_record().created_at);
    assert_eq!(decoded.expires_at, failed_record().expires_at);
    assert_eq!(decoded.encode(), golden_failed());
    assert_eq!(
        Record::decode(&decoded.encode()).expect("re-encoded value decodes"),
        decoded
    );
}

#[test]
fn pending_round_trips() {
    let decoded = Record::decode(&golden_pending()).expect("golden value decodes");
    assert_eq!(decoded, pending_record());
    assert_eq!(decoded.encode(), golden_pending());
}

#[test]
fn tombstone_round_trips() {
    let decoded = Record::decode(&golden_tombstone()).expect("golden value decodes");
    assert_eq!(decoded, tombstone_record());
    assert_eq!(decoded.encode(), golden_tombstone());
    // The failure flag is one byte: 0x01 reads as a failed intent, anything above is corrupt.
    // (Each variant is resealed, so the checksum holds and the body decoder decides.)
    let mut failed = unsealed(&golden_tombstone());
    let flag_at = 1 + 32 + 6 + 6 + 5 + 1 + 2;
    assert_eq!(failed[flag_at], 0x00);
    failed[flag_at] = 0x01;
    let State::Tombstone(t) = Record::decode(&seal(&failed)).expect("decodes").state else {
        panic!("still a tombstone")
    };
    assert!(t.is_failure());
    failed[flag_at] = 0x02;
    assert!(matches!(
        Record::decode(&seal(&failed)),
        Err(Error::CorruptRecord { .. })
    ));
}

#[test]
fn forget_at_is_stored_as_a_difference_and_never_before_expires_at() {
    // A hand-built record whose forget_at is before expires_at stores a difference of 0 and
    // reads back with forget_at = expires_at.
    let mut r = completed_record();
    r.forget_at = Timestamp(T0);
    let back = Record::decode(&r.encode()).expect("decodes");
    assert_eq!(back.forget_at, back.expires_at);
    // A difference that overflows saturates at the far future.
    let mut huge = unsealed(&golden_pending());
    let at = 1 + 32 + 6 + 6;
    huge.splice(
        at..at + 1,
        [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    );
    let back = Record::decode(&seal(&huge)).expect("decodes");
    assert_eq!(back.forget_at, Timestamp(u64::MAX));
}

// ---- hostile input ----

#[test]
fn every_truncation_is_a_corrupt_record() {
    for (name, _, golden) in goldens() {
        for n in 0..golden.len() {
            let got = catch_unwind(|| Record::decode(&golden[..n]))
                .unwrap_or_else(|_| panic!("{name}: decode panicked on the first {n} bytes"));
            assert!(
                matches!(got, Err(Error::CorruptRecord { .. })),
                "{name}: the first {n} bytes gave {got:?}"
            );
            assert!(
                walk(&golden[..n]).is_err(),
                "{name}: the reference decoder accepted the first {n} bytes"
            );
        }
        // Behind a right checksum, every proper prefix of the body is still corrupt: the body
        // decoder bounds-checks every length.
        let body = unsealed(&golden);
        for n in 1..body.len() {
            let bytes = seal(&body[..n]);
            let got = catch_unwind(|| Record::decode(&bytes)).unwrap_or_else(|_| {
                panic!("{name}: decode panicked on the first {n} body bytes, resealed")
            });
            assert!(
                matches!(got, Err(Error::CorruptRecord { .. })),
                "{name}: the first {n} body bytes, resealed, gave {got:?}"
            );
            assert!(walk(&bytes).is_err(), "{name}: {n} body bytes, resealed");
        }
    }
}

#[test]
fn every_single_byte_substitution_is_a_typed_error() {
    // The stored value as damage leaves it: the checksum no longer matches, so no substitution
    // anywhere (version, body or checksum) decodes, to the original record or any other.
    for (name, _, golden) in goldens() {
        for pos in 0..golden.len() {
            for value in 0..=u8::MAX {
                if value == golden[pos] {
                    continue;
                }
                let mut bytes = golden.clone();
                bytes[pos] = value;
                let got = catch_unwind(AssertUnwindSafe(|| Record::decode(&bytes))).unwrap_or_else(
                    |_| panic!("{name}: decode panicked with byte {pos} set to {value:#04x}"),
                );
                match got {
                    Err(Error::UnsupportedFormat { found, supported }) => {
                        assert_eq!(pos, 0, "{name}: only the first byte is the version");
                        assert_eq!((found, supported), (value, 2));
                    }
                    Err(Error::CorruptRecord { .. }) => {
                        assert_ne!(
                            pos, 0,
                            "{name}: a bad version byte must be UnsupportedFormat"
                        );
                    }
                    other => panic!("{name}: byte {pos} = {value:#04x} gave {other:?}"),
                }
                assert!(
                    walk(&bytes).is_err(),
                    "{name}: the reference decoder accepted byte {pos} = {value:#04x}"
                );
            }
        }
    }
}

#[test]
fn every_resealed_single_byte_substitution_is_ok_or_typed_error() {
    // A substitution behind a right checksum (as another writer could produce) reaches the body
    // decoder: it gives a record or a typed error, and both decoders agree.
    let mut accepted = 0usize;
    for (name, _, golden) in goldens() {
        let body = unsealed(&golden);
        for pos in 0..body.len() {
            for value in 0..=u8::MAX {
                if value == body[pos] {
                    continue;
                }
                let mut covered = body.clone();
                covered[pos] = value;
                let bytes = seal(&covered);
                let got = catch_unwind(AssertUnwindSafe(|| Record::decode(&bytes))).unwrap_or_else(
                    |_| panic!("{name}: decode panicked with byte {pos} set to {value:#04x}"),
                );
                if (1..33).contains(&pos) {
                    assert!(
                        got.is_ok(),
                        "{name}: any fingerprint byte is valid, got {got:?}"
                    );
                }
                let reference = walk(&bytes);
                match (&got, &reference) {
                    (Ok(record), Ok((_, model))) => {
                        accepted += 1;
                        assert_eq!(
                            record.encode(),
                            model.encode(),
                            "{name}: byte {pos} = {value:#04x}: decoders disagree on the fields"
                        );
                    }
                    (Err(Error::UnsupportedFormat { found, supported }), Err(_)) => {
                        assert_eq!(pos, 0, "{name}: only the first byte is the version");
                        assert_eq!((*found, *supported), (value, 2));
                    }
                    (Err(Error::CorruptRecord { .. }), Err(_)) => {
                        assert_ne!(
                            pos, 0,
                            "{name}: a bad version byte must be UnsupportedFormat"
                        );
                    }
                    _ => panic!(
                        "{name}: byte {pos} = {value:#04x}: decode gave {got:?}, \
                         the reference decoder gave {:?}",
                        reference.map(|(_, r)| r)
                    ),
                }
            }
        }
    }
    // At least every fingerprint substitution decoded.
    assert!(accepted >= 3 * 32 * 255);
}

#[test]
fn unknown_versions_are_unsupported_format() {
    for version in [0u8, 1, 3, 0xff] {
        let mut bytes = golden_completed();
        bytes[0] = version;
        let got = Record::decode(&bytes);
        assert!(
            matches!(
                got,
                Err(Error::UnsupportedFormat {
                    found,
                    supported: 2
                }) if found == version
            ),
            "version {version}: {got:?}"
        );
        // The version alone decides: nothing after it is looked at.
        assert!(matches!(
            Record::decode(&[version]),
            Err(Error::UnsupportedFormat {
                found,
                supported: 2
            }) if found == version
        ));
    }
}

#[test]
fn empty_value_is_a_corrupt_record() {
    assert!(matches!(
        Record::decode(&[]),
        Err(Error::CorruptRecord { .. })
    ));
}

#[test]
fn trailing_bytes_are_a_corrupt_record() {
    for (name, _, golden) in goldens() {
        for extra in [0x00u8, 0x01, 0xff] {
            let mut bytes = golden.clone();
            bytes.push(extra);
            let got = Record::decode(&bytes);
            assert!(
                matches!(got, Err(Error::CorruptRecord { .. })),
                "{name} + {extra:#04x}: {got:?}"
            );
            // Behind a right checksum too: the body must end exactly where the checksum starts.
            let mut covered = unsealed(&golden);
            covered.push(extra);
            let got = Record::decode(&seal(&covered));
            match &got {
                Err(e @ Error::CorruptRecord { .. }) => {
                    assert!(e.to_string().contains("1 trailing bytes"), "{e}");
                }
                other => panic!("{name} + {extra:#04x} resealed: {other:?}"),
            }
            assert!(walk(&seal(&covered)).is_err(), "{name} + {extra:#04x}");
        }
    }
}

#[test]
fn overlong_varints_are_accepted_and_reencoded_short() {
    // docs/FORMAT.md, "Decoding rules": postcard accepts a varint padded with 0x80 continuation
    // bytes (within the type's maximum length); idem re-encodes it in the shortest form.
    // (Only another writer could store one: the checksum covers the bytes as written.)
    let mut bytes = unsealed(&golden_pending());
    let attempt_at = bytes.len() - 1;
    assert_eq!(bytes[attempt_at], 0x01);
    bytes[attempt_at] = 0x81;
    bytes.push(0x00);
    let record = Record::decode(&seal(&bytes)).expect("overlong attempt decodes");
    assert_eq!(record, pending_record());
    assert_eq!(record.encode(), golden_pending());
    // u32 allows at most 5 varint bytes; a 6th is an error.
    let mut too_long = unsealed(&golden_pending());
    too_long.truncate(attempt_at);
    too_long.extend_from_slice(&[0x81, 0x80, 0x80, 0x80, 0x80, 0x00]);
    assert!(matches!(
        Record::decode(&seal(&too_long)),
        Err(Error::CorruptRecord { .. })
    ));
}

// ---- fingerprints and downstream keys ----

#[test]
fn fingerprint_of_bytes_is_pinned() {
    assert_eq!(
        Fingerprint::of_bytes(b"hello").to_hex(),
        "4428712e59fe5064237c1456762839ab4c07d1cada76bf958732e1420c744215"
    );
}

#[test]
fn fingerprint_of_serialize_is_pinned() {
    assert_eq!(
        Fingerprint::of_serialize(&("a", 1u32))
            .expect("a tuple serializes")
            .to_hex(),
        "420ab93fd15c512c13965f379a210d416caf696b66d080dc99cf3b7add958dea"
    );
}

#[test]
fn downstream_key_is_pinned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("idem.redb")).expect("open");
    let begin = store
        .begin(Request::from_canonical_bytes(
            Scope::new("t", "op"),
            "k",
            b"x",
        ))
        .expect("begin");
    let BeginAnswer::Acquired(lease) = begin else {
        panic!("a fresh key is acquired, got {begin:?}")
    };
    assert_eq!(
        lease.downstream_key().to_hex(),
        "417198a6b001b039bbf549500ead10409f311d7cbd742af97736274a08c0dd1e"
    );
}

// ---- outbox event ids ----

/// docs/FORMAT.md, "Outbox event ids": the contexts, one per kind of origin.
const EVENT_ID_RECORD_CONTEXT: &str =
    "idem 2026-11-30 outbox event id from an idempotency record v2";
const EVENT_ID_MARK_CONTEXT: &str = "idem 2026-11-30 outbox event id from an inbox mark v2";
const EVENT_ID_CALLER_CONTEXT: &str = "idem 2026-11-30 outbox event id from caller identity v1";

/// The id of push `n` of a transaction committing the row `key` of generation `generation`,
/// written from docs/FORMAT.md: `derive_key(context, u64be(len key) ‖ key ‖ u64be(generation)
/// ‖ u32be(n))`.
fn event_id(context: &str, key: &[u8], generation: u64, n: u32) -> String {
    let mut input = Vec::new();
    input.extend_from_slice(&(key.len() as u64).to_be_bytes());
    input.extend_from_slice(key);
    input.extend_from_slice(&generation.to_be_bytes());
    input.extend_from_slice(&n.to_be_bytes());
    blake3::derive_key(context, &input)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The message id that makes subscriber `"t"`'s inbox mark key the same bytes as the record key
/// of `t`/`op`/`k` (docs/FORMAT.md, "Outbox event ids").
const SPELLING_MESSAGE_ID: &[u8] = b"\x00\x02op\x00\x01k";

/// The pinned event ids: (what, id as idem pushes it, independent derivation, pinned hex).
fn golden_event_ids() -> Vec<(&'static str, String, String, &'static str)> {
    let store = Store::builder()
        .clock(ManualClock::new(Timestamp(T0)))
        .open(
            tempfile::tempdir()
                .expect("tempdir")
                .path()
                .join("idem.redb"),
        )
        .expect("open");
    let mut pushed = Vec::new();
    let outcome = store
        .execute(
            Request::from_canonical_bytes(Scope::new("t", "op"), "k", b"x"),
            |tx| {
                pushed.push(
                    tx.outbox()
                        .push(idem::outbox::Event::new("e", b"0".to_vec()))?,
                );
                pushed.push(
                    tx.outbox()
                        .push(idem::outbox::Event::new("e", b"1".to_vec()))?,
                );
                pushed.push(
                    tx.outbox()
                        .push(idem::outbox::Event::new("e", b"2".to_vec()).identity("k"))?,
                );
                Ok(Response::new(200, "ok"))
            },
        )
        .expect("execute");
    assert!(
        matches!(outcome, idem::ExecuteAnswer::Ran(_)),
        "{outcome:?}"
    );
    store
        .process("t", SPELLING_MESSAGE_ID, |tx| {
            pushed.push(
                tx.outbox()
                    .push(idem::outbox::Event::new("e", b"m".to_vec()))?,
            );
            Ok(())
        })
        .expect("process");
    let from_store: Vec<String> = store
        .pending_events(10)
        .expect("pending")
        .into_iter()
        .map(|e| e.id.to_hex())
        .collect();
    let returned: Vec<String> = pushed.iter().map(|id| id.to_hex()).collect();
    assert_eq!(from_store, returned, "push returns the id that is stored");

    let record_key = golden_record_key();
    let mark_key = [&[0x01u8, 0x00, 0x01][..], b"t", SPELLING_MESSAGE_ID].concat();
    assert_eq!(record_key, mark_key, "the two origins are the same bytes");
    let caller: String = blake3::derive_key(EVENT_ID_CALLER_CONTEXT, b"k")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    vec![
        (
            "record t/op/k, created_at T0, push 0",
            from_store[0].clone(),
            event_id(EVENT_ID_RECORD_CONTEXT, &record_key, T0, 0),
            "445b8cbb3abdb4df31968d9926105b4141fe7d012c68e5e4de39735fe22e0140",
        ),
        (
            "record t/op/k, created_at T0, push 1",
            from_store[1].clone(),
            event_id(EVENT_ID_RECORD_CONTEXT, &record_key, T0, 1),
            "1b5c90cfb41eb789aaf12452988389b755b25d771b532e90fb097091d8deef31",
        ),
        (
            "Event::identity(\"k\")",
            from_store[2].clone(),
            caller,
            "5572147b49e8d2f394dcd18e1fd6ff9882ff9df60b73d76150efc0e6a0389e6c",
        ),
        (
            "inbox mark with the same key bytes, processed_at T0, push 0",
            from_store[3].clone(),
            event_id(EVENT_ID_MARK_CONTEXT, &mark_key, T0, 0),
            "b0f20c64ff947485c23e44f8e6c0f68a192e89adb71d437f9d7ee5520da50b79",
        ),
    ]
}

/// Event ids are what consumers deduplicate on: idem's ids equal the derivation written from
/// docs/FORMAT.md, equal the pinned values, and the document shows every pinned value.
#[test]
fn event_ids_are_pinned_and_derive_as_documented() {
    let doc = format_md();
    for (what, pushed, derived, pinned) in golden_event_ids() {
        assert_eq!(pushed, derived, "{what}: idem vs the documented derivation");
        assert_eq!(pushed, pinned, "{what}: idem vs the pinned value");
        assert!(
            doc.contains(pinned),
            "docs/FORMAT.md must show the event id of {what}: {pinned}"
        );
    }
}

// ---- inbox marks ----

const INBOX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.inbox.v2");
/// docs/FORMAT.md, "Inbox marks": the checksum contexts of the two layouts.
const MARK_CONTEXT: &str = "idem 2026-11-30 inbox mark checksum";
const REJECTION_MARK_CONTEXT: &str = "idem 2026-11-30 inbox mark with rejection checksum";

/// A processed mark and a rejection mark as a store at `T0` (default 7-day inbox retention)
/// writes them: (mark key, value) of subscriber `"sub"`, messages `"m-1"` and `"m-2"`.
fn stored_marks() -> Vec<(Vec<u8>, Vec<u8>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = written_at_t0(&dir, |store| {
        store.process("sub", "m-1", |_| Ok(())).expect("process");
        let r = store
            .process("sub", "m-2", |_| -> Result<(), idem::Abort> {
                Err(idem::Abort::terminal(
                    Response::new(422, "bad").with_resource("order", "o1"),
                ))
            })
            .expect("process");
        assert!(
            matches!(r, idem::inbox::ProcessAnswer::Rejected(_)),
            "{r:?}"
        );
    });
    let read = db.begin_read().expect("read");
    let inbox = read.open_table(INBOX).expect("inbox table");
    inbox
        .iter()
        .expect("iter")
        .map(|row| {
            let (k, v) = row.expect("row");
            (k.value().to_vec(), v.value().to_vec())
        })
        .collect()
}

/// The plain mark: `u64be(processed_at) ‖ u64be(forget_at) ‖ checksum`.
fn golden_plain_mark() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&T0.to_be_bytes());
    v.extend_from_slice(&(T0 + 7 * DAY_MS).to_be_bytes());
    v.extend_from_slice(&[0xe5, 0xb5, 0xb6, 0xe7, 0x10, 0x8a, 0x0b, 0xe1]);
    v
}

/// The rejection mark: `03 ‖ u64be(processed_at) ‖ u64be(forget_at) ‖ u16be(status) ‖
/// u32be(len body) ‖ body ‖ 01 ‖ u32be(len kind) ‖ kind ‖ u32be(len id) ‖ id ‖ checksum`.
fn golden_rejection_mark() -> Vec<u8> {
    let mut v = vec![0x03];
    v.extend_from_slice(&T0.to_be_bytes());
    v.extend_from_slice(&(T0 + 7 * DAY_MS).to_be_bytes());
    v.extend_from_slice(&[0x01, 0xa6]); // 422
    v.extend_from_slice(&[0, 0, 0, 3]);
    v.extend_from_slice(b"bad");
    v.push(0x01);
    v.extend_from_slice(&[0, 0, 0, 5]);
    v.extend_from_slice(b"order");
    v.extend_from_slice(&[0, 0, 0, 2]);
    v.extend_from_slice(b"o1");
    v.extend_from_slice(&[0xb1, 0xbc, 0xd8, 0x2f, 0xb4, 0x7f, 0x70, 0xad]);
    v
}

/// What a mark says, decoded from docs/FORMAT.md alone: (processed_at, forget_at, rejection as
/// (status, body, resource)).
type MarkFields = (u64, u64, Option<(u16, Vec<u8>, Option<(String, String)>)>);

/// Decodes a mark following docs/FORMAT.md, "Inbox marks" (no idem code).
fn walk_mark(bytes: &[u8]) -> Result<MarkFields, String> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err("short".into());
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    fn u32be(b: &mut &[u8]) -> Result<usize, String> {
        Ok(u32::from_be_bytes(take(b, 4)?.try_into().map_err(|_| "u32")?) as usize)
    }
    fn u64be(b: &mut &[u8]) -> Result<u64, String> {
        Ok(u64::from_be_bytes(
            take(b, 8)?.try_into().map_err(|_| "u64")?,
        ))
    }
    fn sum(context: &str, covered: &[u8]) -> Vec<u8> {
        blake3::derive_key(context, covered)[..8].to_vec()
    }
    if bytes.len() < 8 {
        return Err("short".into());
    }
    let (covered, stored) = bytes.split_at(bytes.len() - 8);
    if bytes.len() == 24 {
        if stored != sum(MARK_CONTEXT, covered) {
            return Err("checksum".into());
        }
        let mut b = covered;
        return Ok((u64be(&mut b)?, u64be(&mut b)?, None));
    }
    if covered.first() != Some(&0x03) || stored != sum(REJECTION_MARK_CONTEXT, covered) {
        return Err("not a rejection mark".into());
    }
    let mut b = &covered[1..];
    let processed_at = u64be(&mut b)?;
    let forget_at = u64be(&mut b)?;
    let status = u16::from_be_bytes(take(&mut b, 2)?.try_into().map_err(|_| "u16")?);
    let n = u32be(&mut b)?;
    let body = take(&mut b, n)?.to_vec();
    let resource = match take(&mut b, 1)? {
        [0] => None,
        [1] => {
            let n = u32be(&mut b)?;
            let kind = String::from_utf8(take(&mut b, n)?.to_vec()).map_err(|e| e.to_string())?;
            let n = u32be(&mut b)?;
            let id = String::from_utf8(take(&mut b, n)?.to_vec()).map_err(|e| e.to_string())?;
            Some((kind, id))
        }
        _ => return Err("resource flag".into()),
    };
    if !b.is_empty() {
        return Err("trailing".into());
    }
    Ok((processed_at, forget_at, Some((status, body, resource))))
}

/// Both mark layouts, as a store writes them: the exact bytes (checksums included), what the
/// independent decoder reads from them, and the hex rows docs/FORMAT.md shows. The plain layout
/// is the one every mark had before rejections were kept, byte for byte, so old marks read.
#[test]
fn inbox_marks_encode_to_golden_bytes() {
    let marks = stored_marks();
    let key = |m: &str| [&[0x01u8, 0x00, 0x03][..], b"sub", m.as_bytes()].concat();
    let plain = golden_plain_mark();
    let rejection = golden_rejection_mark();
    let fill = |mut v: Vec<u8>, context: &str| {
        let at = v.len() - 8;
        let sum = blake3::derive_key(context, &v[..at]);
        v[at..].copy_from_slice(&sum[..8]);
        v
    };
    assert_eq!(fill(plain.clone(), MARK_CONTEXT), plain, "pinned checksum");
    assert_eq!(
        fill(rejection.clone(), REJECTION_MARK_CONTEXT),
        rejection,
        "pinned checksum"
    );
    assert_eq!(
        marks,
        vec![(key("m-1"), plain.clone()), (key("m-2"), rejection.clone())]
    );
    assert_eq!(
        walk_mark(&plain),
        Ok((T0, T0 + 7 * DAY_MS, None)),
        "the plain mark"
    );
    assert_eq!(
        walk_mark(&rejection),
        Ok((
            T0,
            T0 + 7 * DAY_MS,
            Some((422, b"bad".to_vec(), Some(("order".into(), "o1".into()))))
        )),
        "the rejection mark"
    );
    let doc = format_md();
    for (what, bytes) in [("plain mark", &plain), ("rejection mark", &rejection)] {
        let row = hex_row(bytes);
        assert!(
            doc.contains(&row),
            "docs/FORMAT.md must show the {what}: {row}"
        );
    }
}

// ---- the store file ----

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idem.meta.v1");
const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");

#[test]
fn store_file_has_the_documented_tables_key_and_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = written_at_t0(&dir, |store| {
        let begin = store
            .begin(Request::from_canonical_bytes(
                Scope::new("t", "op"),
                "k",
                b"x",
            ))
            .expect("begin");
        let BeginAnswer::Acquired(lease) = begin else {
            panic!("a fresh key is acquired, got {begin:?}")
        };
        lease.complete(Response::new(200, "ok")).expect("complete");
    });
    let read = db.begin_read().expect("read");
    let mut tables: Vec<String> = read
        .list_tables()
        .expect("list")
        .map(|t| t.name().to_owned())
        .collect();
    tables.sort();
    assert_eq!(
        tables,
        ["idem.expiry.v1", "idem.meta.v1", "idem.records.v1"]
    );

    let meta = read.open_table(META).expect("meta table");
    let marker = meta.get("format").expect("get").expect("format marker");
    assert_eq!(marker.value(), [2u8]);
    // The default mode, journal mode, keeps its checkpoint row beside the marker
    // (docs/FORMAT.md, "Checkpoint row"); nothing else is there.
    let keys: Vec<String> = meta
        .iter()
        .expect("iter")
        .map(|row| row.expect("row").0.value().to_owned())
        .collect();
    assert_eq!(keys, ["format", "journal"]);

    let records = read.open_table(RECORDS).expect("records table");
    let rows: Vec<(Vec<u8>, Vec<u8>)> = records
        .iter()
        .expect("iter")
        .map(|row| {
            let (k, v) = row.expect("row");
            (k.value().to_vec(), v.value().to_vec())
        })
        .collect();
    let expected_key = golden_record_key();
    let expected_value = Record {
        fingerprint: Fingerprint::of_bytes(b"x"),
        created_at: Timestamp(T0),
        expires_at: Timestamp(T0 + DAY_MS),
        forget_at: Timestamp(T0 + 7 * DAY_MS),
        state: State::Completed(Response::new(200, "ok")),
    }
    .encode();
    assert_eq!(rows, vec![(expected_key, expected_value)]);

    let expiry = read.open_table(EXPIRY).expect("expiry table");
    let entries: Vec<(Vec<u8>, u8)> = expiry
        .iter()
        .expect("iter")
        .map(|row| {
            let (k, v) = row.expect("row");
            (k.value().to_vec(), v.value())
        })
        .collect();
    // One entry, due at the end of the response window, valued with the state tag (1: Completed).
    assert_eq!(entries, vec![(golden_expiry_entry(), 1)]);
}

// ---- the reference decoder and the dumps in docs/FORMAT.md ----

/// One annotated field: where it starts, its bytes, what they mean.
struct Seg {
    offset: usize,
    bytes: Vec<u8>,
    what: String,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    segs: Vec<Seg>,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: impl Into<String>) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).ok_or("length overflow")?;
        let s = self.bytes.get(self.at..end).ok_or("unexpected end")?;
        self.segs.push(Seg {
            offset: self.at,
            bytes: s.to_vec(),
            what: what.into(),
        });
        self.at = end;
        Ok(s)
    }

    /// LEB128, at most `ceil(bits / 7)` bytes, no bits beyond `bits` in the last one.
    fn varint(&mut self, bits: u32, what: &str) -> Result<u64, String> {
        let max_len = bits.div_ceil(7);
        let start = self.at;
        let mut value = 0u64;
        for i in 0..max_len {
            let b = *self.bytes.get(self.at).ok_or("unexpected end")?;
            self.at += 1;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if i == max_len - 1 && u32::from(b) >= 1 << (bits - 7 * i) {
                    return Err(format!("{what}: varint overflows u{bits}"));
                }
                self.segs.push(Seg {
                    offset: start,
                    bytes: self.bytes[start..self.at].to_vec(),
                    what: format!("{what} = {value}"),
                });
                return Ok(value);
            }
        }
        Err(format!("{what}: varint longer than {max_len} bytes"))
    }

    fn raw<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        for (i, chunk) in (0..N).step_by(16).enumerate() {
            let n = (N - chunk).min(16);
            let part = self.take(n, format!("{what}[{}..{}]", i * 16, i * 16 + n))?;
            out[chunk..chunk + n].copy_from_slice(part);
        }
        Ok(out)
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let len = self.varint(64, &format!("{what} length"))?;
        let len = usize::try_from(len).map_err(|_| "length overflows usize")?;
        let mut rest = len;
        let start = self.at;
        while rest > 0 {
            let n = rest.min(16);
            let s = self.take(n, "")?;
            let seg = self.segs.last_mut().ok_or("no segment")?;
            seg.what = format!("{what} = {}", printable(s));
            rest -= n;
        }
        Ok(&self.bytes[start..start + len])
    }

    fn str(&mut self, what: &str) -> Result<String, String> {
        let b = self.bytes(what)?;
        let s = std::str::from_utf8(b).map_err(|e| format!("{what}: {e}"))?;
        Ok(s.to_owned())
    }
}

/// Decodes a record value following docs/FORMAT.md alone (no postcard, no serde), returning
/// the annotated fields and the record.
fn walk(bytes: &[u8]) -> Result<(Vec<Seg>, Record), String> {
    let version = *bytes.first().ok_or("empty value")?;
    if version != 2 {
        return Err(format!("unsupported version {version}"));
    }
    // The checksum is the last 8 bytes; it is checked before any field is read.
    if bytes.len() < 1 + 8 {
        return Err(format!("{} bytes: no room for the checksum", bytes.len()));
    }
    let (covered, sum) = bytes.split_at(bytes.len() - 8);
    if sum != checksum(covered) {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader {
        bytes: covered,
        at: 0,
        segs: Vec::new(),
    };
    r.take(1, "format version = 2")?;
    let fingerprint = Fingerprint(r.raw::<32>("fingerprint")?);
    let created_at = Timestamp(r.varint(64, "created_at (ms)")?);
    let expires_at = Timestamp(r.varint(64, "expires_at (ms)")?);
    let forget_after = r.varint(64, "forget_after (ms)")?;
    let forget_at = Timestamp(expires_at.0.saturating_add(forget_after));
    let state = match r.varint(32, "state variant")? {
        0 => {
            r.segs.last_mut().ok_or("no segment")?.what += " (Pending)";
            let holder = HolderToken(r.raw::<16>("holder")?);
            let lease_deadline = Timestamp(r.varint(64, "lease_deadline (ms)")?);
            let attempt = r.varint(32, "attempt")?;
            State::Pending {
                holder,
                lease_deadline,
                attempt: u32::try_from(attempt).map_err(|e| e.to_string())?,
            }
        }
        tag @ (1 | 2) => {
            r.segs.last_mut().ok_or("no segment")?.what += if tag == 1 {
                " (Completed)"
            } else {
                " (Failed)"
            };
            let status = r.varint(16, "status")?;
            let body = r.bytes("body")?.to_vec();
            let mut response =
                Response::new(u16::try_from(status).map_err(|e| e.to_string())?, body);
            match r.take(1, "resource")?[0] {
                0 => r.segs.last_mut().ok_or("no segment")?.what += " = None",
                1 => {
                    r.segs.last_mut().ok_or("no segment")?.what += " = Some";
                    let kind = r.str("resource.kind")?;
                    let id = r.str("resource.id")?;
                    response = response.with_resource(kind, id);
                }
                other => return Err(format!("bad option tag {other}")),
            }
            if tag == 1 {
                State::Completed(response)
            } else {
                State::Failed(response)
            }
        }
        3 => {
            r.segs.last_mut().ok_or("no segment")?.what += " (Tombstone)";
            let status = r.varint(16, "status")?;
            let failed = match r.take(1, "failed")?[0] {
                0 => false,
                1 => true,
                other => return Err(format!("bad bool {other}")),
            };
            r.segs.last_mut().ok_or("no segment")?.what += &format!(" = {failed}");
            let mut resource = None;
            match r.take(1, "resource")?[0] {
                0 => r.segs.last_mut().ok_or("no segment")?.what += " = None",
                1 => {
                    r.segs.last_mut().ok_or("no segment")?.what += " = Some";
                    let kind = r.str("resource.kind")?;
                    let id = r.str("resource.id")?;
                    resource = Some(Resource { kind, id });
                }
                other => return Err(format!("bad option tag {other}")),
            }
            State::Tombstone(Tombstone::new(
                u16::try_from(status).map_err(|e| e.to_string())?,
                resource,
                failed,
            ))
        }
        other => return Err(format!("unknown state variant {other}")),
    };
    if r.at != covered.len() {
        return Err(format!("{} trailing bytes", covered.len() - r.at));
    }
    r.segs.push(Seg {
        offset: covered.len(),
        bytes: sum.to_vec(),
        what: "checksum (blake3, first 8 bytes)".into(),
    });
    let record = Record {
        fingerprint,
        created_at,
        expires_at,
        forget_at,
        state,
    };
    Ok((r.segs, record))
}

/// The annotated dump of a golden value, as it appears in docs/FORMAT.md.
fn dump(bytes: &[u8]) -> String {
    let (segs, _) = walk(bytes).unwrap_or_else(|e| panic!("golden value rejected: {e}"));
    let mut out = String::from(" off  bytes                                            field\n");
    for s in segs {
        out += &format!("{:>4}  {:<47}  {}\n", s.offset, hex_row(&s.bytes), s.what);
    }
    out
}

#[test]
fn reference_decoder_agrees_on_the_goldens() {
    for (name, record, golden) in goldens() {
        let (segs, model) = walk(&golden).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(model.encode(), golden, "{name}");
        assert_eq!(model.encode(), record.encode(), "{name}");
        let covered: usize = segs.iter().map(|s| s.bytes.len()).sum();
        assert_eq!(
            covered,
            golden.len(),
            "{name}: every byte is annotated once"
        );
    }
}

#[test]
fn format_md_shows_the_golden_dumps() {
    let doc = format_md();
    let key = hex_row(&golden_record_key());
    assert!(
        doc.contains(&key),
        "docs/FORMAT.md must show the record key {key}"
    );
    let entry = hex_row(&golden_expiry_entry());
    assert!(
        doc.contains(&entry),
        "docs/FORMAT.md must show the expiry-index entry {entry}"
    );
    for (name, _, golden) in goldens() {
        let d = dump(&golden);
        assert!(
            doc.contains(&d),
            "docs/FORMAT.md must contain this dump of the {name} record:\n{d}"
        );
    }
}

#[test]
#[ignore = "prints the dumps for docs/FORMAT.md"]
fn print_format_dumps() {
    println!("record key: {}\n", hex_row(&golden_record_key()));
    println!("expiry entry: {}\n", hex_row(&golden_expiry_entry()));
    for (name, _, golden) in goldens() {
        println!("{name} ({} bytes):\n{}", golden.len(), dump(&golden));
    }
    for (what, pushed, _, _) in golden_event_ids() {
        println!("event id of {what}: {pushed}");
    }
    for (key, value) in stored_marks() {
        println!("mark {}: {}", hex_row(&key), hex_row(&value));
    }
}
