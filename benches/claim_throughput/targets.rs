//! The throughput and latency goals the issues set (benches/README.md, "Goals"), judged on the
//! pre-filled store and printed as `TARGETS` with a met / NOT met verdict.

use crate::bench::Bench;
use crate::fmt::with_commas;
use crate::rows::{Fill, Row, System, Work};

/// Prints every goal with its measured value and verdict (`not measured` for a row that did
/// not run).
pub fn print(b: &Bench) {
    let rate = |r: &Row| b.rate(r);
    let lat = |r: &Row, p: f64| b.latency(r, p);
    let fill = Fill::Prefilled;
    let at = |system, work, callers| Row {
        system,
        work,
        fill,
        callers,
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let idem = |c| at(System::Idem, Work::NewKeys, c);
    let idem_send = |c| at(System::IdemSend, Work::NewKeys, c);
    let naive = |c| at(System::Naive, Work::NewKeys, c);
    let group = |c| at(System::NaiveGroup, Work::NewKeys, c);
    let p50_ratio = |c| {
        ratio(
            lat(&idem(c), 0.5).map(|v| v as f64),
            lat(&naive(c), 0.5).map(|v| v as f64),
        )
    };
    struct Check {
        name: &'static str,
        value: Option<f64>,
        at_least: bool,
        target: f64,
        unit: &'static str,
    }
    let check = |name, value, at_least, target, unit| Check {
        name,
        value,
        at_least,
        target,
        unit,
    };
    let lat_ratio =
        |a: Row, b: Row, p: f64| ratio(lat(&a, p).map(|v| v as f64), lat(&b, p).map(|v| v as f64));
    let checks = [
        check(
            "64 callers, new keys: idem ÷ naive group-commit writer",
            ratio(rate(&idem(64)), rate(&group(64))),
            true,
            1.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem execute_on_writer ÷ group-commit writer",
            ratio(rate(&idem_send(64)), rate(&group(64))),
            true,
            1.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem p99 ÷ group-commit writer p99",
            lat_ratio(idem(64), group(64), 0.99),
            false,
            1.2,
            "×",
        ),
        check(
            "64 callers, new keys: idem execute_on_writer p99 ÷ writer p99",
            lat_ratio(idem_send(64), group(64), 0.99),
            false,
            1.2,
            "×",
        ),
        check(
            "64 callers, new keys: idem ÷ naive redb",
            ratio(rate(&idem(64)), rate(&naive(64))),
            true,
            6.0,
            "×",
        ),
        check(
            "8 callers, new keys: idem ÷ naive redb",
            ratio(rate(&idem(8)), rate(&naive(8))),
            true,
            3.0,
            "×",
        ),
        check(
            "1 caller, new keys: idem ÷ naive redb (throughput)",
            ratio(rate(&idem(1)), rate(&naive(1))),
            true,
            0.95,
            "×",
        ),
        check(
            "2 callers, new keys: idem p99 ÷ naive redb p99",
            lat_ratio(idem(2), naive(2), 0.99),
            false,
            1.0,
            "×",
        ),
        check(
            "2 callers, new keys: idem max ÷ naive redb max",
            lat_ratio(idem(2), naive(2), 1.0),
            false,
            1.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem ÷ SQLite (busy timeout)",
            ratio(
                rate(&idem(64)),
                rate(&at(System::Sqlite, Work::NewKeys, 64)),
            ),
            true,
            4.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem ÷ SQLite (writers behind a Mutex)",
            ratio(
                rate(&idem(64)),
                rate(&at(System::SqliteSerial, Work::NewKeys, 64)),
            ),
            true,
            4.0,
            "×",
        ),
        check(
            "64 callers, new keys: idem p99",
            lat(&idem(64), 0.99).map(|v| v as f64 / 1e6),
            false,
            10.0,
            " ms",
        ),
        check(
            "1 caller, new keys: idem p50 ÷ naive redb p50",
            p50_ratio(1),
            false,
            1.3,
            "×",
        ),
        check(
            "replays, 1 thread: idem ÷ SQLite prepared SELECT",
            ratio(
                rate(&at(System::Idem, Work::Replay, 1)),
                rate(&at(System::Sqlite, Work::Replay, 1)),
            ),
            true,
            1.3,
            "×",
        ),
    ];
    println!();
    println!(
        "TARGETS (from the issue), on the pre-filled {}-record store{}:",
        with_commas(b.cfg.prefill as u64),
        if b.cfg.prefill < 1_000_000 {
            " (the issue's store has 1,000,000 records: full mode judges)"
        } else {
            ""
        }
    );
    for c in checks {
        let (shown, verdict) = match c.value {
            Some(v) if v.is_finite() => (
                format!("{v:.2}{}", c.unit),
                if (c.at_least && v >= c.target) || (!c.at_least && v <= c.target) {
                    "met"
                } else {
                    "NOT met"
                },
            ),
            _ => ("?".into(), "not measured"),
        };
        let goal = format!(
            "{} {}{}",
            if c.at_least { "≥" } else { "≤" },
            c.target,
            c.unit
        );
        println!("  {:<62} {shown:>10}   target {goal:<8} {verdict}", c.name);
    }
}
