//! Bad input is refused with a typed error before anything runs or commits: empty or oversized
//! names, oversized responses, corrupt or foreign stored bytes, files that are not stores. Never
//! a panic.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::*;
use idem::error::Field;
use idem::format::FORMAT_VERSION;
use idem::store::Limits;
use idem::{Error, Response, Scope, Store};

#[track_caller]
fn assert_empty<T: std::fmt::Debug>(result: Result<T, Error>, expected: Field) {
    match result {
        Err(Error::Empty { field }) => assert_eq!(field, expected),
        other => panic!("expected Empty {{ {expected:?} }}, got {other:?}"),
    }
}

#[track_caller]
fn assert_too_long<T: std::fmt::Debug>(result: Result<T, Error>, f: Field, l: usize, m: usize) {
    match result {
        Err(Error::TooLong { field, len, max }) => assert_eq!((field, len, max), (f, l, m)),
        other => panic!("expected TooLong {{ {f:?}, {l}, {m} }}, got {other:?}"),
    }
}

#[test]
fn empty_tenant_operation_or_key_is_refused_before_anything_runs() {
    let h = Harness::new();
    let store = h.store();
    let ran = Cell::new(false);
    let attempt = |t: &str, o: &str, k: &str| {
        store.execute(req(t, o, k, b"p"), |tx| {
            ran.set(true);
            bump(tx, "x")?;
            Ok(Response::new(200, "ok"))
        })
    };
    assert_empty(attempt("", "op", "k"), Field::Tenant);
    assert_empty(attempt("t", "", "k"), Field::Operation);
    assert_empty(attempt("t", "op", ""), Field::Key);
    assert_empty(store.begin(req("", "op", "k", b"p")), Field::Tenant);
    assert_empty(store.begin(req("t", "", "k", b"p")), Field::Operation);
    assert_empty(store.begin(req("t", "op", "", b"p")), Field::Key);
    assert_empty(store.get(&Scope::new("t", "op"), ""), Field::Key);
    assert!(!ran.get());
    assert_eq!(effects(store, "x"), 0);
}

#[test]
fn oversized_names_are_refused_with_default_limits() {
    let h = Harness::new();
    let store = h.store();
    let ran = Cell::new(false);
    let attempt = |t: &str, o: &str, k: &str| {
        store.execute(req(t, o, k, b"p"), |_| {
            ran.set(true);
            Ok(Response::new(200, "ok"))
        })
    };
    let key_256 = "k".repeat(256);
    assert_too_long(attempt("t", "op", &key_256), Field::Key, 256, 255);
    assert_too_long(
        store.begin(req("t", "op", &key_256, b"p")),
        Field::Key,
        256,
        255,
    );
    assert_too_long(
        attempt(&"t".repeat(129), "op", "k"),
        Field::Tenant,
        129,
        128,
    );
    assert_too_long(
        attempt("t", &"o".repeat(129), "k"),
        Field::Operation,
        129,
        128,
    );
    assert!(!ran.get());

    // Exactly at the limits is fine.
    executed(attempt(
        &"t".repeat(128),
        &"o".repeat(128),
        &"k".repeat(255),
    ));
    assert!(ran.get());
}

#[test]
fn custom_limits_raise_the_caps() {
    let limits = Limits {
        max_key_len: 1024,
        max_tenant_len: 300,
        max_operation_len: 200,
    };
    let h = Harness::with(|b| b.limits(limits));
    let store = h.store();
    let key = "k".repeat(1024);
    executed(
        store.execute(req(&"t".repeat(300), &"o".repeat(200), &key, b"p"), |_| {
            Ok(Response::new(200, "long names"))
        }),
    );
    let again = replayed(
        store.execute(req(&"t".repeat(300), &"o".repeat(200), &key, b"p"), |_| {
            Ok(Response::new(500, "must not run"))
        }),
    );
    assert_eq!(again.body(), b"long names");
    let r = store.execute(req("t", "o", &"k".repeat(1025), b"p"), |_| {
        Ok(Response::new(200, "ok"))
    });
    assert_too_long(r, Field::Key, 1025, 1024);
    let r = store.execute(req(&"t".repeat(301), "o", "k", b"p"), |_| {
        Ok(Response::new(200, "ok"))
    });
    assert_too_long(r, Field::Tenant, 301, 300);
    let r = store.execute(req("t", &"o".repeat(201), "k", b"p"), |_| {
        Ok(Response::new(200, "ok"))
    });
    assert_too_long(r, Field::Operation, 201, 200);
}

#[test]
fn impossible_limits_are_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    for limits in [
        Limits {
            max_key_len: 0,
            ..Limits::default()
        },
        Limits {
            max_key_len: 70_000,
            ..Limits::default()
        },
        Limits {
            max_tenant_len: 65_536,
            ..Limits::default()
        },
        Limits {
            max_operation_len: 0,
            ..Limits::default()
        },
    ] {
        let r = Store::builder().limits(limits).open(&path);
        assert!(matches!(r, Err(Error::Config { .. })), "{limits:?}: {r:?}");
    }
    let r = Store::builder()
        .max_response_bytes(16 * 1024 * 1024 + 1)
        .open(&path);
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
}

#[test]
fn an_oversized_response_commits_nothing() {
    let h = Harness::with(|b| b.max_response_bytes(100));
    let store = h.store();
    let result = store.execute(req("t", "op", "big", b"p"), |tx| {
        bump(tx, "big")?;
        Ok(Response::new(200, vec![b'x'; 101]))
    });
    match result {
        Err(Error::ResponseTooLarge { len, max }) => assert_eq!((len, max), (101, 100)),
        other => panic!("expected ResponseTooLarge, got {other:?}"),
    }
    assert_eq!(store.get(&Scope::new("t", "op"), "big").expect("get"), None);
    assert_eq!(
        effects(store, "big"),
        0,
        "the caller's write was rolled back"
    );

    // The resource pointer counts too: 90 + "order".len() + "ord_01".len() = 101.
    let result = store.execute(req("t", "op", "big", b"p"), |tx| {
        bump(tx, "big")?;
        Ok(Response::new(200, vec![b'x'; 90]).with_resource("order", "ord_01"))
    });
    assert!(
        matches!(result, Err(Error::ResponseTooLarge { len: 101, .. })),
        "{result:?}"
    );
    assert_eq!(effects(store, "big"), 0);

    // A terminal failure is a stored response too.
    let result = store.execute(req("t", "op", "big", b"p"), |_| {
        Err(idem::Abort::terminal(Response::new(402, vec![b'x'; 101])))
    });
    assert!(
        matches!(result, Err(Error::ResponseTooLarge { .. })),
        "{result:?}"
    );
    assert_eq!(store.get(&Scope::new("t", "op"), "big").expect("get"), None);

    // Exactly at the cap is fine.
    executed(store.execute(req("t", "op", "big", b"p"), |tx| {
        bump(tx, "big")?;
        Ok(Response::new(200, vec![b'x'; 100]))
    }));
    assert_eq!(effects(store, "big"), 1);
}

#[test]
fn an_oversized_completion_releases_the_lease() {
    let h = Harness::with(|b| b.max_response_bytes(10));
    let store = h.store();
    let lease = acquired(store.begin(req("t", "charge", "k", b"p")));
    let result = lease.complete_with(|tx| {
        bump(tx, "ledger")?;
        Ok(Response::new(200, "eleven byte"))
    });
    assert!(
        matches!(result, Err(Error::ResponseTooLarge { len: 11, max: 10 })),
        "{result:?}"
    );
    assert_eq!(effects(store, "ledger"), 0);
    assert_eq!(
        store.get(&Scope::new("t", "charge"), "k").expect("get"),
        None
    );
    assert_eq!(
        acquired(store.begin(req("t", "charge", "k", b"p"))).attempt(),
        1
    );
}

/// Stores a completed record for "victim" and "bystander", then replaces the victim's stored
/// value with `corrupt(original)` on the closed file and reopens the store.
fn with_corrupt_victim(corrupt: impl FnOnce(&[u8]) -> Vec<u8>) -> Harness {
    let mut h = Harness::new();
    for key in ["victim", "bystander"] {
        executed(h.store().execute(req("t", "op", key, b"p"), |_| {
            Ok(Response::new(201, format!("{key} created")).with_resource("thing", key))
        }));
    }
    h.close();
    let rk = record_key("t", "op", b"victim");
    let original = raw_record(&h.path, &rk).expect("victim record is stored under its key");
    overwrite_record(&h.path, &rk, &corrupt(&original));
    h.reopen();
    h
}

/// Every entry point refuses the corrupt key with `check`, never runs the closure, never
/// panics, and leaves the rest of the store working.
fn assert_corrupt_key_is_contained(h: &Harness, check: impl Fn(&Error)) {
    let store = h.store();
    let ran = Cell::new(false);
    let r = store.execute(req("t", "op", "victim", b"p"), |tx| {
        ran.set(true);
        bump(tx, "victim")?;
        Ok(Response::new(201, "again"))
    });
    check(&r.expect_err("execute on a corrupt record"));
    check(
        &store
            .begin(req("t", "op", "victim", b"p"))
            .expect_err("begin on a corrupt record"),
    );
    check(
        &store
            .get(&Scope::new("t", "op"), "victim")
            .expect_err("get on a corrupt record"),
    );
    assert!(!ran.get(), "nothing runs on a corrupt record");
    assert_eq!(
        store.failure(),
        None,
        "a corrupt record does not fail-stop the store"
    );

    let r = replayed(store.execute(req("t", "op", "bystander", b"p"), |_| {
        Ok(Response::new(500, "must not run"))
    }));
    assert_eq!(r.body(), b"bystander created");
    executed(store.execute(req("t", "op", "newcomer", b"p"), |tx| {
        bump(tx, "newcomer")?;
        Ok(Response::new(201, "fine"))
    }));
    assert_eq!(effects(store, "newcomer"), 1);
}

fn is_corrupt(e: &Error) {
    assert!(
        matches!(e, Error::CorruptRecord { .. }),
        "expected CorruptRecord, got {e:?}"
    );
}

#[test]
fn a_garbage_record_is_corrupt_not_a_panic() {
    // Version 1, then bytes that never terminate a varint.
    let h = with_corrupt_victim(|_| {
        let mut v = vec![FORMAT_VERSION];
        v.extend_from_slice(&[0xff; 40]);
        v
    });
    assert_corrupt_key_is_contained(&h, is_corrupt);
}

#[test]
fn a_truncated_record_is_corrupt() {
    let h = with_corrupt_victim(|orig| orig[..orig.len() / 2].to_vec());
    assert_corrupt_key_is_contained(&h, is_corrupt);
}

#[test]
fn a_record_with_one_byte_cut_off_is_corrupt() {
    let h = with_corrupt_victim(|orig| orig[..orig.len() - 1].to_vec());
    assert_corrupt_key_is_contained(&h, is_corrupt);
}

#[test]
fn a_record_with_trailing_bytes_is_corrupt() {
    let h = with_corrupt_victim(|orig| {
        let mut v = orig.to_vec();
        v.push(0);
        v
    });
    assert_corrupt_key_is_contained(&h, is_corrupt);
}

#[test]
fn an_empty_record_value_is_corrupt() {
    let h = with_corrupt_victim(|_| Vec::new());
    assert_corrupt_key_is_contained(&h, is_corrupt);
}

#[test]
fn a_record_with_an_unknown_version_is_unsupported() {
    let h = with_corrupt_victim(|orig| {
        let mut v = orig.to_vec();
        v[0] = 9;
        v
    });
    assert_corrupt_key_is_contained(&h, |e| {
        assert!(
            matches!(
                e,
                Error::UnsupportedFormat {
                    found: 9,
                    supported
                } if *supported == idem::format::FORMAT_VERSION
            ),
            "expected UnsupportedFormat {{ found: 9 }}, got {e:?}"
        );
    });
}

#[test]
fn an_unknown_format_marker_refuses_to_open() {
    let mut h = Harness::new();
    h.close();
    {
        let db = idem::redb::Database::open(&h.path).expect("open redb");
        let w = db.begin_write().expect("write");
        w.open_table(META)
            .expect("meta")
            .insert("format", [9u8].as_slice())
            .expect("insert");
        w.commit().expect("commit");
    }
    let r = Store::builder().open(&h.path);
    assert!(
        matches!(r, Err(Error::UnsupportedFormat { found: 9, .. })),
        "{r:?}"
    );
}

#[test]
fn a_file_that_is_not_a_redb_database_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Deterministic pseudo-random bytes (xorshift64*), several sizes.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    for (i, size) in [1usize, 64, 4096, 65_536].into_iter().enumerate() {
        let bytes = random_bytes(&mut state, size);
        let path = dir.path().join(format!("not-a-store-{i}.redb"));
        std::fs::write(&path, &bytes).expect("write junk");
        let r = Store::open(&path);
        assert!(r.is_err(), "{size} random bytes opened as a store");
    }
    let text = dir.path().join("text.redb");
    std::fs::write(&text, "this is a text file, not a database\n").expect("write text");
    assert!(Store::open(&text).is_err());
}

/// Regression: this used to panic in `Duration::clamp(1 ms, cap)` (fixed in 7dc9c1a).
#[test]
fn a_retry_after_cap_below_one_millisecond_is_refused_or_harmless() {
    for cap in [Duration::ZERO, Duration::from_micros(500)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let opened = Store::builder()
            .clock(idem::clock::ManualClock::new(T0))
            .retry_after_cap(cap)
            .open(dir.path().join("idem.redb"));
        let store = match opened {
            Err(Error::Config { .. }) => continue, // refusing the setting is fine
            Err(e) => panic!("unexpected error for cap {cap:?}: {e}"),
            Ok(store) => store,
        };
        let _lease = acquired(store.begin(req("t", "op", "k", b"p")));
        // Must answer InFlight, not panic.
        let retry_after = begin_in_flight(store.begin(req("t", "op", "k", b"p")));
        assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_millis(1));
    }
}

#[test]
fn opening_a_directory_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(Store::open(dir.path()).is_err());
}

/// A file already open (here by a store of this same process) is a typed error naming the
/// path and what to do, for every open; the file and the first store are untouched.
/// An open that fails on the file system (a missing directory, a missing file for the opens
/// that never create one) is a storage error of that I/O kind whose message names the path
/// and what to check.
#[test]
fn an_open_that_fails_on_the_file_system_names_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let in_missing_dir = dir.path().join("no-such-dir").join("idem.redb");
    let missing = dir.path().join("missing.redb");
    let opens: [(&str, &std::path::Path, Result<(), Error>); 3] = [
        (
            "open",
            &in_missing_dir,
            Store::open(&in_missing_dir).map(drop),
        ),
        (
            "open_existing",
            &missing,
            Store::builder().open_existing(&missing).map(drop),
        ),
        (
            "open_read_only",
            &missing,
            Store::builder().open_read_only(&missing).map(drop),
        ),
    ];
    for (what, path, r) in opens {
        let e = r.expect_err(what);
        let msg = e.to_string();
        assert!(matches!(e, Error::Storage { .. }), "{what}: {e:?}");
        assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
        assert!(msg.contains("directory exists"), "{what}: {msg}");
        let Error::Storage { source } = &e else {
            unreachable!()
        };
        let kind = match source.downcast_ref::<idem::redb::Error>() {
            Some(idem::redb::Error::Io(io)) => io.kind(),
            other => panic!("{what}: {other:?}"),
        };
        assert_eq!(kind, std::io::ErrorKind::NotFound, "{what}");
    }
    assert!(!missing.exists() && !in_missing_dir.exists());
}

#[test]
fn opening_a_file_that_is_already_open_is_a_typed_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    let first = Store::open(&path).expect("open");
    let opens: [(&str, Result<(), idem::Error>); 3] = [
        ("open", Store::open(&path).map(drop)),
        (
            "open_existing",
            Store::builder().open_existing(&path).map(drop),
        ),
        (
            "open_read_only",
            Store::builder().open_read_only(&path).map(drop),
        ),
    ];
    for (what, r) in opens {
        match r {
            Err(e @ idem::Error::AlreadyOpen { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
                assert!(msg.contains("multi_process"), "{what}: {msg}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(path.exists(), "the refused opens left the file alone");
    drop(first);
    Store::open(&path).expect("opens once the first store is dropped");
}

#[test]
fn purge_frees_a_corrupt_key_so_the_intent_can_run_again() {
    let h = with_corrupt_victim(|_| vec![FORMAT_VERSION, 0xff, 0xff]);
    let store = h.store();
    assert!(
        store
            .purge(&Scope::new("t", "op"), "victim")
            .expect("purge")
    );
    assert!(
        !store
            .purge(&Scope::new("t", "op"), "victim")
            .expect("purge again")
    );
    executed(store.execute(req("t", "op", "victim", b"p"), |tx| {
        bump(tx, "victim")?;
        Ok(Response::new(201, "again"))
    }));
    assert_eq!(effects(store, "victim"), 1);
    // The bystander was not touched.
    let r = replayed(store.execute(req("t", "op", "bystander", b"p"), |_| {
        Ok(Response::new(500, "must not run"))
    }));
    assert_eq!(r.body(), b"bystander created");
}

#[test]
fn a_damaged_metadata_marker_is_a_typed_error_at_open() {
    let mut h = Harness::new();
    h.close();
    {
        let db = idem::redb::Database::open(&h.path).expect("open raw");
        let txn = db.begin_write().expect("write");
        txn.open_table(META)
            .expect("meta")
            .insert("format", [1u8, 2, 3].as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }
    let err = Store::open(&h.path).expect_err("damaged marker");
    assert!(matches!(err, Error::CorruptStore { .. }), "got {err:?}");
    {
        let db = idem::redb::Database::open(&h.path).expect("open raw");
        let txn = db.begin_write().expect("write");
        txn.open_table(META)
            .expect("meta")
            .insert("format", [9u8].as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }
    let err = Store::open(&h.path).expect_err("newer format");
    assert!(
        matches!(err, Error::UnsupportedFormat { found: 9, .. }),
        "got {err:?}"
    );
}
