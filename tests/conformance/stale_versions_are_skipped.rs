//! Order-aware handling: a version high-water mark per entity, moved in the handler's own
//! transaction, applies only newer versions and counts the stale ones; a handler that rolls
//! back leaves the mark as it was.

use idem::Response;
use idem::inbox::ProcessAnswer;

use super::*;

/// Events for `sku-1` arrive as versions 2, 1, 2, 3 (each its own message): 2 and 3 apply,
/// 1 and the repeated 2 are stale (no effect), the mark is {3, 2 skipped}. A version-5 handler
/// that aborts rolls its advance back: version 4 then still applies.
pub fn stale_versions_are_skipped_and_a_rollback_keeps_the_mark<E: Engine>(e: &mut E) {
    assert_eq!(e.high_water_mark("sku-1").expect("mark"), None);
    let mut applied = Vec::new();
    for (i, version) in [2u64, 1, 2, 3].into_iter().enumerate() {
        let b = Behavior::answer(Response::new(200, "ok"))
            .version("sku-1", version)
            .effect("sku-1");
        assert!(matches!(
            e.process("stock", &format!("m-{i}"), &b),
            Ok(ProcessAnswer::Ran(_))
        ));
        applied.push(b.checked().expect("checked").should_apply());
    }
    assert_eq!(applied, [true, false, false, true]);
    assert_eq!(e.effects("sku-1"), 2, "stale events are not applied");
    let mark = e.high_water_mark("sku-1").expect("mark").expect("a mark");
    assert_eq!((mark.version, mark.skipped), (3, 2));

    let aborted = Behavior::retryable().version("sku-1", 5).effect("sku-1");
    assert!(e.process("stock", "m-5", &aborted).is_err());
    assert!(aborted.checked().expect("checked").should_apply());
    let mark = e.high_water_mark("sku-1").expect("mark").expect("a mark");
    assert_eq!(
        (mark.version, mark.skipped),
        (3, 2),
        "the aborted advance was rolled back"
    );
    let four = Behavior::answer(Response::new(200, "ok"))
        .version("sku-1", 4)
        .effect("sku-1");
    executed(e.execute(req("t", "restock", "r-4", b"v4"), &four));
    assert!(four.checked().expect("checked").should_apply());
    assert_eq!(
        e.high_water_mark("sku-1")
            .expect("mark")
            .expect("a mark")
            .version,
        4
    );
    assert_eq!(e.effects("sku-1"), 3);
}
