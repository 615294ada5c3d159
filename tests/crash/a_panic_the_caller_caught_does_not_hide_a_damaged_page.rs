//! A panic the caller caught inside its own code does not change what a later damaged page in
//! the same call is. The record walk's callback reads the store's clock, which panics once, and
//! catches that panic itself; when the walk then reaches a page redb panics on, the walk returns
//! `Error::CorruptStore`. (Before, a thread-local "the caller panicked" flag stayed set after
//! the caught panic, and redb's panic was resumed into the caller as if it were the caller's own:
//! 15 of these 60 damaged files panicked out of `Store::for_each_record`.)

use crate::damage;

use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use damage::{PAGE, build_store, damage};
use idem::clock::{Clock, ManualClock};
use idem::{Error, Store, Timestamp};

const RECORDS_N: usize = 800;
const SEEDS: u64 = 60;

/// The bytes of a cleanly closed store with `RECORDS_N` records (built once per test binary).
fn store_bytes() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        build_store(&dir.path().join("base.redb"), RECORDS_N)
    })
}

/// A clock that panics the next time it is read after being armed.
#[derive(Debug, Clone)]
struct PanicsOnceArmed {
    armed: Arc<AtomicBool>,
    clock: ManualClock,
}

impl Clock for PanicsOnceArmed {
    fn now(&self) -> Timestamp {
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("the clock failed once");
        }
        self.clock.now()
    }
}

/// What a walk gave: its result (`Err` if a panic came out of it), the records it visited, and
/// the store it walked.
type Walked = (std::thread::Result<Result<(), Error>>, usize, Store);

/// Walks every record of the store at `path` (`None`: it does not open); the callback of the
/// first record makes the clock panic and catches that panic itself.
fn walk_after_a_caught_clock_panic(path: &Path) -> Option<Walked> {
    let armed = Arc::new(AtomicBool::new(false));
    let clock = PanicsOnceArmed {
        armed: armed.clone(),
        clock: ManualClock::new(damage::BUILT_AT),
    };
    // Without the open-time check of every page, so the walk meets the damaged page itself
    // (it only reads: no commit, where an unchecked damaged file can abort the process).
    let store = Store::builder()
        .clock(clock)
        .verify_on_open(false)
        .open(path)
        .ok()?;
    let mut visited = 0;
    let walk = catch_unwind(AssertUnwindSafe(|| {
        store.for_each_record(|_, _| {
            if visited == 0 {
                armed.store(true, Ordering::SeqCst);
                let clock_panic = catch_unwind(AssertUnwindSafe(|| store.now()))
                    .expect_err("the armed clock panics");
                assert_eq!(
                    clock_panic.downcast_ref::<&str>(),
                    Some(&"the clock failed once"),
                    "the caller catches its own payload"
                );
            }
            visited += 1;
            ControlFlow::Continue(())
        })
    }));
    Some((walk, visited, store))
}

#[test]
fn a_damaged_page_after_a_panic_the_caller_caught_is_corrupt_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");

    // Undamaged: the caught panic changes nothing, every record is visited.
    std::fs::write(&path, store_bytes()).expect("write");
    let (walk, visited, _) = walk_after_a_caught_clock_panic(&path).expect("opens");
    assert!(matches!(walk, Ok(Ok(()))), "{walk:?}");
    assert_eq!(visited, RECORDS_N);

    let mut corrupt_after_a_caught_panic = Vec::new();
    for seed in 0..SEEDS {
        let (damaged, at) = damage(store_bytes(), seed);
        std::fs::write(&path, &damaged).expect("write");
        let ctx = format!("seed {seed} (8 bytes at {at}, page {})", at / PAGE);
        let Some((walk, visited, store)) = walk_after_a_caught_clock_panic(&path) else {
            continue;
        };
        let walk = walk.unwrap_or_else(|_| panic!("{ctx}: a panic came out of the walk"));
        if visited > 0 && matches!(walk, Err(Error::CorruptStore { .. })) {
            corrupt_after_a_caught_panic.push(seed);
        }
        // A read changes nothing: no fail-stop.
        assert_eq!(store.fail_stop_cause(), None, "{ctx}");
    }
    // The case this test is about happened (15 seeds with this damage helper).
    assert!(
        !corrupt_after_a_caught_panic.is_empty(),
        "no walk reached a damaged page after its callback ran"
    );
}
