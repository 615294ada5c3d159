//! The `IDH1` / `IDH2` envelope in which the HTTP layer stores an answer's replayed headers and
//! body as a record's response body (`docs/FORMAT.md`, "HTTP layer formats"), read as plain
//! bytes: no HTTP types, so a tool that only reads a store file (the `idem` CLI) decodes it
//! without the HTTP layer's dependencies. The layer writes the envelope and checks each name
//! and value against HTTP's grammar on top of this structure (`src/http/envelope.rs`).
//!
//! A stored format: any change needs a new magic.

/// The envelope of an answer kept whole.
pub(crate) const ENVELOPE_V1: &[u8; 4] = b"IDH1";

/// The envelope with a flags byte, written only when a flag is set.
pub(crate) const ENVELOPE_V2: &[u8; 4] = b"IDH2";

/// `IDH2` flag: the body (and the headers that describe it) was over the store's response cap
/// and was not kept. The only flag; any other bit makes the envelope unreadable.
pub(crate) const FLAG_BODY_OMITTED: u8 = 0x01;

/// An HTTP answer as the HTTP layer stored it in a record's response body: the replayed
/// header field lines and the body, borrowed from the stored bytes.
///
/// `docs/FORMAT.md` ("HTTP layer formats") gives the layout:
/// `"IDH1" ‖ u16be(count) ‖ (u16be(len) ‖ name ‖ u32be(len) ‖ value)* ‖ body`, or `"IDH2" ‖
/// u8(flags) ‖` the same from the count on. The response's status is the HTTP status
/// ([`Response::status`](crate::Response::status)); it is not in the envelope.
///
/// ```
/// use idem::format::HttpEnvelope;
///
/// let stored = b"IDH1\x00\x01\x00\x0ccontent-type\x00\x00\x00\x10application/json{\"id\":1}";
/// let env = HttpEnvelope::decode(stored)?.expect("the bytes start with a magic");
/// assert_eq!(env.magic(), "IDH1");
/// assert_eq!(env.headers(), [(&b"content-type"[..], &b"application/json"[..])]);
/// assert_eq!(env.body(), br#"{"id":1}"#);
/// assert!(!env.body_omitted());
///
/// // A body written by other code (no magic) is not an envelope.
/// assert_eq!(HttpEnvelope::decode(b"plain"), Ok(None));
/// # Ok::<(), idem::format::EnvelopeError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEnvelope<'a> {
    magic: &'static str,
    headers: Vec<(&'a [u8], &'a [u8])>,
    body: &'a [u8],
    body_omitted: bool,
}

/// Why stored bytes that start with an envelope magic are not a readable envelope. The HTTP
/// layer answers a retry of such a record `500` (`urn:idem:problem:store-failed`), never a
/// guess, and does not run the handler again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The bytes end inside a field.
    #[error(
        "the envelope is cut short: its {field} at byte {offset} needs {needed} bytes, {left} are left"
    )]
    Truncated {
        /// The field that is cut short (`flags`, `header count`, `name length`, `name`,
        /// `value length`, `value`).
        field: &'static str,
        /// Where the field starts, counted from the magic's first byte.
        offset: usize,
        /// How many bytes the field needs.
        needed: usize,
        /// How many bytes are left from `offset` on.
        left: usize,
    },
    /// An `IDH2` flag bit this release does not know: what it would mean is not guessed at.
    #[error("the envelope has flags 0x{flags:02x}, of which this release knows only 0x01")]
    UnknownFlags {
        /// The flags byte.
        flags: u8,
    },
}

impl<'a> HttpEnvelope<'a> {
    /// Reads a stored response body. `Ok(None)` when the bytes do not start with `IDH1` or
    /// `IDH2`: a body written by other code through the store API, or a status-only record
    /// (empty bytes), which the layer replays as the body without headers. An error when they
    /// start with a magic but are cut short or carry an unknown flag.
    ///
    /// Names and values are returned as stored. The layer also requires each to be a valid
    /// HTTP field name and value when it replays them (and answers `500` otherwise); this
    /// function does not judge HTTP's grammar.
    pub fn decode(stored: &'a [u8]) -> Result<Option<Self>, EnvelopeError> {
        let mut r = Reader {
            rest: stored,
            offset: 0,
        };
        let (magic, flags) = if stored.starts_with(ENVELOPE_V1) {
            r.take(4, "magic")?;
            ("IDH1", 0)
        } else if stored.starts_with(ENVELOPE_V2) {
            r.take(4, "magic")?;
            let flags = r.take(1, "flags")?[0];
            if flags & !FLAG_BODY_OMITTED != 0 {
                return Err(EnvelopeError::UnknownFlags { flags });
            }
            ("IDH2", flags)
        } else {
            return Ok(None);
        };
        let count = r.u16be("header count")?;
        let mut headers = Vec::with_capacity(usize::from(count).min(r.rest.len() / 6));
        for _ in 0..count {
            let n = r.u16be("name length")?;
            let name = r.take(usize::from(n), "name")?;
            let n = r.u32be("value length")?;
            // On a 16-bit target a length over usize::MAX cannot be there: cut short.
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let value = r.take(n, "value")?;
            headers.push((name, value));
        }
        Ok(Some(HttpEnvelope {
            magic,
            headers,
            body: r.rest,
            body_omitted: flags & FLAG_BODY_OMITTED != 0,
        }))
    }

    /// `"IDH1"` (an answer kept whole) or `"IDH2"` (with a flags byte).
    pub fn magic(&self) -> &'static str {
        self.magic
    }

    /// The replayed header field lines, `(name, value)`, in stored order (the order of the
    /// layer's replay set; the lines of one name in the order of the answer).
    pub fn headers(&self) -> &[(&'a [u8], &'a [u8])] {
        &self.headers
    }

    /// The answer's body: every byte after the last header. Empty when
    /// [`body_omitted`](Self::body_omitted).
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// The answer was over the store's `max_response_bytes`: its body, and the headers that
    /// describe it, were not kept (`IDH2` flag `0x01`). A retry gets the status and these
    /// headers with an empty body and `Idempotent-Body-Omitted: true`.
    pub fn body_omitted(&self) -> bool {
        self.body_omitted
    }
}

/// Reads the envelope front to back.
struct Reader<'a> {
    rest: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], EnvelopeError> {
        if self.rest.len() < n {
            return Err(EnvelopeError::Truncated {
                field,
                offset: self.offset,
                needed: n,
                left: self.rest.len(),
            });
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        self.offset += n;
        Ok(head)
    }

    fn u16be(&mut self, field: &'static str) -> Result<u16, EnvelopeError> {
        let b = self.take(2, field)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32be(&mut self, field: &'static str) -> Result<u32, EnvelopeError> {
        let b = self.take(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_layouts_decode() {
        let v1 = b"IDH1\x00\x02\x00\x0ccontent-type\x00\x00\x00\x03a/b\x00\x08location\x00\x00\x00\x02/xhi";
        let env = HttpEnvelope::decode(v1).unwrap().unwrap();
        assert_eq!(env.magic(), "IDH1");
        assert_eq!(
            env.headers(),
            [
                (&b"content-type"[..], &b"a/b"[..]),
                (&b"location"[..], &b"/x"[..])
            ]
        );
        assert_eq!((env.body(), env.body_omitted()), (&b"hi"[..], false));

        let v2 = b"IDH2\x01\x00\x01\x00\x08location\x00\x00\x00\x02/x";
        let env = HttpEnvelope::decode(v2).unwrap().unwrap();
        assert_eq!(env.magic(), "IDH2");
        assert_eq!(env.headers(), [(&b"location"[..], &b"/x"[..])]);
        assert!(env.body_omitted() && env.body().is_empty());

        // IDH2 without a flag is never written; it reads like IDH1.
        let env = HttpEnvelope::decode(b"IDH2\x00\x00\x00hi")
            .unwrap()
            .unwrap();
        assert!(!env.body_omitted() && env.headers().is_empty() && env.body() == b"hi");
        // An empty envelope: no header, no body.
        let env = HttpEnvelope::decode(b"IDH1\x00\x00").unwrap().unwrap();
        assert!(env.headers().is_empty() && env.body().is_empty());
    }

    #[test]
    fn bytes_without_a_magic_are_not_an_envelope() {
        for plain in [&b""[..], b"raw", b"IDH", b"IDH3\x00\x00", b"idh1\x00\x00"] {
            assert_eq!(HttpEnvelope::decode(plain), Ok(None), "{plain:?}");
        }
    }

    #[test]
    fn damage_is_an_error_that_names_the_field() {
        let cut = |field, offset, needed, left| {
            Err(EnvelopeError::Truncated {
                field,
                offset,
                needed,
                left,
            })
        };
        assert_eq!(HttpEnvelope::decode(b"IDH2"), cut("flags", 4, 1, 0));
        assert_eq!(
            HttpEnvelope::decode(b"IDH1\x00"),
            cut("header count", 4, 2, 1)
        );
        assert_eq!(
            HttpEnvelope::decode(b"IDH1\x00\x01\x00\x05ab"),
            cut("name", 8, 5, 2)
        );
        assert_eq!(
            HttpEnvelope::decode(b"IDH1\x00\x01\x00\x01a\x00\x00\x00\x05b"),
            cut("value", 13, 5, 1)
        );
        assert_eq!(
            HttpEnvelope::decode(b"IDH1\x00\x01\x00\x01a\x00\x00"),
            cut("value length", 9, 4, 2)
        );
        for flags in [0x02, 0x81, 0xff] {
            assert_eq!(
                HttpEnvelope::decode(&[b'I', b'D', b'H', b'2', flags, 0, 0]),
                Err(EnvelopeError::UnknownFlags { flags })
            );
        }
        let msg = HttpEnvelope::decode(b"IDH1\x00").unwrap_err().to_string();
        assert!(
            msg.contains("cut short") && msg.contains("header count"),
            "{msg}"
        );
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic() {
        let whole = b"IDH1\x00\x02\x00\x0ccontent-type\x00\x00\x00\x03a/b\x00\x08location\x00\x00\x00\x02/x";
        for cut in 4..whole.len() {
            assert!(HttpEnvelope::decode(&whole[..cut]).is_err(), "cut at {cut}");
        }
        assert!(HttpEnvelope::decode(whole).unwrap().is_some());
        // A count far larger than the bytes: an error, without reserving room for it.
        assert!(HttpEnvelope::decode(b"IDH1\xff\xff").is_err());
    }
}
