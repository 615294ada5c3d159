//! The stored record and its versioned encoding (docs/FORMAT.md gives every byte).
//!
//! Encoding: one format-version byte, the postcard encoding of [`WireRecord`], then an 8-byte
//! blake3 checksum of both. Decoding checks the version, then the checksum (so a damaged value is
//! `CorruptRecord`, never a different valid record), then lets postcard bounds-check every length
//! and rejects bytes left between the record and the checksum, so arbitrary bytes decode to a
//! record or a typed error, never a panic.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::keys::Fingerprint;
use crate::model::response::{Resource, Response, Tombstone};

/// The record format version this build writes and reads.
pub const FORMAT_VERSION: u8 = 2;

/// The blake3 key-derivation context of the record checksum (docs/FORMAT.md).
const CHECKSUM_CONTEXT: &str = "idem 2026-11-30 record checksum v2";

/// Length of the checksum that ends every record value.
const CHECKSUM_LEN: usize = 8;

/// The checksum of a value's version byte and postcard body: the first [`CHECKSUM_LEN`] bytes
/// of blake3 in key-derivation mode over those bytes.
fn checksum(covered: &[u8]) -> [u8; CHECKSUM_LEN] {
    checksum8(CHECKSUM_CONTEXT, covered)
}

/// The 8-byte checksum idem appends to a stored value (records, inbox marks): the first 8
/// bytes of blake3 in key-derivation mode with `context` over `covered` (docs/FORMAT.md).
pub(crate) fn checksum8(context: &str, covered: &[u8]) -> [u8; 8] {
    let hash = blake3::Hasher::new_derive_key(context)
        .update(covered)
        .finalize();
    let mut out = [0u8; 8];
    for (o, b) in out.iter_mut().zip(hash.as_bytes()) {
        *o = *b;
    }
    out
}

/// The token that names one lease holder. Unique per attempt (8 random bytes per store instance
/// plus a per-instance counter), so a stale holder can never be mistaken for a newer one, even
/// after the key was released and claimed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderToken(pub [u8; 16]);

impl HolderToken {
    /// The store instance that granted the lease: the token's first 8 bytes (docs/FORMAT.md,
    /// "Holder tokens").
    pub fn instance(&self) -> [u8; 8] {
        let mut instance = [0u8; 8];
        instance.copy_from_slice(&self.0[..8]);
        instance
    }
}

/// The state of an intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// An attempt holds a lease (flow B) and may be calling the outside world.
    Pending {
        /// Who holds it.
        holder: HolderToken,
        /// When the lease lapses unless heartbeated.
        lease_deadline: Timestamp,
        /// 1 for the first attempt, +1 on every takeover.
        attempt: u32,
    },
    /// Finished successfully; the response is replayed.
    Completed(Response),
    /// Finished with a terminal failure; the response is replayed.
    Failed(Response),
    /// A finished intent whose response window is over: the body is gone, the status, the
    /// resource pointer and whether it failed are kept, so a late retry learns that the intent
    /// already happened (`ExecuteAnswer::Expired`) instead of running it again. Written by the sweep;
    /// a Completed or Failed record past its `expires_at` is decided as one even before that.
    Tombstone(Tombstone),
}

impl State {
    /// The state's number on the wire (docs/FORMAT.md), also the value of its expiry-index
    /// entry: 0 Pending, 1 Completed, 2 Failed, 3 Tombstone.
    pub(crate) fn tag(&self) -> u8 {
        match self {
            State::Pending { .. } => 0,
            State::Completed(_) => 1,
            State::Failed(_) => 2,
            State::Tombstone(_) => 3,
        }
    }
}

/// One idempotency record. The request payload is never stored, only its fingerprint.
///
/// Two instants bound its life (docs/design.md, "Record lifecycle"): until `expires_at` a
/// finished record replays its response; from `expires_at` to `forget_at` it answers as a
/// tombstone (the intent happened, the body is gone); from `forget_at` on it counts as absent.
/// A Pending record has `forget_at == expires_at`: a lease that never finished leaves no
/// tombstone. Every rule reads these stored instants, whether or not a sweep has run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Fingerprint of the request that first used the key.
    pub fingerprint: Fingerprint,
    /// When the first attempt claimed the key.
    pub created_at: Timestamp,
    /// End of the response window: from this instant a finished record no longer replays its
    /// response (it answers `Expired`), whether or not a sweep shrank it.
    pub expires_at: Timestamp,
    /// From this instant the record counts as absent and its key is free, whether or not a
    /// sweep deleted it. Never before `expires_at`: it is stored as the difference.
    pub forget_at: Timestamp,
    /// Pending, Completed, Failed or Tombstone.
    pub state: State,
}

#[derive(Serialize, Deserialize)]
struct WireRecord<'a> {
    fingerprint: [u8; 32],
    created_at: u64,
    expires_at: u64,
    /// `forget_at - expires_at` in ms (0 for Pending).
    forget_after: u64,
    #[serde(borrow)]
    state: WireState<'a>,
}

#[derive(Serialize, Deserialize)]
enum WireState<'a> {
    Pending {
        holder: [u8; 16],
        lease_deadline: u64,
        attempt: u32,
    },
    Completed(#[serde(borrow)] WireResponse<'a>),
    Failed(#[serde(borrow)] WireResponse<'a>),
    Tombstone(#[serde(borrow)] WireTombstone<'a>),
}

#[derive(Serialize, Deserialize)]
struct WireTombstone<'a> {
    status: u16,
    failed: bool,
    #[serde(borrow)]
    resource: Option<(&'a str, &'a str)>,
}

#[derive(Serialize, Deserialize)]
struct WireResponse<'a> {
    status: u16,
    #[serde(borrow)]
    body: Bytes<'a>,
    #[serde(borrow)]
    resource: Option<(&'a str, &'a str)>,
}

/// Bytes encoded as postcard `bytes` (varint length + raw), borrowed on decode.
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Bytes<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de [u8]>::deserialize(d).map(Bytes)
    }
}

fn wire_response(r: &Response) -> WireResponse<'_> {
    WireResponse {
        status: r.status(),
        body: Bytes(r.body()),
        resource: wire_resource(r.resource()),
    }
}

fn wire_resource(r: Option<&Resource>) -> Option<(&str, &str)> {
    r.map(|x| (x.kind.as_str(), x.id.as_str()))
}

fn owned_resource(r: Option<(&str, &str)>) -> Option<Resource> {
    r.map(|(k, i)| Resource {
        kind: k.to_owned(),
        id: i.to_owned(),
    })
}

fn owned_response(w: WireResponse<'_>, failed: bool) -> Response {
    Response::from_parts(
        w.status,
        w.body.0.to_vec(),
        owned_resource(w.resource),
        failed,
    )
}

impl Record {
    /// Encodes the record: the version byte, postcard, then the checksum of both.
    pub fn encode(&self) -> Vec<u8> {
        let state = match &self.state {
            State::Pending {
                holder,
                lease_deadline,
                attempt,
            } => WireState::Pending {
                holder: holder.0,
                lease_deadline: lease_deadline.0,
                attempt: *attempt,
            },
            State::Completed(r) => WireState::Completed(wire_response(r)),
            State::Failed(r) => WireState::Failed(wire_response(r)),
            State::Tombstone(t) => WireState::Tombstone(WireTombstone {
                status: t.status(),
                failed: t.is_failure(),
                resource: wire_resource(t.resource()),
            }),
        };
        let wire = WireRecord {
            fingerprint: self.fingerprint.0,
            created_at: self.created_at.0,
            expires_at: self.expires_at.0,
            // A `forget_at` before `expires_at` cannot be stored; it is read back as equal.
            forget_after: self.forget_at.0.saturating_sub(self.expires_at.0),
            state,
        };
        let out = vec![FORMAT_VERSION];
        // Invariant: serializing into a Vec cannot fail: every field is a plain integer, byte
        // string or str, and the Vec flavour grows without limit.
        let mut out = match postcard::to_extend(&wire, out) {
            Ok(v) => v,
            Err(_) => unreachable!("postcard serialization into a Vec is infallible"),
        };
        let sum = checksum(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// Decodes a record, checking the version, the checksum, every length and the absence of
    /// trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Record, Error> {
        let Some(&version) = bytes.first() else {
            return Err(Error::CorruptRecord {
                reason: "empty value".into(),
            });
        };
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedFormat {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let Some((covered, stored)) = bytes
            .len()
            .checked_sub(CHECKSUM_LEN)
            .filter(|&at| at >= 1)
            .and_then(|at| bytes.split_at_checked(at))
        else {
            return Err(Error::CorruptRecord {
                reason: format!(
                    "a value of {} bytes is shorter than the version byte and the {CHECKSUM_LEN}-byte checksum",
                    bytes.len()
                ),
            });
        };
        if stored != checksum(covered) {
            return Err(Error::CorruptRecord {
                reason: "checksum mismatch: the value's bytes changed after idem wrote them, so \
                         none of its fields can be trusted"
                    .into(),
            });
        }
        let rest = covered.get(1..).unwrap_or_default();
        let (wire, trailing): (WireRecord<'_>, &[u8]) =
            postcard::take_from_bytes(rest).map_err(|e| Error::CorruptRecord {
                reason: format!("undecodable record: {e}"),
            })?;
        if !trailing.is_empty() {
            return Err(Error::CorruptRecord {
                reason: format!(
                    "{} trailing bytes between the record and its checksum",
                    trailing.len()
                ),
            });
        }
        let state = match wire.state {
            WireState::Pending {
                holder,
                lease_deadline,
                attempt,
            } => State::Pending {
                holder: HolderToken(holder),
                lease_deadline: Timestamp(lease_deadline),
                attempt,
            },
            WireState::Completed(r) => State::Completed(owned_response(r, false)),
            WireState::Failed(r) => State::Failed(owned_response(r, true)),
            WireState::Tombstone(t) => State::Tombstone(Tombstone::new(
                t.status,
                owned_resource(t.resource),
                t.failed,
            )),
        };
        Ok(Record {
            fingerprint: Fingerprint(wire.fingerprint),
            created_at: Timestamp(wire.created_at),
            expires_at: Timestamp(wire.expires_at),
            forget_at: Timestamp(wire.expires_at.saturating_add(wire.forget_after)),
            state,
        })
    }
}
