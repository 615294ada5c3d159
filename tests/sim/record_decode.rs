//! `record_decode`: arbitrary bytes → `Record::decode` returns a record or a typed error, never
//! panics; whatever decodes re-encodes to bytes that decode to the same record. (Postcard
//! accepts non-minimal varints on decode, so the re-encoding may be shorter than the input; it
//! is always minimal.)
//!
//! Every input is tried twice: as a whole stored value, and as the postcard bytes of a value,
//! i.e. behind the version byte and followed by their right checksum (docs/FORMAT.md,
//! "Checksum"). Random bytes almost never carry a right checksum, so only the second form lets
//! the fuzzer reach the body decoder.

use idem::Error;
use idem::format::{FORMAT_VERSION, Record};

/// The record checksum's blake3 key-derivation context (docs/FORMAT.md, "Checksum").
const CHECKSUM_CONTEXT: &str = "idem 2026-11-30 record checksum v2";

/// Runs one input.
pub fn run(data: &[u8]) {
    // As a stored value: a record or a typed error (almost always a checksum mismatch).
    let _ = round_trip(data);
    // As the postcard bytes behind a right checksum: the body decoder decides.
    let sealed = seal(data);
    match round_trip(&sealed) {
        Err(Error::UnsupportedFormat { .. }) => panic!("a sealed value has the current version"),
        Err(Error::CorruptRecord { reason }) => assert!(
            !reason.starts_with("checksum mismatch"),
            "a sealed value's checksum is right, so the body decoder must decide: {reason}"
        ),
        _ => {}
    }
}

/// `FORMAT_VERSION ‖ body ‖ checksum`: a value whose checksum is right, whatever `body` holds.
fn seal(body: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(1 + body.len() + 8);
    value.push(FORMAT_VERSION);
    value.extend_from_slice(body);
    let sum = blake3::derive_key(CHECKSUM_CONTEXT, &value);
    value.extend_from_slice(&sum[..8]);
    value
}

/// Decodes `value`; if it decodes, checks that it re-encodes, no longer, to a value that
/// decodes to the same record. Returns the decoder's answer.
fn round_trip(value: &[u8]) -> Result<Record, Error> {
    let decoded = Record::decode(value);
    if let Ok(record) = &decoded {
        let bytes = record.encode();
        assert!(
            bytes.len() <= value.len(),
            "the encoder writes minimal varints"
        );
        let again = Record::decode(&bytes);
        assert_eq!(
            again.ok().as_ref(),
            Some(record),
            "encode∘decode must round-trip"
        );
    }
    decoded
}
