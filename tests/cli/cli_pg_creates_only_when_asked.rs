//! `idem pg`: the operator's commands on a PostgreSQL store. Only `migrate` creates the schema;
//! `stats`, `get`, `purge` and `sweep` refuse a database without it (exit 1, nothing created),
//! so a mistyped URL or schema never becomes a new, empty store. On an existing store they
//! print what the store holds.
#![cfg(all(feature = "cli", feature = "postgres"))]

use crate::common;

use std::process::{Command, Output};

use common::pg::{PgHarness, client, fresh_schema, pg_url};
use common::{executed, req};
use idem::Response;

fn idem_pg(url: &str, schema: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["pg", "--url", url, "--schema", schema])
        .args(args)
        .output()
        .expect("run idem")
}

fn schema_exists(url: &str, schema: &str) -> bool {
    let row = client(url)
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .expect("query the catalog");
    row.get::<_, i64>(0) > 0
}

#[test]
fn read_commands_refuse_a_missing_schema_and_create_nothing() {
    let Some(url) = pg_url() else { return };
    let schema = fresh_schema("cli_missing");
    for args in [
        &["stats"][..],
        &["get", "--tenant", "t", "--op", "o", "--key", "k"],
        &["sweep"],
    ] {
        let out = idem_pg(&url, &schema, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no idem store"), "{args:?}: {err}");
        assert!(!schema_exists(&url, &schema), "{args:?} created the schema");
    }
}

#[test]
fn migrate_creates_and_the_other_commands_read_the_store() {
    let Some(url) = pg_url() else { return };
    let schema = fresh_schema("cli_migrate");
    let out = idem_pg(&url, &schema, &["migrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("schema_version  1"));
    // Migrating again only checks.
    assert!(idem_pg(&url, &schema, &["migrate"]).status.success());
    let _ = client(&url).batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}

#[test]
fn stats_get_and_purge_see_what_the_service_stored() {
    let Some(h) = PgHarness::new("cli_read") else {
        return;
    };
    executed(h.store().execute(req("acme", "pay", "k1", b"p"), |_| {
        Ok(Response::new(201, "paid"))
    }));
    let stats = idem_pg(&h.url, &h.schema, &["stats", "--json"]);
    assert!(stats.status.success());
    let json: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("one JSON object");
    assert_eq!(json["records"], 1);
    assert_eq!(json["completed"], 1);
    let get = idem_pg(
        &h.url,
        &h.schema,
        &["get", "--tenant", "acme", "--op", "pay", "--key", "k1"],
    );
    assert!(get.status.success());
    assert!(String::from_utf8_lossy(&get.stdout).contains("completed"));
    let purge = idem_pg(
        &h.url,
        &h.schema,
        &[
            "purge", "--yes", "--tenant", "acme", "--op", "pay", "--key", "k1",
        ],
    );
    assert!(purge.status.success());
    assert!(
        h.store()
            .get(&idem::Scope::new("acme", "pay"), "k1")
            .unwrap()
            .is_none()
    );
    let again = idem_pg(
        &h.url,
        &h.schema,
        &[
            "purge", "--yes", "--tenant", "acme", "--op", "pay", "--key", "k1",
        ],
    );
    assert_eq!(
        again.status.code(),
        Some(1),
        "an absent key exits 1, as `get` does"
    );
}
