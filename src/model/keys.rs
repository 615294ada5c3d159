//! Request fingerprints, downstream keys and step-key derivation: blake3 in derive-key mode, one fixed context string
//! per purpose, so a fingerprint can never equal a downstream key or a fingerprint made through
//! the other entry point. Changing a context string changes every stored fingerprint: never do it
//! without a record-format version bump.

use crate::error::Error;

const CTX_CANONICAL_BYTES: &str = "idem 2026-11-30 request fingerprint: canonical bytes v1";
const CTX_SERDE_POSTCARD: &str = "idem 2026-11-30 request fingerprint: serde postcard v1";

/// The 32-byte blake3 fingerprint of a request payload. Only this is stored, never the payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Fingerprint of bytes the caller has canonicalised (e.g. a JSON body with sorted keys).
    pub fn of_bytes(canonical: &[u8]) -> Self {
        let mut h = blake3::Hasher::new_derive_key(CTX_CANONICAL_BYTES);
        h.update(canonical);
        Fingerprint(*h.finalize().as_bytes())
    }

    /// Fingerprint of a `serde::Serialize` value through its postcard encoding, streamed into
    /// the hasher without an intermediate buffer. Maps must iterate in a deterministic order
    /// (`BTreeMap`, not `HashMap`).
    pub fn of_serialize<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        let h = blake3::Hasher::new_derive_key(CTX_SERDE_POSTCARD);
        let h = postcard::to_io(value, h).map_err(|source| Error::Fingerprint { source })?;
        Ok(Fingerprint(*h.finalize().as_bytes()))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// A key to send to a downstream system (a payment provider's `Idempotency-Key`, an email API's
/// dedupe id), derived deterministically from the record key alone: every attempt at the same
/// intent, including one that takes over after a crash, sends the same value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DownstreamKey([u8; 32]);

impl DownstreamKey {
    pub(crate) fn from_raw(bytes: [u8; 32]) -> Self {
        DownstreamKey(bytes)
    }

    /// The lease's key is the root of the step-key tree: `derive_key(record key, "")`, the same
    /// derivation as every step, activity and compensation key ([`derive_key`]).
    pub(crate) fn derive(record_key: &[u8]) -> Self {
        derive_key(record_key, b"")
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lowercase hex characters: fits every provider's key limit (Stripe: 255).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl std::fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Debug for DownstreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DownstreamKey({})", self.to_hex())
    }
}

/// Bytes as lowercase hexadecimal, two digits a byte (`[0x00, 0xab]` is `"00ab"`): the form in
/// which idem shows every byte string — fingerprints, downstream keys, event ids
/// (their `to_hex`), the dumps of `docs/FORMAT.md`, the `idem` CLI's record keys and binary
/// bodies. Public as `idem::format::to_hex`.
///
/// ```
/// assert_eq!(idem::format::to_hex(&[0x00, 0xab, 0xff]), "00abff");
/// assert_eq!(idem::format::to_hex(b""), "");
/// ```
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

// ---- Step keys: stable idempotency keys for the calls a step makes, derived with blake3's
// `derive_key` under a fixed context, so every retry of the same step sends the same key. ----

/// blake3 `derive_key` context of step keys.
const CTX_STEP_KEY: &str = "idem 2026-11-30 downstream step key v1";

/// The key of step `step` under `parent` (a lease's `Lease::downstream_key`, a workflow id,
/// an outbox event id, …): the same inputs always give the same key, different steps of one
/// parent get unrelated keys. The encoding is unambiguous (the parent's length is part of
/// the input), so `("ab", "c")` and `("a", "bc")` differ.
pub fn derive_key(parent: impl AsRef<[u8]>, step: impl AsRef<[u8]>) -> DownstreamKey {
    let parent = parent.as_ref();
    let mut h = blake3::Hasher::new_derive_key(CTX_STEP_KEY);
    h.update(&(parent.len() as u64).to_be_bytes());
    h.update(parent);
    h.update(step.as_ref());
    DownstreamKey::from_raw(*h.finalize().as_bytes())
}

/// The key of activity `activity_id` of workflow run `workflow_id` (Temporal's advice:
/// workflow run id + activity id), identical on every retry of the activity.
pub fn activity_key(workflow_id: impl AsRef<[u8]>, activity_id: impl AsRef<[u8]>) -> DownstreamKey {
    let workflow = derive_key(workflow_id, b"workflow");
    derive_key(workflow.as_bytes(), activity_id)
}

/// The key of the compensation of the step whose key is `forward`: distinct from `forward`
/// (a provider never confuses the undo with the do) and stable across retries of the
/// compensation, so a compensation that runs twice has one effect.
pub fn compensation_key(forward: &DownstreamKey) -> DownstreamKey {
    derive_key(forward.as_bytes(), b"\0compensate")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn entry_points_are_domain_separated() {
        let v: &[u8] = b"abc";
        let via_serde = Fingerprint::of_serialize(&v).map(|f| f.0);
        let raw = postcard::to_allocvec(&v).map(|b| Fingerprint::of_bytes(&b).0);
        assert_ne!(via_serde.ok(), raw.ok());
        assert_ne!(Fingerprint::of_bytes(b"k").0, DownstreamKey::derive(b"k").0);
    }

    #[test]
    fn btreemap_insertion_order_does_not_matter() {
        let mut a = BTreeMap::new();
        a.insert("b", 2);
        a.insert("a", 1);
        let mut b = BTreeMap::new();
        b.insert("a", 1);
        b.insert("b", 2);
        assert_eq!(
            Fingerprint::of_serialize(&a).ok(),
            Fingerprint::of_serialize(&b).ok()
        );
    }

    #[test]
    fn golden_fingerprint() {
        // Pins the context string: changing it would silently orphan every stored record.
        assert_eq!(
            Fingerprint::of_bytes(b"hello").to_hex(),
            "4428712e59fe5064237c1456762839ab4c07d1cada76bf958732e1420c744215"
        );
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
    }
}

#[cfg(test)]
mod step_key_tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_separated() {
        assert_eq!(derive_key("p", "s"), derive_key("p", "s"));
        assert_ne!(derive_key("p", "s"), derive_key("p", "t"));
        assert_ne!(derive_key("ab", "c"), derive_key("a", "bc"));
        let fwd = activity_key("wf-1", "charge");
        assert_eq!(fwd, activity_key("wf-1", "charge"));
        assert_ne!(fwd, activity_key("wf-2", "charge"));
        assert_ne!(compensation_key(&fwd), fwd);
        assert_eq!(compensation_key(&fwd), compensation_key(&fwd));
    }

    /// Keys are sent to other systems and must never change between releases.
    #[test]
    fn derivation_is_pinned() {
        assert_eq!(
            derive_key("p", "s").to_hex(),
            "e3874a553e444eddb6847dfc645d4586e26393c6df9d77ef5f08cd3fbd8a802c"
        );
    }
}
