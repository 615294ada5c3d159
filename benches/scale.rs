//! The file store as it grows: for stores of 100,000 and 1,000,000 records (and 10,000,000 with
//! `IDEM_SCALE_10M=1`), claims/s with 1 and 64 callers, replay lookups/s, p99, bytes on disk per
//! record, the process's RSS after a mixed load (the default builder: journal mode), and, in
//! direct mode (`journal(false)`, where quick-repair applies), the reopen after a SIGKILL — its
//! time and the RSS it leaves before the first request — with and without quick-repair, whose
//! cost in claims/s at 1, 8 and 64 callers it also measures on each store (two copies side by
//! side, interleaved rep by rep, medians of 3). The RSS after mixed load is taken with the default
//! 64 MiB page cache and with redb's own 1 GiB default. `Durability::Periodic(10 ms)` next to the
//! default and to the same store on tmpfs (`/dev/shm`: no disk, the CPU ceiling) at 1, 8 and 64
//! callers.
//!
//! ```text
//! cargo bench -p idem-benches --bench scale                       # 100k and 1M records
//! IDEM_SCALE_10M=1 cargo bench -p idem-benches --bench scale      # and 10M (tens of minutes, ~5 GB of disk)
//! IDEM_BENCH_QUICK=1 cargo bench -p idem-benches --bench scale    # 100k only, short runs
//! IDEM_SCALE_SIZES=1000000 IDEM_SCALE_CACHES=16,64,128,256,1024 cargo bench -p idem-benches --bench scale
//!                                                                 # only 1M, and a table of page cache sizes
//! ```
//!
//! Each measurement that needs a fresh process (RSS, a reopen after SIGKILL) re-executes this
//! binary as a child. `IDEM_BENCH_DIR` chooses the filesystem (default the system temp dir).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use bench_common::workload::{request, response};
use bench_common::{
    bench_parent, copy_synced, env_parse, git_commit, median, percentile, quick, rss_mib,
};
use idem::{Durability, ExecuteAnswer, Store, StoreBuilder};

fn claim(store: &Store, key: &str) {
    let outcome = store
        .execute(request(key), |_| Ok(response()))
        .expect("claim");
    assert!(matches!(outcome, ExecuteAnswer::Ran(_)), "{key}");
}

fn replay(store: &Store, key: &str) {
    let outcome = store
        .execute(request(key), |_| panic!("a replay runs nothing"))
        .expect("replay");
    assert!(matches!(outcome, ExecuteAnswer::Replayed(_)), "{key}");
}

fn existing(i: u64) -> String {
    format!("pre-{i:010}")
}

/// Fills `path` with `n` records through the public API (64 threads, relaxed durability, one
/// flush at the end), and returns how long it took.
fn build(path: &Path, n: u64) -> Duration {
    let started = Instant::now();
    let store = Store::builder()
        .durability(Durability::Periodic(Duration::from_millis(200)))
        .open(path)
        .expect("open for the fill");
    let threads = 64u64;
    thread::scope(|s| {
        for t in 0..threads {
            let store = &store;
            s.spawn(move || {
                let mut i = t;
                while i < n {
                    claim(store, &existing(i));
                    i += threads;
                }
            });
        }
    });
    drop(store); // flushes
    started.elapsed()
}

/// Calls per second and the p99 of `callers` threads doing `op(caller, i)` for ~`secs`.
fn rate(callers: usize, secs: f64, op: impl Fn(usize, u64) + Sync) -> (f64, Duration) {
    let barrier = Barrier::new(callers);
    let limit = Duration::from_secs_f64(secs);
    let (n, elapsed, mut lat) = thread::scope(|s| {
        let hs: Vec<_> = (0..callers)
            .map(|c| {
                let (barrier, op) = (&barrier, &op);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut lat = Vec::new();
                    let mut i = 0;
                    while start.elapsed() < limit {
                        let t = Instant::now();
                        op(c, i);
                        lat.push(t.elapsed());
                        i += 1;
                    }
                    (i, start.elapsed(), lat)
                })
            })
            .collect();
        let mut n = 0;
        let mut elapsed = Duration::ZERO;
        let mut lat = Vec::new();
        for h in hs {
            let (i, e, l) = h.join().expect("caller");
            n += i;
            elapsed = elapsed.max(e);
            lat.extend(l);
        }
        (n, elapsed, lat)
    });
    lat.sort_unstable();
    let p99 = percentile(&lat, 0.99);
    (n as f64 / elapsed.as_secs_f64(), p99)
}

/// Drops the OS page cache (root only); reopen times are then cold. Returns whether it could.
fn drop_caches() -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .and_then(|mut f| f.write_all(b"3\n"))
        .is_ok()
}

/// Runs this binary as a child `mode` on `path`, returning its stdout lines.
fn child(mode: &str, path: &Path, extra: &[(&str, String)]) -> std::process::Child {
    let exe = std::env::current_exe().expect("bench binary");
    let mut c = Command::new(exe);
    c.env("IDEM_SCALE_CHILD", mode).env("IDEM_SCALE_PATH", path);
    for (k, v) in extra {
        c.env(k, v);
    }
    c.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a child")
}

/// Child: opens `path` (the default configuration, or with `IDEM_SCALE_CACHE` bytes of cache),
/// runs `IDEM_SCALE_SECS` of 8-thread mixed load (90 % replays of existing keys, 10 % new
/// keys), prints `rss <MiB>`.
fn child_mixed(path: &Path) {
    let n: u64 = env_parse("IDEM_SCALE_N").unwrap_or(1);
    let secs: f64 = env_parse("IDEM_SCALE_SECS").unwrap_or(60.0);
    let mut b = Store::builder();
    if let Some(bytes) = env_parse::<usize>("IDEM_SCALE_CACHE") {
        b = b.cache_size(bytes);
    }
    let store = b.open(path).expect("open");
    let (ops, _) = rate(8, secs, |c, i| {
        if i % 10 == 9 {
            claim(&store, &format!("mixed-{c:02}-{i:010}"));
        } else {
            let k = (i.wrapping_mul(2_654_435_761).wrapping_add(c as u64 * 97)) % n;
            replay(&store, &existing(k));
        }
    });
    println!("rss {:.1}", rss_mib());
    println!("ops {ops:.0}");
    // Then one thread replaying uniformly random existing keys, on the cache as the load left it.
    let (r1, _) = rate(1, 3.0, |_, i| {
        let k = i.wrapping_mul(2_654_435_761) % n;
        replay(&store, &existing(k));
    });
    println!("replays1 {r1:.0}");
}

/// Child: claims on `path` in direct mode (quick-repair per `IDEM_SCALE_QR`: it concerns direct
/// mode's durable commits; journal mode's reopen after a crash is `reopen_after_crash`'s) until
/// killed; prints `ready` once it committed some.
fn child_crash(path: &Path) {
    let qr = std::env::var("IDEM_SCALE_QR").as_deref() == Ok("1");
    let store = Store::builder()
        .journal(false)
        .quick_repair(qr)
        .open(path)
        .expect("open");
    let mut out = std::io::stdout();
    thread::scope(|s| {
        for t in 0..8 {
            let store = &store;
            s.spawn(move || {
                for i in 0u64.. {
                    claim(store, &format!("crash-{t}-{i:010}"));
                }
            });
        }
        thread::sleep(Duration::from_millis(500));
        let _ = writeln!(out, "ready");
        let _ = out.flush();
    });
}

/// Child: opens `path` (after a crash of [`child_crash`], in its mode) and prints how long the
/// open took and the RSS then.
fn child_reopen(path: &Path) {
    let started = Instant::now();
    let store = Store::builder().journal(false).open(path).expect("reopen");
    let took = started.elapsed();
    println!("reopen_ms {}", took.as_millis());
    println!("rss {:.1}", rss_mib());
    drop(store);
}

fn field(lines: &[String], name: &str) -> Option<f64> {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

fn output(mut c: std::process::Child) -> Vec<String> {
    let lines = BufReader::new(c.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
        .collect();
    let _ = c.wait();
    lines
}

/// A SIGKILL while claiming, then a reopen in a fresh process: (reopen ms, RSS MiB).
fn crash_and_reopen(store: &Path, work: &Path, quick_repair: bool) -> (f64, f64) {
    copy_synced(store, work);
    let mut c = child(
        "crash",
        work,
        &[("IDEM_SCALE_QR", if quick_repair { "1" } else { "0" }.into())],
    );
    let mut lines = BufReader::new(c.stdout.take().expect("stdout")).lines();
    while let Some(Ok(line)) = lines.next() {
        if line == "ready" {
            break;
        }
    }
    let _ = c.kill();
    let _ = c.wait();
    let cold = drop_caches();
    let out = output(child("reopen", work, &[]));
    if !cold {
        eprintln!("scale: could not drop the page cache (not root): the reopen is warm");
    }
    (
        field(&out, "reopen_ms").unwrap_or(f64::NAN),
        field(&out, "rss").unwrap_or(f64::NAN),
    )
}

/// How a fresh store for the configuration rows is built.
type Config = fn() -> StoreBuilder;

fn main() {
    if let Ok(mode) = std::env::var("IDEM_SCALE_CHILD") {
        let path = PathBuf::from(std::env::var_os("IDEM_SCALE_PATH").expect("path"));
        match mode.as_str() {
            "mixed" => child_mixed(&path),
            "crash" => child_crash(&path),
            "reopen" => child_reopen(&path),
            _ => {}
        }
        return;
    }
    let quick = quick();
    let mut sizes: Vec<u64> = if quick {
        vec![100_000]
    } else {
        vec![100_000, 1_000_000]
    };
    if std::env::var("IDEM_SCALE_10M").is_ok_and(|v| v == "1") {
        sizes.push(10_000_000);
    }
    if let Ok(list) = std::env::var("IDEM_SCALE_SIZES") {
        sizes = list
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
    }
    // Page cache sizes (MiB) whose mixed load, RSS and replay rate are compared per store size.
    let caches: Vec<usize> = std::env::var("IDEM_SCALE_CACHES")
        .map(|list| {
            list.split(',')
                .filter_map(|c| c.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut cache_rows: Vec<String> = Vec::new();
    let secs = if quick { 1.0 } else { 3.0 };
    let mixed_secs: f64 =
        env_parse("IDEM_SCALE_MIXED_SECS").unwrap_or(if quick { 10.0 } else { 60.0 });
    let dir = tempfile::tempdir_in(bench_parent()).expect("bench dir");
    let commit = git_commit();
    println!(
        "file store at scale (commit {commit}; runs of ~{secs:.0} s; mixed load {mixed_secs:.0} s)\n"
    );
    println!(
        "| records | build | bytes/record | claims/s 1 | p99 1 | claims/s 64 | p99 64 | replays/s 1 | RSS after mixed (default: 64 MiB cache) | RSS after mixed (1 GiB cache: redb's default) | reopen after SIGKILL (direct) | RSS at reopen | reopen, quick-repair | RSS, quick-repair |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // Per store size: medians of claims/s at 1, 8 and 64 callers, [default, quick-repair].
    let mut qr_rows: Vec<(u64, [[f64; 2]; 3])> = Vec::new();
    let reps = if quick { 1 } else { 3 };
    for &n in &sizes {
        let master = dir.path().join(format!("master-{n}.redb"));
        let built = build(&master, n);
        let bytes = std::fs::metadata(&master).map_or(0, |m| m.len());
        let work = dir.path().join("work.redb");
        copy_synced(&master, &work);
        let store = Store::open(&work).expect("open the copy");
        let (c1, p1) = rate(1, secs, |c, i| claim(&store, &format!("n1-{c}-{i:010}")));
        let (c64, p64) = rate(64, secs, |c, i| claim(&store, &format!("n64-{c}-{i:010}")));
        let (r1, _) = rate(1, secs, |_, i| {
            let k = i.wrapping_mul(2_654_435_761) % n;
            replay(&store, &existing(k));
        });
        drop(store);
        let mut rss = Vec::new();
        let mut mixed = Vec::new();
        for cache in [None, Some(1usize << 30)] {
            copy_synced(&master, &work);
            let mut extra = vec![
                ("IDEM_SCALE_N", n.to_string()),
                ("IDEM_SCALE_SECS", mixed_secs.to_string()),
            ];
            if let Some(c) = cache {
                extra.push(("IDEM_SCALE_CACHE", c.to_string()));
            }
            let out = output(child("mixed", &work, &extra));
            rss.push(field(&out, "rss").unwrap_or(f64::NAN));
            mixed.push(field(&out, "ops").unwrap_or(f64::NAN));
        }
        for &mib in &caches {
            copy_synced(&master, &work);
            let out = output(child(
                "mixed",
                &work,
                &[
                    ("IDEM_SCALE_N", n.to_string()),
                    ("IDEM_SCALE_SECS", mixed_secs.to_string()),
                    ("IDEM_SCALE_CACHE", (mib << 20).to_string()),
                ],
            ));
            let f = |name| field(&out, name).unwrap_or(f64::NAN);
            cache_rows.push(format!(
                "| {n} | {mib} MiB | {:.0} | {:.0} MiB | {:.0} |",
                f("ops"),
                f("rss"),
                f("replays1")
            ));
        }
        let (plain_ms, plain_rss) = crash_and_reopen(&master, &work, false);
        let (qr_ms, qr_rss) = crash_and_reopen(&master, &work, true);
        // Quick-repair's cost on this store: two copies open side by side, the default and
        // quick-repair runs interleaved rep by rep (the machine's drift hits both), medians.
        let twin = dir.path().join("twin.redb");
        copy_synced(&master, &work);
        copy_synced(&master, &twin);
        {
            let plain = Store::builder()
                .journal(false)
                .open(&work)
                .expect("open the copy");
            let repaired = Store::builder()
                .journal(false)
                .quick_repair(true)
                .open(&twin)
                .expect("open the twin");
            let mut cells = [
                [Vec::new(), Vec::new()],
                [Vec::new(), Vec::new()],
                [Vec::new(), Vec::new()],
            ];
            for rep in 0..reps {
                for (j, &callers) in [1usize, 8, 64].iter().enumerate() {
                    for (which, store) in [&plain, &repaired].into_iter().enumerate() {
                        let (r, _) = rate(callers, secs, |k, i| {
                            claim(store, &format!("qr{rep}-{callers}-{k}-{i:010}"))
                        });
                        cells[j][which].push(r);
                    }
                }
            }
            qr_rows.push((n, cells.map(|pair| pair.map(|v| median(&v)))));
        }
        let _ = std::fs::remove_file(&twin);
        println!(
            "| {n} | {:.1} s | {:.0} | {c1:.0} | {:.2} ms | {c64:.0} | {:.2} ms | {r1:.0} | {:.0}, {:.0} MiB | {:.0}, {:.0} MiB | {plain_ms:.0} ms | {plain_rss:.0} MiB | {qr_ms:.0} ms | {qr_rss:.0} MiB |",
            built.as_secs_f64(),
            bytes as f64 / n as f64,
            p1.as_secs_f64() * 1e3,
            p64.as_secs_f64() * 1e3,
            mixed[0],
            rss[0],
            mixed[1],
            rss[1],
        );
        let _ = std::fs::remove_file(&master);
    }

    if !cache_rows.is_empty() {
        println!(
            "\n| records | page cache | mixed ops/s (8 threads, {mixed_secs:.0} s) | RSS after | replays/s, 1 thread, after |"
        );
        println!("|---|---|---|---|---|");
        for row in &cache_rows {
            println!("{row}");
        }
    }

    println!(
        "\n| records | claims/s 1: direct | direct, quick-repair | claims/s 8: direct | direct, quick-repair | claims/s 64: direct | direct, quick-repair | quick-repair / direct at 64 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (n, [one, eight, many]) in &qr_rows {
        println!(
            "| {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}x |",
            one[0],
            one[1],
            eight[0],
            eight[1],
            many[0],
            many[1],
            many[1] / many[0]
        );
    }

    // Quick-repair's cost, and Durability::Periodic(10 ms), on a fresh store.
    println!(
        "\n| configuration (fresh store; medians of {reps}) | claims/s 1 | claims/s 8 | claims/s 64 |"
    );
    println!("|---|---|---|---|");
    let configs: [(&str, Config); 4] = [
        ("default (journal mode, Immediate)", Store::builder),
        ("direct mode (journal(false))", || {
            Store::builder().journal(false)
        }),
        ("direct mode, quick_repair(true)", || {
            Store::builder().journal(false).quick_repair(true)
        }),
        ("Durability::Periodic(10 ms)", || {
            Store::builder().durability(Durability::Periodic(Duration::from_millis(10)))
        }),
    ];
    // The same store on tmpfs, where an fsync costs nothing: idem's own CPU ceiling on this
    // machine (skipped where there is no /dev/shm).
    let shm = Path::new("/dev/shm");
    let ceiling = shm
        .is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten();
    let mut runs: Vec<(&str, Config, &Path)> = configs
        .iter()
        .map(|&(name, make)| (name, make, dir.path()))
        .collect();
    if let Some(mem) = &ceiling {
        runs.push((
            "default on tmpfs (no disk: the CPU ceiling)",
            Store::builder,
            mem.path(),
        ));
    }
    // Every configuration's store stays open; the runs go round the configurations rep by rep.
    let stores: Vec<(&str, Store)> = runs
        .iter()
        .enumerate()
        .map(|(j, &(name, make, on))| {
            let path = on.join(format!("fresh-{j}.redb"));
            (name, make().open(&path).expect("open"))
        })
        .collect();
    let mut rates = vec![[Vec::new(), Vec::new(), Vec::new()]; stores.len()];
    for rep in 0..reps {
        for (j, (_, store)) in stores.iter().enumerate() {
            for (c, &callers) in [1usize, 8, 64].iter().enumerate() {
                let (r, _) = rate(callers, secs, |k, i| {
                    claim(store, &format!("f{rep}-{callers}-{k}-{i:010}"))
                });
                rates[j][c].push(r);
            }
        }
    }
    for ((name, _), cells) in stores.iter().zip(rates) {
        let [one, eight, many] = cells.map(|v| median(&v));
        println!("| {name} | {one:.0} | {eight:.0} | {many:.0} |");
    }
}
