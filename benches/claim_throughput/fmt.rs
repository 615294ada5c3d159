//! How the summary prints numbers.

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

pub fn fmt_bytes(b: f64) -> String {
    if b < 10_000.0 {
        format!("{b:.0}")
    } else {
        format!("{:.1}K", b / 1024.0)
    }
}

pub fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() => format!("{r:.2}×"),
        _ => "-".into(),
    }
}

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
