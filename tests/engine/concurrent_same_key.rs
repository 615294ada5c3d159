//! Eight threads race on one (scope, key, payload): exactly one of them causes the effect, and
//! every other one gets the same answer (or is told the key is in flight).

use crate::common;

use std::sync::Barrier;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;

use common::*;
use idem::{BeginAnswer, Error, ExecuteAnswer, Response};

const THREADS: usize = 8;
const ROUNDS: usize = 20;

fn body_for(round: usize) -> Vec<u8> {
    format!("{{\"round\":{round}}}").into_bytes()
}

#[test]
fn racing_execute_runs_the_effect_exactly_once() {
    let h = Harness::new();
    let store = h.store();
    for round in 0..ROUNDS {
        let key = format!("key-{round}");
        let label = format!("effect-{round}");
        let runs = AtomicU32::new(0);
        let barrier = Barrier::new(THREADS);
        let outcomes: Vec<Result<ExecuteAnswer, Error>> = thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        store.execute(req("t1", "create", &key, b"same payload"), |tx| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            bump(tx, &label)?;
                            Ok(Response::new(201, body_for(round)).with_resource("order", &key))
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread panicked"))
                .collect()
        });

        let mut executed_count = 0;
        let mut replayed_count = 0;
        for outcome in &outcomes {
            match outcome {
                Ok(ExecuteAnswer::Ran(r)) => {
                    executed_count += 1;
                    assert_eq!(r.body(), body_for(round).as_slice());
                }
                Ok(ExecuteAnswer::Replayed(r)) => {
                    replayed_count += 1;
                    assert_eq!(r.body(), body_for(round).as_slice());
                    assert_eq!(r.status(), 201);
                }
                // Flow A never leaves a Pending record behind, so nobody can be in flight.
                other => panic!("round {round}: unexpected outcome {other:?}"),
            }
        }
        assert_eq!(executed_count, 1, "round {round}: exactly one Ran");
        assert_eq!(
            replayed_count,
            THREADS - 1,
            "round {round}: all others replay"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "round {round}: closure ran once"
        );
        assert_eq!(
            effects(store, &label),
            1,
            "round {round}: exactly one effect"
        );
    }
}

#[test]
fn racing_begin_grants_exactly_one_lease() {
    let h = Harness::new();
    let store = h.store();
    for round in 0..ROUNDS {
        let key = format!("key-{round}");
        let external_calls = AtomicU32::new(0);
        let barrier = Barrier::new(THREADS);
        // Odd rounds: the winner completes inside its thread, so losers may already see the
        // result. Even rounds: the winner keeps the lease until everyone has answered.
        let complete_in_thread = round % 2 == 1;
        let answers: Vec<Result<BeginAnswer, Error>> = thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let answer = store.begin(req("t1", "charge", &key, b"amount=100"));
                        match answer {
                            Ok(BeginAnswer::Acquired(lease)) if complete_in_thread => {
                                external_calls.fetch_add(1, Ordering::SeqCst);
                                let stored = lease
                                    .complete(Response::new(200, body_for(round)))
                                    .expect("winner completes");
                                // Report the win as a replay of our own stored answer, but
                                // count it separately through `external_calls`.
                                Ok(BeginAnswer::Replayed(stored))
                            }
                            Ok(BeginAnswer::Acquired(lease)) => {
                                external_calls.fetch_add(1, Ordering::SeqCst);
                                Ok(BeginAnswer::Acquired(lease))
                            }
                            other => other,
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread panicked"))
                .collect()
        });

        assert_eq!(
            external_calls.load(Ordering::SeqCst),
            1,
            "round {round}: exactly one attempt acquired the lease"
        );
        let mut winner = None;
        for answer in answers {
            match answer {
                Ok(BeginAnswer::Acquired(lease)) => {
                    assert!(winner.is_none(), "round {round}: two leases granted");
                    assert_eq!(lease.attempt(), 1);
                    winner = Some(lease);
                }
                Ok(BeginAnswer::InFlight { retry_after }) => {
                    assert!(!retry_after.is_zero());
                }
                Ok(BeginAnswer::Replayed(r)) => {
                    assert!(
                        complete_in_thread,
                        "round {round}: nobody completed, yet a replay"
                    );
                    assert_eq!(r.body(), body_for(round).as_slice());
                }
                Ok(BeginAnswer::Expired(t)) => panic!("round {round}: no time passed, yet {t:?}"),
                Err(e) => panic!("round {round}: begin failed: {e}"),
            }
        }
        if let Some(lease) = winner {
            assert!(!complete_in_thread);
            lease
                .complete(Response::new(200, body_for(round)))
                .expect("winner completes");
        }

        // After the winner completed, every later begin replays the same answer.
        let barrier = Barrier::new(THREADS);
        thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    barrier.wait();
                    let r = begin_replayed(store.begin(req("t1", "charge", &key, b"amount=100")));
                    assert_eq!(r.status(), 200);
                    assert_eq!(r.body(), body_for(round).as_slice());
                });
            }
        });
    }
}

#[test]
fn execute_and_begin_racing_on_one_key_have_one_winner() {
    let h = Harness::new();
    let store = h.store();
    for round in 0..ROUNDS {
        let key = format!("key-{round}");
        let label = format!("mixed-{round}");
        let wins = AtomicU32::new(0);
        let barrier = Barrier::new(THREADS);
        thread::scope(|s| {
            for i in 0..THREADS {
                let (key, label, wins, barrier) = (&key, &label, &wins, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let request = req("t1", "pay", key, b"same");
                    if i % 2 == 0 {
                        let outcome = store.execute(request, |tx| {
                            bump(tx, label)?;
                            Ok(Response::new(201, body_for(round)))
                        });
                        match outcome {
                            Ok(ExecuteAnswer::Ran(_)) => {
                                wins.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(ExecuteAnswer::Replayed(r)) => {
                                assert_eq!(r.body(), body_for(round).as_slice())
                            }
                            Ok(ExecuteAnswer::InFlight { .. }) => {}
                            Ok(ExecuteAnswer::Expired(t)) => panic!("no time passed, yet {t:?}"),
                            Err(e) => panic!("execute failed: {e}"),
                        }
                    } else {
                        match store.begin(request) {
                            Ok(BeginAnswer::Acquired(lease)) => {
                                wins.fetch_add(1, Ordering::SeqCst);
                                lease
                                    .complete_with(|tx| {
                                        bump(tx, label)?;
                                        Ok(Response::new(201, body_for(round)))
                                    })
                                    .expect("complete");
                            }
                            Ok(BeginAnswer::Replayed(r)) => {
                                assert_eq!(r.body(), body_for(round).as_slice())
                            }
                            Ok(BeginAnswer::InFlight { .. }) => {}
                            Ok(BeginAnswer::Expired(t)) => panic!("no time passed, yet {t:?}"),
                            Err(e) => panic!("begin failed: {e}"),
                        }
                    }
                });
            }
        });
        assert_eq!(wins.load(Ordering::SeqCst), 1, "round {round}: one winner");
        assert_eq!(effects(store, &label), 1, "round {round}: one effect");
        let r = replayed(store.execute(req("t1", "pay", &key, b"same"), |_| {
            Ok(Response::new(500, "must not run"))
        }));
        assert_eq!(r.body(), body_for(round).as_slice());
    }
}
