//! `record_decode`: arbitrary bytes → `Record::decode` returns a record or a typed error, never
//! panics; whatever decodes re-encodes to bytes that decode to the same record. (Postcard
//! accepts non-minimal varints on decode, so the re-encoding may be shorter than the input; it
//! is always minimal.)

/// Runs one input.
pub fn run(data: &[u8]) {
    if let Ok(record) = idem::Record::decode(data) {
        let bytes = record.encode();
        assert!(
            bytes.len() <= data.len(),
            "the encoder writes minimal varints"
        );
        let again = idem::Record::decode(&bytes);
        assert_eq!(
            again.ok().as_ref(),
            Some(&record),
            "encode∘decode must round-trip"
        );
    }
}
