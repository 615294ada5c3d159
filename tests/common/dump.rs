//! Helpers of the golden-format tests (record_format, http_formats_are_pinned): the text of
//! docs/FORMAT.md their values are checked against, and the two ways its dumps print bytes.

/// The text of docs/FORMAT.md, which the golden values are checked against.
pub fn format_md() -> String {
    // idem-store's tests run in the repository's root (or the packaged crate's), those of
    // idem-integration one level below it.
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = manifest
        .ancestors()
        .take(2)
        .map(|dir| dir.join("docs/FORMAT.md"))
        .find(|path| path.is_file())
        .expect("docs/FORMAT.md exists");
    std::fs::read_to_string(path).expect("docs/FORMAT.md is readable")
}

/// Bytes as space-separated lowercase hex pairs.
pub fn hex_row(bytes: &[u8]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.join(" ")
}

/// Printable ASCII as itself, anything else as `\xNN`.
pub fn printable(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            0x20..=0x7e => char::from(b).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect()
}
