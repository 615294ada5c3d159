//! The `idem` operator binary on a real store file.
#![cfg(feature = "cli")]

use crate::idem_cli;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

use idem::clock::ManualClock;
use idem::{Abort, BeginAnswer, Request, Response, Scope, Store, Timestamp};
use idem_cli::idem;
use serde_json::Value;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The one JSON value on stdout (a single line).
fn json(o: &Output) -> Value {
    let out = stdout(o);
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The field names the `--help` of `command` lists for `--json`: the first word of each
/// indented line after the `JSON (` paragraph.
fn documented_fields(file: &Path, command: &str) -> BTreeSet<String> {
    let o = idem(file, &[command, "--help"]);
    assert!(o.status.success(), "{o:?}");
    let help = stdout(&o);
    let (_, fields) = help
        .split_once("\nJSON (")
        .unwrap_or_else(|| panic!("{command} --help documents no JSON fields:\n{help}"));
    let names: BTreeSet<String> = fields
        .lines()
        .skip(1)
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(names.len() > 5, "{help}");
    names
}

/// The names of an object's fields, and of the `http` object's as `http.<name>`.
fn json_fields(v: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (k, v) in v.as_object().expect("an object") {
        names.insert(k.clone());
        if k == "http" {
            for inner in v.as_object().expect("http is an object").keys() {
                names.insert(format!("http.{inner}"));
            }
        }
    }
    names
}

/// docs/CLI.md's section on the JSON output, where every field is documented.
fn cli_doc_json_section() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CLI.md"))
        .expect("docs/CLI.md");
    let start = doc
        .find("## JSON output")
        .expect("docs/CLI.md has the JSON output section");
    let rest = &doc[start + 3..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_owned()
}

fn assert_cli_doc_documents(fields: &BTreeSet<String>) {
    let section = cli_doc_json_section();
    for f in fields {
        assert!(
            section.contains(&format!("`{f}`")),
            "docs/CLI.md's JSON output section does not document the JSON field `{f}`"
        );
    }
}

/// Stores `body` as the completed answer `status` of `key` (tenant t1, operation op).
fn put(store: &Store, key: &str, status: u16, body: &[u8]) {
    let req = Request::from_canonical_bytes(Scope::new("t1", "op"), key, b"x");
    let outcome = store
        .execute(req, |_| Ok(Response::new(status, body.to_vec())))
        .unwrap();
    assert!(matches!(outcome, idem::ExecuteAnswer::Ran(_)));
}

/// `get --tenant t1 --op op --key <key>` with `more` flags.
fn get(file: &Path, key: &str, more: &[&str]) -> Output {
    let args = [
        &["get", "--tenant", "t1", "--op", "op", "--key", key][..],
        more,
    ]
    .concat();
    idem(file, &args)
}

fn line<'a>(out: &'a str, field: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(field).map(str::trim))
        .unwrap_or_else(|| panic!("no {field} in {out}"))
}

/// `span` is whole days and the hours past them, `3451433d5h`, or whole days alone when there
/// are no hours past them, `3451433d` (what `idem get` prints for a span of a day or more).
fn assert_days_and_hours(span: &str, out: &str) {
    let (days, hours) = span.split_once('d').unwrap_or_default();
    assert!(
        !days.is_empty()
            && days.bytes().all(|b| b.is_ascii_digit())
            && (hours.is_empty()
                || hours
                    .strip_suffix('h')
                    .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_digit()))),
        "days and hours: {out}"
    );
}

#[test]
fn stats_get_purge_sweep_compact() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    {
        let store = Store::open(&file).unwrap();
        let scope = Scope::new("t1", "POST /v1/payments");
        let ok = Request::from_canonical_bytes(scope.clone(), "k-ok", b"a");
        let _ = store
            .execute(ok, |_| {
                Ok(Response::new(201, "secret-body").with_resource("payment", "pay_1"))
            })
            .unwrap();
        let failed = Request::from_canonical_bytes(scope.clone(), "k-failed", b"b");
        let _ = store
            .execute(failed, |_| {
                Err(Abort::Terminal(Response::new(402, "declined")))
            })
            .unwrap();
    }

    let o = idem(&file, &["stats"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert_eq!(line(&out, "records"), "2");
    assert_eq!(line(&out, "completed"), "1");
    assert_eq!(line(&out, "failed"), "1");
    assert_eq!(line(&out, "pending"), "0");
    assert!(line(&out, "file_bytes").parse::<u64>().unwrap() > 0);

    let key = [
        "--tenant",
        "t1",
        "--op",
        "POST /v1/payments",
        "--key",
        "k-ok",
    ];
    let o = idem(&file, &[&["get"], &key[..]].concat());
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert_eq!(line(&out, "state"), "completed");
    assert_eq!(line(&out, "status"), "201");
    assert_eq!(line(&out, "body_bytes"), "11");
    assert_eq!(
        line(&out, "stored_bytes"),
        "11",
        "a plain body is stored as it is"
    );
    assert_eq!(line(&out, "resource"), "payment pay_1");
    assert_eq!(line(&out, "fingerprint").len(), 64);
    let expires = line(&out, "expires_at");
    assert!(expires.contains("Z (in 23h59m"), "{out}");
    assert!(
        jiff_like_rfc3339(&expires[..expires.find(" (").unwrap()]),
        "{out}"
    );
    assert!(!out.contains("secret-body"), "bodies only with --body");
    let o = idem(&file, &[&["get"], &key[..], &["--body"]].concat());
    assert!(stdout(&o).contains("secret-body"));

    let o = idem(
        &file,
        &[
            "get",
            "--tenant",
            "t1",
            "--op",
            "POST /v1/payments",
            "--key",
            "nope",
        ],
    );
    assert!(!o.status.success());
    assert_eq!(stdout(&o).trim(), "absent");

    // Without --yes: refused, the record stays.
    let o = idem(&file, &[&["purge"], &key[..]].concat());
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("pass --yes"),
        "{o:?}"
    );
    assert_eq!(line(&stdout(&idem(&file, &["stats"])), "records"), "2");
    let o = idem(&file, &[&["purge", "--yes"], &key[..]].concat());
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "purged");
    let o = idem(&file, &[&["purge", "--yes"], &key[..]].concat());
    assert!(!o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "absent");
    assert_eq!(line(&stdout(&idem(&file, &["stats"])), "records"), "1");

    let o = idem(&file, &["sweep"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(line(&stdout(&o), "deleted"), "0");
    let o = idem(&file, &["compact"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("bytes_after"));
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`: RFC 3339 in UTC with milliseconds.
fn jiff_like_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 24
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            23 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[test]
fn stats_json_is_one_object_with_the_fields_its_help_and_docs_cli_document() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    {
        let store = Store::open(&file).unwrap();
        put(&store, "a", 201, b"ok");
        put(&store, "b", 201, b"ok");
        let req = Request::from_canonical_bytes(Scope::new("t1", "op"), "c", b"x");
        let _ = store
            .execute(req, |_| Err(Abort::Terminal(Response::new(402, "no"))))
            .unwrap();
    }
    let o = idem(&file, &["stats", "--json"]);
    assert!(o.status.success(), "{o:?}");
    let v = json(&o);
    assert_eq!(v["file"], file.display().to_string());
    assert_eq!(v["file_bytes"], std::fs::metadata(&file).unwrap().len());
    assert_eq!(
        (&v["records"], &v["completed"], &v["failed"], &v["pending"]),
        (&3.into(), &2.into(), &1.into(), &0.into())
    );
    assert_eq!((&v["tombstones"], &v["due"]), (&0.into(), &0.into()));
    assert_eq!(
        (&v["outbox_pending"], &v["dead_letters"]),
        (&0.into(), &0.into())
    );
    let documented = documented_fields(&file, "stats");
    assert_eq!(
        json_fields(&v),
        documented,
        "stats --help lists every field"
    );
    assert_cli_doc_documents(&documented);
    // Without --json, the text lines as before.
    let out = stdout(&idem(&file, &["stats"]));
    assert_eq!(line(&out, "records"), "3");
    // The same exit status as the text form when it fails.
    let missing = dir.path().join("none.redb");
    let o = idem(&missing, &["stats", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty() && stderr(&o).contains("no such store file"));
}

#[test]
fn get_json_is_the_export_object_and_an_absent_key_prints_null_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    {
        let store = Store::open(&file).unwrap();
        let req = Request::from_canonical_bytes(Scope::new("t1", "op"), "k", b"x");
        let _ = store
            .execute(req, |_| {
                Ok(Response::new(201, "secret-body").with_resource("payment", "pay_1"))
            })
            .unwrap();
    }
    let o = get(&file, "k", &["--json"]);
    assert!(o.status.success(), "{o:?}");
    let v = json(&o);
    assert_eq!(
        (&v["tenant"], &v["op"], &v["key"]),
        (&"t1".into(), &"op".into(), &"k".into())
    );
    assert_eq!(v["state"], "completed");
    assert_eq!(v["status"], 201);
    assert_eq!(v["body_bytes"], 11);
    assert_eq!(v["resource"], serde_json::json!(["payment", "pay_1"]));
    assert_eq!(v["fingerprint"].as_str().unwrap().len(), 64);
    assert_eq!(v["expired"], false);
    let created = v["created_at_ms"].as_u64().unwrap();
    assert_eq!(
        v["expires_at_ms"].as_u64().unwrap() - created,
        24 * 3600 * 1000
    );
    assert!(v.get("body").is_none(), "bodies only with --body");
    // The same object as the record's line of `export --jsonl`.
    let export: Value =
        serde_json::from_str(stdout(&idem(&file, &["export", "--jsonl"])).trim()).unwrap();
    assert_eq!(v, export);
    let documented = documented_fields(&file, "get");
    assert_eq!(documented, documented_fields(&file, "export"));
    assert!(json_fields(&v).is_subset(&documented), "{v}");
    assert_cli_doc_documents(&documented);

    let o = get(&file, "k", &["--json", "--body"]);
    let v = json(&o);
    assert_eq!(v["body"], "secret-body");
    assert!(v.get("http").is_none(), "a plain body is no envelope: {v}");

    // An absent key: the exit status and the message of the text form, and `null` where the
    // text form prints `absent`.
    let text = get(&file, "nope", &[]);
    let o = get(&file, "nope", &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(o.status.code(), text.status.code());
    assert_eq!(stdout(&o), "null\n");
    assert_eq!(json(&o), Value::Null);
    assert_eq!(stderr(&o), stderr(&text));
    assert!(stderr(&o).contains(r#"no record for tenant "t1", op "op", key "nope""#));
}

#[test]
fn get_json_of_a_pending_record_has_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    // A lease held by this process while the CLI reads the file (both in multi-process mode).
    let store = Store::builder().multi_process(true).open(&file).unwrap();
    let req = Request::from_canonical_bytes(Scope::new("t1", "op"), "k", b"x");
    let BeginAnswer::Acquired(lease) = store.begin(req).unwrap() else {
        panic!("not claimed");
    };
    let o = idem(
        &file,
        &[
            "--multi-process",
            "get",
            "--tenant",
            "t1",
            "--op",
            "op",
            "--key",
            "k",
            "--json",
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let v = json(&o);
    assert_eq!(v["state"], "pending");
    assert_eq!(v["attempt"], lease.attempt());
    assert_eq!(v["lease_deadline_ms"], lease.deadline().as_millis());
    assert!(
        v.get("status").is_none() && v.get("body_bytes").is_none(),
        "{v}"
    );
    assert!(json_fields(&v).is_subset(&documented_fields(&file, "get")));
    let out = stdout(&idem(
        &file,
        &[
            "--multi-process",
            "get",
            "--tenant",
            "t1",
            "--op",
            "op",
            "--key",
            "k",
        ],
    ));
    assert_eq!(line(&out, "state"), "pending");
    let until = line(&out, "lease_until");
    assert!(until.contains("Z (in ") && until.ends_with("s)"), "{out}");
    lease.release().unwrap();
}

/// The first dump of docs/FORMAT.md, "HTTP layer formats": `201`, `Content-Type:
/// application/json`, `Location: /p/1`, body `{"id":1}`, kept whole.
const IDH1_JSON: &[u8] = b"IDH1\x00\x02\
    \x00\x0ccontent-type\x00\x00\x00\x10application/json\
    \x00\x08location\x00\x00\x00\x04/p/1\
    {\"id\":1}";
/// The second dump: the body was over the cap, `Location: /p/1` and `x-trace: a` kept.
const IDH2_OMITTED: &[u8] = b"IDH2\x01\x00\x02\
    \x00\x08location\x00\x00\x00\x04/p/1\
    \x00\x07x-trace\x00\x00\x00\x01a";

#[test]
fn get_body_decodes_an_http_envelope_and_prints_a_plain_body_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    let binary = [
        &b"IDH1\x00\x01\x00\x0ccontent-type\x00\x00\x00\x18application/octet-stream"[..],
        &[0xff, 0x00, 0xfe],
    ]
    .concat();
    {
        let store = Store::open(&file).unwrap();
        put(&store, "json", 201, IDH1_JSON);
        put(&store, "binary", 200, &binary);
        put(&store, "omitted", 201, IDH2_OMITTED);
        put(&store, "damaged", 201, b"IDH1\x00\x01\x00\x05ab");
        put(&store, "plain", 200, "plain text, caf\u{e9}".as_bytes());
    }
    let text = |key: &str| {
        let o = get(&file, key, &["--body"]);
        assert!(o.status.success(), "{key}: {o:?}");
        stdout(&o)
    };

    let out = text("json");
    assert_eq!(line(&out, "status"), "201");
    assert_eq!(
        line(&out, "body_bytes"),
        "8",
        "the HTTP body, not its envelope"
    );
    assert_eq!(line(&out, "stored_bytes"), IDH1_JSON.len().to_string());
    assert!(line(&out, "envelope").starts_with("IDH1"), "{out}");
    let headers: Vec<&str> = out.lines().filter(|l| l.starts_with("header ")).collect();
    assert_eq!(
        headers,
        [
            "header       content-type: application/json",
            "header       location: /p/1"
        ],
        "{out}"
    );
    assert_eq!(line(&out, "body "), r#"{"id":1}"#);
    assert!(!out.contains("IDH1\u{0}"), "not the raw bytes: {out}");
    // Without --body, neither headers nor body.
    let summary = stdout(&get(&file, "json", &[]));
    assert!(
        !summary.contains("envelope") && !summary.contains("header"),
        "{summary}"
    );
    assert!(!summary.contains(r#"{"id":1}"#), "{summary}");

    let out = text("binary");
    assert_eq!(
        line(&out, "header "),
        "content-type: application/octet-stream"
    );
    assert_eq!(line(&out, "body_hex"), "ff00fe");
    assert!(!out.contains("\nbody "), "{out}");

    let out = text("omitted");
    assert!(line(&out, "envelope").starts_with("IDH2"), "{out}");
    let headers: Vec<&str> = out.lines().filter(|l| l.starts_with("header ")).collect();
    assert_eq!(
        headers,
        ["header       location: /p/1", "header       x-trace: a"]
    );
    assert!(line(&out, "body ").starts_with("(not kept"), "{out}");
    assert!(out.contains("Idempotent-Body-Omitted"), "{out}");

    let out = text("damaged");
    let verdict = line(&out, "envelope");
    assert!(
        verdict.starts_with("DAMAGED: the envelope is cut short"),
        "{out}"
    );
    assert!(verdict.contains("500"), "says what a retry gets: {out}");
    assert_eq!(
        line(&out, "body_hex"),
        "4944483100010005".to_owned() + "6162"
    );

    let out = text("plain");
    assert_eq!(line(&out, "body "), "plain text, caf\u{e9}");
    assert!(
        !out.contains("envelope") && !out.contains("header"),
        "{out}"
    );

    // The same with --json, in the `http` object.
    let documented = documented_fields(&file, "get");
    let object = |key: &str| {
        let v = json(&get(&file, key, &["--body", "--json"]));
        assert!(json_fields(&v).is_subset(&documented), "{key}: {v}");
        v
    };
    let v = object("json");
    assert_eq!(
        v["http"],
        serde_json::json!({
            "envelope": "IDH1",
            "body_omitted": false,
            "headers": [["content-type", "application/json"], ["location", "/p/1"]],
            "body": "{\"id\":1}",
        })
    );
    assert_eq!(v["status"], 201);
    let v = object("binary");
    assert_eq!(v["http"]["body_hex"], "ff00fe");
    assert!(v["http"].get("body").is_none(), "{v}");
    let v = object("omitted");
    assert_eq!(v["http"]["body_omitted"], true);
    assert_eq!(v["http"]["envelope"], "IDH2");
    assert!(v["http"].get("body").is_none() && v["http"].get("body_hex").is_none());
    let v = object("damaged");
    assert!(v.get("http").is_none(), "{v}");
    assert!(
        v["http_error"].as_str().unwrap().contains("cut short"),
        "{v}"
    );
    let v = object("plain");
    assert!(
        v.get("http").is_none() && v.get("http_error").is_none(),
        "{v}"
    );
    assert_eq!(v["body"], "plain text, caf\u{e9}");
}

#[test]
fn purge_of_an_absent_key_exits_like_get_of_an_absent_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    {
        let store = Store::open(&file).unwrap();
        put(&store, "k", 201, b"ok");
    }
    let purge = |key: &str| {
        idem(
            &file,
            &[
                "purge", "--yes", "--tenant", "t1", "--op", "op", "--key", key,
            ],
        )
    };
    let get_absent = get(&file, "nope", &[]);
    let o = purge("nope");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(o.status.code(), get_absent.status.code());
    assert_eq!(stdout(&o), "absent\n");
    let err = stderr(&o);
    assert!(
        err.starts_with(
            r#"idem: no record for tenant "t1", op "op", key "nope": nothing was purged"#
        ),
        "{err}"
    );
    // The record that is there stays; purging it succeeds, and a second purge is absent.
    assert_eq!(line(&stdout(&idem(&file, &["stats"])), "records"), "1");
    let o = purge("k");
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o), "purged\n");
    assert_eq!(purge("k").status.code(), Some(1));
}

#[test]
fn times_are_rfc3339_utc_with_milliseconds_and_how_far_from_now() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    // 2020-01-01T00:00:00.123Z: long past, so every time of the record is "ago".
    let at = Timestamp(1_577_836_800_123);
    {
        let store = Store::builder()
            .clock(ManualClock::new(at))
            .open(&file)
            .unwrap();
        put(&store, "old", 201, b"ok");
    }
    let out = stdout(&get(&file, "old", &[]));
    let created = line(&out, "created_at");
    assert!(created.starts_with("2020-01-01T00:00:00.123Z ("), "{out}");
    // Whole days and the hours past them, truncated; the hours are left out when there are
    // none (this test run within an hour of 00:00:00.123 UTC): "2527d3h ago" or "2527d ago".
    let age = created
        .strip_prefix("2020-01-01T00:00:00.123Z (")
        .and_then(|rest| rest.strip_suffix(" ago)"))
        .unwrap_or_default();
    assert_days_and_hours(age, &out);
    assert!(
        line(&out, "expires_at").starts_with("2020-01-02T00:00:00.123Z ("),
        "{out}"
    );
}

#[test]
fn a_time_past_the_year_9999_is_printed_as_milliseconds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    // Year 11 476: no date shows it; a damaged or foreign record could hold it.
    let far = Timestamp(300_000_000_000_000);
    {
        let store = Store::builder()
            .clock(ManualClock::new(far))
            .open(&file)
            .unwrap();
        put(&store, "far", 201, b"ok");
    }
    let o = get(&file, "far", &[]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    let created = line(&out, "created_at");
    // Whole days and the hours past them; the hours are left out when there are none (one
    // hour in every 24 of the wall clock this test runs at): "in 3451433d5h" or "in 3451433d".
    let rel = created
        .strip_prefix("300000000000000 ms after the Unix epoch, past the year 9999 (in ")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_default();
    assert_days_and_hours(rel, &out);
}

#[test]
fn check_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    {
        let store = Store::open(&file).unwrap();
        for k in ["a", "b"] {
            let req = Request::from_canonical_bytes(Scope::new("t1", "op"), k, b"x");
            let _ = store
                .execute(req, |_| Ok(Response::new(201, format!("body-{k}"))))
                .unwrap();
        }
    }
    let o = idem(&file, &["check"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert!(line(&out, "checking").starts_with("a copy"), "{out}");
    assert_eq!(line(&out, "file_integrity"), "ok");
    // The copy and its journal are gone; the file itself (and its own journal) are left.
    let journal = idem::store::journal_path(&file);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| *p != journal)
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let o = idem(&file, &["check", "--in-place"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(line(&stdout(&o), "file_integrity"), "ok");
    assert_eq!(line(&out, "records_ok"), "2");
    assert_eq!(line(&out, "expiry_index"), "ok");

    let o = idem(&file, &["export", "--jsonl"]);
    assert!(o.status.success(), "{o:?}");
    let rows: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["tenant"], "t1");
    assert_eq!(rows[0]["op"], "op");
    assert_eq!(rows[0]["key"], "a");
    assert_eq!(rows[0]["state"], "completed");
    assert_eq!(rows[0]["status"], 201);
    assert!(rows[0].get("body").is_none());
    let o = idem(&file, &["export", "--jsonl", "--body"]);
    assert!(stdout(&o).contains("body-b"));
    // JSON lines is the only format, and the default.
    let plain = idem(&file, &["export"]);
    assert!(plain.status.success(), "{plain:?}");
    assert_eq!(stdout(&plain), stdout(&idem(&file, &["export", "--jsonl"])));

    // Damage one record behind the store's back: check fails and names it; export reports it.
    {
        let db = idem::redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: idem::redb::TableDefinition<&[u8], &[u8]> =
                idem::redb::TableDefinition::new("idem.records.v1");
            let mut t = txn.open_table(def).unwrap();
            let key = [&[1u8, 0, 2][..], b"t1", &[0, 2], b"op", &[0, 1], b"b"].concat();
            t.insert(key.as_slice(), [0xffu8, 1, 2].as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let o = idem(&file, &["check"]);
    assert!(!o.status.success());
    let out = stdout(&o);
    assert_eq!(line(&out, "records_ok"), "1");
    assert_eq!(line(&out, "records_bad"), "1");
    let o = idem(&file, &["export", "--jsonl"]);
    assert!(o.status.success());
    let bad: serde_json::Value = serde_json::from_str(stdout(&o).lines().nth(1).unwrap()).unwrap();
    assert_eq!(bad["key"], "b");
    assert!(bad["error"].is_string());
}

#[test]
fn check_reports_a_file_that_does_not_open_and_leaves_it_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    std::fs::write(&file, b"this is not a store\n").unwrap();
    let o = idem(&file, &["check"]);
    assert!(!o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert_eq!(line(&out, "file_integrity"), "FAILED", "{out}");
    assert!(out.contains("not a readable redb database"), "{out}");
    assert_eq!(std::fs::read(&file).unwrap(), b"this is not a store\n");
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(files.len(), 1, "the copy is removed: {files:?}");
}

#[test]
fn says_why_it_cannot_open() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.redb");
    let o = idem(&missing, &["stats"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such store file"));
    assert!(!missing.exists(), "the CLI never creates a store");

    // A file another process (here: this one) holds open.
    let file = dir.path().join("idem.redb");
    let store = Store::open(&file).unwrap();
    let o = idem(&file, &["stats"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("another process holds this file"), "{err}");
    drop(store);
    assert!(idem(&file, &["stats"]).status.success());
}

#[test]
fn outbox_stats_list_requeue_discard() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    {
        let store = Store::open(&file).unwrap();
        let req = Request::from_canonical_bytes(Scope::new("t1", "op"), "k", b"x");
        let _ = store
            .execute(req, |tx| {
                tx.outbox().push(
                    idem::outbox::Event::new("payments", "secret-payload-0")
                        .ordering_key("pay_0")
                        .header("type", "payment.captured"),
                )?;
                tx.outbox().push(
                    idem::outbox::Event::new("payments", "secret-payload-1").ordering_key("pay_1"),
                )?;
                Ok(Response::new(201, "ok"))
            })
            .unwrap();
        assert_eq!(outbox_counts(&store), (2, 0));
        // A broker that is always down, and one attempt allowed: both events die.
        let dispatcher = store
            .start_dispatcher(
                |_: &idem::outbox::StoredEvent| -> Result<(), idem::error::BoxError> {
                    Err("broker down\nline two".into())
                },
                idem::outbox::DispatcherOptions::new().max_attempts(1),
            )
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while outbox_counts(&store) != (0, 2) {
            assert!(std::time::Instant::now() < deadline, "no dead letters");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        dispatcher.shutdown().unwrap();
    }

    let o = idem(&file, &["stats"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert_eq!(line(&out, "outbox_pending"), "0");
    assert_eq!(line(&out, "dead_letters"), "2");

    let o = idem(&file, &["outbox", "list"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert_eq!(line(&out, "dead_letters"), "2");
    assert_eq!(line(&out, "seq"), "0");
    assert_eq!(line(&out, "topic"), "payments");
    assert_eq!(line(&out, "ordering_key"), "pay_0");
    assert_eq!(line(&out, "attempts"), "1");
    assert_eq!(line(&out, "error"), "broker down line two");
    assert_eq!(line(&out, "payload_bytes"), "16");
    assert_eq!(line(&out, "id").len(), 64);
    assert_eq!(out.matches("\nseq ").count(), 2, "{out}");
    assert!(!out.contains("secret-payload"), "payloads only with --body");
    assert!(
        !out.contains("payment.captured"),
        "headers only with --body"
    );
    let o = idem(&file, &["outbox", "list", "--body", "--limit", "1"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains("secret-payload-0"), "{out}");
    assert!(out.contains("type: payment.captured"), "{out}");
    assert!(!out.contains("secret-payload-1"), "--limit 1");
    assert!(out.contains("--limit"), "says more are left: {out}");

    let o = idem(&file, &["outbox", "requeue", "0"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "requeued");
    let out = stdout(&idem(&file, &["stats"]));
    assert_eq!(line(&out, "outbox_pending"), "1");
    assert_eq!(line(&out, "dead_letters"), "1");

    let o = idem(&file, &["outbox", "discard", "1"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "discarded");
    let out = stdout(&idem(&file, &["stats"]));
    assert_eq!(line(&out, "outbox_pending"), "1");
    assert_eq!(line(&out, "dead_letters"), "0");
    assert_eq!(
        line(&stdout(&idem(&file, &["outbox", "list"])), "dead_letters"),
        "0"
    );

    // Unknown (or already handled) sequence numbers fail and say so.
    for cmd in ["requeue", "discard"] {
        let o = idem(&file, &["outbox", cmd, "1"]);
        assert!(!o.status.success(), "{cmd}: {o:?}");
        assert_eq!(stdout(&o).trim(), "absent");
        assert!(String::from_utf8_lossy(&o.stderr).contains("no dead letter with seq 1"));
    }

    // The requeued event is the one that was dead, with its attempts reset.
    let store = Store::open(&file).unwrap();
    let pending = store.pending_events(10).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].seq, 0);
    assert_eq!(pending[0].payload, b"secret-payload-0");
    assert_eq!(pending[0].failed_attempts, 0);
}

/// (pending, dead) through the library.
fn outbox_counts(store: &Store) -> (u64, u64) {
    let s = store.outbox_stats().unwrap();
    (s.pending, s.dead)
}

/// `--multi-process`: `check` and `stats` work on a file a multi-process writer holds open (the
/// copy is made under a read transaction, so the writer's commits cannot reuse its pages), and
/// the writer keeps committing after them.
#[test]
fn check_and_stats_beside_a_multi_process_writer() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    let store = Store::builder().multi_process(true).open(&file).unwrap();
    let put = |k: &str| {
        let req = Request::from_canonical_bytes(Scope::new("t1", "op"), k, b"x");
        let outcome = store
            .execute(req, |_| Ok(Response::new(201, format!("body-{k}"))))
            .unwrap();
        assert!(matches!(outcome, idem::ExecuteAnswer::Ran(_)));
    };
    for i in 0..20 {
        put(&format!("k{i}"));
    }
    let o = idem(&file, &["--multi-process", "check"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert_eq!(line(&out, "file_integrity"), "ok", "{out}");
    assert_eq!(line(&out, "records_ok"), "20", "{out}");
    assert_eq!(line(&out, "expiry_index"), "ok", "{out}");
    let o = idem(&file, &["--multi-process", "stats"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(line(&stdout(&o), "records"), "20");
    put("after");
    drop(store);
    let o = idem(&file, &["stats"]);
    assert_eq!(line(&stdout(&o), "records"), "21", "{o:?}");
}

/// The mistakes an operator makes first get a message that fits them: a path that is no store
/// (a text file, an empty file) says so and no recovery essay; a write command on a file a
/// service holds names what to do for that command (never a flag it does not take).
#[test]
fn an_operators_first_mistakes_get_a_message_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a store\n").unwrap();
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").unwrap();
    for file in [&text, &empty] {
        for args in [&["stats"][..], &["export"], &["sweep"], &["check"]] {
            let o = idem(file, args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
            if args[0] == "check" {
                continue; // check reports on its copy in its own words
            }
            assert!(err.contains("not an idem store"), "{args:?}: {err}");
            assert!(err.contains("check the path"), "{args:?}: {err}");
            assert!(!err.contains("report it"), "{args:?}: {err}");
        }
    }

    let file = dir.path().join("idem.redb");
    let store = Store::open(&file).unwrap();
    put(&store, "k", 201, b"ok");
    for args in [&["sweep"][..], &["compact"]] {
        let o = idem(&file, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        assert!(err.contains("stop it first"), "{args:?}: {err}");
        assert!(
            !err.contains("--in-place"),
            "{args:?} takes no --in-place: {err}"
        );
    }
}
