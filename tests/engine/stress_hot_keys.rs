//! Real-thread stress: 8 threads × 10,000 flow-A requests over 100 hot keys,
//! through the group-commit path (`Store::execute` with a caller write via `bump`), on a real
//! file with the default `Durability::Immediate`. Every answer is `Ran` or `Replayed`
//! with the key's body, exactly one answer per key is `Ran`, and there is exactly one
//! effect per key.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use common::*;
use idem::{ExecuteAnswer, Response};

const THREADS: usize = 8;
const REQUESTS: usize = 10_000;
const KEYS: usize = 100;

#[test]
fn eight_threads_on_one_hundred_hot_keys_one_effect_each() {
    let h = Harness::new();
    let store = h.store();
    let executed = AtomicU64::new(0);
    let started = std::time::Instant::now();
    thread::scope(|s| {
        for t in 0..THREADS {
            let executed = &executed;
            s.spawn(move || {
                for i in 0..REQUESTS {
                    // Each thread walks the keys in its own order, so threads collide on the
                    // same key at the same time as often as possible.
                    let key = format!("k{}", (i * (2 * t + 1) + t) % KEYS);
                    let outcome = store
                        .execute(req("t", "op", &key, b"p"), |tx| {
                            bump(tx, &key)?;
                            Ok(Response::new(201, key.clone()))
                        })
                        .unwrap_or_else(|e| panic!("thread {t}, request {i}, {key}: {e:?}"));
                    let response = match &outcome {
                        ExecuteAnswer::Ran(r) => {
                            executed.fetch_add(1, Ordering::Relaxed);
                            r
                        }
                        ExecuteAnswer::Replayed(r) => r,
                        other => panic!("thread {t}, request {i}, {key}: {other:?}"),
                    };
                    assert_eq!(response.status(), 201);
                    assert_eq!(response.body(), key.as_bytes(), "{key}: a different body");
                }
            });
        }
    });
    eprintln!(
        "stress: {} requests in {:?}, {} commits",
        THREADS * REQUESTS,
        started.elapsed(),
        store.metrics().commits
    );
    assert_eq!(
        executed.load(Ordering::Relaxed),
        KEYS as u64,
        "one execution per key"
    );
    let all = all_effects(store);
    assert_eq!(all.len(), KEYS);
    for (key, n) in all {
        assert_eq!(n, 1, "{key}: {n} effects");
    }
    store.check_expiry_index().expect("expiry index");
}
