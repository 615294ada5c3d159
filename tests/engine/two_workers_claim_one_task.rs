//! The claim protocol for polling workers and agents is flow B: claim the task id with a fenced
//! lease, heartbeat, complete. Two workers polling the same task: one wins, the other sees
//! InFlight, and after completion sees the result.

use crate::common;

use std::time::Duration;

use common::{Harness, acquired, begin_in_flight, begin_replayed, req};
use idem::{BeginAnswer, Error, Response};

fn claim(h: &Harness) -> Result<BeginAnswer, Error> {
    h.store()
        .begin(req("worker-pool", "render-task", "task-42", b"spec"))
}

#[test]
fn one_worker_wins_and_the_other_sees_in_flight() {
    let h = Harness::with(|b| b.lease_duration(Duration::from_secs(30)));
    let mut lease = acquired(claim(&h));
    begin_in_flight(claim(&h));
    // The winner heartbeats through a long task; the other worker still sees it in flight.
    h.clock.advance(Duration::from_secs(20));
    lease.heartbeat().unwrap();
    h.clock.advance(Duration::from_secs(20));
    begin_in_flight(claim(&h));
    lease.complete(Response::new(200, "rendered")).unwrap();
    assert_eq!(begin_replayed(claim(&h)).body(), b"rendered");
}

#[test]
fn a_worker_that_stops_heartbeating_loses_the_task() {
    let h = Harness::with(|b| b.lease_duration(Duration::from_secs(30)));
    let mut stale = acquired(claim(&h));
    h.clock.advance(Duration::from_secs(31));
    let fresh = acquired(claim(&h));
    assert!(matches!(stale.heartbeat(), Err(Error::LeaseLost { .. })));
    fresh.complete(Response::new(200, "rendered")).unwrap();
}
