//! Retention: the instants a finish stores and the exact boundaries they give (replay, expired,
//! free), what a sweep does to each state and what stats count, and purge.

use idem::format::State;
use idem::{Response, Scope};

use super::*;
use crate::common::T0;

/// A record finished at T0 stores `expires_at = T0 + retention` and `forget_at = T0 +
/// horizon`; at `expires_at - 1ms` it replays, at `expires_at` it is `Expired` (on both flows,
/// nothing runs), at `forget_at - 1ms` still `Expired`, at `forget_at` the key is claimed again
/// — all from the stored instants, without a sweep.
pub fn retention_boundaries_are_exact<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "create_order");
    let request = req("t1", "create_order", "b-1", b"qty=2");
    let create = Behavior::answer(Response::new(201, "created").with_resource("order", "o1"))
        .effect("orders");
    let first = executed(e.execute(request.clone(), &create));
    let record = e.get(&scope, "b-1").expect("get").expect("record");
    assert_eq!(record.created_at, T0);
    assert_eq!(record.expires_at, T0.saturating_add(RETENTION));
    assert_eq!(record.forget_at, T0.saturating_add(HORIZON));
    assert!(matches!(record.state, State::Completed(_)));

    e.set_time(idem::Timestamp(record.expires_at.0 - 1));
    assert_eq!(replayed(e.execute(request.clone(), &create)), first);
    assert_eq!(begin_replayed(e.begin(request.clone())), first);

    e.set_time(record.expires_at);
    let t = expired(e.execute(request.clone(), &create));
    assert_eq!(
        (t.status(), t.resource().map(|r| r.id.as_str())),
        (201, Some("o1"))
    );
    assert_eq!(begin_expired(e.begin(request.clone())), t);

    e.set_time(idem::Timestamp(record.forget_at.0 - 1));
    assert_eq!(expired(e.execute(request.clone(), &create)), t);
    assert_eq!(create.runs(), 1, "nothing ran before forget_at");
    assert_eq!(
        e.get(&scope, "b-1").expect("get"),
        Some(record.clone()),
        "no answer wrote anything"
    );

    e.set_time(record.forget_at);
    executed(e.execute(request, &create));
    assert_eq!(
        (create.runs(), e.effects("orders")),
        (2, 2),
        "at forget_at the key is free"
    );
    let again = e.get(&scope, "b-1").expect("get").expect("record");
    assert_eq!(again.created_at, record.forget_at, "a new intent");
}

/// Stats count records by state (pending, completed, failed, tombstones) and those due; a
/// sweep past the retention shrinks finished records to tombstones and deletes the lapsed
/// Pending one (it has no tombstone tier); past the horizon it deletes the tombstones; an idle
/// pass sweeps nothing.
pub fn sweep_shrinks_then_deletes_and_stats_count_states<E: Engine>(e: &mut E) {
    executed(e.execute(
        req("t", "op", "done", b"p"),
        &Behavior::answer(Response::new(200, "ok")),
    ));
    executed(e.execute(
        req("t", "op", "failed", b"p"),
        &Behavior::terminal(Response::new(402, "declined")),
    ));
    let lease = acquired(e.begin(req("t", "op", "pending", b"p")));
    let stats = e.stats().expect("stats");
    assert_eq!(
        (
            stats.records,
            stats.pending,
            stats.completed,
            stats.failed,
            stats.tombstones,
            stats.due
        ),
        (3, 1, 1, 1, 0, 0),
        "{stats:?}"
    );
    assert_eq!(e.sweep().expect("sweep").swept(), 0, "nothing is due yet");

    e.advance(RETENTION);
    assert_eq!(e.stats().expect("stats").due, 3);
    let report = e.sweep().expect("sweep");
    assert_eq!((report.tombstoned, report.deleted), (2, 1), "{report:?}");
    let stats = e.stats().expect("stats");
    assert_eq!(
        (
            stats.records,
            stats.pending,
            stats.completed,
            stats.failed,
            stats.tombstones,
            stats.due
        ),
        (2, 0, 0, 0, 2, 0),
        "{stats:?}"
    );
    let failed = e
        .get(&Scope::new("t", "op"), "failed")
        .expect("get")
        .expect("tombstone");
    match failed.state {
        State::Tombstone(t) => assert!(t.is_failure() && t.status() == 402),
        other => panic!("expected a tombstone, got {other:?}"),
    }
    assert_eq!(e.get(&Scope::new("t", "op"), "pending").expect("get"), None);
    lease_lost(lease.complete(Response::new(200, "too late")));
    assert_eq!(e.sweep().expect("sweep").swept(), 0, "an idle pass");

    e.advance(HORIZON - RETENTION);
    assert_eq!(e.stats().expect("stats").due, 2);
    let report = e.sweep().expect("sweep");
    assert_eq!((report.tombstoned, report.deleted), (0, 2), "{report:?}");
    assert_eq!(e.stats().expect("stats").records, 0);
}

/// Purge removes a record whatever its state: a retry of the finished intent runs again (a
/// second effect, by the operator's choice), purging a missing key answers false, and a purged
/// live lease is fenced out.
pub fn purge_frees_the_key_and_fences_its_lease<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "create_order");
    let create = Behavior::answer(Response::new(201, "created")).effect("orders");
    executed(e.execute(req("t1", "create_order", "p-1", b"qty=2"), &create));
    assert!(e.purge(&scope, "p-1").expect("purge"));
    assert_eq!(e.get(&scope, "p-1").expect("get"), None);
    assert!(!e.purge(&scope, "p-1").expect("purge again"));
    executed(e.execute(req("t1", "create_order", "p-1", b"qty=2"), &create));
    assert_eq!((create.runs(), e.effects("orders")), (2, 2));

    let lease = acquired(e.begin(req("t1", "charge", "p-2", b"amount=1")));
    assert!(
        e.purge(&Scope::new("t1", "charge"), "p-2")
            .expect("purge a lease")
    );
    lease_lost(lease.complete(Response::new(200, "after purge")));
    assert_eq!(
        e.get(&Scope::new("t1", "charge"), "p-2").expect("get"),
        None
    );
    let again = acquired(e.begin(req("t1", "charge", "p-2", b"amount=1")));
    assert_eq!(again.attempt(), 1);
    again.release().expect("release");
}

/// A lease kept alive by heartbeats past the retention is never swept: its record's instants
/// follow the deadline, a sweep leaves it, and it completes.
pub fn sweep_spares_a_live_lease<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "export");
    let mut lease = acquired(e.begin(req("t1", "export", "long", b"p")));
    e.advance(RETENTION - LEASE / 3);
    let deadline = lease.heartbeat().expect("heartbeat");
    e.advance(LEASE / 2);
    assert!(e.now() > T0.saturating_add(RETENTION) && e.now() < deadline);
    let record = e.get(&scope, "long").expect("get").expect("record");
    assert!(record.forget_at >= deadline, "{record:?}");
    assert_eq!(e.stats().expect("stats").due, 0);
    assert_eq!(
        e.sweep().expect("sweep").swept(),
        0,
        "a live lease is not swept"
    );
    assert_eq!(e.get(&scope, "long").expect("get"), Some(record));
    let done = lease
        .complete(Response::new(200, "exported"))
        .expect("complete");
    assert_eq!(
        begin_replayed(e.begin(req("t1", "export", "long", b"p"))),
        done
    );
}
