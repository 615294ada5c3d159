//! The two formats the HTTP layer persists are pinned byte for byte (docs/FORMAT.md, "HTTP
//! layer formats"): the `idem-http-v1` request fingerprint stored in every record the layer
//! claims, and the `IDH1` / `IDH2` envelope in which it records an answer's replayed headers
//! and body. A retry is answered from these bytes, possibly by another release: a change to
//! either that no test notices would turn retries of stored intents into `422`s or unreadable
//! answers.
//!
//! Through the public API only: requests go through an `IdempotencyLayer`, and the stored
//! record is read back with `Store::get`. A fingerprint builder and an envelope decoder written
//! from docs/FORMAT.md alone must agree with what the layer stored, and the annotated dumps in
//! docs/FORMAT.md must be exactly what that decoder prints for the golden values. To reprint
//! them after an intended format change (which needs a new tag, see docs/FORMAT.md):
//! `cargo test --all-features --test http_formats_are_pinned -- --ignored --nocapture print_http_format_dumps`.

#![cfg(feature = "http")]

use crate::common;

use common::dump::{format_md, hex_row, printable};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Request, StatusCode};
use axum::routing::any;
use idem::format::State;
use idem::http::IdempotencyLayer;
use idem::{BeginAnswer, Scope, Store};

use crate::http_fixtures;
use http_fixtures::send;

/// The blake3 key-derivation context of the fingerprint (docs/FORMAT.md, "Fingerprints and
/// downstream keys": `Fingerprint::of_bytes`).
const CONTEXT: &str = "idem 2026-11-30 request fingerprint: canonical bytes v1";
/// The tag that opens a fingerprint input whose body part is the body as sent.
const TAG: &[u8] = b"idem-http-v1";
/// The tag when the body part is the body's RFC 8785 canonical JSON.
const TAG_JCS: &[u8] = b"idem-http-v1+jcs";
/// The tag when the body part is what `.fingerprint_body_with(f)` returned.
const TAG_CUSTOM: &[u8] = b"idem-http-v1+custom";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One annotated run of bytes of a dump.
struct Seg {
    offset: usize,
    bytes: Vec<u8>,
    what: String,
}

/// The annotated dump, as it appears in docs/FORMAT.md: 16 bytes a line at most.
fn render(segs: &[Seg]) -> String {
    let mut out = String::from(" off  bytes                                            field\n");
    for s in segs {
        out += &format!("{:>4}  {:<47}  {}\n", s.offset, hex_row(&s.bytes), s.what);
    }
    out
}

/// Appends `bytes` to `segs` as `what`, split into lines of 16 bytes.
fn push(segs: &mut Vec<Seg>, at: &mut usize, bytes: &[u8], what: &str) {
    if bytes.is_empty() {
        segs.push(Seg {
            offset: *at,
            bytes: Vec::new(),
            what: what.to_owned(),
        });
    }
    let lines = bytes.len().div_ceil(16);
    for (i, chunk) in bytes.chunks(16).enumerate() {
        let what = if lines > 1 {
            format!("{what} [{}..{}]", i * 16, i * 16 + chunk.len())
        } else {
            what.to_owned()
        };
        segs.push(Seg {
            offset: *at,
            bytes: chunk.to_vec(),
            what,
        });
        *at += chunk.len();
    }
}

// ---- the request fingerprint ----

/// One request of the fingerprint table.
struct Fp {
    what: &'static str,
    method: &'static str,
    /// The route template; the operation is `"{method} {template}"`.
    template: &'static str,
    /// The request target (path and query).
    target: &'static str,
    /// `.fingerprint_headers(...)`, in this order.
    selected: &'static [&'static str],
    /// Header field lines sent besides the tenant and the key, in this order.
    lines: &'static [(&'static str, &'static str)],
    body: &'static str,
    /// The layer's body mode.
    mode: Mode,
    /// The body part of the input, as docs/FORMAT.md says it is taken from this request.
    part: Part,
    /// The row whose fingerprint this one shares (the table shows what compares alike).
    same_as: Option<&'static str>,
    pinned: &'static str,
}

/// The layer's body mode of a row.
#[derive(Clone, Copy)]
enum Mode {
    /// The default: a body labelled JSON is compared as JSON.
    Default,
    /// `.raw_body()`.
    RawBody,
    /// `.canonical_json_body()`.
    CanonicalJsonBody,
    /// `.fingerprint_body_with(f)`, `f` = the text of the body's member `n`.
    MemberN,
}

/// The body part of a row's input, and so its tag.
#[derive(Clone, Copy)]
enum Part {
    /// The body as sent, under `idem-http-v1`.
    AsSent,
    /// This RFC 8785 canonical JSON of the body, under `idem-http-v1+jcs`.
    Jcs(&'static str),
    /// These bytes from `f`, under `idem-http-v1+custom`.
    Custom(&'static str),
}

impl Fp {
    fn operation(&self) -> String {
        format!("{} {}", self.method, self.template)
    }

    /// The tag and the body part of the input.
    fn tag_and_part(&self) -> (&'static [u8], &'static str) {
        match self.part {
            Part::AsSent => (TAG, self.body),
            Part::Jcs(canonical) => (TAG_JCS, canonical),
            Part::Custom(picked) => (TAG_CUSTOM, picked),
        }
    }

    /// The fingerprint input as docs/FORMAT.md gives it, field by field:
    /// `F(x) = u64be(len x) ‖ x`; `F(tag) ‖ F(method) ‖ F(operation) ‖
    /// F(path and query) ‖ (F(name) ‖ F(u64be(count)) ‖ F(value)*)* ‖ F(body part)`.
    fn documented_input(&self) -> Vec<Seg> {
        let mut segs = Vec::new();
        let mut at = 0;
        let mut field = |segs: &mut Vec<Seg>, what: &str, b: &[u8]| {
            let len = format!("length = {}", b.len());
            push(segs, &mut at, &(b.len() as u64).to_be_bytes(), &len);
            let shown = match <[u8; 8]>::try_from(b) {
                Ok(count) if what == "field lines" => u64::from_be_bytes(count).to_string(),
                _ => printable(b),
            };
            push(segs, &mut at, b, &format!("{what} = {shown}"));
        };
        let (tag, part) = self.tag_and_part();
        field(&mut segs, "tag", tag);
        field(&mut segs, "method", self.method.as_bytes());
        field(&mut segs, "operation", self.operation().as_bytes());
        field(&mut segs, "path and query", self.target.as_bytes());
        for name in self.selected {
            field(&mut segs, "header name", name.as_bytes());
            let values: Vec<&str> = self
                .lines
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .collect();
            field(
                &mut segs,
                "field lines",
                &(values.len() as u64).to_be_bytes(),
            );
            for v in values {
                field(&mut segs, "value", v.as_bytes());
            }
        }
        field(&mut segs, "body", part.as_bytes());
        segs
    }

    /// The row as docs/FORMAT.md's table shows it.
    fn describe(&self) -> String {
        let mut s = format!(
            "`{}` `{}` (route `{}`)",
            self.method, self.target, self.template
        );
        if !self.selected.is_empty() {
            s += &format!(", selected `{}`", self.selected.join("`, `"));
        }
        let lines: Vec<String> = self
            .lines
            .iter()
            .map(|(n, v)| format!("`{n}: {v}`"))
            .collect();
        if !lines.is_empty() {
            s += &format!(", lines {}", lines.join(", "));
        }
        if self.body.is_empty() {
            s += ", no body";
        } else {
            s += &format!(", body `{}`", self.body);
        }
        match self.mode {
            Mode::Default => {}
            Mode::RawBody => s += ", `.raw_body()`",
            Mode::CanonicalJsonBody => s += ", `.canonical_json_body()`",
            Mode::MemberN => s += ", `.fingerprint_body_with(f)` (`f`: the member `n` as JSON)",
        }
        match self.part {
            Part::AsSent => {}
            Part::Jcs(c) => s += &format!("; body part `{c}` under `idem-http-v1+jcs`"),
            Part::Custom(c) => s += &format!("; body part `{c}` under `idem-http-v1+custom`"),
        }
        if let Some(row) = self.same_as {
            s += &format!("; the fingerprint of \"{row}\"");
        }
        s
    }

    fn documented_fingerprint(&self) -> String {
        let input: Vec<u8> = self
            .documented_input()
            .into_iter()
            .flat_map(|s| s.bytes)
            .collect();
        let mut h = blake3::Hasher::new_derive_key(CONTEXT);
        h.update(&input);
        hex(h.finalize().as_bytes())
    }

    fn request(&self, key: &str, tenant: &str) -> Request<Body> {
        let mut req = Request::builder()
            .method(self.method)
            .uri(self.target)
            .header("x-tenant-id", tenant)
            .header("idempotency-key", key)
            .body(Body::from(self.body))
            .unwrap();
        for (n, v) in self.lines {
            req.headers_mut()
                .append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        req
    }

    fn selected(&self) -> Vec<HeaderName> {
        self.selected
            .iter()
            .map(|n| HeaderName::from_static(n))
            .collect()
    }

    /// A router with this request's route behind a layer that selects its headers, in the
    /// row's body mode.
    fn router(&self, layer: IdempotencyLayer) -> Router {
        let layer = match self.mode {
            Mode::Default => layer,
            Mode::RawBody => layer.raw_body(),
            Mode::CanonicalJsonBody => layer.canonical_json_body(),
            Mode::MemberN => layer.fingerprint_body_with(|_, body| {
                let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
                v["n"].to_string().into_bytes()
            }),
        };
        Router::new()
            .route(self.template, any(|| async { StatusCode::CREATED }))
            .route_layer(layer.fingerprint_headers(self.selected()))
    }
}

/// The fingerprint table: each row differs from the first in one thing (or shows an edge).
fn fingerprint_table() -> Vec<Fp> {
    let base = || Fp {
        what: "",
        method: "POST",
        template: "/p/{id}",
        target: "/p/1",
        selected: &[],
        lines: &[],
        body: r#"{"n":1}"#,
        mode: Mode::Default,
        part: Part::AsSent,
        same_as: None,
        pinned: "",
    };
    const JSON: &[(&str, &str)] = &[("content-type", "application/json")];
    vec![
        Fp {
            what: "a JSON body",
            pinned: "71b0ed727b942c0e8119b64355780ce16da583753534a4102d3e0b1f848f43ce",
            ..base()
        },
        Fp {
            what: "an empty body",
            body: "",
            pinned: "439767dd773ea74e4f34f74e02ebd40bad59647bdfc8a1d8de008b5b831bcdd8",
            ..base()
        },
        Fp {
            what: "a query string",
            target: "/p/1?v=2",
            pinned: "736f3cb53e1c9177d748f2918d3c2947d32d45224bc2fc8e67dbc675fa43db17",
            ..base()
        },
        Fp {
            what: "another target of the same route",
            target: "/p/12",
            pinned: "d7d7ff6d7368d9d5a32aa1ca1657c7038cc93c541ae03994e8a767272163c1f3",
            ..base()
        },
        Fp {
            what: "the row above with the target's last byte moved into the body",
            target: "/p/1",
            body: r#"2{"n":1}"#,
            pinned: "4532c077c913e36fe64fae731703c3dd9704cd8ef7fd1f563357f9f6a8e2ce1d",
            ..base()
        },
        Fp {
            what: "another route template for the same target",
            template: "/p/{pid}",
            pinned: "143e097efa3818155980ada29553220ef7b39bfe551fefb7596c53e362e1cb66",
            ..base()
        },
        Fp {
            what: "another method",
            method: "PUT",
            pinned: "9549c1f962e2f8d7731293ab8bf4c7df6e72931ec98bf03f36aac4ffc6978b96",
            ..base()
        },
        Fp {
            what: "a selected header, absent",
            selected: &["x-a"],
            pinned: "8b6741e505acb42eaaf432aa1d63c17077db11e64469e2c3de8609c17ffeeef8",
            ..base()
        },
        Fp {
            what: "a selected header, empty",
            selected: &["x-a"],
            lines: &[("x-a", "")],
            pinned: "a98358d6950523f1c2c8f71bcafd41b08141921d77bd17aa6bf0581e49fb3447",
            ..base()
        },
        Fp {
            what: "a selected header, one line",
            target: "/p/1?v=2",
            selected: &["x-a"],
            lines: &[("x-a", "1")],
            body: "{}",
            pinned: "81124883beb225641a2b1e8fa431efdc69f9215658d61901148d3232ddef7434",
            ..base()
        },
        Fp {
            what: "a selected header, two lines",
            selected: &["x-a"],
            lines: &[("x-a", "1"), ("x-a", "2")],
            pinned: "5be77c7f492e98e3f773d3aa9d6f8e752e9ca4dbe95fc90d602569bb645d8c72",
            ..base()
        },
        Fp {
            what: "a selected header, the two lines in the other order",
            selected: &["x-a"],
            lines: &[("x-a", "2"), ("x-a", "1")],
            pinned: "46d9784f56303fe0e2457fc6bec4e57f2f819610f701649aeca9198e27e4d63e",
            ..base()
        },
        Fp {
            what: "two selected headers",
            selected: &["x-a", "x-b"],
            lines: &[("x-b", "2"), ("x-a", "1")],
            pinned: "36a52d1d8b948d387fe8de37fb03eb522f8adaeaf41dff681312e5e0c3bf6d99",
            ..base()
        },
        Fp {
            what: "two selected headers, selected in the other order",
            selected: &["x-b", "x-a"],
            lines: &[("x-b", "2"), ("x-a", "1")],
            pinned: "06de7f71362eec180690831db2120d2e307db5fe51b7966000d647eeb9436d02",
            ..base()
        },
        // The body part: JSON is compared as JSON when the request labels it so.
        Fp {
            what: "a JSON body labelled JSON",
            lines: JSON,
            part: Part::Jcs(r#"{"n":1}"#),
            pinned: "d8c99d90848463c80aae114e58fa214635e2e39c16eae0040c95fbd808ff551d",
            ..base()
        },
        Fp {
            what: "the same JSON re-serialised, labelled with a parameter",
            lines: &[("content-type", "Application/JSON; charset=utf-8")],
            body: r#"{ "n" : 1.0 }"#,
            part: Part::Jcs(r#"{"n":1}"#),
            same_as: Some("a JSON body labelled JSON"),
            pinned: "d8c99d90848463c80aae114e58fa214635e2e39c16eae0040c95fbd808ff551d",
            ..base()
        },
        Fp {
            what: "a +json type, members out of order",
            lines: &[("content-type", "application/merge-patch+json")],
            body: r#"{"n":1,"a":[true,null]}"#,
            part: Part::Jcs(r#"{"a":[true,null],"n":1}"#),
            pinned: "8cbb3d74df44341353da972266e91a83e324e26d31c77b9ab7c8eeb33dd3caac",
            ..base()
        },
        Fp {
            what: "labelled JSON, not JSON",
            lines: JSON,
            body: r#"{"n":1"#,
            pinned: "c9d3fa8604e805e98844d0ce17348c75bf88c6a4bba1144befeea28d54a32176",
            ..base()
        },
        Fp {
            what: "labelled JSON, a member name twice",
            lines: JSON,
            body: r#"{"n":1,"n":1}"#,
            pinned: "6ab38f9c89a9f795aa38fdc0064892f175909b975aa063f2320a3915a7f98769",
            ..base()
        },
        Fp {
            what: "labelled JSON, a number RFC 8785 would round",
            lines: JSON,
            body: r#"{"n":9007199254740993}"#,
            pinned: "b6a99220151a6ff448c658e2e8a04439d6fe189f9d1adb756c6b06ceb313f3c0",
            ..base()
        },
        Fp {
            what: "a JSON body labelled text/plain",
            lines: &[("content-type", "text/plain")],
            same_as: Some("a JSON body"),
            pinned: "71b0ed727b942c0e8119b64355780ce16da583753534a4102d3e0b1f848f43ce",
            ..base()
        },
        Fp {
            what: "a JSON body labelled JSON, under `.raw_body()`",
            lines: JSON,
            mode: Mode::RawBody,
            same_as: Some("a JSON body"),
            pinned: "71b0ed727b942c0e8119b64355780ce16da583753534a4102d3e0b1f848f43ce",
            ..base()
        },
        Fp {
            what: "an unlabelled JSON body under `.canonical_json_body()`",
            body: r#"{ "n": 1 }"#,
            mode: Mode::CanonicalJsonBody,
            part: Part::Jcs(r#"{"n":1}"#),
            same_as: Some("a JSON body labelled JSON"),
            pinned: "d8c99d90848463c80aae114e58fa214635e2e39c16eae0040c95fbd808ff551d",
            ..base()
        },
        Fp {
            what: "a custom body part",
            lines: JSON,
            body: r#"{"n":1,"ts":7}"#,
            mode: Mode::MemberN,
            part: Part::Custom("1"),
            pinned: "5f5209cad0e46b02749933effd65db43f1d08e5713972a66c0708c04aa336d67",
            ..base()
        },
    ]
}

/// The row whose input docs/FORMAT.md shows as an annotated dump.
const DUMPED_ROW: &str = "a selected header, one line";

fn layer(store: &Store) -> IdempotencyLayer {
    IdempotencyLayer::tenant_header(store.clone(), "x-tenant-id")
}

/// The fingerprint of the record the layer stored for `key`.
fn stored_fingerprint(store: &Store, tenant: &str, operation: &str, key: &str) -> String {
    let record = store
        .get(&Scope::new(tenant, operation), key)
        .unwrap()
        .unwrap_or_else(|| panic!("no record for {tenant}/{operation}/{key}"));
    record.fingerprint.to_hex()
}

#[tokio::test]
async fn fingerprints_are_pinned_through_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    let store = http_fixtures::store(&dir);
    for (i, fp) in fingerprint_table().iter().enumerate() {
        let key = format!("k{i}");
        let (status, _, _) = send(&fp.router(layer(&store)), fp.request(&key, "t1")).await;
        assert_eq!(status, StatusCode::CREATED, "{}", fp.what);
        let stored = stored_fingerprint(&store, "t1", &fp.operation(), &key);
        // The public function is what the layer stores under its default body mode.
        let (parts, _) = fp.request(&key, "t1").into_parts();
        let public = idem::http::request_fingerprint(
            &parts,
            &fp.operation(),
            &fp.selected(),
            fp.body.as_bytes(),
        );
        if matches!(fp.mode, Mode::Default) {
            assert_eq!(public.to_hex(), stored, "{}", fp.what);
        }
        // It is the documented input under the documented context, and the pinned value.
        assert_eq!(stored, fp.documented_fingerprint(), "{}", fp.what);
        assert_eq!(stored, fp.pinned, "{}: the fingerprint changed", fp.what);
    }
}

#[test]
fn every_row_of_the_table_has_its_own_fingerprint() {
    // Unless it names the row it shares one with: those rows show what compares alike.
    let table = fingerprint_table();
    let mut seen = std::collections::BTreeMap::new();
    for fp in table.iter().filter(|fp| fp.same_as.is_none()) {
        if let Some(other) = seen.insert(fp.pinned, fp.what) {
            panic!("{:?} and {:?} share a fingerprint", fp.what, other);
        }
    }
    for fp in table.iter().filter(|fp| fp.same_as.is_some()) {
        let twin = table
            .iter()
            .find(|t| Some(t.what) == fp.same_as && t.same_as.is_none())
            .unwrap_or_else(|| panic!("{:?}: no row {:?}", fp.what, fp.same_as));
        assert_eq!(fp.pinned, twin.pinned, "{:?}", fp.what);
    }
    assert_eq!(
        seen.len() + table.iter().filter(|fp| fp.same_as.is_some()).count(),
        table.len()
    );
}

#[tokio::test]
async fn neither_the_tenant_nor_the_key_nor_an_unselected_header_is_hashed() {
    // Tenant and key name the record (docs/FORMAT.md, "Record key"); the fingerprint binds
    // the request to it, through the headers selected with `.fingerprint_headers(...)` only.
    let dir = tempfile::tempdir().unwrap();
    let store = http_fixtures::store(&dir);
    let fp = &fingerprint_table()[0];
    for (tenant, key, extra) in [
        ("t1", "k1", None),
        ("t2", "k2", None),
        ("t1", "k3", Some("1")),
    ] {
        let mut req = fp.request(key, tenant);
        if let Some(v) = extra {
            req.headers_mut().append("x-a", HeaderValue::from_static(v));
        }
        send(&fp.router(layer(&store)), req).await;
        let stored = stored_fingerprint(&store, tenant, &fp.operation(), key);
        assert_eq!(stored, fp.pinned, "{tenant}/{key}/{extra:?}");
    }
}

#[tokio::test]
async fn an_operation_override_is_the_operation_hashed() {
    let dir = tempfile::tempdir().unwrap();
    let store = http_fixtures::store(&dir);
    let fp = &fingerprint_table()[0];
    let app = Router::new()
        .route(fp.template, any(|| async { StatusCode::CREATED }))
        .route_layer(layer(&store).operation(|_| Some("pay".to_owned())));
    send(&app, fp.request("k1", "t1")).await;
    let stored = stored_fingerprint(&store, "t1", "pay", "k1");
    let (parts, _) = fp.request("k1", "t1").into_parts();
    assert_eq!(
        stored,
        idem::http::request_fingerprint(&parts, "pay", &[], fp.body.as_bytes()).to_hex()
    );
    assert_eq!(
        stored,
        "b80db419424dabe59e2aa7466a831cc03542deee9ad421ae95cedeb796db759f"
    );
}

// ---- the envelope of a recorded answer ----

/// One answer of the envelope table: what the handler answers, under which layer and store
/// settings, and what the store must hold afterwards.
struct Env {
    what: &'static str,
    /// The store's `max_response_bytes`.
    cap: usize,
    /// `.replay_headers(...)`; `None`: the default (`Content-Type`, `Location`).
    replay: Option<&'static [&'static str]>,
    status: u16,
    /// The handler's header field lines, in this order.
    headers: &'static [(&'static str, &'static str)],
    /// The handler's body: `body` repeated `times` times.
    body: &'static [u8],
    times: usize,
    /// The stored response: `Failed` (4xx, 5xx) or `Completed`, its resource pointer of kind
    /// `"location"`, and its bytes.
    failed: bool,
    location: Option<&'static str>,
    golden: &'static [u8],
    /// What a retry gets: header field lines besides `Idempotent-Replayed: true`, and the body.
    replayed: &'static [(&'static str, &'static str)],
}

fn envelope_table() -> Vec<Env> {
    vec![
        Env {
            what: "IDH1: an answer kept whole, with Content-Type and Location",
            cap: 64 * 1024,
            replay: None,
            status: 201,
            headers: &[
                ("content-type", "application/json"),
                ("location", "/p/1"),
                ("x-not-replayed", "dropped"),
            ],
            body: br#"{"id":1}"#,
            times: 1,
            failed: false,
            location: Some("/p/1"),
            golden: b"IDH1\x00\x02\
                \x00\x0ccontent-type\x00\x00\x00\x10application/json\
                \x00\x08location\x00\x00\x00\x04/p/1\
                {\"id\":1}",
            replayed: &[("content-type", "application/json"), ("location", "/p/1")],
        },
        Env {
            what: "IDH1: a kept replay header on two lines, in replay-set order",
            cap: 64 * 1024,
            replay: Some(&["x-trace", "content-type"]),
            status: 200,
            headers: &[
                ("content-type", "text/plain"),
                ("x-trace", "a"),
                ("x-trace", "b"),
            ],
            body: b"ok",
            times: 1,
            failed: false,
            location: None,
            golden: b"IDH1\x00\x03\
                \x00\x07x-trace\x00\x00\x00\x01a\
                \x00\x07x-trace\x00\x00\x00\x01b\
                \x00\x0ccontent-type\x00\x00\x00\x0atext/plain\
                ok",
            replayed: &[
                ("x-trace", "a"),
                ("x-trace", "b"),
                ("content-type", "text/plain"),
            ],
        },
        Env {
            what: "IDH1: no header, no body",
            cap: 64 * 1024,
            replay: None,
            status: 204,
            headers: &[],
            body: b"",
            times: 0,
            failed: false,
            location: None,
            golden: b"IDH1\x00\x00",
            replayed: &[],
        },
        Env {
            what: "IDH1: a terminal failure",
            cap: 64 * 1024,
            replay: None,
            status: 422,
            headers: &[("content-type", "text/plain")],
            body: b"no",
            times: 1,
            failed: true,
            location: None,
            golden: b"IDH1\x00\x01\
                \x00\x0ccontent-type\x00\x00\x00\x0atext/plain\
                no",
            replayed: &[("content-type", "text/plain")],
        },
        Env {
            what: "IDH2: the body omitted, Location and a kept replay header stay",
            cap: 64,
            replay: Some(&["content-type", "location", "x-trace"]),
            status: 201,
            headers: &[
                ("content-type", "application/json"),
                ("location", "/p/1"),
                ("x-trace", "a"),
            ],
            body: b"x",
            times: 100,
            failed: false,
            location: Some("/p/1"),
            golden: b"IDH2\x01\x00\x02\
                \x00\x08location\x00\x00\x00\x04/p/1\
                \x00\x07x-trace\x00\x00\x00\x01a",
            replayed: &[
                ("location", "/p/1"),
                ("x-trace", "a"),
                ("idempotent-body-omitted", "true"),
            ],
        },
        Env {
            what: "IDH2: the body omitted, no Location",
            cap: 64,
            replay: Some(&["content-type", "location", "x-trace"]),
            status: 200,
            headers: &[("content-type", "text/csv"), ("x-trace", "a")],
            body: b"x",
            times: 100,
            failed: false,
            location: None,
            golden: b"IDH2\x01\x00\x01\
                \x00\x07x-trace\x00\x00\x00\x01a",
            replayed: &[("x-trace", "a"), ("idempotent-body-omitted", "true")],
        },
        Env {
            what: "IDH2: the body omitted, no header fits",
            cap: 8,
            replay: None,
            status: 200,
            headers: &[("content-type", "text/csv")],
            body: b"x",
            times: 100,
            failed: false,
            location: None,
            golden: b"IDH2\x01\x00\x00",
            replayed: &[("idempotent-body-omitted", "true")],
        },
    ]
}

/// The rows whose bytes docs/FORMAT.md shows as annotated dumps.
const DUMPED_ENVELOPES: [usize; 2] = [0, 4];

/// An envelope decoded following docs/FORMAT.md alone.
#[derive(Debug, PartialEq)]
struct Decoded {
    flags: u8,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// Reads a byte string front to back, annotating what it takes.
struct Reader<'a> {
    rest: &'a [u8],
    at: usize,
    segs: Vec<Seg>,
}

impl<'a> Reader<'a> {
    /// The next `n` bytes, annotated by `what` of them.
    fn take(&mut self, n: usize, what: impl Fn(&[u8]) -> String) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!("{n} bytes wanted, {} left", self.rest.len()));
        }
        let (head, tail) = self.rest.split_at(n);
        push(&mut self.segs, &mut self.at, head, &what(head));
        self.rest = tail;
        Ok(head)
    }

    fn u16be(&mut self, what: &str) -> Result<u16, String> {
        let b = self.take(2, |b| {
            format!("{what} = {}", u16::from_be_bytes([b[0], b[1]]))
        })?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32be(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, |b| {
            format!("{what} = {}", u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        })?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Decodes envelope bytes following docs/FORMAT.md alone, returning the annotated fields.
/// `Ok(None)`: no magic, the bytes are a body without headers.
fn walk_envelope(bytes: &[u8]) -> Result<(Vec<Seg>, Option<Decoded>), String> {
    let mut r = Reader {
        rest: bytes,
        at: 0,
        segs: Vec::new(),
    };
    let flags = match bytes.get(..4) {
        Some(b"IDH1") => {
            r.take(4, |_| "magic = IDH1".into())?;
            0
        }
        Some(b"IDH2") => {
            r.take(4, |_| "magic = IDH2".into())?;
            let flags = r.take(1, |b| {
                let known = if b[0] == 0x01 { " (body omitted)" } else { "" };
                format!("flags = 0x{:02x}{known}", b[0])
            })?[0];
            if flags & !0x01 != 0 {
                return Err(format!("unknown flags 0x{flags:02x}"));
            }
            flags
        }
        _ => return Ok((r.segs, None)),
    };
    let count = r.u16be("header count")?;
    let mut headers = Vec::new();
    for _ in 0..count {
        let n = r.u16be("name length")?;
        let name = r.take(usize::from(n), |b| format!("name = {}", printable(b)))?;
        let name = String::from_utf8(name.to_vec()).map_err(|e| e.to_string())?;
        if name.is_empty()
            || !name.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.!#$%&'*+^`|~".contains(&b)
            })
        {
            return Err(format!("{name:?} is not a lowercase header name"));
        }
        let n = r.u32be("value length")?;
        let value = r.take(n as usize, |b| format!("value = {}", printable(b)))?;
        if let Some(b) = value
            .iter()
            .find(|&&b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(format!("byte 0x{b:02x} in the value of {name}"));
        }
        headers.push((name, value.to_vec()));
    }
    let body = r.rest.to_vec();
    if flags & 0x01 != 0 && !body.is_empty() {
        return Err("a body after the body-omitted flag".into());
    }
    if !body.is_empty() {
        r.take(body.len(), |b| format!("body = {}", printable(b)))?;
    }
    Ok((
        r.segs,
        Some(Decoded {
            flags,
            headers,
            body,
        }),
    ))
}

fn dump_envelope(bytes: &[u8]) -> String {
    let (segs, _) = walk_envelope(bytes).unwrap_or_else(|e| panic!("golden rejected: {e}"));
    render(&segs)
}

impl Env {
    fn body(&self) -> Vec<u8> {
        self.body.repeat(self.times)
    }

    /// A route `POST /p/{id}` that answers this row's answer, behind a layer on `store`.
    fn router(&self, store: &Store) -> Router {
        let status = StatusCode::from_u16(self.status).unwrap();
        let headers = self.headers;
        let body = self.body();
        let mut layer = layer(store);
        if let Some(names) = self.replay {
            layer = layer.replay_headers(names.iter().map(|n| HeaderName::from_static(n)));
        }
        Router::new()
            .route(
                "/p/{id}",
                any(move || {
                    let body = body.clone();
                    async move {
                        let mut resp = axum::response::Response::new(Body::from(body));
                        *resp.status_mut() = status;
                        for (n, v) in headers {
                            resp.headers_mut()
                                .append(HeaderName::from_static(n), HeaderValue::from_static(v));
                        }
                        resp
                    }
                }),
            )
            .route_layer(layer)
    }
}

fn post(key: &str) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri("/p/1")
        .header("x-tenant-id", "t1")
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn envelopes_are_pinned_through_the_layer() {
    for env in envelope_table() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::builder()
            .max_response_bytes(env.cap)
            .open(dir.path().join("idem.redb"))
            .unwrap();
        let app = env.router(&store);
        let (status, _, first) = send(&app, post("k")).await;
        assert_eq!(status.as_u16(), env.status, "{}", env.what);
        assert_eq!(
            &first[..],
            &env.body()[..],
            "{}: the first answer",
            env.what
        );

        let record = store
            .get(&Scope::new("t1", "POST /p/{id}"), "k")
            .unwrap()
            .unwrap();
        let stored = match (record.state, env.failed) {
            (State::Completed(r), false) | (State::Failed(r), true) => r,
            (other, _) => panic!("{}: {other:?}", env.what),
        };
        assert_eq!(stored.status(), env.status, "{}", env.what);
        assert_eq!(
            stored.resource().map(|r| (r.kind.as_str(), r.id.as_str())),
            env.location.map(|id| ("location", id)),
            "{}",
            env.what
        );
        assert_eq!(
            stored.body(),
            env.golden,
            "{}: the envelope changed; stored {}",
            env.what,
            hex_row(stored.body())
        );

        // A retry is answered from those bytes.
        let (status, headers, body) = send(&app, post("k")).await;
        assert_eq!(status.as_u16(), env.status, "{}", env.what);
        let mut expected: Vec<(String, Vec<u8>)> = env
            .replayed
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        expected.push(("idempotent-replayed".into(), b"true".to_vec()));
        let mut got: Vec<(String, Vec<u8>)> = headers
            .iter()
            .filter(|(n, _)| *n != "content-length") // the router's, from the body
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        // The field lines of one name keep their order; names are compared as a set.
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, expected, "{}: the replayed headers", env.what);
        let omitted = env.golden.get(..5) == Some(b"IDH2\x01".as_slice());
        let replayed_body = if omitted { Vec::new() } else { env.body() };
        assert_eq!(
            &body[..],
            &replayed_body[..],
            "{}: the replayed body",
            env.what
        );
    }
}

#[test]
fn the_documented_decoder_reads_every_golden_envelope() {
    for env in envelope_table() {
        let (segs, decoded) = walk_envelope(env.golden).unwrap_or_else(|e| panic!("{e}"));
        let decoded = decoded.unwrap_or_else(|| panic!("{}: no magic", env.what));
        let covered: usize = segs.iter().map(|s| s.bytes.len()).sum();
        assert_eq!(
            covered,
            env.golden.len(),
            "{}: every byte annotated",
            env.what
        );
        let omitted = decoded.flags & 0x01 != 0;
        assert_eq!(omitted, env.golden.starts_with(b"IDH2"), "{}", env.what);
        assert_eq!(
            decoded.body,
            if omitted { Vec::new() } else { env.body() },
            "{}",
            env.what
        );
        // Every header in the envelope is one the handler answered, in replay-set order.
        for (name, value) in &decoded.headers {
            assert!(
                env.headers
                    .iter()
                    .any(|(n, v)| n == name && v.as_bytes() == &value[..]),
                "{}: {name}",
                env.what
            );
        }
    }
}

/// `idem::format::HttpEnvelope` (the decoder the CLI reads envelopes with, which the layer
/// decodes through) reads every golden envelope as the decoder written from docs/FORMAT.md
/// does, refuses what it refuses for the layout's sake, and leaves HTTP's grammar of names and
/// values to the layer.
#[test]
fn the_public_envelope_decoder_agrees_with_the_documented_one() {
    use idem::format::HttpEnvelope;
    for env in envelope_table() {
        let (_, documented) = walk_envelope(env.golden).unwrap_or_else(|e| panic!("{e}"));
        let documented = documented.unwrap_or_else(|| panic!("{}: no magic", env.what));
        let public = HttpEnvelope::decode(env.golden)
            .unwrap_or_else(|e| panic!("{}: {e}", env.what))
            .unwrap_or_else(|| panic!("{}: not an envelope", env.what));
        assert_eq!(public.magic().as_bytes(), &env.golden[..4], "{}", env.what);
        assert_eq!(
            public.body_omitted(),
            documented.flags & 0x01 != 0,
            "{}",
            env.what
        );
        assert_eq!(public.body(), &documented.body[..], "{}", env.what);
        let headers: Vec<(String, Vec<u8>)> = public
            .headers()
            .iter()
            .map(|(n, v)| (String::from_utf8(n.to_vec()).unwrap(), v.to_vec()))
            .collect();
        assert_eq!(headers, documented.headers, "{}", env.what);
    }
    for plain in [&b"plain"[..], b""] {
        assert_eq!(HttpEnvelope::decode(plain), Ok(None));
        assert!(matches!(walk_envelope(plain), Ok((_, None))));
    }
    for damaged in [
        &b"IDH2\x02\x00\x00"[..],
        b"IDH2\x81\x00\x00",
        b"IDH2",
        b"IDH1\x00",
        b"IDH1\x00\x01\x00\x05ab",
        b"IDH1\x00\x01\x00\x01a\x00\x00\x00\x05b",
    ] {
        assert!(HttpEnvelope::decode(damaged).is_err(), "{damaged:?}");
        assert!(walk_envelope(damaged).is_err(), "{damaged:?}");
    }
    // Well framed, but not an HTTP field name / value: read as stored; the layer answers 500
    // (`unreadable_envelopes_are_a_store_failure_never_a_guess`).
    for framed in [
        &b"IDH1\x00\x01\x00\x01 \x00\x00\x00\x00"[..],
        b"IDH1\x00\x01\x00\x01a\x00\x00\x00\x01\n",
    ] {
        let env = HttpEnvelope::decode(framed).unwrap().unwrap();
        assert_eq!(env.headers().len(), 1, "{framed:?}");
        assert!(walk_envelope(framed).is_err(), "{framed:?}");
    }
}

/// A record as an earlier release stored it: what, its bytes and status, and what a retry gets
/// (header field lines besides `Idempotent-Replayed: true`, and the body).
type Old = (
    &'static str,
    &'static [u8],
    u16,
    &'static [(&'static str, &'static str)],
    &'static [u8],
);

/// Stored bytes as a record of an earlier release holds them, replayed by this one.
#[tokio::test]
async fn records_written_before_are_replayed_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let store = http_fixtures::store(&dir);
    let fp = &fingerprint_table()[0];
    let app = fp.router(layer(&store));
    let cases: [Old; 5] = [
        (
            "IDH1 as the first release wrote it",
            b"IDH1\x00\x02\x00\x0ccontent-type\x00\x00\x00\x03a/b\x00\x08location\x00\x00\x00\x02/xhi",
            201,
            &[("content-type", "a/b"), ("location", "/x")],
            b"hi",
        ),
        (
            "IDH2 with no flag set (never written; read like IDH1)",
            b"IDH2\x00\x00\x01\x00\x0ccontent-type\x00\x00\x00\x03a/bhi",
            201,
            &[("content-type", "a/b")],
            b"hi",
        ),
        (
            "IDH2 with the body omitted",
            b"IDH2\x01\x00\x01\x00\x08location\x00\x00\x00\x02/x",
            201,
            &[("location", "/x"), ("idempotent-body-omitted", "true")],
            b"",
        ),
        (
            "no magic: a body without headers",
            b"plain",
            200,
            &[],
            b"plain",
        ),
        ("no bytes: the status alone", b"", 204, &[], b""),
    ];
    for (i, (what, bytes, status, headers, body)) in cases.into_iter().enumerate() {
        let key = format!("old-{i}");
        let (parts, _) = fp.request(&key, "t1").into_parts();
        let request = idem::Request::with_fingerprint(
            Scope::new("t1", fp.operation()),
            key.as_str(),
            idem::http::request_fingerprint(&parts, &fp.operation(), &[], fp.body.as_bytes()),
        );
        let BeginAnswer::Acquired(lease) = store.begin(request).unwrap() else {
            panic!("{what}: not claimed");
        };
        lease
            .complete(idem::Response::new(status, bytes.to_vec()))
            .unwrap();
        let (got_status, got_headers, got_body) = send(&app, fp.request(&key, "t1")).await;
        assert_eq!(got_status.as_u16(), status, "{what}");
        let mut expected: Vec<(&str, &[u8])> =
            headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        expected.push(("idempotent-replayed", b"true"));
        let got: Vec<(&str, &[u8])> = got_headers
            .iter()
            .filter(|(n, _)| *n != "content-length") // the router's, from the body
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        assert_eq!(got, expected, "{what}");
        assert_eq!(&got_body[..], body, "{what}");
    }
}

/// A JSON request recorded under `idem-http-v1` (its bytes), as the layer fingerprinted every
/// body before a body labelled JSON was compared as JSON: a retry of the same bytes under the
/// default is another request (`422`); under `.raw_body()` it is replayed.
#[tokio::test]
async fn a_json_request_recorded_by_its_bytes_is_matched_under_raw_body_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = http_fixtures::store(&dir);
    let fp = fingerprint_table()
        .into_iter()
        .find(|fp| fp.what == "a JSON body labelled JSON")
        .unwrap();
    // The same request without its label: the body as sent, under `idem-http-v1`.
    let unlabelled = &fingerprint_table()[0];
    let (parts, _) = unlabelled.request("old", "t1").into_parts();
    let as_sent = idem::http::request_fingerprint(&parts, &fp.operation(), &[], fp.body.as_bytes());
    assert_eq!(as_sent.to_hex(), unlabelled.pinned);
    let request = idem::Request::with_fingerprint(Scope::new("t1", fp.operation()), "old", as_sent);
    let BeginAnswer::Acquired(lease) = store.begin(request).unwrap() else {
        panic!("not claimed");
    };
    lease
        .complete(idem::Response::new(201, b"hi".to_vec()))
        .unwrap();
    let (status, _, _) = send(&fp.router(layer(&store)), fp.request("old", "t1")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let raw = fp.router(layer(&store).raw_body());
    let (status, headers, body) = send(&raw, fp.request("old", "t1")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(&body[..], b"hi");
}

#[test]
fn unreadable_envelopes_are_a_store_failure_never_a_guess() {
    for bytes in [
        &b"IDH2\x02\x00\x00"[..],                   // an unknown flag
        b"IDH2\x81\x00\x00",                        // the known flag and an unknown one
        b"IDH2",                                    // no flags byte
        b"IDH1\x00",                                // a count cut short
        b"IDH1\x00\x01\x00\x05ab",                  // a name cut short
        b"IDH1\x00\x01\x00\x01a\x00\x00\x00\x05b",  // a value cut short
        b"IDH1\x00\x01\x00\x01 \x00\x00\x00\x00",   // not a header name
        b"IDH1\x00\x01\x00\x01a\x00\x00\x00\x01\n", // not a header value
    ] {
        let resp = idem::http::replay(&idem::Response::new(201, bytes.to_vec()));
        assert_eq!(
            resp.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{bytes:?}"
        );
        assert!(walk_envelope(bytes).is_err(), "{bytes:?}");
    }
}

#[test]
fn format_md_shows_the_pinned_values() {
    let doc = format_md();
    for needle in [
        CONTEXT,
        "idem-http-v1",
        "idem-http-v1+jcs",
        "idem-http-v1+custom",
        "IDH1",
        "IDH2",
    ] {
        assert!(doc.contains(needle), "docs/FORMAT.md must name {needle}");
    }
    for fp in fingerprint_table() {
        assert!(
            doc.contains(fp.pinned),
            "docs/FORMAT.md must show the fingerprint of {:?}: {}",
            fp.what,
            fp.pinned
        );
    }
    let row = fingerprint_table()
        .into_iter()
        .find(|fp| fp.what == DUMPED_ROW)
        .unwrap();
    let input = row.documented_input();
    let len: usize = input.iter().map(|s| s.bytes.len()).sum();
    let d = format!("({len} bytes):\n\n```text\n{}", render(&input));
    assert!(
        doc.contains(&d),
        "docs/FORMAT.md must contain this dump of the fingerprint input of {DUMPED_ROW:?}:\n{d}"
    );
    let table = envelope_table();
    for i in DUMPED_ENVELOPES {
        let golden = table[i].golden;
        let d = format!(
            "({} bytes):\n\n```text\n{}",
            golden.len(),
            dump_envelope(golden)
        );
        assert!(
            doc.contains(&d),
            "docs/FORMAT.md must contain this dump of {:?}:\n{d}",
            table[i].what
        );
    }
    for env in &table {
        let row = hex_row(env.golden);
        assert!(
            doc.contains(&row),
            "docs/FORMAT.md must show the bytes of {:?}: {row}",
            env.what
        );
    }
}

#[test]
#[ignore = "prints the pinned values and dumps for docs/FORMAT.md"]
fn print_http_format_dumps() {
    for fp in fingerprint_table() {
        println!(
            "| {} | {} | `{}` |",
            fp.what,
            fp.describe(),
            fp.documented_fingerprint()
        );
    }
    let row = fingerprint_table()
        .into_iter()
        .find(|fp| fp.what == DUMPED_ROW)
        .unwrap();
    let input = row.documented_input();
    let len: usize = input.iter().map(|s| s.bytes.len()).sum();
    println!("\n{DUMPED_ROW} ({len} bytes):\n{}", render(&input));
    for env in envelope_table() {
        println!("{}: {}", env.what, hex_row(env.golden));
    }
    for i in DUMPED_ENVELOPES {
        let env = &envelope_table()[i];
        println!(
            "\n{} ({} bytes):\n{}",
            env.what,
            env.golden.len(),
            dump_envelope(env.golden)
        );
    }
}
