//! The stored answer: a status and the `IDH1` / `IDH2` envelope of the replayed headers and the
//! body (`docs/FORMAT.md`, "HTTP layer formats"), and [`fit_response`], which fits an answer
//! into the store's response cap. A stored format: any change needs a new magic. The byte
//! layout is read by [`HttpEnvelope`] (`src/model/envelope.rs`, public as
//! `idem::format::HttpEnvelope`, so a tool reads it without HTTP types); this file writes it
//! and checks the names and values against HTTP's grammar.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, LOCATION};
use http::{HeaderMap, StatusCode};

use crate::Response;
use crate::model::envelope::{ENVELOPE_V1, ENVELOPE_V2, FLAG_BODY_OMITTED, HttpEnvelope};

/// The replayed headers of an answer, in the order of the replay set.
fn select_headers<'a>(
    headers: &'a HeaderMap,
    replay: &'a [HeaderName],
) -> Vec<(&'a HeaderName, &'a HeaderValue)> {
    replay
        .iter()
        .flat_map(|n| headers.get_all(n).iter().map(move |v| (n, v)))
        .filter(|(n, v)| n.as_str().len() <= usize::from(u16::MAX) && v.len() <= u32::MAX as usize)
        .take(usize::from(u16::MAX))
        .collect()
}

/// Headers that describe a body: not replayed with an omitted one (an empty body must not be
/// announced as `application/json` of some length, or cached under the original's validator).
fn describes_body(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("content-") || matches!(n, "etag" | "last-modified" | "digest" | "repr-digest")
}

/// The envelope bytes. `flags == 0`: `"IDH1" ‖ u16be(count) ‖ (u16be(len) ‖ name ‖
/// u32be(len) ‖ value)* ‖ body` (the format since the first release, so older readers replay
/// it). Otherwise `"IDH2" ‖ u8(flags) ‖` the same from the count on.
fn encode_envelope(headers: &[(&HeaderName, &HeaderValue)], flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    if flags == 0 {
        out.extend_from_slice(ENVELOPE_V1);
    } else {
        out.extend_from_slice(ENVELOPE_V2);
        out.push(flags);
    }
    // `select_headers` keeps at most u16::MAX headers, each within the length prefixes.
    out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
    for (n, v) in headers {
        out.extend_from_slice(&(n.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(n.as_str().as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// The record's resource pointer: the answer's `Location`, which so survives into the
/// tombstone (and into a replay whose envelope had no room for it).
fn location_of(headers: &HeaderMap) -> Option<&str> {
    headers.get(LOCATION).and_then(|v| v.to_str().ok())
}

fn with_location(resp: Response, location: Option<&str>) -> Response {
    match location {
        Some(loc) => resp.with_resource("location", loc),
        None => resp,
    }
}

/// The stored form of an HTTP answer kept whole: the store keeps a status and opaque bytes,
/// so the replayed headers travel in a small envelope before the body ([`encode_envelope`]).
fn stored_response(
    status: StatusCode,
    headers: &HeaderMap,
    replay: &[HeaderName],
    body: &[u8],
) -> Response {
    let selected = select_headers(headers, replay);
    let resp = Response::new(status.as_u16(), encode_envelope(&selected, 0, body));
    with_location(resp, location_of(headers))
}

/// The stored form of an answer within `max` bytes (the store's `max_response_bytes`, as the
/// store counts it: envelope plus resource pointer), and whether its body was kept. What
/// fits is kept, in this order of sacrifice: the body and the headers that describe it
/// (marked [`FLAG_BODY_OMITTED`]), then the other replayed headers from the last, then the
/// resource pointer, and at last the envelope itself: the status alone can always be stored.
pub(super) fn fit_response(
    status: StatusCode,
    headers: &HeaderMap,
    replay: &[HeaderName],
    body: &[u8],
    max: usize,
) -> (Response, bool) {
    let whole = stored_response(status, headers, replay, body);
    if whole.stored_len() <= max {
        return (whole, true);
    }
    let mut selected: Vec<_> = select_headers(headers, replay)
        .into_iter()
        .filter(|(n, _)| !describes_body(n))
        .collect();
    let mut location = location_of(headers);
    loop {
        let envelope = encode_envelope(&selected, FLAG_BODY_OMITTED, b"");
        let resp = with_location(Response::new(status.as_u16(), envelope), location);
        if resp.stored_len() <= max {
            return (resp, false);
        }
        if selected.pop().is_none() && location.take().is_none() {
            // Not even an empty envelope fits (a cap under 7 bytes): the status alone.
            return (Response::new(status.as_u16(), Vec::new()), false);
        }
    }
}

/// A decoded envelope.
#[derive(Debug)]
pub(super) struct Envelope {
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    pub(super) body_omitted: bool,
}

/// Decodes [`encode_envelope`]'s bytes (`IDH1` or `IDH2`); `None` if they are damaged, carry
/// an unknown flag, or hold a name or a value that is not a valid HTTP field name or value. A
/// body without a magic (a record written by other code, or a status-only record) is replayed
/// as is, without headers.
pub(super) fn decode_envelope(bytes: &[u8]) -> Option<Envelope> {
    let Some(env) = HttpEnvelope::decode(bytes).ok()? else {
        return Some(Envelope {
            headers: HeaderMap::new(),
            body: Bytes::copy_from_slice(bytes),
            body_omitted: false,
        });
    };
    let mut headers = HeaderMap::new();
    for (name, value) in env.headers() {
        let name = HeaderName::from_bytes(name).ok()?;
        let value = HeaderValue::from_bytes(value).ok()?;
        headers.append(name, value);
    }
    Some(Envelope {
        headers,
        body: Bytes::copy_from_slice(env.body()),
        body_omitted: env.body_omitted(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::replay::replay;
    use axum::body::Body;
    use http::header::CONTENT_TYPE;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn envelope_round_trips_and_rejects_damage() {
        let h = headers(&[("content-type", "application/json"), ("x-other", "dropped")]);
        let stored = stored_response(StatusCode::CREATED, &h, &[CONTENT_TYPE, LOCATION], b"{}");
        let env = decode_envelope(stored.body()).unwrap();
        assert_eq!(env.headers.len(), 1);
        assert_eq!(env.headers[CONTENT_TYPE], "application/json");
        assert_eq!(&env.body[..], b"{}");
        assert!(!env.body_omitted);
        for cut in 5..stored.body().len() - 2 {
            // Truncations inside the header block are errors, never panics.
            let _ = decode_envelope(&stored.body()[..cut]);
        }
        assert!(decode_envelope(b"IDH1\x00\x01\x00\x05ab").is_none());
        assert!(decode_envelope(b"IDH2").is_none());
        assert_eq!(&decode_envelope(b"raw").unwrap().body[..], b"raw");
    }

    #[test]
    fn envelope_golden_bytes() {
        let h = headers(&[("content-type", "a/b"), ("location", "/x")]);
        let replay = [CONTENT_TYPE, LOCATION];
        // A whole answer: IDH1, unchanged since the first release.
        let whole = stored_response(StatusCode::CREATED, &h, &replay, b"hi");
        let golden_v1: &[u8] = b"IDH1\x00\x02\
            \x00\x0ccontent-type\x00\x00\x00\x03a/b\
            \x00\x08location\x00\x00\x00\x02/x\
            hi";
        assert_eq!(whole.body(), golden_v1);
        assert_eq!(whole.resource().unwrap().id, "/x");
        // A record written by an earlier release decodes as before.
        let env = decode_envelope(golden_v1).unwrap();
        assert_eq!(
            (env.headers.len(), &env.body[..], env.body_omitted),
            (2, &b"hi"[..], false)
        );

        // A body that was not kept: IDH2, flags 0x01, no body, no header describing it.
        let (omitted, kept) = fit_response(StatusCode::CREATED, &h, &replay, &[b'x'; 100], 40);
        assert!(!kept);
        let golden_v2: &[u8] = b"IDH2\x01\x00\x01\x00\x08location\x00\x00\x00\x02/x";
        assert_eq!(omitted.body(), golden_v2);
        assert_eq!(omitted.status(), 201);
        assert_eq!(omitted.resource().unwrap().id, "/x");
        let env = decode_envelope(golden_v2).unwrap();
        assert!(env.body_omitted && env.body.is_empty());
        assert_eq!(env.headers[LOCATION], "/x");

        // Unknown flags are not guessed at.
        assert!(decode_envelope(b"IDH2\x02\x00\x00").is_none());
        assert!(decode_envelope(b"IDH2\x81\x00\x00").is_none());
    }

    #[test]
    fn the_magics_the_flag_and_the_headers_that_go_with_the_body_are_pinned() {
        // docs/FORMAT.md, "HTTP layer formats": a change to any of these is a new magic.
        assert_eq!((ENVELOPE_V1, ENVELOPE_V2), (b"IDH1", b"IDH2"));
        assert_eq!(FLAG_BODY_OMITTED, 0x01);
        // The flags select the magic; IDH2 only when a flag is set.
        let (ct, v) = (CONTENT_TYPE, HeaderValue::from_static("a/b"));
        assert_eq!(
            encode_envelope(&[(&ct, &v)], 0, b"hi"),
            b"IDH1\x00\x01\x00\x0ccontent-type\x00\x00\x00\x03a/bhi"
        );
        assert_eq!(
            encode_envelope(&[(&ct, &v)], FLAG_BODY_OMITTED, b""),
            b"IDH2\x01\x00\x01\x00\x0ccontent-type\x00\x00\x00\x03a/b"
        );
        // IDH2 without a flag is never written; it reads like IDH1.
        let env = decode_envelope(b"IDH2\x00\x00\x00hi").unwrap();
        assert!(!env.body_omitted && env.headers.is_empty() && &env.body[..] == b"hi");
        // The headers left out with an omitted body: they describe it.
        for (name, with_body) in [
            ("content-type", true),
            ("content-length", true),
            ("content-encoding", true),
            ("content-language", true),
            ("content-location", true),
            ("content-range", true),
            ("content-disposition", true),
            ("etag", true),
            ("last-modified", true),
            ("digest", true),
            ("repr-digest", true),
            ("location", false),
            ("link", false),
            ("cache-control", false),
            ("vary", false),
            ("x-trace", false),
        ] {
            let n = HeaderName::from_static(name);
            assert_eq!(describes_body(&n), with_body, "{name}");
        }
    }

    #[test]
    fn an_answer_is_fitted_into_the_cap_dropping_body_then_headers_then_pointer() {
        let h = headers(&[
            ("content-type", "text/csv"),
            ("location", "/r/1"),
            ("x-a", "aaaaaaaaaa"),
        ]);
        let replay = [CONTENT_TYPE, LOCATION, HeaderName::from_static("x-a")];
        let fit = |max| fit_response(StatusCode::OK, &h, &replay, &[b'b'; 1000], max);
        let cap = 64 * 1024;
        let (r, kept) = fit(cap);
        assert!(kept && r.body().ends_with(&[b'b'; 1000]));
        for max in [1000, 100, 40, 30, 20, 10, 7, 6, 0] {
            let (r, kept) = fit(max);
            assert!(!kept, "{max}");
            assert!(r.stored_len() <= max, "{max}: {}", r.stored_len());
            assert_eq!(r.status(), 200);
            let resp = replay_of(&r);
            assert!(resp.headers().get(CONTENT_TYPE).is_none(), "{max}");
        }
        // Room for everything but the body: Location and x-a are kept, Content-Type is not.
        let env = decode_envelope(fit(100).0.body()).unwrap();
        assert_eq!(env.headers.len(), 2);
        assert!(env.body_omitted);
        // Less room: x-a (last) goes first, then Location from the envelope (the pointer
        // still carries it), then the pointer.
        let (r, _) = fit(35);
        let env = decode_envelope(r.body()).unwrap();
        assert_eq!(env.headers.len(), 0);
        assert_eq!(r.resource().unwrap().id, "/r/1");
        assert_eq!(replay_of(&r).headers()[LOCATION], "/r/1");
        let (r, _) = fit(10);
        assert!(r.resource().is_none() && decode_envelope(r.body()).unwrap().body_omitted);
        // Under 7 bytes not even the empty envelope fits: the status alone.
        let (r, _) = fit(6);
        assert!(r.body().is_empty() && r.resource().is_none());
    }

    fn replay_of(r: &Response) -> http::Response<Body> {
        replay(r)
    }
}
