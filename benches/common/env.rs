//! The environment variables every bench reads the same way.

use std::path::PathBuf;

/// `name` parsed as `T` (surrounding whitespace ignored); `None` when unset or unparsable, so
/// the caller's default applies.
pub fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `IDEM_BENCH_QUICK` set to anything but empty or `0`: the bench's quick mode.
pub fn quick() -> bool {
    std::env::var("IDEM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Where a bench makes its temp dir: `IDEM_BENCH_DIR`, or the system temp dir. Every store of a
/// run lives under it, so the run measures that filesystem.
pub fn bench_parent() -> PathBuf {
    std::env::var_os("IDEM_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}
