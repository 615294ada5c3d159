//! Golden tests for the journal's bytes (docs/FORMAT.md, "Journal").
//!
//! Pins, through the real encoders (`idem::__journal::format`): the header of the worked
//! example, its checkpoint row (and the clean one), its first entry frame and a wrap frame,
//! checksums included. A decoder written from docs/FORMAT.md alone (`walk_*`, no idem code)
//! reads every golden value, recomputing each checksum, and must agree with idem's
//! `read_frame` and `decode_body` on every resealed single-byte change; the annotated dumps in
//! docs/FORMAT.md must be exactly what it prints. A single-byte change as stored is a tail or a
//! typed error, never another entry.
//!
//! To regenerate the dumps after an intended format change:
//! `cargo test --test format -- --ignored --nocapture journal_format::print_journal_dumps`.

// White-box hooks (`idem::__journal`, `StoreBuilder::__break_journal`, `check_expiry_index`):
// compiled only with the internal feature, which this repository's own tests always have.
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use common::dump::{format_md, hex_row, printable};

use idem::__journal::format::{
    Checksum, EntryBuilder, FormatError, Frame, HEADER_LEN, Header, KIND_ENTRY, KIND_WRAP, OP_PUT,
    Row, StoreId, TABLE_PLAIN, decode_body, encode_frame, read_frame,
};
use idem::redb::Value;

// ---- the worked example's inputs ----

/// The worked example's capacity: 64 MiB.
const CAPACITY: u64 = 64 << 20;

/// The worked example's store id: 00 01 … 0f.
fn store_id() -> StoreId {
    std::array::from_fn(|i| i as u8)
}

/// The chain of a new journal.
const ZERO: Checksum = [0; 8];

/// docs/FORMAT.md's contexts of the three checksums.
pub const HEADER_CONTEXT: &str = "idem 2026-12-06 journal header v1";
pub const FRAME_CONTEXT: &str = "idem 2026-12-06 journal frame v1";
pub const ROW_CONTEXT: &str = "idem 2026-12-06 journal checkpoint v1";

/// docs/FORMAT.md: the first 8 bytes of `blake3::derive_key(context, parts…)`.
pub fn keyed(context: &str, parts: &[&[u8]]) -> [u8; 8] {
    let covered: Vec<u8> = parts.concat();
    let hash = blake3::derive_key(context, &covered);
    let mut out = [0u8; 8];
    out.copy_from_slice(&hash[..8]);
    out
}

fn example_header() -> Header {
    Header {
        capacity: CAPACITY,
        store_id: store_id(),
    }
}

fn example_row(clean: bool) -> Row {
    Row {
        store_id: store_id(),
        lsn: 0,
        position: HEADER_LEN,
        chain: ZERO,
        clean,
    }
}

/// The first entry's body: one put into `orders` (`&str` → `u32`), `"o-1"` → 7.
fn example_body() -> Vec<u8> {
    let mut e = EntryBuilder::default();
    let t = e.table(
        "orders",
        TABLE_PLAIN,
        <&str as Value>::type_name().name(),
        <u32 as Value>::type_name().name(),
    );
    e.record(OP_PUT, t, b"o-1", Some(&<u32 as Value>::as_bytes(&7)));
    e.finish().expect("a small entry")
}

/// The first entry's frame (LSN 1, chain zero) and its checksum.
fn example_entry() -> (Vec<u8>, Checksum) {
    encode_frame(&store_id(), &ZERO, KIND_ENTRY, 1, &example_body())
}

/// The wrap frame that would follow it: LSN 2 (the entry after it), chained on the entry.
fn example_wrap() -> (Vec<u8>, Checksum) {
    let (_, chain) = example_entry();
    encode_frame(&store_id(), &chain, KIND_WRAP, 2, &[])
}

// ---- the golden bytes ----

fn golden_header() -> Vec<u8> {
    let mut b = vec![
        0x49, 0x44, 0x45, 0x4d, 0x4a, 0x52, 0x4e, 0x4c, // magic
        0x01, // header version
        0x00, 0x00, 0x00, // reserved
        0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, // capacity
    ];
    b.extend(0u8..16); // store id
    b.extend([0xb9, 0xb5, 0xd7, 0x76, 0xdf, 0x0a, 0x6f, 0xea]); // checksum
    b
}

fn golden_row(clean: bool) -> Vec<u8> {
    let mut b = vec![0x01]; // row version
    b.extend(0u8..16); // store id
    b.extend([0, 0, 0, 0, 0, 0, 0, 0]); // LSN 0
    b.extend([0, 0, 0, 0, 0, 0, 0x10, 0x00]); // position 4096
    b.extend([0, 0, 0, 0, 0, 0, 0, 0]); // chain
    if clean {
        b.push(0x01);
        b.extend([0x34, 0xfb, 0xc2, 0x69, 0xcd, 0xc3, 0x5f, 0x33]); // checksum
    } else {
        b.push(0x00);
        b.extend([0x3a, 0x1b, 0xc7, 0x44, 0x67, 0x09, 0xde, 0x85]); // checksum
    }
    b
}

fn golden_entry() -> Vec<u8> {
    let mut b = vec![
        0x49, 0x44, 0x4a, 0x46, // magic
        0x01, // frame version
        0x01, // kind: entry
        0x00, 0x00, // reserved
        0x00, 0x00, 0x00, 0x2c, // body length 44
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // LSN 1
        0x00, 0x01, // table count
        0x00, 0x06, b'o', b'r', b'd', b'e', b'r', b's', // name
        0x01, // kind: table
        0x00, 0x04, b'&', b's', b't', b'r', // key type
        0x00, 0x03, b'u', b'3', b'2', // value type
        0x00, 0x00, 0x00, 0x01, // record count
        0x01, // put
        0x00, 0x00, // table 0
        0x00, 0x00, 0x00, 0x03, b'o', b'-', b'1', // key
        0x00, 0x00, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, // value
    ];
    b.extend([0xb8, 0xc5, 0x84, 0x55, 0xd7, 0x4a, 0xd3, 0xd6]); // checksum
    b.resize(96, 0); // padding
    b
}

fn golden_wrap() -> Vec<u8> {
    let mut b = vec![
        0x49, 0x44, 0x4a, 0x46, // magic
        0x01, // frame version
        0x02, // kind: wrap
        0x00, 0x00, // reserved
        0x00, 0x00, 0x00, 0x00, // body length 0
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, // LSN 2
    ];
    b.extend([0x04, 0x29, 0xdc, 0xd3, 0x5e, 0xb4, 0x8c, 0x4c]); // checksum
    b.resize(32, 0); // padding
    b
}

#[test]
fn frames_encode_to_golden_bytes() {
    // The type names an entry records are redb's.
    assert_eq!(<&str as Value>::type_name().name(), "&str");
    assert_eq!(<u32 as Value>::type_name().name(), "u32");
    assert_eq!(
        example_header().encode().to_vec(),
        golden_header(),
        "header"
    );
    assert_eq!(
        example_row(false).encode().to_vec(),
        golden_row(false),
        "row"
    );
    assert_eq!(
        example_row(true).encode().to_vec(),
        golden_row(true),
        "clean row"
    );
    let (entry, entry_sum) = example_entry();
    assert_eq!(entry, golden_entry(), "entry frame");
    assert_eq!(
        entry_sum[..],
        golden_entry()[64..72],
        "the entry's checksum"
    );
    let (wrap, wrap_sum) = example_wrap();
    assert_eq!(wrap, golden_wrap(), "wrap frame");
    assert_eq!(wrap_sum[..], golden_wrap()[20..28], "the wrap's checksum");
}

// ---- the documented decoder ----

/// One annotated field of a dump: where it starts, its bytes as shown, what they mean.
#[derive(Debug, PartialEq, Eq)]
struct Seg {
    offset: usize,
    hex: String,
    what: String,
}

/// Why the documented decoder refuses bytes (docs/FORMAT.md, "Reading the journal").
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refused {
    /// Not a successor: recovery stops.
    Tail,
    /// `Error::UnsupportedJournal`.
    Unsupported,
    /// `Error::CorruptStore`.
    Corrupt(String),
}

fn corrupt<T>(what: impl Into<String>) -> Result<T, Refused> {
    Err(Refused::Corrupt(what.into()))
}

struct Walk<'a> {
    b: &'a [u8],
    at: usize,
    segs: Vec<Seg>,
}

impl<'a> Walk<'a> {
    fn new(b: &'a [u8]) -> Self {
        Walk {
            b,
            at: 0,
            segs: Vec::new(),
        }
    }

    fn take(&mut self, n: usize, what: impl Into<String>) -> Result<&'a [u8], Refused> {
        let Some(s) = self
            .at
            .checked_add(n)
            .and_then(|end| self.b.get(self.at..end))
        else {
            return corrupt("a field past the end");
        };
        self.segs.push(Seg {
            offset: self.at,
            hex: hex_row(s),
            what: what.into(),
        });
        self.at += n;
        Ok(s)
    }

    /// Appends to the last field's annotation.
    fn note(&mut self, more: &str) {
        if let Some(seg) = self.segs.last_mut() {
            seg.what += more;
        }
    }

    fn be(&mut self, n: usize, what: &str) -> Result<u64, Refused> {
        let s = self.take(n, what)?;
        let v = s.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b));
        if !what.is_empty() && !matches!(what, "reserved") {
            self.note(&format!(" = {v}"));
        }
        Ok(v)
    }

    /// `u16be(len) ‖ text` as one field: `what: length n, text`.
    fn text(&mut self, what: &str) -> Result<String, Refused> {
        let start = self.at;
        let len = self
            .b
            .get(start..start + 2)
            .ok_or(Refused::Corrupt("cut".into()))?;
        let n = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let s = self.take(2 + n, "")?;
        let Ok(text) = std::str::from_utf8(&s[2..]) else {
            return corrupt(format!("{what} is not UTF-8"));
        };
        self.note(&format!("{what}: length {n}, {}", printable(&s[2..])));
        Ok(text.to_owned())
    }

    /// `u32be(len) ‖ bytes` as one field.
    fn bytes(&mut self, what: &str) -> Result<Vec<u8>, Refused> {
        let start = self.at;
        let Some(len) = self.b.get(start..start + 4) else {
            return corrupt("cut");
        };
        let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let s = self.take(4 + n, "")?;
        let v = s[4..].to_vec();
        self.note(&format!("{what}: length {n}"));
        Ok(v)
    }
}

#[derive(Debug, PartialEq, Eq)]
struct DocHeader {
    capacity: u64,
    store_id: StoreId,
}

/// Reads a journal header following docs/FORMAT.md alone; `b` is the file's first 4,096 bytes
/// (or fewer), `file_len` the file's length.
fn walk_header(b: &[u8], file_len: u64) -> Result<(Vec<Seg>, DocHeader), Refused> {
    if b.len() < 44 || &b[..8] != b"IDEMJRNL" {
        return corrupt("no IDEMJRNL magic");
    }
    if keyed(HEADER_CONTEXT, &[&b[..36]]) != b[36..44] {
        return corrupt("the header's checksum");
    }
    if b[8] != 0x01 {
        return Err(Refused::Unsupported);
    }
    let mut w = Walk::new(b);
    w.take(8, "magic = IDEMJRNL")?;
    w.be(1, "header version")?;
    if w.be(3, "reserved")? != 0 {
        return corrupt("reserved bytes");
    }
    let capacity = w.be(8, "capacity")?;
    if capacity != file_len || capacity % 32 != 0 || capacity < 4096 + 64 {
        return corrupt("the capacity");
    }
    let store_id: StoreId = w.take(16, "store id")?.try_into().expect("16 bytes");
    w.take(8, "checksum (blake3, first 8 bytes)")?;
    if b.len() > 44 {
        w.segs.push(Seg {
            offset: 44,
            hex: "00 …".into(),
            what: format!("zeros to {}", b.len()),
        });
    }
    Ok((w.segs, DocHeader { capacity, store_id }))
}

#[derive(Debug, PartialEq, Eq)]
struct DocRow {
    store_id: StoreId,
    lsn: u64,
    position: u64,
    chain: Checksum,
    clean: bool,
}

/// Reads a checkpoint row following docs/FORMAT.md alone.
fn walk_row(b: &[u8]) -> Result<(Vec<Seg>, DocRow), Refused> {
    if b.len() != 50 {
        return corrupt("a row of another length");
    }
    if keyed(ROW_CONTEXT, &[&b[..42]]) != b[42..50] {
        return corrupt("the row's checksum");
    }
    if b[0] != 0x01 {
        return Err(Refused::Unsupported);
    }
    let mut w = Walk::new(b);
    w.be(1, "row version")?;
    let store_id: StoreId = w.take(16, "store id")?.try_into().expect("16 bytes");
    let lsn = w.be(8, "LSN")?;
    let position = w.be(8, "position")?;
    let chain: Checksum = w.take(8, "chain")?.try_into().expect("8 bytes");
    if chain == ZERO {
        w.note(" (new journal)");
    }
    let clean = match w.take(1, "flags")?[0] {
        0 => {
            w.note(": not clean");
            false
        }
        1 => {
            w.note(" = 0x01 (clean)");
            true
        }
        _ => return corrupt("unknown flags"),
    };
    w.take(8, "checksum (blake3, first 8 bytes)")?;
    let row = DocRow {
        store_id,
        lsn,
        position,
        chain,
        clean,
    };
    Ok((w.segs, row))
}

type DocTable = (String, u8, String, String);
type DocRecord = (u8, u16, Vec<u8>, Option<Vec<u8>>);

#[derive(Debug, PartialEq, Eq)]
enum DocFrame {
    Entry {
        tables: Vec<DocTable>,
        records: Vec<DocRecord>,
        checksum: Checksum,
        next: u64,
    },
    Wrap {
        checksum: Checksum,
    },
}

/// Reads the frame at `pos` of the journal `file` as the successor with LSN `lsn` of a frame
/// whose checksum was `chain`, following docs/FORMAT.md, "Reading the journal", alone. The
/// segments' offsets are from the frame's start.
fn walk_frame(
    file: &[u8],
    store_id: &StoreId,
    chain: &Checksum,
    pos: usize,
    lsn: u64,
) -> Result<(Vec<Seg>, DocFrame), Refused> {
    // Steps 2 and 3: the tail.
    let f = &file[pos..];
    if f.len() < 28 || &f[..4] != b"IDJF" {
        return Err(Refused::Tail);
    }
    let n = u32::from_be_bytes([f[8], f[9], f[10], f[11]]) as usize;
    if 28 + n > f.len() {
        return Err(Refused::Tail);
    }
    let checksum = keyed(FRAME_CONTEXT, &[store_id, chain, &f[..20 + n]]);
    if checksum != f[20 + n..28 + n] {
        return Err(Refused::Tail);
    }
    // Step 4: a frame that checks out is never a tail.
    let (version, kind) = (f[4], f[5]);
    if version != 0x01 {
        return Err(Refused::Unsupported);
    }
    if !matches!(kind, 0x01 | 0x02) {
        return corrupt("a kind version 0x01 does not have");
    }
    let mut w = Walk::new(&f[..20 + n]);
    w.take(4, "magic = IDJF")?;
    w.be(1, "frame version")?;
    w.be(1, "kind")?;
    w.note(if kind == 1 { " (entry)" } else { " (wrap)" });
    if w.be(2, "reserved")? != 0 {
        return corrupt("reserved bytes");
    }
    w.be(4, "body length")?;
    if w.be(8, "LSN")? != lsn {
        return corrupt("another LSN");
    }
    let frame = if kind == 0x02 {
        if n != 0 {
            return corrupt("a wrap frame with a body");
        }
        DocFrame::Wrap { checksum }
    } else {
        let (tables, records) = walk_body(&mut w)?;
        let len = (28 + n).div_ceil(32) * 32;
        DocFrame::Entry {
            tables,
            records,
            checksum,
            next: (pos + len) as u64,
        }
    };
    if w.at != 20 + n {
        return corrupt("bytes after the last record");
    }
    let mut segs = w.segs;
    segs.push(Seg {
        offset: 20 + n,
        hex: hex_row(&checksum),
        what: "checksum (blake3, first 8 bytes)".into(),
    });
    let len = (28 + n).div_ceil(32) * 32;
    segs.push(Seg {
        offset: 28 + n,
        hex: format!("00 × {}", len - 28 - n),
        what: format!("padding to {len}"),
    });
    Ok((segs, frame))
}

/// An entry's body (docs/FORMAT.md, "Entry body"), read from `w`'s position.
fn walk_body(w: &mut Walk<'_>) -> Result<(Vec<DocTable>, Vec<DocRecord>), Refused> {
    let count = w.be(2, "table count")?;
    let mut tables = Vec::new();
    for i in 0..count {
        let name = w.text(&format!("table {i} name"))?;
        let kind = w.be(1, &format!("table {i} kind"))? as u8;
        match kind {
            0x01 => w.note(" (table)"),
            0x02 => w.note(" (multimap)"),
            _ => return corrupt("a table kind"),
        }
        let key_type = w.text("key type")?;
        let value_type = w.text("value type")?;
        tables.push((name, kind, key_type, value_type));
    }
    let count = w.be(4, "record count")?;
    let mut records = Vec::new();
    for _ in 0..count {
        let op = w.be(1, "op")? as u8;
        w.note(match op {
            0x01 => " (put)",
            0x02 => " (remove)",
            0x03 => " (remove a pair)",
            _ => return corrupt("an unknown op"),
        });
        let table = w.be(2, "table index")? as u16;
        let Some((_, kind, key_type, value_type)) = tables.get(usize::from(table)).cloned() else {
            return corrupt("a table index out of range");
        };
        if !matches!((op, kind), (0x01, _) | (0x02, 0x01) | (0x03, 0x02)) {
            return corrupt("an op its table's kind does not allow");
        }
        let key = w.bytes("key")?;
        w.note(&format!(", {}", shown(&key, &key_type)));
        let value = if op == 0x02 {
            None
        } else {
            let v = w.bytes("value")?;
            w.note(&format!(", {}", shown(&v, &value_type)));
            Some(v)
        };
        records.push((op, table, key, value));
    }
    Ok((tables, records))
}

/// A key or value as the dump shows it: redb's bytes of its type.
fn shown(bytes: &[u8], type_name: &str) -> String {
    match (type_name, bytes.len()) {
        ("u32", 4) => format!(
            "{} (u32, little-endian)",
            u32::from_le_bytes(bytes.try_into().expect("4 bytes"))
        ),
        ("u64", 8) => format!(
            "{} (u64, little-endian)",
            u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
        ),
        _ => printable(bytes),
    }
}

/// A journal image: the example's header, `frames` at 4,096 one after the other, zeros to
/// `capacity`.
fn image(capacity: usize, frames: &[&[u8]]) -> Vec<u8> {
    let mut f = vec![0u8; capacity];
    let h = Header {
        capacity: capacity as u64,
        store_id: store_id(),
    };
    f[..44].copy_from_slice(&h.encode());
    let mut at = HEADER_LEN as usize;
    for frame in frames {
        f[at..at + frame.len()].copy_from_slice(frame);
        at += frame.len();
    }
    f
}

#[test]
fn the_documented_decoder_reads_every_golden_frame() {
    // The header, in a file of the example's capacity (only its first 4,096 bytes are read).
    let mut header = golden_header();
    header.resize(4096, 0);
    let (segs, h) = walk_header(&header, CAPACITY).expect("the golden header");
    assert_eq!(
        h,
        DocHeader {
            capacity: CAPACITY,
            store_id: store_id()
        }
    );
    assert_eq!(segs.len(), 7, "every field of the header annotated");
    assert_eq!(
        walk_header(&header, CAPACITY + 32),
        Err(Refused::Corrupt("the capacity".into())),
        "a capacity other than the file's length"
    );

    for clean in [false, true] {
        let (segs, row) = walk_row(&golden_row(clean)).expect("the golden row");
        assert_eq!(
            row,
            DocRow {
                store_id: store_id(),
                lsn: 0,
                position: 4096,
                chain: ZERO,
                clean
            }
        );
        let covered: usize = segs.iter().map(|s| s.hex.split(' ').count()).sum();
        assert_eq!(covered, 50, "every byte of the row annotated once");
    }

    // The entry, then the wrap frame after it, in a small journal.
    let file = image(8192, &[&golden_entry(), &golden_wrap()]);
    let (segs, entry) = walk_frame(&file, &store_id(), &ZERO, 4096, 1).expect("the entry");
    let entry_sum: Checksum = golden_entry()[64..72].try_into().expect("8 bytes");
    assert_eq!(
        entry,
        DocFrame::Entry {
            tables: vec![("orders".into(), 0x01, "&str".into(), "u32".into())],
            records: vec![(0x01, 0, b"o-1".to_vec(), Some(vec![7, 0, 0, 0]))],
            checksum: entry_sum,
            next: 4096 + 96,
        }
    );
    assert_eq!(segs.last().map(|s| s.what.as_str()), Some("padding to 96"));
    let (_, wrap) = walk_frame(&file, &store_id(), &entry_sum, 4192, 2).expect("the wrap");
    assert_eq!(
        wrap,
        DocFrame::Wrap {
            checksum: golden_wrap()[20..28].try_into().expect("8 bytes")
        }
    );
    // Only as the successor it was written as: another chain, store id or LSN.
    assert_eq!(
        walk_frame(&file, &store_id(), &[1; 8], 4096, 1).err(),
        Some(Refused::Tail)
    );
    assert_eq!(
        walk_frame(&file, &[9; 16], &ZERO, 4096, 1).err(),
        Some(Refused::Tail)
    );
    assert_eq!(
        walk_frame(&file, &store_id(), &ZERO, 4096, 2).err(),
        Some(Refused::Corrupt("another LSN".into()))
    );
    // After the wrap frame: zeros, the tail.
    assert_eq!(
        walk_frame(&file, &store_id(), &ZERO, 4224, 2).err(),
        Some(Refused::Tail)
    );
}

/// What idem's reader makes of the frame at `pos`, in the documented decoder's terms.
fn idem_reads(file: &[u8], chain: &Checksum, pos: u64, lsn: u64) -> Result<DocFrame, Refused> {
    let refused = |e: FormatError| match e {
        FormatError::Corrupt(_) => Refused::Corrupt(String::new()),
        FormatError::Version(_) => Refused::Unsupported,
    };
    match read_frame(file, &store_id(), chain, pos, lsn).map_err(refused)? {
        Frame::Tail => Err(Refused::Tail),
        Frame::Wrap { checksum } => Ok(DocFrame::Wrap { checksum }),
        Frame::Entry {
            body,
            checksum,
            next,
        } => {
            let entry = decode_body(&file[body.clone()]).map_err(refused)?;
            let b = &file[body];
            Ok(DocFrame::Entry {
                tables: entry
                    .tables
                    .into_iter()
                    .map(|t| (t.name, t.kind, t.key_type, t.value_type))
                    .collect(),
                records: entry
                    .records
                    .into_iter()
                    .map(|r| {
                        (
                            r.op,
                            r.table,
                            b[r.key].to_vec(),
                            r.value.map(|v| b[v].to_vec()),
                        )
                    })
                    .collect(),
                checksum,
                next,
            })
        }
    }
}

/// The documented decoder's answer with the reason of a `Corrupt` dropped (idem words it
/// otherwise).
fn doc_reads(file: &[u8], chain: &Checksum, pos: u64, lsn: u64) -> Result<DocFrame, Refused> {
    walk_frame(file, &store_id(), chain, pos as usize, lsn)
        .map(|(_, f)| f)
        .map_err(|e| match e {
            Refused::Corrupt(_) => Refused::Corrupt(String::new()),
            other => other,
        })
}

/// The golden frames in a journal image, each with the chain and LSN it is read with.
fn golden_frames() -> Vec<(&'static str, Vec<u8>, Checksum, u64)> {
    let entry_sum: Checksum = golden_entry()[64..72].try_into().expect("8 bytes");
    vec![
        ("entry", golden_entry(), ZERO, 1),
        ("wrap", golden_wrap(), entry_sum, 2),
    ]
}

#[test]
fn every_single_byte_change_of_a_golden_frame_is_a_tail_or_a_typed_error() {
    for (name, frame, chain, lsn) in golden_frames() {
        let file = image(8192, &[&frame]);
        let intact = idem_reads(&file, &chain, 4096, lsn).expect("the golden frame");
        // The checksum's end: the padding after it is not covered.
        let covered = match &intact {
            DocFrame::Entry { .. } => 72,
            DocFrame::Wrap { .. } => 28,
        };
        for i in 0..frame.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut g = file.clone();
                g[4096 + i] ^= flip;
                let read = idem_reads(&g, &chain, 4096, lsn);
                if i < covered {
                    assert!(
                        matches!(
                            read_frame(&g, &store_id(), &chain, 4096, lsn),
                            Ok(Frame::Tail) | Err(_)
                        ),
                        "{name}: byte {i} ^ {flip:#04x} read as {read:?}"
                    );
                } else {
                    // Padding: ignored, the same frame.
                    assert_eq!(read.as_ref(), Ok(&intact), "{name}: padding byte {i}");
                }
                assert_eq!(
                    read,
                    doc_reads(&g, &chain, 4096, lsn),
                    "{name}: byte {i} ^ {flip:#04x}: idem and the documented decoder differ"
                );
            }
        }
    }
}

#[test]
fn a_resealed_single_byte_change_reads_as_the_documented_decoder_says() {
    // With its checksum recomputed, a changed frame is what step 4 says: idem's reader and
    // the documented decoder agree on every one (an entry, a wrap, or which error).
    let mut seen = std::collections::BTreeSet::new();
    for (name, frame, chain, lsn) in golden_frames() {
        let file = image(8192, &[&frame]);
        let n = u32::from_be_bytes(frame[8..12].try_into().expect("4 bytes")) as usize;
        for i in 0..20 + n {
            for value in [
                frame[i] ^ 0x01,
                frame[i] ^ 0x80,
                frame[i] ^ 0xff,
                0x00,
                0x02,
            ] {
                if value == frame[i] {
                    continue;
                }
                let mut g = file.clone();
                g[4096 + i] = value;
                let len = u32::from_be_bytes(g[4104..4108].try_into().expect("4 bytes")) as usize;
                let end = 4096 + 20 + len;
                if end + 8 <= g.len() {
                    let sum = keyed(FRAME_CONTEXT, &[&store_id(), &chain, &g[4096..end]]);
                    g[end..end + 8].copy_from_slice(&sum);
                }
                let idem = idem_reads(&g, &chain, 4096, lsn);
                assert_eq!(
                    idem,
                    doc_reads(&g, &chain, 4096, lsn),
                    "{name}: byte {i} = {value:#04x}"
                );
                seen.insert(match idem {
                    Ok(DocFrame::Entry { .. }) => "entry",
                    Ok(DocFrame::Wrap { .. }) => "wrap",
                    Err(Refused::Tail) => "tail",
                    Err(Refused::Unsupported) => "unsupported",
                    Err(Refused::Corrupt(_)) => "corrupt",
                });
            }
        }
    }
    // Each outcome happens: the comparison is not vacuous.
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["corrupt", "entry", "tail", "unsupported"]
    );
}

#[test]
fn every_single_byte_change_of_the_header_and_the_row_is_refused() {
    let mut header = golden_header();
    header.resize(4096, 0);
    for i in 0..44 {
        let mut h = header.clone();
        h[i] ^= 0x01;
        assert!(Header::decode(&h, CAPACITY).is_err(), "header byte {i}");
        assert!(walk_header(&h, CAPACITY).is_err(), "header byte {i}");
    }
    for clean in [false, true] {
        for i in 0..50 {
            let mut r = golden_row(clean);
            r[i] ^= 0x01;
            assert!(Row::decode(&r).is_err(), "row byte {i}");
            assert!(walk_row(&r).is_err(), "row byte {i}");
        }
    }
}

// ---- the dumps in docs/FORMAT.md ----

fn render(segs: &[Seg]) -> String {
    let mut out = String::from(" off  bytes                                            field\n");
    for s in segs {
        out += &format!("{:>4}  {:<47}  {}\n", s.offset, s.hex, s.what);
    }
    out
}

/// A dump or a hex row, with what it shows.
type Named = (&'static str, String);

/// The dumps docs/FORMAT.md shows, as the documented decoder prints them, and the one-line
/// values.
fn dumps() -> (Vec<Named>, Vec<Named>) {
    let mut header = golden_header();
    header.resize(4096, 0);
    let (header, _) = walk_header(&header, CAPACITY).expect("header");
    let (row, _) = walk_row(&golden_row(false)).expect("row");
    let file = image(8192, &[&golden_entry(), &golden_wrap()]);
    let (entry, _) = walk_frame(&file, &store_id(), &ZERO, 4096, 1).expect("entry");
    let entry_sum: Checksum = golden_entry()[64..72].try_into().expect("8 bytes");
    let (wrap, _) = walk_frame(&file, &store_id(), &entry_sum, 4192, 2).expect("wrap");
    let blocks = vec![
        ("header", render(&header)),
        ("row", render(&row)),
        ("entry", render(&entry)),
        ("wrap", render(&wrap)),
    ];
    let lines = vec![("clean row", hex_row(&golden_row(true)))];
    (blocks, lines)
}

#[test]
fn format_md_shows_the_journal_dumps() {
    let doc = format_md();
    let (blocks, lines) = dumps();
    for (name, d) in blocks {
        assert!(
            doc.contains(&d),
            "docs/FORMAT.md must contain this dump of the {name}:\n{d}"
        );
    }
    for (name, l) in lines {
        assert!(doc.contains(&l), "docs/FORMAT.md must show the {name}: {l}");
    }
    let section = &doc[doc.find("\n# Journal\n").expect("the Journal section")..];
    let section = &section[..section.find("\n# Compatibility").unwrap_or(section.len())];
    assert!(
        !section.contains("(8 bytes)"),
        "docs/FORMAT.md's Journal section still has a checksum placeholder"
    );
}

#[test]
#[ignore = "prints the journal dumps for docs/FORMAT.md"]
fn print_journal_dumps() {
    let (blocks, lines) = dumps();
    for (name, d) in blocks {
        println!("{name}:\n{d}");
    }
    for (name, l) in lines {
        println!("{name}: {l}");
    }
}
