//! How the summary prints numbers.

/// A latency in ns with a unit that keeps it short (`850ns`, `420µs`, `6.55ms`, `1.20s`).
pub fn fmt_ns(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us < 1.0 {
        format!("{ns}ns")
    } else if us < 1000.0 {
        format!("{us:.0}µs")
    } else if us < 10_000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else if us < 1_000_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// Bytes: whole below 10,000, else KiB with one decimal (`12.3K`).
pub fn fmt_bytes(b: f64) -> String {
    if b < 10_000.0 {
        format!("{b:.0}")
    } else {
        format!("{:.1}K", b / 1024.0)
    }
}

/// A ratio as `1.23×`, or `-` when there is none.
pub fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() => format!("{r:.2}×"),
        _ => "-".into(),
    }
}

/// `1000000` as `1,000,000`.
pub fn with_commas(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}
