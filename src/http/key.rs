//! The `Idempotency-Key` field grammar (`docs/HTTP.md`, "The key grammar"): exactly one
//! Structured Field string without parameters, or a bare key.

use http::header::HeaderName;

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Why a key field was refused (the problem's `detail` names the header). Public only through
/// the white-box hooks (`idem::http::whitebox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The field appears on this many lines.
    Lines(usize),
    /// No characters (an empty value, or `""`).
    Empty,
    /// Longer than the store's key limit.
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Starts with a quote but is not exactly one Structured Field string without parameters.
    NotAString(String),
    /// A bare key with a character outside its alphabet, at this byte offset.
    BadChar {
        /// The byte.
        byte: u8,
        /// Its offset in the value (after the whitespace around it).
        at: usize,
    },
}

impl KeyError {
    pub(super) fn detail(&self, header: &HeaderName) -> String {
        match self {
            KeyError::Lines(n) => format!(
                "the request has {n} {header} field lines: send exactly one key (two lines, or \
                 one line listing two keys, never name one intent)"
            ),
            KeyError::Empty => format!("the {header} is empty: send a new unique key per intent"),
            KeyError::TooLong { len, max } => format!(
                "the {header} is {len} bytes, over the store's limit of {max} (Limits::max_key_len)"
            ),
            KeyError::NotAString(why) => format!(
                "the {header} starts with a quote but is not one Structured Field string \
                 (RFC 9651) without parameters: {why}"
            ),
            KeyError::BadChar { byte, at } => format!(
                "the {header} has byte 0x{byte:02x} at offset {at}; an unquoted key is visible \
                 ASCII without '\"', ',', ';', '\\' or whitespace (quote it as a Structured \
                 Field string, \"...\", to use spaces)"
            ),
        }
    }
}

/// A byte a bare (unquoted) key may contain: visible ASCII except the characters that would
/// make it ambiguous with a Structured Field string (`"`, `\`), a list (`,`) or parameters
/// (`;`). Whitespace and control characters are never part of a key.
fn bare_key_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'"' | b',' | b';' | b'\\')
}

/// Optional whitespace around a field value (RFC 9110 §5.5) is not part of it.
pub(super) fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

/// Parses one key field value (see `docs/HTTP.md`): a value starting with `"` must be exactly
/// one Structured Field string without parameters (RFC 9651, parsed by `sfv`); any other value
/// is a bare key of [`bare_key_byte`]s (Stripe-style clients send unquoted UUIDs). Either way
/// 1..=`max_len` bytes.
pub(super) fn parse_key(value: &[u8], max_len: usize) -> Result<String, KeyError> {
    let v = trim_ows(value);
    let key = if v.first() == Some(&b'"') {
        sfv::Parser::new(v)
            .parse_item_with_visitor(KeyItem)
            .map_err(|e| KeyError::NotAString(e.to_string()))?
    } else {
        if let Some(at) = v.iter().position(|&b| !bare_key_byte(b)) {
            return Err(KeyError::BadChar { byte: v[at], at });
        }
        // Every byte is ASCII (checked above), so this never fails.
        String::from_utf8(v.to_vec()).map_err(|_| KeyError::BadChar { byte: 0, at: 0 })?
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > max_len {
        return Err(KeyError::TooLong {
            len: key.len(),
            max: max_len,
        });
    }
    Ok(key)
}

/// `sfv` visitor of the key item: a String bare item, no parameters.
struct KeyItem;

/// The key's parameters visitor: refuses any parameter.
struct NoParams(String);

/// Why a quoted value is not a key (wrapped into `sfv`'s error message).
#[derive(Debug)]
struct NotAKey(&'static str);

impl std::fmt::Display for NotAKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for NotAKey {}

impl<'de> sfv::visitor::ItemVisitor<'de> for KeyItem {
    type Out = String;
    type Error = NotAKey;

    fn bare_item(
        self,
        bare_item: sfv::BareItemFromInput<'de>,
    ) -> Result<impl sfv::visitor::ParameterVisitor<'de, Out = String>, NotAKey> {
        match bare_item {
            sfv::GenericBareItem::String(s) => Ok(NoParams(s.as_str().to_owned())),
            _ => Err(NotAKey("the value is not a string")),
        }
    }
}

impl<'de> sfv::visitor::ParameterVisitor<'de> for NoParams {
    type Out = String;
    type Error = NotAKey;

    fn parameter(
        &mut self,
        _key: &'de sfv::KeyRef,
        _value: sfv::BareItemFromInput<'de>,
    ) -> Result<(), NotAKey> {
        Err(NotAKey("the key has parameters"))
    }

    fn finish(self) -> Result<String, NotAKey> {
        Ok(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_grammar_table() {
        const MAX: usize = 8;
        let ok = |v: &[u8], k: &str| assert_eq!(parse_key(v, MAX), Ok(k.to_owned()), "{v:?}");
        let not_a_string = |v: &[u8]| {
            assert!(
                matches!(parse_key(v, MAX), Err(KeyError::NotAString(_))),
                "{:?}: {:?}",
                String::from_utf8_lossy(v),
                parse_key(v, MAX)
            )
        };
        let bad_char = |v: &[u8], byte: u8, at: usize| {
            assert_eq!(
                parse_key(v, MAX),
                Err(KeyError::BadChar { byte, at }),
                "{v:?}"
            )
        };

        // Structured Field strings (RFC 9651 §3.3.3), parsed by sfv.
        ok(b"\"abc\"", "abc");
        ok(b"\"a b\"", "a b");
        ok(b"\"a\\\"b\"", "a\"b");
        ok(b"\"a\\\\b\"", "a\\b");
        ok(b"\"a,b\"", "a,b");
        ok(b"\"a;b\"", "a;b");
        ok(b" \"abc\" ", "abc");
        ok(b"\t\"abc\"\t", "abc");
        ok(b"\"12345678\"", "12345678");
        not_a_string(b"\"abc\";p=1"); // parameters
        not_a_string(b"\"abc\";p"); // a boolean parameter
        not_a_string(b"\"abc\"; p=1");
        not_a_string(b"\"a\", \"b\""); // a list
        not_a_string(b"\"a\",\"b\"");
        not_a_string(b"\"a\" \"b\"");
        not_a_string(b"\"abc"); // unbalanced quote
        not_a_string(b"\"abc\\\""); // the closing quote is escaped
        not_a_string(b"\"abc\"x"); // trailing characters
        not_a_string(b"\"abc\",");
        not_a_string(b"\"a\\tb\""); // only \" and \\ are escapes
        not_a_string(b"\"a\tb\""); // a control character in the string
        not_a_string(b"\"a\x7fb\"");
        not_a_string(b"\"caf\xc3\xa9\""); // not ASCII
        not_a_string(b"\"");
        assert_eq!(parse_key(b"\"\"", MAX), Err(KeyError::Empty));
        assert_eq!(parse_key(b" \"\" ", MAX), Err(KeyError::Empty));
        assert_eq!(
            parse_key(b"\"123456789\"", MAX),
            Err(KeyError::TooLong { len: 9, max: MAX })
        );

        // Bare keys: Stripe-style values, visible ASCII without " , ; \ or whitespace.
        ok(b"abc", "abc");
        ok(b"8e03978e", "8e03978e"); // starts with a digit: not an sf-token, still a key
        ok(b"a-b_c.d~", "a-b_c.d~");
        ok(b"?1", "?1");
        ok(b":YQ==:", ":YQ==:");
        ok(b"*/+=!#$%", "*/+=!#$%");
        ok(b"(a)", "(a)");
        ok(b"@1", "@1");
        ok(b"  abc\t", "abc"); // OWS around the value is not part of it
        ok(b"12345678", "12345678");
        bad_char(b"a, b", b',', 1); // a combined list
        bad_char(b"a,b", b',', 1);
        bad_char(b"a;p=1", b';', 1); // parameters
        bad_char(b"a b", b' ', 1); // whitespace inside
        bad_char(b"a\tb", b'\t', 1);
        bad_char(b"a\x01b", 0x01, 1); // control characters
        bad_char(b"a\x7fb", 0x7f, 1);
        bad_char(b"abc\"", b'"', 3); // a quote not at the start
        bad_char(b"a\\b", b'\\', 1);
        bad_char(b"caf\xc3\xa9", 0xc3, 3); // not ASCII
        bad_char(b"\xff", 0xff, 0);
        assert_eq!(parse_key(b"", MAX), Err(KeyError::Empty));
        assert_eq!(parse_key(b" \t ", MAX), Err(KeyError::Empty));
        assert_eq!(
            parse_key(b"123456789", MAX),
            Err(KeyError::TooLong { len: 9, max: MAX })
        );

        // Every single byte, bare: exactly the alphabet is accepted.
        for b in 0..=255u8 {
            let accepted = parse_key(&[b'k', b, b'k'], MAX).is_ok();
            let expected = (0x21..=0x7e).contains(&b) && !b"\",;\\".contains(&b);
            assert_eq!(accepted, expected, "byte 0x{b:02x}");
        }
        // Two field lines are refused before parsing (`key_of`); the detail says so.
        assert!(
            KeyError::Lines(2)
                .detail(&HeaderName::from_static(IDEMPOTENCY_KEY))
                .contains("2 idempotency-key field lines")
        );
    }
}
