//! JSON request bodies in the fingerprint: whether a request labels its body JSON (its
//! `Content-Type`), and the body's RFC 8785 canonical form (JCS, `serde_jcs`) when that form
//! keeps everything a handler could read from the body.

use http::HeaderMap;
use http::header::CONTENT_TYPE;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// True if `headers` has exactly one `Content-Type` field line and its media type is
/// `application/json` or `application/<name>+json` (RFC 9110 §8.3.1, RFC 6839 §3.1): type and
/// subtype are tokens compared without regard to case, whitespace around them is tolerated and
/// parameters (`; charset=utf-8`) are ignored. Two lines, or a value that is no media type, are
/// not a JSON label.
pub(super) fn labelled_json(headers: &HeaderMap) -> bool {
    let mut lines = headers.get_all(CONTENT_TYPE).iter();
    match (lines.next(), lines.next()) {
        (Some(value), None) => is_json_media_type(value.as_bytes()),
        _ => false,
    }
}

/// `value` is a media type (`type "/" subtype *(OWS ";" ...)`) naming JSON.
pub(super) fn is_json_media_type(value: &[u8]) -> bool {
    let essence = match value.iter().position(|&b| b == b';') {
        Some(semicolon) => &value[..semicolon],
        None => value,
    };
    let essence = essence.trim_ascii();
    let Some(slash) = essence.iter().position(|&b| b == b'/') else {
        return false;
    };
    let (kind, subtype) = (&essence[..slash], &essence[slash + 1..]);
    if !is_token(kind) || !is_token(subtype) {
        return false;
    }
    const SUFFIX: &[u8] = b"+json";
    kind.eq_ignore_ascii_case(b"application")
        && (subtype.eq_ignore_ascii_case(b"json")
            || (subtype.len() > SUFFIX.len()
                && subtype[subtype.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX)))
}

/// RFC 9110 §5.6.2 `token`: one or more `tchar`.
fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The RFC 8785 canonical form of `body`, or `None` when `body` is not JSON or when its
/// canonical form would lose something of it:
///
/// - not a JSON text (RFC 8259, UTF-8, at most 128 levels deep: serde_json's parser);
/// - an object with a member name twice, escapes decoded (not I-JSON, RFC 7493 §2.3, which RFC
///   8785 requires: serde_json would keep the last value, another parser the first);
/// - a number whose value the canonical form would change: RFC 8785 writes every number as the
///   shortest form of the IEEE 754 double nearest to it, so `9007199254740993`, `1e-400` or
///   `0.10000000000000000001` would be written as another number (`…992`, `0`, `0.1`).
///
/// So two bodies with the same canonical form hold the same values: the same structure, member
/// names and strings, and numbers of the same decimal value (`1.0` and `1`, `-0` and `0`, `1e2`
/// and `100` are one value each).
pub(super) fn canonical(body: &[u8]) -> Option<Vec<u8>> {
    let Strict(value) = serde_json::from_slice(body).ok()?;
    if !numbers_keep_their_values(body) {
        return None;
    }
    serde_jcs::to_vec(&value).ok()
}

/// A JSON value parsed like serde_json's `Value`, except that an object with a member name twice
/// is an error.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value without duplicate member names")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        Number::from_f64(n)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(de::Error::custom("a member name twice in one object"));
            }
            let Strict(value) = map.next_value()?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

/// Every number of the JSON text `body` has the decimal value of its canonical form.
///
/// `body` parsed as JSON, so outside strings a number is exactly a run that starts with `-` or
/// a digit and goes on over digits, `-`, `+`, `.`, `e`, `E`; strings are skipped with their
/// escapes (`\"` does not end one).
fn numbers_keep_their_values(body: &[u8]) -> bool {
    let mut i = 0;
    while let Some(&b) = body.get(i) {
        match b {
            b'"' => {
                i += 1;
                while let Some(&c) = body.get(i) {
                    match c {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while body
                    .get(i)
                    .is_some_and(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                {
                    i += 1;
                }
                if !number_keeps_its_value(body.get(start..i).unwrap_or_default()) {
                    return false;
                }
            }
            _ => i += 1,
        }
    }
    true
}

/// The JSON number `token` and its RFC 8785 form (as the canonical body writes it) have the
/// same decimal value.
fn number_keeps_its_value(token: &[u8]) -> bool {
    let canonical = serde_json::from_slice::<Value>(token)
        .ok()
        .and_then(|v| serde_jcs::to_vec(&v).ok());
    match (decimal(token), canonical.as_deref().and_then(decimal)) {
        (Some(written), Some(canonical)) => written == canonical,
        _ => false,
    }
}

/// The exact value of a decimal number (JSON's grammar, or ECMAScript's `1e+21`): its sign,
/// its significant digits without leading or trailing zeros, and the power of ten of the last
/// one. Zero, of either sign, is `(false, [], 0)`. `None` for what is not such a number, or an
/// exponent beyond `i64`.
fn decimal(text: &[u8]) -> Option<(bool, Vec<u8>, i64)> {
    let (negative, rest) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let (mantissa, exponent) = match rest.iter().position(|&b| b == b'e' || b == b'E') {
        Some(e) => (&rest[..e], exponent(&rest[e + 1..])?),
        None => (rest, 0),
    };
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        // A dot needs a digit after it.
        Some(dot) if dot + 1 == mantissa.len() => return None,
        Some(dot) => (&mantissa[..dot], &mantissa[dot + 1..]),
        None => (mantissa, &[][..]),
    };
    if int.is_empty() || !int.iter().chain(frac).all(u8::is_ascii_digit) {
        return None;
    }
    let digits: Vec<u8> = int.iter().chain(frac).copied().collect();
    let Some(first) = digits.iter().position(|&d| d != b'0') else {
        return Some((false, Vec::new(), 0));
    };
    // A nonzero digit exists (`first`), so `rposition` finds one at or after it.
    let last = digits.iter().rposition(|&d| d != b'0').unwrap_or(first);
    let trailing = i64::try_from(digits.len() - 1 - last).ok()?;
    let frac_len = i64::try_from(frac.len()).ok()?;
    let power = exponent.checked_sub(frac_len)?.checked_add(trailing)?;
    Some((negative, digits[first..=last].to_vec(), power))
}

/// An exponent's digits with an optional sign, as an `i64`.
fn exponent(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: i64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn labelled(lines: &[&[u8]]) -> bool {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(CONTENT_TYPE, HeaderValue::from_bytes(line).unwrap());
        }
        labelled_json(&headers)
    }

    #[test]
    fn json_labels_are_parsed_as_media_types() {
        for json in [
            &b"application/json"[..],
            b"APPLICATION/JSON",
            b"Application/Json; charset=utf-8",
            b"application/json;charset=UTF-8",
            b"application/json ; charset=utf-8",
            b" application/json\t",
            b"application/json;",
            b"application/merge-patch+json",
            b"application/problem+JSON; charset=utf-8",
            b"application/vnd.api+json",
        ] {
            assert!(labelled(&[json]), "{}", String::from_utf8_lossy(json));
        }
        for other in [
            &b""[..],
            b"text/plain",
            b"text/json",
            b"application/jsonx",
            b"application/json-seq",
            b"application/x-json5",
            b"application/+json",
            b"application/json+zip",
            b"application",
            b"application/",
            b"/json",
            b"application /json",
            b"application/ json",
            b"application/json garbage",
            b"application/json, text/plain",
            b"multipart/form-data; boundary=x",
        ] {
            assert!(!labelled(&[other]), "{}", String::from_utf8_lossy(other));
        }
        assert!(!labelled(&[]), "no Content-Type");
        assert!(
            !labelled(&[b"application/json", b"application/json"]),
            "two field lines"
        );
        // A value that is not visible ASCII is not a JSON label (and no panic).
        assert!(!labelled(&[b"application/js\xc3\xb6n"]));
    }

    fn canon(body: &str) -> Option<String> {
        canonical(body.as_bytes()).map(|c| String::from_utf8(c).unwrap())
    }

    #[test]
    fn canonical_form_sorts_members_drops_whitespace_and_writes_numbers_once() {
        let c = r#"{"a":[1,true,null,"x"],"b":{"c":"é/"}}"#;
        assert_eq!(canon(c).as_deref(), Some(c));
        assert_eq!(
            canon(
                "{ \"b\" : { \"c\" : \"\\u00e9\\/\" },\n \"a\" : [ 1.0 , true , null , \"x\" ] }"
            )
            .as_deref(),
            Some(c)
        );
        // One value, several spellings (RFC 8785 §3.2.2.3).
        for (written, canonical) in [
            ("1.0", "1"),
            ("1", "1"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0e5", "0"),
            ("1e2", "100"),
            ("1E+2", "100"),
            ("100", "100"),
            ("0.10", "0.1"),
            ("1e21", "1e+21"),
            ("1e-7", "1e-7"),
            ("9007199254740992", "9007199254740992"),
            ("-9007199254740992", "-9007199254740992"),
            ("100000000000000000000", "100000000000000000000"),
            ("5e-324", "5e-324"),
        ] {
            assert_eq!(canon(written).as_deref(), Some(canonical), "{written}");
        }
    }

    #[test]
    fn what_canonicalisation_would_change_has_no_canonical_form() {
        for body in [
            // Not JSON.
            "",
            " ",
            "{",
            r#"{"a":1,}"#,
            "{'a':1}",
            "\u{feff}{}",
            "NaN",
            r#""\ud800""#,
            "1 2",
            // A member name twice, also through an escape or in a nested object.
            r#"{"a":1,"a":1}"#,
            r#"{"a":1,"\u0061":2}"#,
            r#"[{"x":{"y":1,"y":2}}]"#,
            // Numbers the canonical form would change.
            "9007199254740993",
            "-9007199254740993",
            "18446744073709551617",
            "9007199254740992.5",
            "0.10000000000000000001",
            "1e-400",
            "1e400",
            r#"{"n":[1,2,12345678901234567890]}"#,
        ] {
            assert_eq!(canon(body), None, "{body:?}");
        }
        // Not UTF-8.
        assert_eq!(canonical(b"\"\xff\""), None);
        // Deeper than serde_json's limit: an error, not a stack overflow.
        assert_eq!(canon(&"[".repeat(100_000)), None);
        assert!(canon(&format!("{}{}", "[".repeat(100), "]".repeat(100))).is_some());
    }

    #[test]
    fn numbers_in_strings_and_member_names_are_not_numbers() {
        // `9007199254740993` inside a string is a string: kept as written.
        assert_eq!(
            canon(r#"{"9007199254740993":"9007199254740993 \"1e-400\""}"#).as_deref(),
            Some(r#"{"9007199254740993":"9007199254740993 \"1e-400\""}"#)
        );
    }

    #[test]
    fn decimal_values() {
        let d = |s: &str| decimal(s.as_bytes());
        assert_eq!(d("0"), Some((false, vec![], 0)));
        assert_eq!(d("-0.000e7"), Some((false, vec![], 0)));
        assert_eq!(d("1.0"), d("1"));
        assert_eq!(d("1e2"), d("100"));
        assert_eq!(d("1e+21"), d("1000000000000000000000"));
        assert_eq!(d("0.0012"), Some((false, b"12".to_vec(), -4)));
        assert_eq!(d("-120"), Some((true, b"12".to_vec(), 1)));
        assert_ne!(d("1"), d("-1"));
        assert_ne!(d("0.1"), d("0.10000000000000000001"));
        for bad in [
            "",
            "-",
            ".5",
            "1.",
            "1.e2",
            "1e",
            "1e+",
            "e5",
            "1x",
            "1e99999999999999999999",
        ] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
    }
}
