//! Opening the journal beside a store: creating it, replaying its live entries into redb, and
//! the open-time checkpoint (docs/design.md, "Opening and recovery").
//!
//! Crash safety, step by step:
//! - a new journal is written in full (zeros to its capacity, then its header), synced and
//!   renamed into place before any row names it; a crash before the row's durable commit leaves
//!   a file no row names, and the next open writes a new one;
//! - every batch's transaction writes the row describing the state it leaves (its LSN, where
//!   the next frame goes, the chain), so whichever commit makes redb's state durable (a
//!   checkpoint, redb's own close) carries the row that says where replay resumes: replay never
//!   applies an entry twice nor skips one;
//! - replay reads frames from the row's position as long as each is the successor of the one
//!   before (its LSN and its chained checksum), decodes and checks every entry before applying
//!   any, then applies them all and writes the row after the last in one durable commit: a
//!   crash during it leaves the journal as it was, and the next open replays the same entries.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use redb::{BackendError, Database, ReadableDatabase, ReadableTable, StorageBackend};

use crate::engine::boundary::unlatched;
#[cfg(any(test, feature = "__internal_whitebox"))]
use crate::engine::journal::BrokenJournal;
use crate::engine::journal::applier::{Redb, Target};
use crate::engine::journal::apply::Registry;
use crate::engine::journal::format::{
    self, Checksum, Entry, FormatError, Frame, HEADER_LEN, Header, Row, StoreId,
};
use crate::engine::journal::log::Journal;
use crate::engine::tables::META;
use crate::error::Error;

/// Key of the checkpoint row in `idem.meta.v1`.
pub(crate) const META_JOURNAL: &str = "journal";

/// Journal settings ([`crate::StoreBuilder::journal`] and the two sizes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) capacity: u64,
    pub(crate) checkpoint_bytes: u64,
    /// A step deliberately broken (white-box tests only; `No` otherwise).
    #[cfg(any(test, feature = "__internal_whitebox"))]
    pub(crate) broken: BrokenJournal,
    /// P's byte bound (`StoreBuilder::journal_pending_bytes`).
    pub(crate) pending_bytes: usize,
}

/// Where the journal is.
pub(crate) enum Place {
    /// Beside the store's file: its path with `.journal` appended.
    Beside(PathBuf),
    /// A storage backend (tests' simulated and fault-injecting disks).
    Backend(Box<dyn StorageBackend>),
}

/// The journal's path for the store file at `store`.
pub fn journal_path(store: &Path) -> PathBuf {
    let mut p = store.as_os_str().to_owned();
    p.push(".journal");
    PathBuf::from(p)
}

/// The journal file's I/O: positioned reads and writes and `fdatasync`.
#[derive(Debug)]
struct FileIo(File);

impl StorageBackend for FileIo {
    fn len(&self) -> Result<u64, BackendError> {
        Ok(self.0.metadata()?.len())
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        Ok(self.0.read_exact_at(out, offset)?)
    }
    fn set_len(&self, len: u64) -> Result<(), BackendError> {
        Ok(self.0.set_len(len)?)
    }
    fn sync_data(&self) -> Result<(), BackendError> {
        Ok(self.0.sync_data()?)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.0.write_all_at(data, offset)?;
        Ok(start_writeback(&self.0, offset, data.len())?)
    }
}

/// Starts writing `len` bytes at `offset` back to the device without waiting (Linux's
/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`): a frame's pages are then on their way while redb
/// commits, and the `fdatasync` that makes the frame durable waits for less. It promises nothing
/// about durability: only `sync_data` does. An error (an I/O error starting the write-back) is
/// the write's error, which latches the journal failed.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn start_writeback(file: &File, offset: u64, len: usize) -> Result<(), std::io::Error> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Ok(());
    };
    // SAFETY: `sync_file_range` takes a file descriptor and three integers and touches no
    // memory of this process; the descriptor is `file`'s, open for as long as `file` is
    // borrowed. Why it is worth an `unsafe` block: one caller's claims run faster in journal
    // mode (benches/results/2026-12-06-writeback-and-syncer-ab.md).
    let done = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Elsewhere the journal's `fdatasync` does all of the write-back.
#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: usize) -> Result<(), std::io::Error> {
    Ok(())
}

fn corrupt(reason: impl Into<String>) -> Error {
    Error::CorruptStore {
        reason: reason.into(),
    }
}

fn format_error(e: FormatError) -> Error {
    match e {
        FormatError::Corrupt(reason) => corrupt(reason),
        FormatError::Version(found) => Error::UnsupportedJournal {
            found,
            supported: format::VERSION,
        },
    }
}

pub(crate) fn io(what: &str, e: impl Into<std::io::Error>) -> Error {
    let e = e.into();
    Error::Storage {
        source: crate::error::StorageError::new(std::io::Error::new(
            e.kind(),
            format!("{what}: {e}"),
        )),
    }
}

/// Before the store file is opened for writing: a journal beside it whose header is of another
/// version refuses the open while both files are as they were (an open for writing rewrites
/// redb's file even when it is refused later).
pub(crate) fn precheck(path: &Path) -> Result<(), Error> {
    use std::io::Read;
    let Ok(mut file) = File::open(path) else {
        return Ok(());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut head = [0u8; 44];
    if file.read_exact(&mut head).is_err() {
        return Ok(());
    }
    match Header::decode(&head, len) {
        Err(e @ FormatError::Version(_)) => Err(format_error(e)),
        // Anything else is for the open to judge, against the row.
        _ => Ok(()),
    }
}

/// The checkpoint row in a read of `db`, if there is one.
pub(crate) fn read_row(read: &redb::ReadTransaction) -> Result<Option<Row>, Error> {
    let meta = match read.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(unlatched(e)),
    };
    let Some(v) = meta.get(META_JOURNAL).map_err(unlatched)? else {
        return Ok(None);
    };
    Row::decode(v.value()).map(Some).map_err(format_error)
}

/// Writes `row` (or removes it, `None`) in one durable commit with quick-repair.
fn commit_row(db: &Database, row: Option<&Row>) -> Result<(), Error> {
    let mut txn = db.begin_write().map_err(unlatched)?;
    txn.set_quick_repair(true);
    {
        let mut meta = txn.open_table(META).map_err(unlatched)?;
        match row {
            Some(row) => meta.insert(META_JOURNAL, row.encode().as_slice()),
            None => meta.remove(META_JOURNAL),
        }
        .map_err(unlatched)?;
    }
    txn.commit().map_err(unlatched)
}

/// Writes a new journal file: zeros to `capacity`, then the header, synced; at a path, written
/// beside it, renamed into place and the directory synced.
fn create(
    place: Place,
    capacity: u64,
    store_id: StoreId,
) -> Result<Box<dyn StorageBackend>, Error> {
    let header = Header { capacity, store_id }.encode();
    match place {
        Place::Backend(b) => {
            b.set_len(capacity)
                .map_err(|e| io("sizing the journal", e))?;
            fill(&*b, capacity, &header)?;
            Ok(b)
        }
        Place::Beside(path) => {
            let mut tmp = path.as_os_str().to_owned();
            tmp.push(".new");
            let tmp = PathBuf::from(tmp);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(|e| io("creating the journal", e))?;
            let b = FileIo(file);
            let written = fill(&b, capacity, &header).and_then(|()| {
                std::fs::rename(&tmp, &path).map_err(|e| io("renaming the new journal", e))
            });
            if let Err(e) = written {
                // A partly written journal (a full disk) must not keep the space it took.
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            crate::engine::create::sync_parent(&path)
                .map_err(|e| io("syncing the journal's directory", e))?;
            Ok(Box::new(b))
        }
    }
}

/// Zeros to `capacity` (so later syncs flush data blocks only), the header, one sync.
fn fill(b: &dyn StorageBackend, capacity: u64, header: &[u8]) -> Result<(), Error> {
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < capacity {
        let n = (capacity - at).min(zeros.len() as u64) as usize;
        b.write(at, &zeros[..n])
            .map_err(|e| io("writing the journal", e))?;
        at += n as u64;
    }
    b.write(0, header)
        .map_err(|e| io("writing the journal", e))?;
    b.sync_data().map_err(|e| io("syncing the journal", e))
}

/// Opens the journal at `place` if there is one.
fn open_existing(place: Place) -> Result<Option<Box<dyn StorageBackend>>, Error> {
    match place {
        Place::Backend(b) => {
            let len = b.len().map_err(|e| io("reading the journal", e))?;
            Ok((len > 0).then_some(b))
        }
        Place::Beside(path) => match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => Ok(Some(Box::new(FileIo(f)))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("opening the journal", e)),
        },
    }
}

/// The live entries of a journal, checked: every entry decoded, every table known.
struct Live {
    file: Vec<u8>,
    entries: Vec<(std::ops::Range<usize>, Entry)>,
    /// The row after the last live entry (the given row when none is live).
    end: Row,
}

/// Reads the journal in `file` from `row`'s position (docs/FORMAT.md, "Reading the journal").
fn scan(
    b: &dyn StorageBackend,
    row: &Row,
    registry: &Registry,
    settings: &Settings,
) -> Result<Live, Error> {
    let len = b.len().map_err(|e| io("reading the journal", e))?;
    let mut file =
        vec![0u8; usize::try_from(len).map_err(|_| corrupt("a journal larger than memory"))?];
    b.read(0, &mut file)
        .map_err(|e| io("reading the journal", e))?;
    let header = Header::decode(&file, len).map_err(format_error)?;
    if header.store_id != row.store_id {
        return Err(corrupt(
            "the journal beside the store belongs to another store (its store id differs)",
        ));
    }
    let mut pos = row.position;
    let mut chain: Checksum = row.chain;
    let mut lsn = row.lsn + 1;
    let mut entries = Vec::new();
    // A full circle at most: frames never overlap the live journal, so a longer chain is
    // impossible without damage.
    let mut steps = (len - HEADER_LEN) / format::ALIGN + 1;
    loop {
        if pos >= len {
            pos = HEADER_LEN;
        }
        if steps == 0 {
            return Err(corrupt("the journal's frames form a loop"));
        }
        steps -= 1;
        let frame = read_frame(&file, row, &chain, pos, lsn, settings)?;
        #[cfg(any(test, feature = "__internal_whitebox"))]
        if settings.broken == BrokenJournal::StopAtWrap && matches!(frame, Frame::Wrap { .. }) {
            break;
        }
        match frame {
            Frame::Tail => break,
            Frame::Wrap { checksum } => {
                chain = checksum;
                pos = HEADER_LEN;
            }
            Frame::Entry {
                body,
                checksum,
                next,
            } => {
                let entry = format::decode_body(&file[body.clone()]).map_err(format_error)?;
                registry
                    .check(&entry.tables)
                    .map_err(|reason| Error::Config { reason })?;
                registry
                    .check_records(&entry.tables, &entry.records, &file[body.clone()])
                    .map_err(corrupt)?;
                entries.push((body, entry));
                chain = checksum;
                pos = if next >= len { HEADER_LEN } else { next };
                lsn += 1;
            }
        }
    }
    Ok(Live {
        file,
        entries,
        end: Row {
            store_id: row.store_id,
            lsn: lsn - 1,
            position: pos,
            chain,
            clean: false,
        },
    })
}

/// The frame at `pos`, expected to be entry `lsn` continuing `chain`.
fn read_frame(
    file: &[u8],
    row: &Row,
    chain: &Checksum,
    pos: u64,
    lsn: u64,
    settings: &Settings,
) -> Result<Frame, Error> {
    #[cfg(any(test, feature = "__internal_whitebox"))]
    if settings.broken == BrokenJournal::UnchainedFrames {
        return Ok(format::read_frame_by_lsn(file, pos, lsn));
    }
    let _ = settings;
    format::read_frame(file, &row.store_id, chain, pos, lsn).map_err(format_error)
}

/// Applies `live`'s entries and writes its end row in one durable commit.
fn replay(db: &Database, live: &Live, registry: &Registry) -> Result<(), Error> {
    // Invariant: `read_live` found every body's range inside the file it read.
    let bodies: Option<Vec<&[u8]>> = live
        .entries
        .iter()
        .map(|(body, _)| live.file.get(body.clone()))
        .collect();
    let bodies = bodies.ok_or(Error::Internal {
        what: "a live journal entry's body lies outside the journal read",
    })?;
    Redb { db, registry }
        .apply(&bodies, &live.end, true)
        .map_err(unlatched)
}

/// Opens the journal of the store on `db` in journal mode: creates it for a store without one,
/// or replays its live entries; returns it ready for new entries. The open's last step is a
/// durable commit of the row (not clean), before any new entry.
pub(crate) fn attach(
    db: &Database,
    place: Place,
    settings: Settings,
    registry: &Registry,
) -> Result<Journal, Error> {
    let row = read_row(&db.begin_read().map_err(unlatched)?)?;
    let mut replayed = 0;
    let (file, row) = match row {
        None => {
            let mut store_id = [0u8; 16];
            getrandom::fill(&mut store_id).map_err(|e| Error::Random {
                reason: e.to_string(),
            })?;
            let file = create(place, settings.capacity, store_id)?;
            let row = Row {
                store_id,
                lsn: 0,
                position: HEADER_LEN,
                chain: [0; 8],
                clean: false,
            };
            commit_row(db, Some(&row))?;
            (file, row)
        }
        Some(row) => {
            let file = match open_existing_or_recreate(place, &row, settings.capacity)? {
                Some(f) => f,
                None => return Err(missing()),
            };
            #[allow(unused_mut, reason = "only a white-box build breaks the replay")]
            let mut live = scan(&*file, &row, registry, &settings)?;
            #[cfg(any(test, feature = "__internal_whitebox"))]
            if settings.broken == BrokenJournal::NoReplay {
                live.entries.clear();
                live.end = row;
            }
            if live.entries.is_empty() {
                commit_row(db, Some(&live.end))?;
            } else {
                replay(db, &live, registry)?;
                replayed = live.entries.len() as u64;
            }
            (file, live.end)
        }
    };
    let capacity = file.len().map_err(|e| io("reading the journal", e))?;
    // An existing journal keeps its own capacity, which the builder's checkpoint_bytes was
    // not checked against: at most half of it, so a checkpoint always comes before it fills.
    let journal = Journal::new(
        file,
        capacity,
        row,
        settings.checkpoint_bytes.min(capacity / 2),
        replayed,
    );
    #[cfg(any(test, feature = "__internal_whitebox"))]
    let journal = journal.answering_before_sync(settings.broken == BrokenJournal::AnswerBeforeSync);
    Ok(journal)
}

fn missing() -> Error {
    corrupt(
        "the store's journal file is missing but the store was not closed cleanly: the answers it holds would be lost; put the file named <store>.journal back beside the store",
    )
}

/// The journal file, or a new one with the row's store id if the row says nothing was live
/// (a clean close), or `None` if it is missing while entries may be live.
fn open_existing_or_recreate(
    place: Place,
    row: &Row,
    capacity: u64,
) -> Result<Option<Box<dyn StorageBackend>>, Error> {
    let (again, found) = match place {
        Place::Beside(path) => (
            Place::Beside(path.clone()),
            open_existing(Place::Beside(path))?,
        ),
        Place::Backend(b) => {
            let len = b.len().map_err(|e| io("reading the journal", e))?;
            if len > 0 {
                return Ok(Some(b));
            }
            (Place::Backend(b), None)
        }
    };
    match found {
        Some(f) => Ok(Some(f)),
        None if row.clean => {
            // A new file with zeros where the row points: nothing there chains on.
            create(again, capacity, row.store_id).map(Some)
        }
        None => Ok(None),
    }
}

/// A store opened without journal mode: replays a journal left by journal mode, if any, then
/// removes the row (the store continues with durable redb commits).
pub(crate) fn detach(
    db: &Database,
    place: Place,
    settings: Settings,
    registry: &Registry,
) -> Result<(), Error> {
    let Some(row) = read_row(&db.begin_read().map_err(unlatched)?)? else {
        return Ok(());
    };
    match open_existing(place)? {
        Some(file) => {
            let live = scan(&*file, &row, registry, &settings)?;
            if !live.entries.is_empty() {
                replay(db, &live, registry)?;
            }
            let _ = file.close();
        }
        // A clean close left nothing live: there is nothing to replay.
        None if row.clean => {}
        None => return Err(missing()),
    }
    commit_row(db, None)
}

/// Whether a journal may hold entries redb lacks (the row is not clean).
pub(crate) fn journal_live(read: &redb::ReadTransaction) -> Result<bool, Error> {
    Ok(read_row(read)?.is_some_and(|row| !row.clean))
}

/// For a read-only open: `Err(NeedsRecovery)` if a journal may hold entries redb lacks.
pub(crate) fn check_read_only(read: &redb::ReadTransaction) -> Result<(), Error> {
    match journal_live(read)? {
        true => Err(Error::NeedsRecovery),
        false => Ok(()),
    }
}

/// The closing checkpoint: the row after every sealed entry, clean, durable.
pub(crate) fn close(db: &Database, journal: &Journal) -> Result<(), Error> {
    commit_row(db, Some(&journal.current_row(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write through the journal's file starts its write-back (on Linux) and leaves the bytes
    /// where a read finds them; the write-back call never reports an error on a healthy file.
    #[test]
    fn a_write_starts_its_write_back_and_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("j"))
            .expect("open");
        let io = FileIo(file);
        io.set_len(8192).expect("set_len");
        io.write(4096, b"frame bytes")
            .expect("write and start write-back");
        let mut back = [0u8; 11];
        io.read(4096, &mut back).expect("read");
        assert_eq!(&back, b"frame bytes");
        start_writeback(&io.0, 0, 8192).expect("the whole file");
        io.sync_data().expect("sync");
    }
}
