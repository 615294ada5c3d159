//! The PostgreSQL engine's claim throughput, next to the article's hand-written SQL flow on the
//! same server, in the same run: claims/s, p50 and p99 with 1, 8 and 64 callers in one process,
//! and with 1, 2 and 4 processes (each with `IDEM_PG_BENCH_PROC_CALLERS` callers, default 16)
//! on one database.
//!
//! ```text
//! eval "$(scripts/pg-test-cluster start)"                        # a private server; sets IDEM_PG_URL
//! cargo bench -p idem-benches --features postgres --bench pg_throughput           # full: 5 runs of ~3 s per row
//! IDEM_BENCH_QUICK=1 cargo bench -p idem-benches --features postgres --bench pg_throughput   # 2 runs of ~1 s
//! ```
//!
//! A claim is one new intent: `execute` with a closure that writes one effect row (an upsert)
//! in the claim's transaction. The baseline does the same work the way the source article
//! writes it, one transaction per claim on its own connection per caller, with prepared
//! statements: `BEGIN`; `INSERT … ON CONFLICT DO NOTHING` of a pending row; `SELECT … FOR
//! UPDATE`; the effect's upsert; `UPDATE` to completed with the response; `COMMIT`. Both run
//! on the same server (`synchronous_commit = on`, fsync on), in fresh schemas, alternating row
//! by row. The last table row is the server's single-connection commit rate (one-row
//! `INSERT` + `COMMIT`), the fsync-bound limit of a lone writer.
//!
//! Without `IDEM_PG_URL` it prints why and exits 0 (benchmarks are not part of CI).

use std::process::Command;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use bench_common::workload::{OPERATION, TENANT, payload, request, response};
use bench_common::{env_parse, git_commit, percentile, quick};
use idem::postgres::PgStore;
use idem::{ExecuteAnswer, Response};

#[derive(Clone, Copy)]
struct Settings {
    runs: usize,
    run_secs: f64,
}

fn settings() -> Settings {
    let quick = quick();
    Settings {
        runs: env_parse("IDEM_BENCH_RUNS").unwrap_or(if quick { 2 } else { 5 }),
        run_secs: env_parse("IDEM_BENCH_RUN_SECS").unwrap_or(if quick { 1.0 } else { 3.0 }),
    }
}

fn client(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect to the benchmark server")
}

/// A fresh schema with the caller's effects table and the baseline's table.
fn fresh_schema(url: &str, label: &str) -> String {
    let schema = format!("bench_{label}_{}", std::process::id());
    client(url)
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
             CREATE TABLE {schema}.effects (k text PRIMARY KEY, n int8 NOT NULL);
             CREATE TABLE {schema}.api_idempotency (
                 tenant_id text NOT NULL, operation text NOT NULL, idempotency_key text NOT NULL,
                 request_hash text NOT NULL, state text NOT NULL, status_code int,
                 response_body text, created_at timestamptz NOT NULL DEFAULT now(),
                 expires_at timestamptz NOT NULL,
                 PRIMARY KEY (tenant_id, operation, idempotency_key));"
        ))
        .expect("create the benchmark schema");
    schema
}

fn drop_schema(url: &str, schema: &str) {
    let _ = client(url).batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
}

/// What a run measured.
struct Sample {
    claims: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Sample {
    fn per_sec(&self) -> f64 {
        self.claims as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `callers` threads, each making `claim(caller, i)` calls until `secs` passed, and
/// collects every call's latency.
fn run_callers<W>(callers: usize, secs: f64, make: impl Fn(usize) -> W + Sync) -> Sample
where
    W: FnMut(usize) + Send,
{
    let barrier = Barrier::new(callers + 1);
    let deadline = Duration::from_secs_f64(secs);
    let (total, elapsed, latencies) = thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|c| {
                let barrier = &barrier;
                let make = &make;
                s.spawn(move || {
                    let mut claim = make(c);
                    barrier.wait();
                    let start = Instant::now();
                    let mut lat = Vec::new();
                    let mut i = 0;
                    while start.elapsed() < deadline {
                        let t = Instant::now();
                        claim(i);
                        lat.push(t.elapsed());
                        i += 1;
                    }
                    (i, lat)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut total = 0;
        let mut latencies = Vec::new();
        for h in handles {
            let (n, lat) = h.join().expect("caller thread");
            total += n;
            latencies.extend(lat);
        }
        (total, start.elapsed(), latencies)
    });
    let mut latencies = latencies;
    latencies.sort_unstable();
    Sample {
        claims: total,
        elapsed,
        latencies,
    }
}

/// The store's settings: the defaults, or `IDEM_PG_BENCH_WRITERS` writers.
fn builder(url: &str, schema: &str, callers: usize) -> idem::postgres::PgStoreBuilder {
    let b = PgStore::builder(url).schema(schema);
    match env_parse::<usize>("IDEM_PG_BENCH_WRITERS") {
        Some(w) => b.writers(w.min(callers.max(1))),
        None => b,
    }
}

/// idem: `execute` with a one-statement closure.
fn idem_run(url: &str, callers: usize, secs: f64, tag: &str) -> Sample {
    let schema = fresh_schema(url, &format!("idem{tag}"));
    let store = builder(url, &schema, callers)
        .open()
        .expect("open the PostgreSQL store");
    let upsert = format!(
        "INSERT INTO {schema}.effects (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = {schema}.effects.n + 1"
    );
    let pid = std::process::id();
    let sample = run_callers(callers, secs, |c| {
        let store = store.clone();
        let upsert = upsert.clone();
        move |i| {
            let key = format!("new-{tag}-{pid}-{c:02}-{i:08}");
            let outcome = store
                .execute(request(&key), |tx| {
                    let s = tx.prepare(&upsert)?;
                    tx.execute(&s, &[&key])?;
                    Ok(response())
                })
                .expect("claim");
            assert!(matches!(outcome, ExecuteAnswer::Ran(_)));
        }
    });
    drop(store);
    drop_schema(url, &schema);
    sample
}

/// The article's flow: one transaction per claim, one connection per caller.
fn baseline_run(url: &str, callers: usize, secs: f64, tag: &str) -> Sample {
    let schema = fresh_schema(url, &format!("sql{tag}"));
    let pid = std::process::id();
    let sample = run_callers(callers, secs, |c| {
        let mut db = client(url);
        let insert = db
            .prepare(&format!(
                "INSERT INTO {schema}.api_idempotency (tenant_id, operation, idempotency_key, request_hash, state, expires_at)
                 VALUES ($1, $2, $3, $4, 'pending', now() + interval '1 day') ON CONFLICT DO NOTHING"
            ))
            .expect("prepare");
        let lock = db
            .prepare(&format!(
                "SELECT request_hash, state FROM {schema}.api_idempotency
                 WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 FOR UPDATE"
            ))
            .expect("prepare");
        let effect = db
            .prepare(&format!(
                "INSERT INTO {schema}.effects (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = {schema}.effects.n + 1"
            ))
            .expect("prepare");
        let complete = db
            .prepare(&format!(
                "UPDATE {schema}.api_idempotency SET state = 'completed', status_code = 201, response_body = $4
                 WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
            ))
            .expect("prepare");
        move |i| {
            let key = format!("new-{tag}-{pid}-{c:02}-{i:08}");
            let hash = blake3::hash(&payload(&key)).to_hex().to_string();
            let mut tx = db.transaction().expect("begin");
            tx.execute(&insert, &[&TENANT, &OPERATION, &key, &hash])
                .expect("insert");
            let row = tx
                .query_one(&lock, &[&TENANT, &OPERATION, &key])
                .expect("lock");
            let stored: String = row.get(0);
            let state: String = row.get(1);
            assert!(stored == hash && state == "pending");
            tx.execute(&effect, &[&key]).expect("effect");
            tx.execute(&complete, &[&TENANT, &OPERATION, &key, &r#"{"ok":true}"#])
                .expect("complete");
            tx.commit().expect("commit");
        }
    });
    drop_schema(url, &schema);
    sample
}

/// The server's single-connection commit rate: one-row insert, commit.
fn commit_rate(url: &str, secs: f64) -> Sample {
    let schema = fresh_schema(url, "fsync");
    let sample = run_callers(1, secs, |_| {
        let mut db = client(url);
        let s = db
            .prepare(&format!(
                "INSERT INTO {schema}.effects (k, n) VALUES ($1, 1)"
            ))
            .expect("prepare");
        move |i| {
            db.execute(&s, &[&format!("k{i}")]).expect("insert");
        }
    });
    drop_schema(url, &schema);
    sample
}

/// One child process of the multi-process rows: runs idem with `callers` callers for `secs`,
/// starting at the wall-clock instant `IDEM_PG_BENCH_START_MS`, and prints
/// `claims elapsed_ms` and every latency in µs on stdout.
fn child(url: &str) {
    let callers: usize = env_parse("IDEM_PG_BENCH_CHILD_CALLERS").unwrap_or(16);
    let secs: f64 = env_parse("IDEM_PG_BENCH_CHILD_SECS").unwrap_or(3.0);
    let schema: String = std::env::var("IDEM_PG_BENCH_CHILD_SCHEMA").expect("schema");
    let start_ms: u128 = env_parse("IDEM_PG_BENCH_START_MS").unwrap_or(0);
    let store = builder(url, &schema, callers).open().expect("open");
    let upsert = format!(
        "INSERT INTO {schema}.effects (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = {schema}.effects.n + 1"
    );
    // Start together with the other children.
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        if now >= start_ms {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    let pid = std::process::id();
    let sample = run_callers(callers, secs, |c| {
        let store = store.clone();
        let upsert = upsert.clone();
        move |i| {
            let key = format!("proc-{pid}-{c:02}-{i:08}");
            let outcome = store
                .execute(request(&key), |tx| {
                    let s = tx.prepare(&upsert)?;
                    tx.execute(&s, &[&key])?;
                    Ok(Response::new(201, r#"{"ok":true}"#))
                })
                .expect("claim");
            assert!(matches!(outcome, ExecuteAnswer::Ran(_)));
        }
    });
    println!("{} {}", sample.claims, sample.elapsed.as_millis());
    let lat: Vec<String> = sample
        .latencies
        .iter()
        .map(|d| d.as_micros().to_string())
        .collect();
    println!("{}", lat.join(" "));
}

/// `processes` children on one schema, started together.
fn processes_run(url: &str, processes: usize, callers: usize, secs: f64) -> Sample {
    let schema = fresh_schema(url, &format!("procs{processes}"));
    // Create idem's tables once, before the children race to open.
    drop(
        PgStore::builder(url)
            .schema(&schema)
            .open()
            .expect("create the schema"),
    );
    let exe = std::env::current_exe().expect("benchmark binary");
    let start_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
        + 1500;
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(&exe)
                .env("IDEM_PG_BENCH_CHILD", "1")
                .env("IDEM_PG_BENCH_CHILD_CALLERS", callers.to_string())
                .env("IDEM_PG_BENCH_CHILD_SECS", secs.to_string())
                .env("IDEM_PG_BENCH_CHILD_SCHEMA", &schema)
                .env("IDEM_PG_BENCH_START_MS", start_ms.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start a child process")
        })
        .collect();
    let mut claims = 0;
    let mut elapsed = Duration::ZERO;
    let mut latencies = Vec::new();
    for c in children {
        let out = c.wait_with_output().expect("child output");
        assert!(out.status.success(), "a child failed");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut lines = text.lines();
        let mut head = lines.next().unwrap_or("0 1").split(' ');
        claims += head
            .next()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let ms = head.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(1);
        elapsed = elapsed.max(Duration::from_millis(ms));
        latencies.extend(
            lines
                .next()
                .unwrap_or("")
                .split(' ')
                .filter_map(|v| v.parse::<u64>().ok())
                .map(Duration::from_micros),
        );
    }
    latencies.sort_unstable();
    drop_schema(url, &schema);
    Sample {
        claims,
        elapsed,
        latencies,
    }
}

/// The median run of `runs` (by throughput).
fn median(mut samples: Vec<Sample>) -> Sample {
    samples.sort_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
    let mid = samples.len() / 2;
    samples.swap_remove(mid)
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let Ok(url) = std::env::var("IDEM_PG_URL") else {
        println!(
            "pg_throughput: IDEM_PG_URL is not set; start a server with `eval \"$(scripts/pg-test-cluster start)\"` and run again"
        );
        return;
    };
    if std::env::var_os("IDEM_PG_BENCH_CHILD").is_some() {
        child(&url);
        return;
    }
    // `cargo bench` passes `--bench`; nothing else to parse.
    let s = settings();
    let commit = git_commit();
    println!(
        "PostgreSQL engine vs the article's hand-written SQL flow, same server, same run (commit {commit}; {} runs of ~{:.0} s per row, medians)\n",
        s.runs, s.run_secs
    );
    println!(
        "| workload | callers | idem claims/s | idem p50 ms | idem p99 ms | SQL claims/s | SQL p50 ms | SQL p99 ms | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for callers in [1usize, 8, 64] {
        let mut idem = Vec::new();
        let mut sql = Vec::new();
        for r in 0..s.runs {
            idem.push(idem_run(
                &url,
                callers,
                s.run_secs,
                &format!("{callers}r{r}"),
            ));
            sql.push(baseline_run(
                &url,
                callers,
                s.run_secs,
                &format!("{callers}r{r}"),
            ));
        }
        let (i, q) = (median(idem), median(sql));
        println!(
            "| new keys, one process | {callers} | {:.0} | {} | {} | {:.0} | {} | {} | {:.2}× |",
            i.per_sec(),
            fmt_ms(percentile(&i.latencies, 0.5)),
            fmt_ms(percentile(&i.latencies, 0.99)),
            q.per_sec(),
            fmt_ms(percentile(&q.latencies, 0.5)),
            fmt_ms(percentile(&q.latencies, 0.99)),
            i.per_sec() / q.per_sec()
        );
    }
    let per_proc: usize = env_parse("IDEM_PG_BENCH_PROC_CALLERS").unwrap_or(16);
    println!("\n| processes | callers each | idem claims/s | p50 ms | p99 ms | vs 1 process |");
    println!("|---|---|---|---|---|---|");
    let mut one = None;
    for processes in [1usize, 2, 4] {
        let runs: Vec<Sample> = (0..s.runs)
            .map(|_| processes_run(&url, processes, per_proc, s.run_secs))
            .collect();
        let m = median(runs);
        let base = *one.get_or_insert(m.per_sec());
        println!(
            "| {processes} | {per_proc} | {:.0} | {} | {} | {:.2}× |",
            m.per_sec(),
            fmt_ms(percentile(&m.latencies, 0.5)),
            fmt_ms(percentile(&m.latencies, 0.99)),
            m.per_sec() / base
        );
    }
    let runs: Vec<Sample> = (0..s.runs).map(|_| commit_rate(&url, s.run_secs)).collect();
    let c = median(runs);
    println!(
        "\nserver commit rate, one connection (one-row INSERT + COMMIT): {:.0}/s, p50 {} ms",
        c.per_sec(),
        fmt_ms(percentile(&c.latencies, 0.5))
    );
}
