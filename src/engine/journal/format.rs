//! The journal's bytes (docs/FORMAT.md, "Journal"): the header, frames, entry bodies and the
//! checkpoint row, encoded and decoded as pure functions over byte slices. Nothing here does
//! I/O, so recovery's reading of a journal is the same code the tests and the fuzzer drive.
//! (Items are `pub` for the white-box re-export `idem::__journal_format`; the module is not.)

use std::ops::Range;

/// The header's length: frames start here.
pub const HEADER_LEN: u64 = 4096;
/// Frames start on multiples of this, counted from [`HEADER_LEN`].
pub const ALIGN: u64 = 32;
/// A frame's bytes before its body: magic, version, kind, reserved, body length, LSN.
pub const FRAME_HEAD: usize = 20;
/// The checksum's length, after the body.
pub const CHECKSUM_LEN: usize = 8;
/// The version of the header, of frames and of the checkpoint row this build writes and reads.
pub const VERSION: u8 = 1;

const HEADER_MAGIC: &[u8; 8] = b"IDEMJRNL";
const FRAME_MAGIC: &[u8; 4] = b"IDJF";
const HEADER_CONTEXT: &str = "idem 2026-12-06 journal header v1";
const FRAME_CONTEXT: &str = "idem 2026-12-06 journal frame v1";
const ROW_CONTEXT: &str = "idem 2026-12-06 journal checkpoint v1";

/// A frame's kind byte.
pub const KIND_ENTRY: u8 = 0x01;
/// The kind byte of a wrap frame.
pub const KIND_WRAP: u8 = 0x02;

/// A table's kind byte in an entry's table list.
pub const TABLE_PLAIN: u8 = 0x01;
/// The kind byte of a multimap table.
pub const TABLE_MULTIMAP: u8 = 0x02;

/// A redo record's operation byte.
pub const OP_PUT: u8 = 0x01;
/// Remove a key (plain tables).
pub const OP_REMOVE: u8 = 0x02;
/// Remove a key-value pair (multimap tables).
pub const OP_REMOVE_PAIR: u8 = 0x03;

/// The chain value and checksum of frames: the first 8 bytes of a keyed blake3.
pub type Checksum = [u8; CHECKSUM_LEN];
/// A journal's identity, in its header and in the checkpoint row.
pub type StoreId = [u8; 16];

/// Why journal bytes were refused (docs/FORMAT.md, "Reading the journal"). A tail is not an
/// error: [`read_frame`] reports it as [`Frame::Tail`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// Damaged, or another store's: `CorruptStore`.
    Corrupt(String),
    /// A valid header, frame or row of a version this build does not read: `UnsupportedJournal`.
    Version(u8),
}

fn corrupt(what: impl Into<String>) -> FormatError {
    FormatError::Corrupt(what.into())
}

fn keyed(context: &str, parts: &[&[u8]]) -> Checksum {
    let mut hasher = blake3::Hasher::new_derive_key(context);
    for part in parts {
        hasher.update(part);
    }
    let mut out = [0u8; CHECKSUM_LEN];
    out.copy_from_slice(&hasher.finalize().as_bytes()[..CHECKSUM_LEN]);
    out
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// The journal file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The file's length, header included; a multiple of [`ALIGN`].
    pub capacity: u64,
    /// Random at creation; the same bytes as in the checkpoint row.
    pub store_id: StoreId,
}

impl Header {
    /// The header's 44 meaningful bytes (the rest of the first 4,096 are zero).
    pub fn encode(&self) -> [u8; 44] {
        let mut b = [0u8; 44];
        b[..8].copy_from_slice(HEADER_MAGIC);
        b[8] = VERSION;
        b[12..20].copy_from_slice(&self.capacity.to_be_bytes());
        b[20..36].copy_from_slice(&self.store_id);
        let sum = keyed(HEADER_CONTEXT, &[&b[..36]]);
        b[36..44].copy_from_slice(&sum);
        b
    }

    /// Checks the first bytes of a journal file of length `file_len`: magic and checksum before
    /// the version, then the reserved bytes and the capacity.
    pub fn decode(b: &[u8], file_len: u64) -> Result<Header, FormatError> {
        if b.len() < 44 || &b[..8] != HEADER_MAGIC {
            return Err(corrupt("the journal's header has no IDEMJRNL magic"));
        }
        if keyed(HEADER_CONTEXT, &[&b[..36]]) != b[36..44] {
            return Err(corrupt("the journal's header fails its checksum"));
        }
        if b[8] != VERSION {
            return Err(FormatError::Version(b[8]));
        }
        if b[9..12] != [0, 0, 0] {
            return Err(corrupt("the journal's header has nonzero reserved bytes"));
        }
        let capacity = u64_at(b, 12);
        if capacity != file_len
            || !capacity.is_multiple_of(ALIGN)
            || capacity < HEADER_LEN + 2 * ALIGN
        {
            return Err(corrupt(format!(
                "the journal's header gives a capacity of {capacity} bytes, the file has {file_len}"
            )));
        }
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(&b[20..36]);
        Ok(Header { capacity, store_id })
    }
}

/// The checkpoint row (`"journal"` in `idem.meta.v1`): where the live journal begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The journal header's store id.
    pub store_id: StoreId,
    /// The last entry the redb state holding this row includes.
    pub lsn: u64,
    /// Where the frame after entry `lsn` goes.
    pub position: u64,
    /// The checksum that frame continues.
    pub chain: Checksum,
    /// Written by a close when nothing was live.
    pub clean: bool,
}

/// The row's length.
pub const ROW_LEN: usize = 50;

impl Row {
    /// The row's 50 bytes, checksum included.
    pub fn encode(&self) -> [u8; ROW_LEN] {
        let mut b = [0u8; ROW_LEN];
        b[0] = VERSION;
        b[1..17].copy_from_slice(&self.store_id);
        b[17..25].copy_from_slice(&self.lsn.to_be_bytes());
        b[25..33].copy_from_slice(&self.position.to_be_bytes());
        b[33..41].copy_from_slice(&self.chain);
        b[41] = u8::from(self.clean);
        let sum = keyed(ROW_CONTEXT, &[&b[..42]]);
        b[42..50].copy_from_slice(&sum);
        b
    }

    /// Checks a row's checksum, then its version and flags.
    pub fn decode(b: &[u8]) -> Result<Row, FormatError> {
        if b.len() != ROW_LEN {
            return Err(corrupt(format!(
                "the journal checkpoint row has {} bytes, not {ROW_LEN}",
                b.len()
            )));
        }
        if keyed(ROW_CONTEXT, &[&b[..42]]) != b[42..50] {
            return Err(corrupt("the journal checkpoint row fails its checksum"));
        }
        if b[0] != VERSION {
            return Err(FormatError::Version(b[0]));
        }
        if b[41] & !1 != 0 {
            return Err(corrupt("the journal checkpoint row has unknown flags"));
        }
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(&b[1..17]);
        let mut chain = [0u8; 8];
        chain.copy_from_slice(&b[33..41]);
        Ok(Row {
            store_id,
            lsn: u64_at(b, 17),
            position: u64_at(b, 25),
            chain,
            clean: b[41] == 1,
        })
    }
}

/// A frame's length on disk, padding included, for a body of `body_len` bytes.
pub fn frame_len(body_len: usize) -> u64 {
    let raw = (FRAME_HEAD + body_len + CHECKSUM_LEN) as u64;
    raw.div_ceil(ALIGN) * ALIGN
}

/// Encodes a frame (padded to [`ALIGN`]) and returns it with its checksum, the next frame's
/// chain.
pub fn encode_frame(
    store_id: &StoreId,
    chain: &Checksum,
    kind: u8,
    lsn: u64,
    body: &[u8],
) -> (Vec<u8>, Checksum) {
    let len = frame_len(body.len()) as usize;
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(FRAME_MAGIC);
    f.push(VERSION);
    f.push(kind);
    f.extend_from_slice(&[0, 0]);
    // Invariant: entries are bounded by the journal's capacity (a u64 far below 4 GiB in
    // practice, and entries above a quarter of it are never framed), checked by the caller.
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(&lsn.to_be_bytes());
    f.extend_from_slice(body);
    let sum = keyed(FRAME_CONTEXT, &[store_id, chain, &f]);
    f.extend_from_slice(&sum);
    f.resize(len, 0);
    (f, sum)
}

/// What a position in the frame area holds, read as the successor of the frame before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// An entry: its body's range in the file, its checksum, and where the next frame starts.
    Entry {
        /// The body's bytes in the file.
        body: Range<usize>,
        /// The frame's checksum: the next frame's chain.
        checksum: Checksum,
        /// Where the next frame starts.
        next: u64,
    },
    /// A wrap frame: the next frame is at [`HEADER_LEN`], continuing this checksum.
    /// The checksum the next frame continues.
    Wrap {
        /// The checksum the next frame continues.
        checksum: Checksum,
    },
    /// Not a successor: recovery stops here.
    Tail,
}

/// Reads the frame at `pos` of the journal `file` (the whole file, header included) as the
/// successor with LSN `lsn` of a frame whose checksum was `chain` (docs/FORMAT.md, "Reading
/// the journal", steps 2 to 5; a body is checked by [`decode_body`]).
pub fn read_frame(
    file: &[u8],
    store_id: &StoreId,
    chain: &Checksum,
    pos: u64,
    lsn: u64,
) -> Result<Frame, FormatError> {
    let end = file.len() as u64;
    if pos < HEADER_LEN || pos >= end || !(pos - HEADER_LEN).is_multiple_of(ALIGN) {
        return Err(corrupt(format!(
            "a journal position ({pos}) outside the frame area or off the 32-byte grid"
        )));
    }
    let at = pos as usize;
    let left = file.len() - at;
    if left < FRAME_HEAD + CHECKSUM_LEN || &file[at..at + 4] != FRAME_MAGIC {
        return Ok(Frame::Tail);
    }
    let body_len = u32_at(file, at + 8) as usize;
    let Some(sum_at) = (at + FRAME_HEAD).checked_add(body_len) else {
        return Ok(Frame::Tail);
    };
    if sum_at + CHECKSUM_LEN > file.len() {
        return Ok(Frame::Tail);
    }
    let expected = keyed(FRAME_CONTEXT, &[store_id, chain, &file[at..sum_at]]);
    if expected != file[sum_at..sum_at + CHECKSUM_LEN] {
        return Ok(Frame::Tail);
    }
    // A frame that checks out is never a tail.
    let (version, kind) = (file[at + 4], file[at + 5]);
    if version != VERSION {
        return Err(FormatError::Version(version));
    }
    if kind != KIND_ENTRY && kind != KIND_WRAP {
        // Not damage (the checksum holds) nor another version: a writer that broke the rule
        // that a new kind bumps the frame version.
        return Err(corrupt(format!(
            "a journal frame has kind {kind:#04x}, which frame version {version} does not have"
        )));
    }
    if file[at + 6..at + 8] != [0, 0] {
        return Err(corrupt("a journal frame has nonzero reserved bytes"));
    }
    let found = u64_at(file, at + 12);
    if found != lsn {
        return Err(corrupt(format!(
            "a journal frame carries LSN {found} where {lsn} was expected"
        )));
    }
    if kind == KIND_WRAP {
        if body_len != 0 {
            return Err(corrupt("a journal wrap frame has a body"));
        }
        return Ok(Frame::Wrap { checksum: expected });
    }
    Ok(Frame::Entry {
        body: at + FRAME_HEAD..sum_at,
        checksum: expected,
        next: pos + frame_len(body_len),
    })
}

/// A deliberately broken reader for the tests that prove recovery's checks catch what they
/// exist for: accepts the frame at `pos` by its magic and LSN alone, without the chain.
#[cfg(any(test, feature = "__internal_whitebox"))]
pub fn read_frame_by_lsn(file: &[u8], pos: u64, lsn: u64) -> Frame {
    let at = pos as usize;
    if at + FRAME_HEAD + CHECKSUM_LEN > file.len() || &file[at..at + 4] != FRAME_MAGIC {
        return Frame::Tail;
    }
    let body_len = u32_at(file, at + 8) as usize;
    let sum_at = at + FRAME_HEAD + body_len;
    if sum_at + CHECKSUM_LEN > file.len() || u64_at(file, at + 12) != lsn {
        return Frame::Tail;
    }
    let mut checksum = [0u8; CHECKSUM_LEN];
    checksum.copy_from_slice(&file[sum_at..sum_at + CHECKSUM_LEN]);
    if file[at + 5] == KIND_WRAP {
        return Frame::Wrap { checksum };
    }
    Frame::Entry {
        body: at + FRAME_HEAD..sum_at,
        checksum,
        next: pos + frame_len(body_len),
    }
}

/// A table an entry writes to, as recorded in its table list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRef {
    /// The table's name.
    pub name: String,
    /// [`TABLE_PLAIN`] or [`TABLE_MULTIMAP`].
    pub kind: u8,
    /// redb's name of the key type.
    pub key_type: String,
    /// redb's name of the value type.
    pub value_type: String,
}

/// One redo record of a decoded entry; ranges index the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redo {
    /// [`OP_PUT`], [`OP_REMOVE`] or [`OP_REMOVE_PAIR`].
    pub op: u8,
    /// Index into the entry's table list.
    pub table: u16,
    /// The key's bytes in the body.
    pub key: Range<usize>,
    /// The value's bytes in the body (not for a remove).
    pub value: Option<Range<usize>>,
}

/// A decoded entry body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The tables, in the order of their first record.
    pub tables: Vec<TableRef>,
    /// The redo records, in the order the batch made them.
    pub records: Vec<Redo>,
}

/// Builds an entry body as a batch writes (docs/FORMAT.md, "Entry body").
#[derive(Debug, Default)]
pub struct EntryBuilder {
    tables: Vec<TableRef>,
    records: Vec<u8>,
    count: u32,
}

impl EntryBuilder {
    /// No record yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The index of a table in the entry's list, added on first use.
    pub fn table(&mut self, name: &str, kind: u8, key_type: &str, value_type: &str) -> u16 {
        if let Some(i) = self.tables.iter().position(|t| t.name == name) {
            return i as u16;
        }
        self.tables.push(TableRef {
            name: name.to_owned(),
            kind,
            key_type: key_type.to_owned(),
            value_type: value_type.to_owned(),
        });
        // Invariant: a batch opens far fewer than 65,536 tables (redb's table names are
        // distinct and every open is a B-tree lookup); `check` refuses an entry that did.
        (self.tables.len() - 1) as u16
    }

    /// Appends a record.
    pub fn record(&mut self, op: u8, table: u16, key: &[u8], value: Option<&[u8]>) {
        self.records.push(op);
        self.records.extend_from_slice(&table.to_be_bytes());
        self.records
            .extend_from_slice(&(key.len() as u32).to_be_bytes());
        self.records.extend_from_slice(key);
        if let Some(v) = value {
            self.records
                .extend_from_slice(&(v.len() as u32).to_be_bytes());
            self.records.extend_from_slice(v);
        }
        self.count = self.count.saturating_add(1);
    }

    /// The encoded body, or why it cannot be one (a field past its length prefix's range).
    pub fn finish(&self) -> Result<Vec<u8>, String> {
        if self.tables.len() > usize::from(u16::MAX) {
            return Err(format!("a batch wrote to {} tables", self.tables.len()));
        }
        let mut b = Vec::with_capacity(64 + self.records.len());
        b.extend_from_slice(&(self.tables.len() as u16).to_be_bytes());
        for t in &self.tables {
            for (i, s) in [&t.name, &t.key_type, &t.value_type]
                .into_iter()
                .enumerate()
            {
                let len = u16::try_from(s.len())
                    .map_err(|_| format!("a table name or type name of {} bytes", s.len()))?;
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(s.as_bytes());
                if i == 0 {
                    b.push(t.kind);
                }
            }
        }
        b.extend_from_slice(&self.count.to_be_bytes());
        b.extend_from_slice(&self.records);
        Ok(b)
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<Range<usize>, FormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| corrupt("a journal entry ends inside a field"))?;
        let r = self.at..end;
        self.at = end;
        Ok(r)
    }
    fn u8(&mut self) -> Result<u8, FormatError> {
        let r = self.take(1)?;
        Ok(self.b[r.start])
    }
    fn u16(&mut self) -> Result<u16, FormatError> {
        let r = self.take(2)?;
        Ok(u16_at(self.b, r.start))
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        let r = self.take(4)?;
        Ok(u32_at(self.b, r.start))
    }
    fn text(&mut self) -> Result<String, FormatError> {
        let n = usize::from(self.u16()?);
        let r = self.take(n)?;
        std::str::from_utf8(&self.b[r])
            .map(str::to_owned)
            .map_err(|_| corrupt("a journal entry's table or type name is not UTF-8"))
    }
}

/// Decodes an entry body exactly: every length bounds-checked, names UTF-8, table indexes in
/// range, each operation allowed for its table's kind, no bytes left over.
pub fn decode_body(body: &[u8]) -> Result<Entry, FormatError> {
    let mut c = Cursor { b: body, at: 0 };
    let count = c.u16()?;
    let mut tables = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let name = c.text()?;
        let kind = c.u8()?;
        if kind != TABLE_PLAIN && kind != TABLE_MULTIMAP {
            return Err(corrupt(format!("a journal entry's table kind {kind:#04x}")));
        }
        let key_type = c.text()?;
        let value_type = c.text()?;
        tables.push(TableRef {
            name,
            kind,
            key_type,
            value_type,
        });
    }
    let n = c.u32()?;
    // Each record takes at least 7 bytes: a count beyond that is damage, not an allocation.
    let mut records = Vec::with_capacity((n as usize).min(body.len() / 7));
    for _ in 0..n {
        let op = c.u8()?;
        let table = c.u16()?;
        let kind = tables
            .get(usize::from(table))
            .ok_or_else(|| corrupt("a journal record names a table the entry does not list"))?
            .kind;
        let allowed = match op {
            OP_PUT => true,
            OP_REMOVE => kind == TABLE_PLAIN,
            OP_REMOVE_PAIR => kind == TABLE_MULTIMAP,
            _ => false,
        };
        if !allowed {
            return Err(corrupt(format!(
                "a journal record's operation {op:#04x} on a table of kind {kind:#04x}"
            )));
        }
        let key_len = c.u32()? as usize;
        let key = c.take(key_len)?;
        let value = if op == OP_REMOVE {
            None
        } else {
            let len = c.u32()? as usize;
            Some(c.take(len)?)
        };
        records.push(Redo {
            op,
            table,
            key,
            value,
        });
    }
    if c.at != body.len() {
        return Err(corrupt("a journal entry has bytes after its last record"));
    }
    Ok(Entry { tables, records })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(cap: u64) -> Vec<u8> {
        let mut f = vec![0u8; cap as usize];
        let h = Header {
            capacity: cap,
            store_id: [7; 16],
        };
        f[..44].copy_from_slice(&h.encode());
        f
    }

    #[test]
    fn a_frame_reads_back_only_as_the_successor_it_was_written_as() {
        let mut f = journal(HEADER_LEN + 1024);
        let mut e = EntryBuilder::default();
        let t = e.table("orders", TABLE_PLAIN, "&str", "u32");
        e.record(OP_PUT, t, b"o-1", Some(&7u32.to_le_bytes()));
        let body = e.finish().unwrap();
        let (frame, sum) = encode_frame(&[7; 16], &[0; 8], KIND_ENTRY, 1, &body);
        f[4096..4096 + frame.len()].copy_from_slice(&frame);
        let read = read_frame(&f, &[7; 16], &[0; 8], 4096, 1).unwrap();
        let Frame::Entry {
            body: r,
            checksum,
            next,
        } = read
        else {
            panic!("not an entry: {read:?}")
        };
        assert_eq!(checksum, sum);
        assert_eq!(next, 4096 + frame.len() as u64);
        let entry = decode_body(&f[r]).unwrap();
        assert_eq!(entry.tables[0].name, "orders");
        assert_eq!(entry.records.len(), 1);
        // Another chain, another store, a cut: a tail, never another entry.
        assert_eq!(read_frame(&f, &[7; 16], &[1; 8], 4096, 1), Ok(Frame::Tail));
        assert_eq!(read_frame(&f, &[8; 16], &[0; 8], 4096, 1), Ok(Frame::Tail));
        for cut in 0..frame.len() {
            let mut g = f.clone();
            g[4096 + cut] ^= 0x40;
            let r = read_frame(&g, &[7; 16], &[0; 8], 4096, 1);
            assert!(
                matches!(r, Ok(Frame::Tail)) || r.is_err() || cut >= 20 + body.len() + 8,
                "a changed byte {cut} gave {r:?}"
            );
        }
        // The wrong LSN behind a right checksum is damage.
        assert!(matches!(
            read_frame(&f, &[7; 16], &[0; 8], 4096, 2),
            Err(FormatError::Corrupt(_))
        ));
    }

    #[test]
    fn header_and_row_round_trip_and_refuse_changes() {
        let h = Header {
            capacity: HEADER_LEN + 4096,
            store_id: [3; 16],
        };
        let mut f = journal(HEADER_LEN + 4096);
        f[..44].copy_from_slice(&h.encode());
        assert_eq!(Header::decode(&f, f.len() as u64), Ok(h));
        assert!(Header::decode(&f, f.len() as u64 + 32).is_err());
        let row = Row {
            store_id: [3; 16],
            lsn: 9,
            position: 4096 + 64,
            chain: [5; 8],
            clean: true,
        };
        let b = row.encode();
        assert_eq!(Row::decode(&b), Ok(row));
        for i in 0..ROW_LEN {
            let mut c = b;
            c[i] ^= 1;
            assert!(Row::decode(&c).is_err(), "byte {i}");
        }
    }

    #[test]
    fn bodies_decode_exactly() {
        let mut e = EntryBuilder::default();
        let t = e.table("m", TABLE_MULTIMAP, "u64", "u64");
        e.record(OP_PUT, t, &[1; 8], Some(&[2; 8]));
        e.record(OP_REMOVE_PAIR, t, &[1; 8], Some(&[2; 8]));
        let body = e.finish().unwrap();
        assert_eq!(decode_body(&body).unwrap().records.len(), 2);
        let mut longer = body.clone();
        longer.push(0);
        assert!(decode_body(&longer).is_err());
        for cut in 0..body.len() {
            assert!(decode_body(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_op = EntryBuilder::default();
        let t = bad_op.table("m", TABLE_MULTIMAP, "u64", "u64");
        bad_op.record(OP_REMOVE, t, &[1; 8], None);
        assert!(decode_body(&bad_op.finish().unwrap()).is_err());
    }
}
