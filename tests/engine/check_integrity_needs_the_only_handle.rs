//! `Store::check_integrity` runs redb's full check and idem's index check on a healthy file,
//! and, like compaction, refuses while another handle is alive.

use crate::common;

use common::*;
use idem::{Error, Response};

#[test]
fn a_healthy_file_passes_and_other_handles_are_refused() {
    let mut h = Harness::new();
    for i in 0..20 {
        executed(
            h.store()
                .execute(req("t", "op", &format!("k{i}"), b"p"), |tx| {
                    bump(tx, "x")?;
                    Ok(Response::new(201, "ok"))
                }),
        );
    }
    let mut store = h.store().clone();
    let err = store
        .check_integrity()
        .expect_err("the harness still holds a handle");
    assert!(matches!(err, Error::InUse { .. }), "{err:?}");
    h.close();
    assert!(
        store.check_integrity().expect("check"),
        "a healthy file passes"
    );
    // The store keeps working after the check.
    executed(store.execute(req("t", "op", "after", b"p"), |_| {
        Ok(Response::new(201, "ok"))
    }));
}
