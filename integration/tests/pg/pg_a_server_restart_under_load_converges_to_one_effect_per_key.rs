//! PostgreSQL restarted under load: flow-A callers run against a `PgStore` while the test
//! restarts the server (`pg_ctl -D <data_directory> -m fast -w restart`, as the cluster's owner:
//! `runuser -u postgres -- …` when the test runs as root); the callers retry with the same key
//! on `Error::OutcomeUnknown` and `Error::Storage` until every call settles.
//!
//! Proves, for calls that settled before the restart and calls that ran across it: the store
//! survives the restart (it reconnects by itself, no reopen); every error a caller sees is one
//! of those two typed variants; every call converges to `Ran` or `Replayed`; every key
//! ends with exactly one effect; at most one caller saw `Ran`; and every caller got the
//! same answer for a key (the one a fresh store replays).
//!
//! **This test restarts the shared test server**, which other tests use concurrently: every
//! session on it is cut. So it is in a test binary of its own and runs only when
//! `IDEM_PG_RESTART_OK=1` is set (otherwise it is skipped with a printed reason, even in CI):
//! run it alone, after the other tests, e.g.
//! `IDEM_PG_RESTART_OK=1 cargo test --all-features --test
//! pg_a_server_restart_under_load_converges_to_one_effect_per_key`.
//!
//! It also needs `IDEM_PG_URL` (tests/common/pg.rs: skipped without it, failing when
//! `IDEM_REQUIRE_PG` or `CI` is set) naming a server on this machine that it may restart: the
//! data directory comes from `SHOW data_directory`, `pg_ctl` from
//! `/usr/lib/postgresql/<major>/bin` (or the `PATH`), and the test must run as root or as the
//! data directory's owner. When it cannot restart the server it fails with the reason if
//! `IDEM_REQUIRE_PG` or `CI` is set, and is skipped with the reason otherwise. The restarted
//! server keeps its settings (pg_ctl reuses the postmaster's command line) and, when the
//! data directory's parent holds a `server.log` (scripts/pg-test-cluster's), logs there.

#![cfg(feature = "postgres")]
#![cfg(unix)]

use crate::common;
use crate::pg_fleet;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use idem::{Request, Scope};

use pg_fleet::{Calls, Converged, Load, Schema, check_converged};

const RESTART_ENV: &str = "IDEM_PG_RESTART_OK";
const KEYS: usize = 600;
const CALLERS: usize = 6;
const PAUSE: Duration = Duration::from_millis(50);
const SETTLE_WITHIN: Duration = Duration::from_secs(120);

fn scope() -> Scope {
    Scope::new("fleet", "restart")
}

fn request(key: &str) -> Request {
    Request::from_canonical_bytes(scope(), key, key.as_bytes())
}

/// How this test restarts the server.
struct Restarter {
    pg_ctl: PathBuf,
    data_dir: PathBuf,
    /// `Some(user)`: run pg_ctl through `runuser -u user --` (the test runs as root).
    as_user: Option<String>,
    log: Option<PathBuf>,
}

impl Restarter {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = match &self.as_user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&self.pg_ctl);
                c
            }
            None => Command::new(&self.pg_ctl),
        };
        c.arg("-D").arg(&self.data_dir).args(args);
        c
    }

    /// `pg_ctl restart -m fast -w`; returns how long it took.
    fn restart(&self) -> Duration {
        let began = Instant::now();
        let mut args = vec!["-m", "fast", "-w", "-t", "60"];
        let log = self.log.as_ref().map(|l| l.to_string_lossy().into_owned());
        if let Some(log) = &log {
            args.extend(["-l", log.as_str()]);
        }
        args.push("restart");
        // Without -l the new postmaster writes to pg_ctl's stdout: never a pipe we wait on.
        let out = self
            .command(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run pg_ctl restart");
        assert!(
            out.status.success(),
            "pg_ctl restart failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        began.elapsed()
    }
}

/// This process's user id (from /proc, or `id -u`).
fn my_uid() -> Option<u32> {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        return status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse().ok());
    }
    let out = Command::new("id").arg("-u").output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// The user name of `uid` (from /etc/passwd).
fn user_name(uid: u32) -> Option<String> {
    std::fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2].parse() == Ok(uid)).then(|| f[0].to_owned())
        })
}

/// How to restart the server behind `c`, or why this test cannot.
fn restarter(c: &mut postgres::Client) -> Result<Restarter, String> {
    let data_dir: String = c
        .query_one("SHOW data_directory", &[])
        .map_err(|e| {
            format!("SHOW data_directory failed ({e}): the URL's user must be a superuser")
        })?
        .get(0);
    let data_dir = PathBuf::from(data_dir);
    let version: String = c
        .query_one("SHOW server_version_num", &[])
        .map_err(|e| format!("SHOW server_version_num failed: {e}"))?
        .get(0);
    let major = version.parse::<u32>().map_err(|e| e.to_string())? / 10_000;
    let owner = std::fs::metadata(&data_dir)
        .map_err(|e| {
            format!(
                "the server's data directory {} is not on this machine ({e}): the server is not one this test can restart",
                data_dir.display()
            )
        })?
        .uid();
    let bundled = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin/pg_ctl"));
    let pg_ctl = if bundled.exists() {
        bundled
    } else {
        PathBuf::from("pg_ctl")
    };
    let me = my_uid().ok_or("cannot tell this process's user id")?;
    let as_user = if me == owner {
        None
    } else if me == 0 {
        Some(user_name(owner).unwrap_or_else(|| "postgres".to_owned()))
    } else {
        return Err(format!(
            "this test runs as uid {me}, neither root nor the owner (uid {owner}) of the data directory {}: it cannot run pg_ctl on it",
            data_dir.display()
        ));
    };
    let log = data_dir
        .parent()
        .map(|p| p.join("server.log"))
        .filter(|l| l.exists());
    let r = Restarter {
        pg_ctl,
        data_dir,
        as_user,
        log,
    };
    // The same tool, as the same user, must see the running server.
    let status = r
        .command(&["status"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", r.pg_ctl.display()))?;
    if !status.status.success() {
        return Err(format!(
            "`{} -D {} status` does not see a running server ({}): {}",
            r.pg_ctl.display(),
            r.data_dir.display(),
            status.status,
            String::from_utf8_lossy(&status.stdout).trim()
        ));
    }
    Ok(r)
}

fn start_time(url: &str) -> String {
    common::pg::client(url)
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .expect("the server's start time")
        .get(0)
}

#[test]
fn a_server_restart_under_load_converges_to_one_effect_per_key() {
    if std::env::var(RESTART_ENV).as_deref() != Ok("1") {
        eprintln!(
            "skipped: this test restarts the PostgreSQL server, cutting every other test's sessions; \
             set {RESTART_ENV}=1 and run this test alone to run it"
        );
        return;
    }
    let Some(url) = common::pg::pg_url() else {
        return;
    };
    let restarter = match restarter(&mut common::pg::client(&url)) {
        Ok(r) => r,
        Err(why) => {
            let required =
                std::env::var_os("IDEM_REQUIRE_PG").is_some() || std::env::var_os("CI").is_some();
            assert!(
                !required,
                "cannot restart the PostgreSQL server, but PostgreSQL tests are required here: {why}"
            );
            eprintln!("skipped: cannot restart the PostgreSQL server: {why}");
            return;
        }
    };
    let began = Instant::now();
    let schema = Schema::create(&url, "restart");
    let store = schema.open();
    let started_before = start_time(&url);
    let settled = AtomicUsize::new(0);
    let total = KEYS * CALLERS;
    let load = Load {
        store: &store,
        schema: &schema.name,
        request,
        keys: KEYS,
        pause: PAUSE,
        settle_within: SETTLE_WITHIN,
        settled: &settled,
    };

    let (results, (restart_took, restarted_at, back_at)): (Vec<Calls>, _) = thread::scope(|s| {
        let restart = s.spawn(|| {
            // Under load: once a fifth of the calls settled, the rest run across the restart.
            let waiting = Instant::now();
            while settled.load(Ordering::Relaxed) < total / 5 {
                assert!(
                    waiting.elapsed() < Duration::from_secs(60),
                    "the callers made no progress before the restart"
                );
                thread::sleep(Duration::from_millis(5));
            }
            let before = settled.load(Ordering::Relaxed);
            let took = restarter.restart();
            (took, before, settled.load(Ordering::Relaxed))
        });
        let callers: Vec<_> = (0..CALLERS)
            .map(|c| {
                let load = &load;
                s.spawn(move || load.run_caller(c, 1234 + c as u64))
            })
            .collect();
        let results = callers
            .into_iter()
            .map(|h| h.join().expect("a caller panicked"))
            .collect();
        (results, restart.join().expect("the restart"))
    });
    assert_ne!(
        start_time(&url),
        started_before,
        "the server was not restarted"
    );
    // Under load: calls had settled before the restart began, and others settled only after
    // the server was back (whether a caller saw an error depends on where the shutdown caught
    // it: a connection the pool waits for is no error).
    assert!(
        back_at < total,
        "every call had settled by the time the server was back: not under load"
    );
    let Converged { met, unheard } = check_converged(&schema, request, KEYS, results);
    println!(
        "server restart: restarted after {restarted_at} of {total} calls had settled, back after {back_at}, pg_ctl took {:.2} s; \
         callers met {} OutcomeUnknown and {} Storage errors, all converged ({unheard} keys executed \
         by a call that got OutcomeUnknown, then replayed); {:.1} s in all",
        restart_took.as_secs_f64(),
        met.outcome_unknown,
        met.storage,
        began.elapsed().as_secs_f64()
    );
}
