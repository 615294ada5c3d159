//! The stored values of the messaging layer, with their encodings (docs/FORMAT.md gives every
//! byte): an inbox [`Mark`] (a processed message or a received webhook delivery) and a version
//! [`HighWaterMark`]. The rules about them are in `rules::inbox` and `rules::versions`.

use crate::error::{Error, Field};
use crate::model::clock::Timestamp;
use crate::model::record::checksum8;
use crate::model::response::{Resource, Response};
use crate::model::rules::{InboxDecision, inbox_decide};
use crate::model::scope::Limits;

/// Key namespace of consumer inbox marks (`process`).
pub(crate) const NS_INBOX: u8 = 0x01;
/// Key namespace of webhook receipts (`receive`).
pub(crate) const NS_WEBHOOK: u8 = 0x02;

/// The key of a mark (docs/FORMAT.md, "Inbox marks"): `ns ‖ u16be(len subscriber) ‖
/// subscriber ‖ id`, where the subscriber (or webhook source) is limited like an operation and
/// the message (or delivery) id like a key; errors name them `operation` and `idempotency
/// key`.
pub(crate) fn mark_key(
    ns: u8,
    subscriber: &str,
    id: &[u8],
    limits: &Limits,
) -> Result<Vec<u8>, Error> {
    check(Field::Operation, subscriber.len(), limits.max_operation_len)?;
    check(Field::Key, id.len(), limits.max_key_len)?;
    let mut key = Vec::with_capacity(3 + subscriber.len() + id.len());
    key.push(ns);
    // Limits are ≤ u16::MAX (validated at open).
    key.extend_from_slice(&(subscriber.len() as u16).to_be_bytes());
    key.extend_from_slice(subscriber.as_bytes());
    key.extend_from_slice(id);
    Ok(key)
}

fn check(field: Field, len: usize, max: usize) -> Result<(), Error> {
    if len == 0 {
        return Err(Error::Empty { field });
    }
    if len > max {
        return Err(Error::TooLong { field, len, max });
    }
    Ok(())
}

/// A stored mark: when the message was processed, when the mark is forgotten, and the
/// response of a first handling that was a terminal rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Mark {
    /// When the message was processed (the store clock's time of the transaction).
    pub processed_at: Timestamp,
    /// From this instant the mark is treated as absent (and swept).
    pub forget_at: Timestamp,
    /// The response of [`Abort::Terminal`](crate::model::response::Abort::Terminal) when the first
    /// handling rejected the message (`ProcessAnswer::Rejected`, `ReceiveAnswer::Rejected`), answered
    /// again to every redelivery;
    /// `None` when it was processed (and for marks written before rejections were kept).
    pub rejection: Option<Response>,
}

/// The answer of an inbox's `process` (`Store::process`, and the same call of every engine).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessAnswer<T> {
    /// The closure ran; its writes and the mark committed together. Ack the message.
    Ran(T),
    /// The closure returned [`Abort::Terminal`](crate::model::response::Abort::Terminal): the mark (keeping this response) and the
    /// closure's writes committed (the message is consumed, a redelivery is a duplicate that
    /// carries the same response); the response says why.
    Rejected(Response),
    /// The message was processed before: the closure did not run. Ack the message.
    Duplicate {
        /// When it was processed.
        processed_at: Timestamp,
        /// `Some(response)` when the first handling was a terminal rejection: the response it
        /// returned then ([`ProcessAnswer::Rejected`]), so a redelivery can be answered the same
        /// way (e.g. the same dead-letter reason). `None` when the first handling succeeded
        /// (the closure's value is not kept: keep what a redelivery needs in your own tables,
        /// written in the same transaction), and for marks written before rejections were kept.
        rejection: Option<Response>,
    },
}

/// The answer of a webhook `receive` (`Store::receive`, and the same call of every engine).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReceiveAnswer<T> {
    /// First delivery: the receipt and the closure's writes committed together (answer 2xx).
    Ran(T),
    /// The closure returned [`Abort::Terminal`](crate::model::response::Abort::Terminal): the receipt (keeping this response) and the
    /// closure's writes committed; answer the sender with this response (a redelivery is a
    /// duplicate that carries the same response).
    Rejected(Response),
    /// This delivery id was received before: nothing ran.
    Duplicate {
        /// When the first delivery was received.
        received_at: Timestamp,
        /// `Some(response)` when the first delivery was rejected ([`ReceiveAnswer::Rejected`]):
        /// answer the redelivery with that same response, not with a 2xx. `None` when the
        /// first delivery was accepted: answer 2xx so the sender stops (and for receipts
        /// written before rejections were kept).
        rejection: Option<Response>,
    },
}

/// How a delivery was consumed, before it is named for the inbox or for webhooks.
pub(crate) enum Consumed<T> {
    Ran(T),
    Rejected(Response),
    Duplicate(Timestamp, Option<Response>),
}

/// The duplicate answer for a live `mark` at `now`, or `None` when the message may run.
pub(crate) fn duplicate<T>(mark: Option<Mark>, now: Timestamp) -> Option<Consumed<T>> {
    let mark = mark?;
    match inbox_decide(Some(&mark), now) {
        InboxDecision::Duplicate { processed_at } => {
            Some(Consumed::Duplicate(processed_at, mark.rejection))
        }
        InboxDecision::Process => None,
    }
}

/// The blake3 key-derivation context of a plain mark's checksum (docs/FORMAT.md).
const MARK_CHECKSUM_CONTEXT: &str = "idem 2026-11-30 inbox mark checksum";

/// The blake3 key-derivation context of the checksum of a mark that keeps a rejection.
const REJECTION_MARK_CHECKSUM_CONTEXT: &str = "idem 2026-11-30 inbox mark with rejection checksum";

/// A plain mark's length: two big-endian u64 instants and an 8-byte checksum of them. Every
/// mark without a rejection is written this way (as before rejections were kept), so a build
/// that predates them reads it.
const MARK_LEN: usize = 24;

/// The first byte of a mark that keeps a rejection (docs/FORMAT.md, "Inbox marks"). Such a
/// value is never 24 bytes long, so it is never mistaken for a plain mark, and no plain mark
/// is ever read as one.
const REJECTION_MARK_TAG: u8 = 0x03;

/// The shortest mark with a rejection: tag, two instants, status, body length, resource flag,
/// checksum.
const REJECTION_MARK_MIN_LEN: usize = 1 + 8 + 8 + 2 + 4 + 1 + 8;

impl Mark {
    /// The stored bytes: a plain 24-byte mark, or a tagged mark that keeps the rejection.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let Some(r) = &self.rejection else {
            let mut out = Vec::with_capacity(MARK_LEN);
            out.extend_from_slice(&self.processed_at.0.to_be_bytes());
            out.extend_from_slice(&self.forget_at.0.to_be_bytes());
            let sum = checksum8(MARK_CHECKSUM_CONTEXT, &out);
            out.extend_from_slice(&sum);
            return out;
        };
        let mut out = Vec::with_capacity(REJECTION_MARK_MIN_LEN + r.stored_len() + 8);
        out.push(REJECTION_MARK_TAG);
        out.extend_from_slice(&self.processed_at.0.to_be_bytes());
        out.extend_from_slice(&self.forget_at.0.to_be_bytes());
        out.extend_from_slice(&r.status().to_be_bytes());
        put_bytes(&mut out, r.body());
        match r.resource() {
            None => out.push(0),
            Some(res) => {
                out.push(1);
                put_bytes(&mut out, res.kind.as_bytes());
                put_bytes(&mut out, res.id.as_bytes());
            }
        }
        let sum = checksum8(REJECTION_MARK_CHECKSUM_CONTEXT, &out);
        out.extend_from_slice(&sum);
        out
    }

    /// A mark that does not decode is an error, never "no mark": treating it as absent would
    /// process the message a second time.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Mark, Error> {
        let corrupt = |what: String| Error::CorruptRecord {
            reason: format!("inbox mark: {what}"),
        };
        const DAMAGED: &str = "checksum mismatch: its bytes changed after idem wrote them (Store::purge_inbox_mark or Store::purge_webhook_receipt removes it, and the message is then processed again)";
        if bytes.len() != MARK_LEN {
            return match bytes.first() {
                Some(&REJECTION_MARK_TAG) if bytes.len() >= REJECTION_MARK_MIN_LEN => {
                    let (covered, sum) = bytes.split_at(bytes.len() - 8);
                    if checksum8(REJECTION_MARK_CHECKSUM_CONTEXT, covered) != sum {
                        return Err(corrupt(DAMAGED.into()));
                    }
                    decode_rejection_mark(&covered[1..]).map_err(corrupt)
                }
                // Only a later release writes other first bytes in a value of this length.
                Some(&found) if found > REJECTION_MARK_TAG => Err(Error::UnsupportedFormat {
                    found,
                    supported: REJECTION_MARK_TAG,
                }),
                _ => Err(corrupt(format!(
                    "{} bytes, neither a {MARK_LEN}-byte mark nor a mark with a rejection",
                    bytes.len()
                ))),
            };
        }
        let (covered, sum) = bytes.split_at(16);
        if checksum8(MARK_CHECKSUM_CONTEXT, covered) != sum {
            return Err(corrupt(DAMAGED.into()));
        }
        let mut r = Reader(covered);
        Ok(Mark {
            processed_at: Timestamp(r.u64().map_err(corrupt)?),
            forget_at: Timestamp(r.u64().map_err(corrupt)?),
            rejection: None,
        })
    }
}

/// Appends `u32be(len bytes) ‖ bytes`. Lengths fit: a kept response is at most the store's
/// `max_response_bytes`, which is capped far below `u32::MAX` at open.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Decodes the checksummed fields of a mark with a rejection (after the tag), bounds-checking
/// every length and refusing trailing bytes.
fn decode_rejection_mark(fields: &[u8]) -> Result<Mark, String> {
    let mut r = Reader(fields);
    let processed_at = Timestamp(r.u64()?);
    let forget_at = Timestamp(r.u64()?);
    let status = u16::from_be_bytes(r.array::<2>("status")?);
    let body = r.bytes("body")?.to_vec();
    let resource = match r.array::<1>("resource flag")? {
        [0] => None,
        [1] => Some(Resource {
            kind: r.text("resource kind")?,
            id: r.text("resource id")?,
        }),
        [other] => return Err(format!("resource flag {other}, expected 0 or 1")),
    };
    if !r.0.is_empty() {
        return Err(format!("{} trailing bytes after the rejection", r.0.len()));
    }
    Ok(Mark {
        processed_at,
        forget_at,
        rejection: Some(Response::from_parts(status, body, resource, true)),
    })
}

/// A cursor over a mark's fields; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or_else(|| format!("the value ends inside the {what}"))?;
        self.0 = rest;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array::<8>("instants").map(u64::from_be_bytes)
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let len = u32::from_be_bytes(self.array::<4>(what)?) as usize;
        let (head, rest) = self
            .0
            .split_at_checked(len)
            .ok_or_else(|| format!("the {what} claims {len} bytes, more than the value holds"))?;
        self.0 = rest;
        Ok(head)
    }

    fn text(&mut self, what: &str) -> Result<String, String> {
        let bytes = self.bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("the {what} is not UTF-8"))
    }
}

/// A stored high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HighWaterMark {
    /// The newest version applied.
    pub version: u64,
    /// Stale events skipped for this entity.
    pub skipped: u64,
}

impl HighWaterMark {
    /// The stored 16 bytes: the version, then the skip count, both big-endian.
    pub(crate) fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.version.to_be_bytes());
        out[8..].copy_from_slice(&self.skipped.to_be_bytes());
        out
    }

    /// Reads a stored mark; any other length than 16 bytes is [`Error::CorruptRecord`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let corrupt = || Error::CorruptRecord {
            reason: format!(
                "a version high-water mark is {} bytes, expected 16",
                bytes.len()
            ),
        };
        let (a, b) = bytes.split_first_chunk::<8>().ok_or_else(corrupt)?;
        let b: &[u8; 8] = b.try_into().map_err(|_| corrupt())?;
        Ok(HighWaterMark {
            version: u64::from_be_bytes(*a),
            skipped: u64::from_be_bytes(*b),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip() {
        let m = Mark {
            processed_at: Timestamp(1),
            forget_at: Timestamp(u64::MAX),
            rejection: None,
        };
        assert_eq!(
            m.encode().len(),
            MARK_LEN,
            "a plain mark keeps its 24 bytes"
        );
        assert_eq!(Mark::decode(&m.encode()).ok(), Some(m.clone()));
        for len in [0, 15, 16, 23, 25] {
            assert!(matches!(
                Mark::decode(&vec![0; len]),
                Err(Error::CorruptRecord { .. })
            ));
        }
        // Every single-byte flip is caught.
        for i in 0..MARK_LEN {
            let mut bytes = m.encode();
            bytes[i] ^= 0x01;
            assert!(
                matches!(Mark::decode(&bytes), Err(Error::CorruptRecord { .. })),
                "flip at {i}"
            );
        }
    }

    fn rejected(resource: bool) -> Mark {
        let r = Response::new(422, "bad order");
        let r = if resource {
            r.with_resource("order", "o-1")
        } else {
            r
        };
        Mark {
            processed_at: Timestamp(10),
            forget_at: Timestamp(20),
            rejection: Some(r.mark_failed()),
        }
    }

    #[test]
    fn marks_with_a_rejection_round_trip_and_every_damage_is_a_typed_error() {
        for m in [rejected(false), rejected(true)] {
            let bytes = m.encode();
            assert_ne!(bytes.len(), MARK_LEN);
            assert_eq!(bytes[0], REJECTION_MARK_TAG);
            let back = Mark::decode(&bytes).expect("decodes");
            assert_eq!(back, m);
            assert!(back.rejection.as_ref().is_some_and(|r| r.is_failure()));
            for i in 0..bytes.len() {
                let mut flipped = bytes.clone();
                flipped[i] ^= 0x01;
                assert!(
                    matches!(Mark::decode(&flipped), Err(Error::CorruptRecord { .. })),
                    "flip at {i}"
                );
            }
            for len in 0..bytes.len() {
                assert!(Mark::decode(&bytes[..len]).is_err(), "truncated to {len}");
            }
        }
        // An empty body and no resource: the shortest value.
        let short = Mark {
            rejection: Some(Response::new(400, "").mark_failed()),
            ..rejected(false)
        };
        assert_eq!(short.encode().len(), REJECTION_MARK_MIN_LEN);
        assert_eq!(Mark::decode(&short.encode()).ok(), Some(short));
        // A value from a later layout.
        let mut later = rejected(false).encode();
        later[0] = REJECTION_MARK_TAG + 1;
        assert!(matches!(
            Mark::decode(&later),
            Err(Error::UnsupportedFormat { found: 4, .. })
        ));
    }

    /// Bytes with a right checksum but wrong fields (lengths past the end, a bad resource
    /// flag, text that is not UTF-8, trailing bytes) are typed errors, never a panic.
    #[test]
    fn resealed_garbage_in_a_rejection_mark_is_a_typed_error() {
        let seal = |fields: &[u8]| {
            let mut v = vec![REJECTION_MARK_TAG];
            v.extend_from_slice(fields);
            let sum = checksum8(REJECTION_MARK_CHECKSUM_CONTEXT, &v);
            v.extend_from_slice(&sum);
            v
        };
        let head = [&[0u8; 16][..], &[0x01, 0x90]].concat();
        let cases: [&[u8]; 4] = [
            &[0xff, 0xff, 0xff, 0xff, 0],
            &[0, 0, 0, 0, 7],
            &[0, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0, 0, 0, 0],
            &[0, 0, 0, 0, 0, 9],
        ];
        for case in cases {
            let bytes = seal(&[head.as_slice(), case].concat());
            assert!(
                matches!(Mark::decode(&bytes), Err(Error::CorruptRecord { .. })),
                "{case:?}"
            );
        }
    }
}
