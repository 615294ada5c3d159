//! `execute_typed` on both engines: the closure's serde value commits with its writes and every
//! retry gets the same value back decoded, without running the closure; a terminal rejection is
//! replayed as a rejection; a stored answer of another type is a typed error, never a wrong value.

use crate::common;

use std::cell::Cell;

use common::{Harness, req};
use idem::store::ExecuteTypedAnswer;
use idem::{Abort, Error, Response};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Reserved {
    sku: String,
    units: u32,
}

fn reserved() -> Reserved {
    Reserved {
        sku: "sku-1".into(),
        units: 2,
    }
}

#[test]
fn a_typed_answer_replays_decoded_on_the_file_store() {
    let h = Harness::new();
    let runs = Cell::new(0);
    let run = || {
        h.store()
            .execute_typed(req("shop", "reserve", "m1", b"p"), |_| {
                runs.set(runs.get() + 1);
                Ok(reserved())
            })
    };
    assert_eq!(run().unwrap(), ExecuteTypedAnswer::Ran(reserved()));
    assert_eq!(run().unwrap(), ExecuteTypedAnswer::Replayed(reserved()));
    assert_eq!(runs.get(), 1);
    let rejected = |replay| {
        let r = h
            .store()
            .execute_typed::<Reserved, _>(req("shop", "reserve", "m2", b"p"), |_| {
                Err(Abort::Terminal(Response::new(409, "out of stock")))
            });
        assert!(
            matches!(&r, Ok(ExecuteTypedAnswer::Rejected { replayed, response }) if *replayed == replay && response.status() == 409),
            "{r:?}"
        );
    };
    rejected(false);
    rejected(true);
    // The same key read as another type: the stored bytes do not decode as it.
    let other = h
        .store()
        .execute_typed::<Vec<String>, _>(req("shop", "reserve", "m1", b"p"), |_| Ok(vec![]));
    assert!(
        matches!(other, Err(Error::CorruptRecord { .. })),
        "{other:?}"
    );
}

#[cfg(feature = "postgres")]
#[test]
fn a_typed_answer_replays_decoded_on_postgres() {
    let Some(h) = common::pg::PgHarness::new("typed") else {
        return;
    };
    let runs = Cell::new(0);
    let run = || {
        h.store()
            .execute_typed(req("shop", "reserve", "m1", b"p"), |_| {
                runs.set(runs.get() + 1);
                Ok(reserved())
            })
    };
    assert_eq!(run().unwrap(), ExecuteTypedAnswer::Ran(reserved()));
    assert_eq!(run().unwrap(), ExecuteTypedAnswer::Replayed(reserved()));
    assert_eq!(runs.get(), 1);
}
