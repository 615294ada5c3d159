//! `header_parsers`: every parser of request bytes from outside, each against a reference
//! written from its grammar here, never by calling the parser under test:
//!
//! - **`Idempotency-Key`** (`src/http/key.rs`, docs/HTTP.md "The key grammar"): after the
//!   whitespace around it (SP, HTAB), a value starting with `"` is accepted iff it is exactly one
//!   RFC 9651 sf-string Item without parameters — checked against sfv's own parse of an Item
//!   and against the sf-string grammar written out below, which must agree — and the key is the
//!   string's characters; any other value is a bare key of visible ASCII without `"` `,` `;` `\`.
//!   Either way 1..=max bytes, each refusal with its kind (and the offending byte and offset).
//!   An accepted key serialised as an sf-string (by sfv, and by the escaper here) parses back to
//!   itself, so a key quoted or not names one intent.
//! - **The tenant header** (`idem::http::tenant_from_header`): one field line, its value without
//!   the whitespace around it 1..=max bytes of visible ASCII without `,`; the refusal's kind,
//!   byte and offset.
//! - **The JSON media type** (`src/http/json.rs`): a value that is an RFC 9110 media type
//!   (`type "/" subtype *( OWS ";" OWS [ parameter ] )`, the grammar written out below) is
//!   labelled JSON iff it is `application/json` or `application/<name>+json`, case-insensitive;
//!   as docs/FORMAT.md ("Labelled JSON") says, the parameters are ignored, so any value is
//!   decided by its type and subtype before the first `;`. Exactly one `Content-Type` line.
//! - **GitHub `X-Hub-Signature-256`** (`verify_github`): accepted iff the value, without the
//!   whitespace around it, is `sha256=` and 64 hex digits (either case) of the HMAC-SHA256 of the
//!   body, computed here from RFC 2104 over SHA-256 (checked against RFC 4231's vectors); every
//!   refusal has its documented kind, an empty secret first.
//! - **Standard Webhooks** (`StandardWebhooks`): the secret is `whsec_` (optional) and canonical
//!   base64 (decoded by the decoder here), non-empty; a request is accepted iff the timestamp
//!   (`+`? digits, a `u64`) is within the tolerance of now (whole seconds) and one
//!   whitespace-separated entry of the signature list is exactly `v1,` and the canonical base64
//!   of the HMAC of `id.timestamp.body`. Correctly signed requests (several entries, rotated
//!   keys, other versions) verify, and a change of one byte of the body, the id, the timestamp
//!   or the signature fails.
//! - **The canonical JSON form** (`src/http/json.rs`, the body part of the fingerprint): a body
//!   with a canonical form is JSON, the form is JSON of the same value, and its own canonical
//!   form; two numbers have the same canonical form iff they have the same decimal value (exact
//!   decimal arithmetic here), and a number's canonical text has its value.
//!
//! The input's first byte picks the parser; the rest is either the raw bytes (libFuzzer's own
//! mutations reach odd corners) or a recipe that builds a value from the grammar's pieces (so
//! accepted values and near misses are common).

use std::sync::Once;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use http::{HeaderMap, HeaderName, HeaderValue};
use idem::Timestamp;
use idem::http::whitebox::{self, KeyError};
use idem::http::{InvalidTenant, tenant_from_header};
use idem::webhook::{StandardWebhooks, WebhookError, verify_github};
use serde_json::Value;

/// Runs one input.
pub fn run(data: &[u8]) {
    hmac_reference_is_rfc_4231();
    let mut u = Unstructured::new(data);
    let Ok(which) = u.int_in_range(0..=11u8) else {
        return;
    };
    // Running out of input ends a case early; what ran was checked.
    let _ = match which {
        0 => key_raw(&mut u),
        1 => key_built(&mut u),
        2 => tenant(&mut u),
        3 => media_type_raw(&mut u),
        4 => media_type_built(&mut u),
        5 => github_raw(&mut u),
        6 => github_signed(&mut u),
        7 => standard_raw(&mut u),
        8 => standard_signed(&mut u),
        9 => json_raw(&mut u),
        10 => json_numbers(&mut u),
        _ => standard_secret(&mut u),
    };
}

// ---------------------------------------------------------------------------------------------
// Idempotency-Key

fn ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// `v` without the OWS (SP, HTAB) around it.
fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|&b| !ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|&b| !ows(b)).map_or(start, |e| e + 1);
    &v[start..end]
}

/// RFC 9651 §3.3.3: `v` is exactly `DQUOTE *( unescaped / escaped ) DQUOTE`, with
/// `unescaped = %x20-21 / %x23-5B / %x5D-7E` and `escaped = "\" ( DQUOTE / "\" )`: its
/// characters.
fn sf_string(v: &[u8]) -> Option<String> {
    let (&first, mut rest) = v.split_first()?;
    if first != b'"' {
        return None;
    }
    let mut out = String::new();
    loop {
        let (&c, after) = rest.split_first()?;
        rest = after;
        match c {
            b'"' => return rest.is_empty().then_some(out),
            b'\\' => {
                let (&e, after) = rest.split_first()?;
                rest = after;
                if e != b'"' && e != b'\\' {
                    return None;
                }
                out.push(char::from(e));
            }
            0x20..=0x7e => out.push(char::from(c)),
            _ => return None,
        }
    }
}

/// sfv's own parse of `v` as an Item: the string of a String Item without parameters.
fn sfv_string_item(v: &[u8]) -> Option<String> {
    let item = sfv::Parser::new(v).parse::<sfv::Item>().ok()?;
    match item.bare_item {
        sfv::BareItem::String(s) if item.params.is_empty() => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// A byte of a bare key: visible ASCII except `"` `,` `;` `\`.
fn bare_key_byte(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && !b"\",;\\".contains(&b)
}

/// What `parse_key(value, max)` must answer (`NotAString`'s text is sfv's).
fn expected_key(value: &[u8], max: usize) -> Result<String, KeyError> {
    let v = trim_ows(value);
    let key = if v.first() == Some(&b'"') {
        let mine = sf_string(v);
        assert_eq!(
            mine,
            sfv_string_item(v),
            "the sf-string grammar here and sfv disagree on {:?}",
            String::from_utf8_lossy(v)
        );
        mine.ok_or_else(|| KeyError::NotAString(String::new()))?
    } else if let Some(at) = v.iter().position(|&b| !bare_key_byte(b)) {
        return Err(KeyError::BadChar { byte: v[at], at });
    } else {
        v.iter().map(|&b| char::from(b)).collect()
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > max {
        return Err(KeyError::TooLong {
            len: key.len(),
            max,
        });
    }
    Ok(key)
}

/// `s` (printable ASCII) as an sf-string, escaped here.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn check_key(value: &[u8], max: usize) {
    let got = whitebox::parse_key(value, max);
    let expected = expected_key(value, max);
    let shown = String::from_utf8_lossy(value);
    match (&got, &expected) {
        (Err(KeyError::NotAString(_)), Err(KeyError::NotAString(_))) => {}
        _ => assert_eq!(got, expected, "parse_key({shown:?}, {max})"),
    }
    let Ok(key) = got else {
        return;
    };
    assert!(
        key.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "{shown:?}: an accepted key is printable ASCII: {key:?}"
    );
    // The key as an sf-string, by sfv and by hand, with OWS around it: the same key.
    let sf = sfv::StringRef::from_str(&key)
        .unwrap_or_else(|e| panic!("{shown:?}: sfv refuses the accepted key {key:?}: {e}"));
    let by_sfv = sfv::ItemSerializer::new()
        .bare_item(sfv::RefBareItem::String(sf))
        .finish();
    assert_eq!(by_sfv, quote(&key), "sfv serialises {key:?} otherwise");
    for again in [by_sfv.clone(), format!(" \t{by_sfv} ")] {
        assert_eq!(
            whitebox::parse_key(again.as_bytes(), max),
            Ok(key.clone()),
            "{shown:?}: the key {key:?} as the sf-string {again:?}"
        );
    }
}

fn max_len(u: &mut Unstructured) -> arbitrary::Result<usize> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => 255,
        _ => u.int_in_range(1..=40)?,
    })
}

fn key_raw(u: &mut Unstructured) -> arbitrary::Result<()> {
    let max = max_len(u)?;
    check_key(rest(u), max);
    Ok(())
}

/// A character of a built key: mostly ordinary, often one that matters to the grammar.
fn key_char(u: &mut Unstructured) -> arbitrary::Result<u8> {
    const SPECIAL: &[u8] = b"\"\\,; \t=()*:?@\x7f\x00\x1f\xc3\xa9";
    Ok(match u.int_in_range(0..=3u8)? {
        0 => *u.choose(SPECIAL)?,
        _ => u.int_in_range(0x20..=0x7e)?,
    })
}

fn key_built(u: &mut Unstructured) -> arbitrary::Result<()> {
    let max = max_len(u)?;
    let n = u.int_in_range(0..=24)?;
    let mut chars = Vec::with_capacity(n);
    for _ in 0..n {
        chars.push(key_char(u)?);
    }
    let mut value = Vec::new();
    for _ in 0..u.int_in_range(0..=2)? {
        value.push(*u.choose(b" \t")?);
    }
    if u.arbitrary()? {
        // Quoted, each quote and backslash escaped or not.
        value.push(b'"');
        for &c in &chars {
            if (c == b'"' || c == b'\\') && u.int_in_range(0..=7u8)? != 0 {
                value.push(b'\\');
            }
            value.push(c);
        }
        value.push(b'"');
    } else {
        value.extend_from_slice(&chars);
    }
    const SUFFIXES: &[&[u8]] = &[
        b"", b"", b"", b" ", b"\t", b";p=1", b";p", b"; p=1", b", \"b\"", b",", b"x", b"\"",
    ];
    value.extend_from_slice(u.choose(SUFFIXES)?);
    check_key(&value, max);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tenant

/// Header values as HTTP carries them (`HeaderValue::from_bytes`: no CR, LF, NUL or DEL).
fn header_value(u: &mut Unstructured) -> arbitrary::Result<Option<HeaderValue>> {
    let bytes: Vec<u8> = if u.arbitrary()? {
        u.arbitrary()?
    } else {
        // Mostly a tenant-like value, with a byte that matters here and there.
        let n = u.int_in_range(0..=20)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(match u.int_in_range(0..=5u8)? {
                0 => *u.choose(b" \t,\"\x80\xff")?,
                _ => u.int_in_range(0x21..=0x7e)?,
            });
        }
        v
    };
    Ok(HeaderValue::from_bytes(&bytes).ok())
}

fn tenant(u: &mut Unstructured) -> arbitrary::Result<()> {
    let name = if u.arbitrary()? {
        HeaderName::from_static("x-tenant")
    } else {
        let bytes: Vec<u8> = u.arbitrary()?;
        match HeaderName::from_bytes(&bytes) {
            Ok(name) => name,
            Err(_) => return Ok(()),
        }
    };
    let max = max_len(u)?;
    let mut headers = HeaderMap::new();
    let lines = u.int_in_range(0..=3u8)?;
    let mut values = Vec::new();
    for _ in 0..lines {
        if let Some(v) = header_value(u)? {
            headers.append(&name, v.clone());
            values.push(v);
        }
    }
    // Other headers are not the tenant's.
    headers.append("x-other", HeaderValue::from_static("a, b"));
    let got = tenant_from_header(&headers, &name, max);
    let expected = match values.as_slice() {
        _ if name == "x-other" => return Ok(()),
        [] => Ok(None),
        [value] => {
            let v = trim_ows(value.as_bytes());
            match v
                .iter()
                .position(|&b| !(0x21..=0x7e).contains(&b) || b == b',')
            {
                Some(at) => Err(InvalidTenant::BadByte { byte: v[at], at }),
                None if v.is_empty() => Err(InvalidTenant::Empty),
                None if v.len() > max => Err(InvalidTenant::TooLong { len: v.len(), max }),
                None => Ok(Some(v.iter().map(|&b| char::from(b)).collect())),
            }
        }
        more => Err(InvalidTenant::Lines(more.len())),
    };
    assert_eq!(
        got, expected,
        "tenant_from_header({name}: {values:?}, {max})"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The JSON media type

/// RFC 9110 §5.6.2 `tchar`.
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The longest run of `tchar` at the start of `v`.
fn token_len(v: &[u8]) -> usize {
    v.iter().position(|&b| !tchar(b)).unwrap_or(v.len())
}

fn skip_ows(v: &[u8]) -> &[u8] {
    &v[v.iter().position(|&b| !ows(b)).unwrap_or(v.len())..]
}

/// RFC 9110 §5.6.4 `quoted-string` at the start of `v`: the rest after it.
fn quoted_string(v: &[u8]) -> Option<&[u8]> {
    let mut rest = v.strip_prefix(b"\"")?;
    loop {
        let (&c, after) = rest.split_first()?;
        rest = after;
        match c {
            b'"' => return Some(rest),
            // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
            b'\\' => {
                let (&e, after) = rest.split_first()?;
                if !(e == b'\t' || e == b' ' || (0x21..=0x7e).contains(&e) || e >= 0x80) {
                    return None;
                }
                rest = after;
            }
            // qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text
            b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => {}
            _ => return None,
        }
    }
}

/// RFC 9110 §8.3.1 `media-type = type "/" subtype parameters`, §5.6.6 `parameters = *( OWS ";"
/// OWS [ parameter ] )`, `parameter = token "=" ( token / quoted-string )`, of the whole field
/// value (OWS around it is not part of it): its type and subtype.
fn media_type(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let v = trim_ows(value);
    let t = token_len(v);
    let rest = v.get(t..)?.strip_prefix(b"/")?;
    let s = token_len(rest);
    let (kind, subtype) = (&v[..t], &rest[..s]);
    if kind.is_empty() || subtype.is_empty() {
        return None;
    }
    let mut rest = &rest[s..];
    loop {
        rest = skip_ows(rest);
        if rest.is_empty() {
            return Some((kind, subtype));
        }
        rest = skip_ows(rest.strip_prefix(b";")?);
        let name = token_len(rest);
        if name == 0 {
            // An empty parameter: only OWS, another ";" or the end may follow.
            continue;
        }
        rest = rest[name..].strip_prefix(b"=")?;
        rest = match token_len(rest) {
            0 => quoted_string(rest)?,
            n => &rest[n..],
        };
    }
}

/// `application/json` or `application/<name>+json`, case-insensitive.
fn names_json(kind: &[u8], subtype: &[u8]) -> bool {
    let sub = subtype.to_ascii_lowercase();
    kind.eq_ignore_ascii_case(b"application")
        && (sub == b"json" || (sub.len() > 5 && sub.ends_with(b"+json")))
}

/// docs/FORMAT.md, "Labelled JSON": the value's type and subtype, before its first `;`, decide;
/// the parameters are ignored.
fn expected_json_label(value: &[u8]) -> bool {
    let essence = value.split(|&b| b == b';').next().unwrap_or_default();
    let essence = trim_ows(essence);
    let t = token_len(essence);
    let (kind, rest) = essence.split_at(t);
    let Some(subtype) = rest.strip_prefix(b"/") else {
        return false;
    };
    let is_media_type =
        !kind.is_empty() && !subtype.is_empty() && token_len(subtype) == subtype.len();
    let label = is_media_type && names_json(kind, subtype);
    // A whole media type is decided by its type and subtype: the reference agrees with itself.
    if let Some((k, s)) = media_type(value) {
        assert_eq!(
            label,
            names_json(k, s),
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
    label
}

fn check_media_type(lines: &[Vec<u8>]) {
    let mut headers = HeaderMap::new();
    let mut valid = Vec::new();
    for line in lines {
        // Whatever the bytes, no panic.
        let _ = whitebox::is_json_media_type(line);
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append(http::header::CONTENT_TYPE, v);
            valid.push(line);
        }
    }
    // The values HTTP can carry: the reference decides.
    for line in &valid {
        assert_eq!(
            whitebox::is_json_media_type(line),
            expected_json_label(line),
            "is_json_media_type({:?})",
            String::from_utf8_lossy(line)
        );
    }
    let expected = matches!(valid.as_slice(), [one] if expected_json_label(one));
    assert_eq!(
        whitebox::labelled_json(&headers),
        expected,
        "labelled_json({valid:?})"
    );
}

fn media_type_raw(u: &mut Unstructured) -> arbitrary::Result<()> {
    check_media_type(&[rest(u).to_vec()]);
    Ok(())
}

fn media_type_built(u: &mut Unstructured) -> arbitrary::Result<()> {
    const KINDS: &[&[u8]] = &[
        b"application",
        b"APPLICATION",
        b"text",
        b"",
        b"appl ication",
        b"*",
    ];
    const SUBTYPES: &[&[u8]] = &[
        b"json",
        b"JSON",
        b"problem+json",
        b"+json",
        b"json+zip",
        b"jsonx",
        b"x-json",
        b"",
        b"vnd.api+json",
        b"json seq",
        b"js\xc3\xb6n",
    ];
    const PARAMS: &[&[u8]] = &[
        b"charset=utf-8",
        b"charset=\"utf-8\"",
        b"charset=\"a;b\\\"c\"",
        b"",
        b"charset",
        b"=x",
        b"charset = utf-8",
        b"q=\"unterminated",
        b"a=b c",
        b"x=\"\\\x01\"",
        b"x=\xff",
    ];
    let lines = u.int_in_range(1..=2u8)?;
    let mut values = Vec::new();
    for _ in 0..lines {
        let mut v = Vec::new();
        for _ in 0..u.int_in_range(0..=1)? {
            v.push(*u.choose(b" \t")?);
        }
        v.extend_from_slice(u.choose(KINDS)?);
        v.extend_from_slice(u.choose(&[&b"/"[..], b"/", b"/", b" /", b"", b"//"])?);
        v.extend_from_slice(u.choose(SUBTYPES)?);
        for _ in 0..u.int_in_range(0..=3)? {
            v.extend_from_slice(u.choose(&[&b";"[..], b" ; ", b";\t", b",", b" "])?);
            v.extend_from_slice(u.choose(PARAMS)?);
        }
        for _ in 0..u.int_in_range(0..=1)? {
            v.push(*u.choose(b" \t")?);
        }
        values.push(v);
    }
    check_media_type(&values);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// HMAC-SHA256, hex and base64, written out here

/// RFC 2104 HMAC over SHA-256 (block 64 bytes).
fn hmac_sha256(key: &[u8], message: &[&[u8]]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for part in message {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The reference HMAC gives RFC 4231's test vectors (cases 1, 2 and 6: a short key, a short
/// key and message, a key longer than a block).
fn hmac_reference_is_rfc_4231() {
    static CHECKED: Once = Once::new();
    CHECKED.call_once(|| {
        let cases: [(&[u8], &[u8], &str); 3] = [
            (
                &[0x0b; 20],
                b"Hi There",
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe",
                b"what do ya want for nothing?",
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First",
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
        ];
        for (key, message, expected) in cases {
            assert_eq!(hex(&hmac_sha256(key, &[message])), expected);
        }
    });
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .map(char::from)
        .collect()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// RFC 4648 §4 base64, padded.
fn base64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// RFC 4648 §4 base64, canonical only: padded to a multiple of 4, the bits after the last byte
/// zero (the inverse of [`base64`]).
fn unbase64(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(4) {
        return None;
    }
    let pad = t.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 || (pad > 0 && t.len() < 4) {
        return None;
    }
    let mut bits: Vec<u8> = Vec::new();
    for &c in &t[..t.len() - pad] {
        let v = B64.iter().position(|&d| d == c)? as u8;
        bits.extend((0..6).rev().map(|i| (v >> i) & 1));
    }
    // Two padding characters leave 4 spare bits, one leaves 2: they must be zero.
    let spare = bits.len() % 8;
    if bits[bits.len() - spare..].iter().any(|&b| b != 0) {
        return None;
    }
    let bytes: Vec<u8> = bits
        .chunks_exact(8)
        .map(|c| c.iter().fold(0u8, |n, &b| n << 1 | b))
        .collect();
    (base64(&bytes) == text).then_some(bytes)
}

// ---------------------------------------------------------------------------------------------
// GitHub

/// The kinds of answer compared (a `Malformed`'s reason is prose).
fn kind(r: &Result<(), WebhookError>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(WebhookError::Malformed { name, .. }) => format!("malformed {name}"),
        Err(WebhookError::BadSecret { .. }) => "bad secret".into(),
        Err(e) => format!("{e:?}"),
    }
}

/// What `verify_github` must answer.
fn expected_github(secret: &[u8], body: &[u8], header: Option<&str>) -> Result<(), WebhookError> {
    const NAME: &str = "X-Hub-Signature-256";
    let malformed = || WebhookError::Malformed {
        name: NAME,
        reason: String::new(),
    };
    if secret.is_empty() {
        return Err(WebhookError::BadSecret {
            reason: String::new(),
        });
    }
    let header = header.ok_or(WebhookError::MissingHeader { name: NAME })?;
    let digits = header
        .trim()
        .strip_prefix("sha256=")
        .ok_or_else(malformed)?;
    if digits.len() != 64 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed());
    }
    if digits.to_ascii_lowercase() == hex(&hmac_sha256(secret, &[body])) {
        Ok(())
    } else {
        Err(WebhookError::BadSignature)
    }
}

fn check_github(secret: &[u8], body: &[u8], header: Option<&str>) -> Result<(), WebhookError> {
    let got = verify_github(secret, body, header);
    assert_eq!(
        kind(&got),
        kind(&expected_github(secret, body, header)),
        "verify_github(secret {secret:?}, body {body:?}, header {header:?})"
    );
    got
}

fn github_raw(u: &mut Unstructured) -> arbitrary::Result<()> {
    let secret: Vec<u8> = u.arbitrary()?;
    let body: Vec<u8> = u.arbitrary()?;
    let header: Option<Vec<u8>> = u.arbitrary()?;
    let header = header.map(|h| String::from_utf8_lossy(&h).into_owned());
    let _ = check_github(&secret, &body, header.as_deref());
    Ok(())
}

fn non_empty(u: &mut Unstructured, max: usize) -> arbitrary::Result<Vec<u8>> {
    let n = u.int_in_range(1..=max)?;
    u.bytes(n).map(<[u8]>::to_vec)
}

/// One byte of `v` changed to another value.
fn change_byte(u: &mut Unstructured, v: &mut [u8]) -> arbitrary::Result<()> {
    let at = u.choose_index(v.len())?;
    v[at] ^= u.int_in_range(1..=255u8)?;
    Ok(())
}

fn github_signed(u: &mut Unstructured) -> arbitrary::Result<()> {
    let secret = non_empty(u, 100)?;
    let body: Vec<u8> = u.arbitrary()?;
    let mut mac = hmac_sha256(&secret, &[&body]);
    let mut digits = hex(&mac);
    if u.arbitrary()? {
        digits = digits.to_ascii_uppercase();
    }
    let header = format!("{}sha256={digits}{}", ows_text(u)?, ows_text(u)?);
    assert_eq!(
        check_github(&secret, &body, Some(&header)),
        Ok(()),
        "{header}"
    );
    match u.int_in_range(0..=5u8)? {
        0 => {
            let mut body = body;
            if body.is_empty() {
                body.push(0);
            } else {
                change_byte(u, &mut body)?;
            }
            assert_eq!(
                check_github(&secret, &body, Some(&header)),
                Err(WebhookError::BadSignature)
            );
        }
        1 => {
            change_byte(u, &mut mac)?;
            let header = format!("sha256={}", hex(&mac));
            assert_eq!(
                check_github(&secret, &body, Some(&header)),
                Err(WebhookError::BadSignature)
            );
        }
        2 => {
            let mut secret = secret;
            change_byte(u, &mut secret)?;
            assert_eq!(
                check_github(&secret, &body, Some(&header)),
                Err(WebhookError::BadSignature)
            );
        }
        3 => {
            // A prefix of the signature is no signature.
            let cut = u.int_in_range(0..=63)?;
            let header = format!("sha256={}", &digits[..cut]);
            assert!(check_github(&secret, &body, Some(&header)).is_err());
        }
        4 => {
            // One byte of the header text replaced: the reference decides.
            let mut text = header.into_bytes();
            let at = u.choose_index(text.len())?;
            text[at] = u.arbitrary()?;
            let text = String::from_utf8_lossy(&text).into_owned();
            let _ = check_github(&secret, &body, Some(&text));
        }
        _ => {
            let extra: String = u.arbitrary()?;
            let _ = check_github(&secret, &body, Some(&format!("{header}{extra}")));
        }
    }
    Ok(())
}

fn ows_text(u: &mut Unstructured) -> arbitrary::Result<&'static str> {
    u.choose(&["", "", " ", "\t", "  "]).copied()
}

// ---------------------------------------------------------------------------------------------
// Standard Webhooks

/// What `StandardWebhooks::new(secret)` must make of the secret: its key.
fn expected_key_of(secret: &str) -> Option<Vec<u8>> {
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    unbase64(b64).filter(|k| !k.is_empty())
}

/// A timestamp as the reference reads it: `+`? then ASCII digits, as a `u64`.
fn timestamp_of(text: &str) -> Option<u64> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut n: u64 = 0;
    for d in digits.bytes() {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(n)
}

/// One Standard Webhooks request.
#[derive(Debug)]
struct Signed<'a> {
    key: &'a [u8],
    tolerance: Duration,
    id: Option<&'a str>,
    timestamp: Option<&'a str>,
    signatures: Option<&'a str>,
    body: &'a [u8],
    now: Timestamp,
}

/// What `verify` must answer.
fn expected_standard(r: &Signed) -> Result<(), WebhookError> {
    let missing = |name| WebhookError::MissingHeader { name };
    let id = r.id.ok_or(missing("webhook-id"))?;
    let text = r.timestamp.ok_or(missing("webhook-timestamp"))?.trim();
    let signatures = r.signatures.ok_or(missing("webhook-signature"))?;
    let ts = timestamp_of(text).ok_or(WebhookError::Malformed {
        name: "webhook-timestamp",
        reason: String::new(),
    })?;
    let now = r.now.0 / 1000;
    let skew = Duration::from_secs(ts.max(now) - ts.min(now));
    if skew > r.tolerance {
        return Err(WebhookError::OutsideTolerance {
            skew,
            tolerance: r.tolerance,
        });
    }
    let mac = hmac_sha256(r.key, &[id.as_bytes(), b".", text.as_bytes(), b".", r.body]);
    let right = format!("v1,{}", base64(&mac));
    let entries: Vec<&str> = signatures.split_whitespace().collect();
    if entries.contains(&right.as_str()) {
        Ok(())
    } else if entries.iter().any(|e| e.starts_with("v1,")) {
        Err(WebhookError::BadSignature)
    } else {
        Err(WebhookError::Malformed {
            name: "webhook-signature",
            reason: String::new(),
        })
    }
}

fn verifier(key: &[u8], prefixed: bool, tolerance: Duration) -> StandardWebhooks {
    let secret = format!("{}{}", if prefixed { "whsec_" } else { "" }, base64(key));
    StandardWebhooks::new(&secret)
        .unwrap_or_else(|e| panic!("the secret {secret:?} of a non-empty key: {e}"))
        .tolerance(tolerance)
}

fn check_standard(v: &StandardWebhooks, r: &Signed) -> Result<(), WebhookError> {
    let got = v.verify(r.id, r.timestamp, r.signatures, r.body, r.now);
    assert_eq!(kind(&got), kind(&expected_standard(r)), "{r:?}");
    got
}

fn tolerance(u: &mut Unstructured) -> arbitrary::Result<Duration> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => Duration::from_secs(300),
        1 => Duration::new(u.int_in_range(0..=600)?, u.int_in_range(0..=999_999_999)?),
        _ => Duration::from_secs(u.int_in_range(0..=600)?),
    })
}

fn lossy(bytes: Option<Vec<u8>>) -> Option<String> {
    bytes.map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn standard_secret(u: &mut Unstructured) -> arbitrary::Result<()> {
    let secret = String::from_utf8_lossy(rest(u)).into_owned();
    let got = StandardWebhooks::new(&secret);
    let expected = expected_key_of(&secret);
    assert_eq!(
        got.is_ok(),
        expected.is_some(),
        "StandardWebhooks::new({secret:?}): {got:?}"
    );
    if let (Ok(v), Some(key)) = (got, expected) {
        // The key it took is the key decoded here: a request signed with it verifies.
        let (id, ts, body) = ("msg_1", "1000", b"{}");
        let mac = hmac_sha256(&key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
        let sig = format!("v1,{}", base64(&mac));
        assert_eq!(
            v.verify(Some(id), Some(ts), Some(&sig), body, Timestamp(1_000_000)),
            Ok(())
        );
    }
    Ok(())
}

fn standard_raw(u: &mut Unstructured) -> arbitrary::Result<()> {
    let key = non_empty(u, 80)?;
    let tolerance = tolerance(u)?;
    let v = verifier(&key, u.arbitrary()?, tolerance);
    let id = lossy(u.arbitrary()?);
    let timestamp = lossy(u.arbitrary()?);
    let signatures = lossy(u.arbitrary()?);
    let now = Timestamp(u.arbitrary()?);
    let body = rest(u);
    let _ = check_standard(
        &v,
        &Signed {
            key: &key,
            tolerance,
            id: id.as_deref(),
            timestamp: timestamp.as_deref(),
            signatures: signatures.as_deref(),
            body,
            now,
        },
    );
    Ok(())
}

/// An entry of a built signature list.
#[derive(Debug, Clone, Arbitrary)]
enum Entry {
    Right,
    /// The right MAC with one byte changed.
    Wrong(u8, u8),
    /// The MAC under another key (a rotated secret).
    OtherKey,
    /// Another version's entry with the right bytes.
    OtherVersion,
    /// The right entry with its padding removed, or one more byte.
    Unpadded,
    Text(String),
}

fn standard_signed(u: &mut Unstructured) -> arbitrary::Result<()> {
    let key = non_empty(u, 80)?;
    let other = non_empty(u, 80)?;
    let tolerance = tolerance(u)?;
    let now_ms: u64 = u.int_in_range(0..=4_000_000_000_000)?;
    let skew: i64 = u.int_in_range(-700..=700)?;
    let ts_value = (now_ms / 1000).saturating_add_signed(skew);
    let ts = match u.int_in_range(0..=7u8)? {
        0 => format!("0{ts_value}"),
        1 => format!("+{ts_value}"),
        _ => ts_value.to_string(),
    };
    let id: String = match u.arbitrary::<Option<String>>()? {
        Some(id) if !id.is_empty() => id,
        _ => "msg_p5jXN8AQM9LWM0D4loKWxJek".into(),
    };
    let body: Vec<u8> = u.arbitrary()?;
    let mac = hmac_sha256(&key, &[id.as_bytes(), b".", ts.as_bytes(), b".", &body]);
    let entries: Vec<Entry> = u.arbitrary()?;
    let entries = if entries.is_empty() {
        vec![Entry::Right]
    } else {
        entries
    };
    let mut list = String::new();
    for (i, e) in entries.iter().enumerate().take(6) {
        if i > 0 {
            list.push_str(u.choose(&[" ", " ", "  ", "\t"])?);
        }
        match e {
            Entry::Right => list.push_str(&format!("v1,{}", base64(&mac))),
            Entry::Wrong(at, x) => {
                let mut m = mac;
                m[usize::from(*at) % 32] ^= (*x).max(1);
                list.push_str(&format!("v1,{}", base64(&m)));
            }
            Entry::OtherKey => {
                let m = hmac_sha256(&other, &[id.as_bytes(), b".", ts.as_bytes(), b".", &body]);
                list.push_str(&format!("v1,{}", base64(&m)));
            }
            Entry::OtherVersion => list.push_str(&format!("v1a,{}", base64(&mac))),
            Entry::Unpadded => {
                let b = base64(&mac);
                list.push_str(&format!("v1,{}", b.trim_end_matches('=')));
            }
            Entry::Text(t) => list.push_str(t),
        }
    }
    let v = verifier(&key, u.arbitrary()?, tolerance);
    let request = Signed {
        key: &key,
        tolerance,
        id: Some(&id),
        timestamp: Some(&ts),
        signatures: Some(&list),
        body: &body,
        now: Timestamp(now_ms),
    };
    let got = check_standard(&v, &request);
    // The rest changes one byte of a request that verified with exactly one right entry.
    if got.is_err() || list.matches(&base64(&mac)).count() != 1 {
        return Ok(());
    }
    // The other key (in rotation) accepts it only if the list carries its own signature.
    let rotated = verifier(&other, true, tolerance);
    let _ = check_standard(
        &rotated,
        &Signed {
            key: &other,
            ..request
        },
    );
    // The fuzzer can learn a signature the verifier compares against and write it into a text
    // entry: a changed request whose own signature the list carries rightly verifies.
    let carried = |id: &str, ts: &str, body: &[u8]| {
        let m = hmac_sha256(&key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
        list.contains(base64(&m).trim_end_matches('='))
    };
    let refused = |r: Result<(), WebhookError>, what: &str| {
        assert!(
            matches!(
                r,
                Err(WebhookError::BadSignature | WebhookError::OutsideTolerance { .. })
            ),
            "{what} changed, the request still verified or was refused otherwise: {r:?}"
        )
    };
    match u.int_in_range(0..=3u8)? {
        0 => {
            let mut body = body.clone();
            if body.is_empty() {
                body.push(b'x');
            } else {
                change_byte(u, &mut body)?;
            }
            if carried(&id, &ts, &body) {
                return Ok(());
            }
            refused(
                check_standard(
                    &v,
                    &Signed {
                        body: &body,
                        ..request
                    },
                ),
                "body",
            );
        }
        1 => {
            // One character replaced by another ASCII one (a changed byte of UTF-8 could decode
            // to the same text).
            let mut chars: Vec<char> = id.chars().collect();
            let at = u.choose_index(chars.len())?;
            let c = char::from(u.int_in_range(0x20..=0x7eu8)?);
            chars[at] = if chars[at] == c { '\u{7f}' } else { c };
            let id: String = chars.into_iter().collect();
            if carried(&id, &ts, &body) {
                return Ok(());
            }
            refused(
                check_standard(
                    &v,
                    &Signed {
                        id: Some(&id),
                        ..request
                    },
                ),
                "id",
            );
        }
        2 => {
            // Another digit (the value changes, the text stays a number).
            let mut t = ts.clone().into_bytes();
            let digits: Vec<usize> = (0..t.len()).filter(|&i| t[i].is_ascii_digit()).collect();
            let at = *u.choose(&digits)?;
            t[at] = b'0' + (t[at] - b'0' + u.int_in_range(1..=9u8)?) % 10;
            let t = String::from_utf8_lossy(&t).into_owned();
            if carried(&id, &t, &body) {
                return Ok(());
            }
            refused(
                check_standard(
                    &v,
                    &Signed {
                        timestamp: Some(&t),
                        ..request
                    },
                ),
                "timestamp",
            );
        }
        _ => {
            let right = format!("v1,{}", base64(&mac));
            let mut m = mac;
            change_byte(u, &mut m)?;
            let list = list.replace(&right, &format!("v1,{}", base64(&m)));
            refused(
                check_standard(
                    &v,
                    &Signed {
                        signatures: Some(&list),
                        ..request
                    },
                ),
                "signature",
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The canonical JSON form

/// JSON values equal, numbers compared as doubles (the canonical form writes `1.0` as `1`).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn check_canonical(body: &[u8]) -> Option<Vec<u8>> {
    let canonical = whitebox::canonical_json(body)?;
    let shown = String::from_utf8_lossy(body);
    let value: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{shown:?} has a canonical form but is not JSON: {e}"));
    let again: Value = serde_json::from_slice(&canonical).unwrap_or_else(|e| {
        panic!(
            "the canonical form of {shown:?}, {:?}, is not JSON: {e}",
            String::from_utf8_lossy(&canonical)
        )
    });
    assert!(
        same_json(&value, &again),
        "{shown:?}: its canonical form has another value"
    );
    assert_eq!(
        whitebox::canonical_json(&canonical).as_deref(),
        Some(canonical.as_slice()),
        "{shown:?}: the canonical form is not its own canonical form"
    );
    Some(canonical)
}

fn json_raw(u: &mut Unstructured) -> arbitrary::Result<()> {
    check_canonical(rest(u));
    Ok(())
}

/// A number's exact decimal value: sign, significant digits (no leading or trailing zeros) and
/// the power of ten of the last one; zero is `(false, "", 0)`. `None` if `text` is not a JSON
/// number (RFC 8259 §6) or its exponent is absurd.
fn exact(text: &str) -> Option<(bool, String, i128)> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(e) => {
            let exp = &rest[e + 1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            let n: i128 = digits.parse().ok()?;
            (&rest[..e], if exp.starts_with('-') { -n } else { n })
        }
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let int_ok = int == "0" || (int.starts_with(|c: char| ('1'..='9').contains(&c)));
    if !int_ok
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || (mantissa.contains('.') && frac.is_empty())
    {
        return None;
    }
    let all = format!("{int}{frac}");
    let significant = all.trim_start_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    let trimmed = significant.trim_end_matches('0');
    let power = exponent - frac.len() as i128 + (significant.len() - trimmed.len()) as i128;
    Some((negative, trimmed.to_owned(), power))
}

/// A number spelled from the input: digits, a point, an exponent; often a second spelling of
/// the same value, sometimes a near one.
fn number(u: &mut Unstructured) -> arbitrary::Result<String> {
    let n = u.int_in_range(1..=25)?;
    let mut digits = String::new();
    for _ in 0..n {
        digits.push(char::from(b'0' + u.int_in_range(0..=9u8)?));
    }
    let digits = match digits.trim_start_matches('0') {
        "" => "0".to_owned(),
        d => d.to_owned(),
    };
    let point = u.int_in_range(0..=digits.len())?;
    let mut text = String::new();
    if u.arbitrary()? {
        text.push('-');
    }
    if point == 0 || point == digits.len() {
        text.push_str(&digits);
    } else if digits.len() > 1 {
        // `0.123` or `12.3`
        let (i, f) = digits.split_at(point);
        text.push_str(&format!("{i}.{f}"));
    } else {
        text.push_str(&digits);
    }
    if u.arbitrary()? {
        let e: i32 = u.int_in_range(-400..=400)?;
        text.push_str(u.choose(&["e", "E"])?);
        if e >= 0 && u.arbitrary()? {
            text.push('+');
        }
        text.push_str(&e.to_string());
    }
    Ok(text)
}

/// Another spelling of `a`'s value (`digits × 10^power`): a fraction `0.` with leading zeros
/// before the digits and trailing zeros after them, or the digits with trailing zeros, each
/// with the exponent that keeps the value.
fn respell(u: &mut Unstructured, a: &str) -> arbitrary::Result<String> {
    let (negative, digits, power) = exact(a).unwrap_or((false, String::new(), 0));
    if digits.is_empty() {
        return Ok(u
            .choose(&["0", "-0", "0.0", "0e5", "-0.000E-7"])?
            .to_string());
    }
    let sign = if negative { "-" } else { "" };
    let lead: usize = u.int_in_range(0..=3)?;
    let trail: usize = u.int_in_range(0..=3)?;
    let (zl, zt) = ("0".repeat(lead), "0".repeat(trail));
    Ok(if u.arbitrary()? {
        // 0.(lead zeros)(digits)(trail zeros) × 10^e = digits × 10^(e - lead - len)
        let e = power + (lead + digits.len()) as i128;
        format!("{sign}0.{zl}{digits}{zt}e{e}")
    } else {
        // (digits)(trail zeros) × 10^e = digits × 10^(e + trail)
        let e = power - trail as i128;
        let plus = if e >= 0 { "+" } else { "" };
        format!("{sign}{digits}{zt}E{plus}{e}")
    })
}

fn json_numbers(u: &mut Unstructured) -> arbitrary::Result<()> {
    let a = number(u)?;
    let b = match u.int_in_range(0..=2u8)? {
        0 => number(u)?,
        _ => respell(u, &a)?,
    };
    let (va, vb) = (exact(&a), exact(&b));
    let wrap = |n: &str| format!("{{\"n\":[{n}]}}");
    let (ca, cb) = (
        check_canonical(wrap(&a).as_bytes()),
        check_canonical(wrap(&b).as_bytes()),
    );
    for (text, value, canonical) in [(&a, &va, &ca), (&b, &vb, &cb)] {
        let value = value
            .as_ref()
            .unwrap_or_else(|| panic!("the harness spelled no JSON number: {text:?}"));
        if let Some(c) = canonical {
            // The canonical text's number has the value written.
            let c = String::from_utf8_lossy(c);
            let n = c
                .strip_prefix("{\"n\":[")
                .and_then(|c| c.strip_suffix("]}"))
                .unwrap_or_else(|| panic!("canonical form of {text:?}: {c}"));
            assert_eq!(exact(n).as_ref(), Some(value), "{text:?} became {n:?}");
        } else if value.1.len() <= 15 && value.2.abs() <= 15 {
            // Up to 15 significant digits near 1 a double holds any decimal exactly enough for
            // the shortest round trip: the form exists.
            panic!("{text:?} has no canonical form");
        }
    }
    if let (Some(ca), Some(cb)) = (&ca, &cb) {
        assert_eq!(
            ca == cb,
            va == vb,
            "{a:?} and {b:?}: same form iff same value"
        );
    }
    Ok(())
}

/// The rest of the input.
fn rest<'a>(u: &mut Unstructured<'a>) -> &'a [u8] {
    u.bytes(u.len()).unwrap_or_default()
}
