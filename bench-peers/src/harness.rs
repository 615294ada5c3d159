//! The measurement loop: `callers` threads claim fresh random keys for a fixed time, each claim's
//! latency recorded; the key generator; the store directories' sizes.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::rows::Row;

/// The length of every claim's key, in bytes (ASCII, so idem can take it as its `&str` key).
pub const KEY_LEN: usize = 16;
/// The key alphabet: 64 symbols, 6 random bits per byte, 96 random bits per key.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// A xorshift64* generator of fresh 16-byte keys (96 random bits: a collision with the store's
/// million records or the run's other keys is about 2^-56 likely, and every row asserts that its
/// key was absent).
pub struct Keys(u64);

impl Keys {
    /// A generator seeded from `seed` and the clock, so no two runs claim the same keys.
    pub fn new(seed: u64) -> Self {
        let clock = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ clock ^ 0xD1B5_4A32_D192_ED03;
        if state == 0 {
            state = 1;
        }
        let mut keys = Keys(state);
        // Mix the seed in before the first key.
        for _ in 0..4 {
            keys.next_u64();
        }
        keys
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next key.
    pub fn next_key(&mut self) -> [u8; KEY_LEN] {
        let mut key = [0u8; KEY_LEN];
        let (a, b) = (self.next_u64(), self.next_u64());
        for (i, byte) in key.iter_mut().enumerate() {
            let bits = if i < 8 {
                a >> (i * 6)
            } else {
                b >> ((i - 8) * 6)
            };
            *byte = ALPHABET[(bits & 63) as usize];
        }
        key
    }
}

/// One row's measurement at one caller count: the claims, the wall time, every claim's latency.
pub struct Sample {
    /// Claims acknowledged in the window.
    pub claims: u64,
    /// The window's length (from the start signal to the last caller's return).
    pub elapsed: Duration,
    /// Each claim's latency in ns.
    pub latencies_ns: Vec<u64>,
    /// CPU time the process used in the window (user + system, all threads).
    pub cpu: Duration,
    /// The share of the machine's CPU time that was busy in the window (any process, and the
    /// kernel's own threads: 1.0 is every core busy).
    pub machine_busy: f64,
    /// Bytes written to the stores' block device in the window (its sectors written, from
    /// `/proc/diskstats`): what reached the disk, background threads' flushes and compactions
    /// included, whoever wrote them (the machine should be otherwise idle). Page-cache writes
    /// reach it when they are synced or written back, so a store's deferred work counts in the
    /// window that pays for it.
    pub written: u64,
}

/// The block device holding `path`: its (major, minor) numbers, from the path's `st_dev`.
pub fn device_of(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(path).ok()?.dev();
    // glibc's gnu_dev_major / gnu_dev_minor.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    Some((major, minor))
}

/// Bytes written to `device` since boot (`/proc/diskstats`' sectors written, 512 bytes each);
/// zero where it cannot be read.
fn device_written(device: Option<(u64, u64)>) -> u64 {
    let (Some((major, minor)), Ok(stats)) = (device, fs::read_to_string("/proc/diskstats")) else {
        return 0;
    };
    stats
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| {
            f.first().and_then(|v| v.parse().ok()) == Some(major)
                && f.get(1).and_then(|v| v.parse().ok()) == Some(minor)
        })
        // Fields: major, minor, name, then reads (4), then writes: completed, merged, sectors.
        .and_then(|f| f.get(9).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |sectors| sectors * 512)
}

/// The process's CPU time so far (user + system), from `/proc/self/stat` (Linux, in ticks of
/// 1/100 s: `USER_HZ` is 100 on every architecture Linux supports); zero where it cannot be read.
fn process_cpu() -> Duration {
    let Ok(stat) = fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime) are the 12th and 13th after the name.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The machine's (busy, total) CPU ticks so far, from the first line of `/proc/stat`: busy is
/// everything but idle and iowait.
fn machine_ticks() -> (u64, u64) {
    let Ok(stat) = fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// `callers` threads each loop `row.claim` on fresh keys for `secs`, recording each latency;
/// `device` is the stores' block device ([`device_of`]).
pub fn measure(
    row: &dyn Row,
    callers: usize,
    secs: f64,
    seed: u64,
    device: Option<(u64, u64)>,
) -> Sample {
    let stop = AtomicBool::new(false);
    let window = Duration::from_secs_f64(secs);
    let (cpu0, (busy0, total0)) = (process_cpu(), machine_ticks());
    let written0 = device_written(device);
    let start = Instant::now();
    let per_thread: Vec<Vec<u64>> = thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|c| {
                let stop = &stop;
                s.spawn(move || {
                    let mut keys = Keys::new(seed ^ ((c as u64 + 1) << 32));
                    let mut lat = Vec::with_capacity(4096);
                    while !stop.load(Ordering::Relaxed) {
                        let key = keys.next_key();
                        let t = Instant::now();
                        row.claim(&key);
                        lat.push(t.elapsed().as_nanos() as u64);
                    }
                    lat
                })
            })
            .collect();
        thread::sleep(window);
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().expect("caller thread"))
            .collect()
    });
    let elapsed = start.elapsed();
    let (cpu1, (busy1, total1)) = (process_cpu(), machine_ticks());
    let written1 = device_written(device);
    let latencies_ns: Vec<u64> = per_thread.into_iter().flatten().collect();
    Sample {
        claims: latencies_ns.len() as u64,
        elapsed,
        latencies_ns,
        cpu: cpu1.saturating_sub(cpu0),
        machine_busy: (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64,
        written: written1.saturating_sub(written0),
    }
}

/// The sizes of the files under `dir`, recursively: (apparent bytes, allocated bytes).
pub fn dir_size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    let Ok(entries) = fs::read_dir(dir) else {
        return total;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            let (a, b) = dir_size(&entry.path());
            total.0 += a;
            total.1 += b;
        } else {
            total.0 += meta.len();
            total.1 += meta.blocks() * 512;
        }
    }
    total
}

/// A marker in an strace log: one `getppid` call, which nothing else in this process makes, so
/// a trace of `fsync,fdatasync,getppid` tells each measured window's syncs from the pre-fill's
/// (README.md, "Syncs per claim").
pub fn strace_mark() {
    let _ = std::os::unix::process::parent_id();
}
