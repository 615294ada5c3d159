//! A new store file is built beside its path and linked into place only once it is durable, so
//! the path never names a half-written store.
//!
//! [`StoreBuilder::open`](crate::StoreBuilder::open) on a missing or empty path writes the new
//! store (redb's first pages, idem's tables and format marker, one durable commit) into
//! `<path>.new.<pid>-<n>`, syncs it, links it to `<path>` (a hard link, which never replaces a
//! file: a store another process created meanwhile is theirs), removes the temporary name and
//! syncs the directory. An empty file at the path (a service may create it before the store
//! opens it) is replaced by a rename instead, its permission bits kept.
//!
//! Invariants:
//! - `<path>` is missing, empty, or a store whose tables committed durably; a crash or an I/O
//!   error at any step of a creation leaves at most a `<path>.new.*` leftover beside it.
//! - A leftover is never opened as a store: a single-process open (the default) removes every
//!   `<name>.new.*` beside its path that no creation in this process is writing; a
//!   [`multi_process`](crate::StoreBuilder::multi_process) open leaves them, since another
//!   process may be writing one.
//! - In `multi_process` mode an empty file at the path, or a file system without hard links, is
//!   initialised in place, as redb's locks coordinate the processes that open it.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use redb::ReadableTable;

use crate::engine::boundary::unlatched;
use crate::engine::journal::recover::io;
use crate::engine::tables::{EXPIRY, META, META_FORMAT, RECORDS};
use crate::error::Error;
use crate::model::record::FORMAT_VERSION;

/// A path [`create_at`] had to do with, for the open's undo after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fresh {
    /// The path was missing and this open put a new store there: removed after a failed open.
    Created,
    /// The path was an empty file this open replaced by a new store: emptied after a failed
    /// open.
    Empty,
    /// A file with contents, a path another process may hold, or one this open did not claim:
    /// left alone.
    NotOurs,
}

impl Fresh {
    /// Takes the store back after the open that created it failed with `e` (a full disk while
    /// the journal was written, say), so that a failed first start leaves nothing behind.
    pub(crate) fn undo(self, path: &Path, e: &Error) {
        if self == Fresh::NotOurs || matches!(e, Error::AlreadyOpen { .. }) {
            return;
        }
        // Best effort: the open's own error is what the caller needs to see.
        let _ = match self {
            Fresh::Created => std::fs::remove_file(path),
            _ => OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_len(0)),
        };
    }
}

/// Temporary names this process is writing a new store under (never removed as leftovers).
static WRITING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Creates a new store at `path` if it is missing or empty; returns what the open may undo.
pub(crate) fn create_at(
    path: &Path,
    redb: &redb::Builder,
    multi_process: bool,
) -> Result<Fresh, Error> {
    if !multi_process {
        remove_leftovers(path);
    }
    let fresh = match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == 0 => Fresh::Empty,
        Err(e) if e.kind() == ErrorKind::NotFound => Fresh::Created,
        // A file with contents, a directory, no permission: for the open to judge.
        _ => return Ok(Fresh::NotOurs),
    };
    if multi_process && fresh == Fresh::Empty {
        return Ok(Fresh::NotOurs);
    }
    let tmp = temporary(path);
    fault::step("creating the new store's file")?;
    // Registered before the file exists: another open's cleanup never sees it unregistered.
    WRITING.lock().push(tmp.clone());
    let placed = match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)
    {
        Ok(file) => build(file, &tmp, redb).and_then(|()| place(&tmp, path, fresh, multi_process)),
        // A missing directory, no permission: the open of the path reports it, naming it.
        Err(_) => Ok(Fresh::NotOurs),
    };
    WRITING.lock().retain(|t| *t != tmp);
    match placed {
        // Nothing of this open's was placed: nothing to make durable.
        Ok(Fresh::NotOurs) => Ok(Fresh::NotOurs),
        Ok(placed) => {
            if let Err(e) = sync_dir(path, "syncing the new store's directory") {
                if !fault::crashed() && !multi_process {
                    placed.undo(path, &e);
                }
                return Err(e);
            }
            // Another process may have opened what this one linked: never take it back.
            Ok(if multi_process {
                Fresh::NotOurs
            } else {
                placed
            })
        }
        Err(e) => {
            if !fault::crashed() {
                let _ = std::fs::remove_file(&tmp);
            }
            Err(e)
        }
    }
}

/// `<path>.new.<pid>-<n>`: unique to this creation.
fn temporary(path: &Path) -> PathBuf {
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(format!(
        ".new.{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    PathBuf::from(name)
}

/// Removes the `<name>.new.*` beside `path` that no creation of this process is writing: what
/// a creation that failed or was cut short left.
fn remove_leftovers(path: &Path) {
    let (Some(dir), Some(name)) = (parent(path), path.file_name()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let writing = WRITING.lock();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let ours = writing
            .iter()
            .any(|t| t.file_name() == Some(&*file) && parent(t) == Some(dir));
        if is_temporary_of(name, &file) && !ours {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether `file` is a name [`temporary`] gives for a store named `name`:
/// `<name>.new.<digits>-<digits>`, nothing else (a caller's `<name>.new.bak` stays).
fn is_temporary_of(name: &std::ffi::OsStr, file: &std::ffi::OsStr) -> bool {
    let mut prefix = name.to_owned();
    prefix.push(".new.");
    let Some(rest) = file
        .as_encoded_bytes()
        .strip_prefix(prefix.as_encoded_bytes())
    else {
        return false;
    };
    let mut parts = rest.split(|b| *b == b'-');
    let digits =
        |p: Option<&[u8]>| p.is_some_and(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit));
    digits(parts.next()) && digits(parts.next()) && parts.next().is_none()
}

/// Writes a new store at `tmp`: redb's pages, idem's tables and marker in one durable commit,
/// then everything synced.
fn build(file: File, tmp: &Path, redb: &redb::Builder) -> Result<(), Error> {
    let db = redb
        .create_with_backend(fault::backend(redb::backends::FileBackend::new(file)))
        .map_err(|e| io("writing the new store", std::io::Error::other(e)))?;
    write_tables(&db)?;
    fault::step("closing the new store")?;
    db.close()
        .map_err(|e| io("closing the new store", std::io::Error::other(e)))?;
    fault::step("syncing the new store")?;
    File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("syncing the new store", e))
}

/// Creates idem's tables and writes (or checks) the format marker in one durable commit.
pub(crate) fn write_tables(db: &redb::Database) -> Result<(), Error> {
    // One table handle at a time: redb poisons a transaction's table registry when it panics
    // on a damaged page, and a handle dropped while that panic unwinds panics again, which
    // aborts the process (no `catch_unwind` contains a second panic).
    let txn = db.begin_write().map_err(unlatched)?;
    {
        let mut meta = txn.open_table(META).map_err(unlatched)?;
        let found = meta
            .get(META_FORMAT)
            .map_err(unlatched)?
            .map(|v| v.value().to_vec());
        match found.as_deref() {
            None => {
                meta.insert(META_FORMAT, [FORMAT_VERSION].as_slice())
                    .map_err(unlatched)?;
            }
            Some(marker) => crate::engine::builder::format_marker(marker)?,
        }
    }
    drop(txn.open_table(RECORDS).map_err(unlatched)?);
    drop(txn.open_table(EXPIRY).map_err(unlatched)?);
    txn.commit().map_err(unlatched)
}

/// Puts the durable store at `tmp` at `path`; `NotOurs` when another process put one there
/// first (then `tmp` is removed, and the open opens theirs).
fn place(tmp: &Path, path: &Path, fresh: Fresh, multi_process: bool) -> Result<Fresh, Error> {
    fault::step("linking the new store into place")?;
    match std::fs::hard_link(tmp, path) {
        Ok(()) => {
            // Best effort: a name left here is removed by the next open as a leftover.
            if fault::step("removing the new store's temporary name").is_ok() {
                let _ = std::fs::remove_file(tmp);
            }
            return Ok(fresh);
        }
        // Still an empty file (a single-process open replaces it), or a store that another
        // process linked after this one looked.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let empty = std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0);
            if !(empty && fresh == Fresh::Empty && !multi_process) {
                let _ = std::fs::remove_file(tmp);
                return Ok(Fresh::NotOurs);
            }
            if let Ok(m) = std::fs::metadata(path) {
                let _ = std::fs::set_permissions(tmp, m.permissions());
            }
        }
        // No hard links here: multi-process opens create in place; one process renames.
        Err(_) if multi_process => {
            let _ = std::fs::remove_file(tmp);
            return Ok(Fresh::NotOurs);
        }
        Err(_) => {}
    }
    std::fs::rename(tmp, path).map_err(|e| io("renaming the new store into place", e))?;
    Ok(fresh)
}

/// Syncs the directory holding `path`, so that a name just linked or renamed there survives a
/// power loss.
fn sync_dir(path: &Path, what: &str) -> Result<(), Error> {
    fault::step(what)?;
    sync_parent(path).map_err(|e| io(what, e))
}

/// Syncs the directory holding `path` (the journal's creation uses it too).
pub(crate) fn sync_parent(path: &Path) -> std::io::Result<()> {
    match parent(path) {
        Some(dir) => File::open(dir).and_then(|d| d.sync_all()),
        None => Ok(()),
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent(path: &Path) -> Option<&Path> {
    path.parent().map(|d| {
        if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        }
    })
}

/// The creation's steps, for the white-box test that fails or cuts short each one
/// (`tests/engine/a_cut_short_first_open_leaves_an_openable_path.rs`); nothing outside that
/// build.
#[cfg(feature = "__internal_whitebox")]
pub mod fault {
    use std::cell::{Cell, RefCell};

    /// What the planned step does.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Cut {
        /// Fails with an I/O error; the open cleans up as after any failure.
        Fail,
        /// Fails, and no cleanup runs afterwards: what a process kill (or a power cut) leaves.
        Crash,
    }

    thread_local! {
        static PLAN: Cell<Option<(usize, Cut)>> = const { Cell::new(None) };
        static DONE: Cell<usize> = const { Cell::new(0) };
        static CRASHED: Cell<bool> = const { Cell::new(false) };
        static LOG: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
    }

    /// A step of a creation, as the test reads it back.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Event {
        /// A write to the new store's file.
        Write,
        /// A sync of the new store's file, with the file's bytes as that sync made them durable.
        Sync(Vec<u8>),
        /// Any other step, by its description.
        Step(String),
    }

    /// Cuts the `n`th step of this thread's next creations (counted from 0), as `cut` says.
    pub fn plan(n: usize, cut: Cut) {
        PLAN.set(Some((n, cut)));
        DONE.set(0);
        CRASHED.set(false);
        LOG.with_borrow_mut(Vec::clear);
    }

    /// Ends the plan; returns the steps this thread took (the cut one included), and whether
    /// the planned step was reached.
    pub fn finish() -> (Vec<Event>, bool) {
        let reached = CRASHED.get() || PLAN.get().is_some_and(|(n, _)| DONE.get() > n);
        PLAN.set(None);
        CRASHED.set(false);
        (LOG.with_borrow_mut(std::mem::take), reached)
    }

    pub(super) fn crashed() -> bool {
        CRASHED.get()
    }

    fn record(event: Event) -> std::io::Result<()> {
        let Some((n, cut)) = PLAN.get() else {
            return Ok(());
        };
        if CRASHED.get() {
            // After a crash nothing more reaches the disk.
            return Err(std::io::Error::other("injected: the process is gone"));
        }
        let i = DONE.get();
        DONE.set(i + 1);
        LOG.with_borrow_mut(|log| log.push(event));
        if i == n {
            if cut == Cut::Crash {
                CRASHED.set(true);
            }
            return Err(std::io::Error::other("injected I/O failure"));
        }
        Ok(())
    }

    pub(super) fn step(what: &str) -> Result<(), crate::Error> {
        record(Event::Step(what.into())).map_err(|e| super::io(what, e))
    }

    /// redb's file, with each write and sync a step.
    #[derive(Debug)]
    pub(super) struct Backend(redb::backends::FileBackend);

    pub(super) fn backend(b: redb::backends::FileBackend) -> Backend {
        Backend(b)
    }

    impl redb::StorageBackend for Backend {
        fn len(&self) -> Result<u64, redb::BackendError> {
            self.0.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
            self.0.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
            record(Event::Write)?;
            self.0.set_len(len)
        }
        fn sync_data(&self) -> Result<(), redb::BackendError> {
            let mut image = vec![0; usize::try_from(self.0.len()?).unwrap_or(0)];
            self.0.read(0, &mut image)?;
            record(Event::Sync(image))?;
            self.0.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
            record(Event::Write)?;
            self.0.write(offset, data)
        }
        fn close(&self) -> Result<(), redb::BackendError> {
            self.0.close()
        }
        fn lock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<(), redb::BackendError> {
            self.0.lock_range(start, end)
        }
        fn lock_shared_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<(), redb::BackendError> {
            self.0.lock_shared_range(start, end)
        }
        fn try_lock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<bool, redb::BackendError> {
            self.0.try_lock_range(start, end)
        }
        fn try_lock_shared_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<bool, redb::BackendError> {
            self.0.try_lock_shared_range(start, end)
        }
        fn unlock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<(), redb::BackendError> {
            self.0.unlock_range(start, end)
        }
        fn query_lock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<bool, redb::BackendError> {
            self.0.query_lock_range(start, end)
        }
    }
}

/// Outside the white-box build the steps are nothing and redb's file is redb's.
#[cfg(not(feature = "__internal_whitebox"))]
mod fault {
    pub(super) fn step(_: &str) -> Result<(), crate::Error> {
        Ok(())
    }

    pub(super) fn crashed() -> bool {
        false
    }

    pub(super) fn backend(b: redb::backends::FileBackend) -> redb::backends::FileBackend {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_a_creation_gives_are_leftovers() {
        let name = std::ffi::OsStr::new("store.redb");
        let made = temporary(Path::new("dir/store.redb"));
        let made = made.file_name().expect("a file name");
        assert!(is_temporary_of(name, made), "{made:?}");
        for kept in [
            "store.redb",
            "store.redb.journal",
            "store.redb.new",
            "store.redb.new.bak",
            "store.redb.new.12",
            "store.redb.new.12-",
            "store.redb.new.12-3-4",
            "store.redb.new.-3",
            "other.redb.new.12-3",
        ] {
            assert!(!is_temporary_of(name, std::ffi::OsStr::new(kept)), "{kept}");
        }
    }
}
