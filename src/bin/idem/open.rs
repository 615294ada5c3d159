//! Opening the store file, and the checks around it: the file must exist (no command creates a
//! store), read commands open it read-only, write commands first check a copy of it; what an
//! open that failed tells the operator.

use std::io::{self, Write};
use std::path::PathBuf;

use idem::store::{ReadOnlyStore, journal_path};
use idem::{Error, Store, StoreBuilder};

use crate::args::{Cli, WriteArgs};
use crate::{Failure, RESTORE};

/// The store file must exist and be a file: the CLI never creates a store (the library's opens
/// used here refuse an empty file and a file that is not an idem store).
pub(crate) fn require_file(cli: &Cli) -> Result<(), Failure> {
    let file = cli.file.display();
    match std::fs::metadata(&cli.file) {
        Ok(m) if m.is_dir() => Err(format!(
            "{file} is a directory, not a store file (pass --file PATH of the store file)"
        )
        .into()),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(format!("{file}: no such store file (pass --file PATH)").into())
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(format!(
            "{file}: permission denied ({e}): run idem as a user who may read the file and its directory"
        )
        .into()),
        Err(e) => Err(format!("{file}: {e}").into()),
    }
}

/// Direct mode (`journal(false)`): the CLI never creates a journal beside a store, and an open
/// for writing first replays a journal a crashed service left (the service's next open starts a
/// new one).
pub(crate) fn builder(cli: &Cli) -> StoreBuilder {
    Store::builder()
        .journal(false)
        .multi_process(cli.multi_process)
        // A file left by a crash takes seconds per GB to repair: say so rather than look hung.
        // (A failed write to stderr is ignored: the repair goes on.)
        .on_repair(|progress| {
            let _ = writeln!(
                io::stderr(),
                "idem: repairing a file that was not closed cleanly (redb walks it to rebuild its allocator state): {:.0} % after {:.1} s",
                progress.fraction() * 100.0,
                progress.elapsed().as_secs_f64()
            );
        })
}

/// The redb error under a storage error, if that is what `e` is.
fn redb_cause(e: &Error) -> Option<&idem::redb::Error> {
    match e {
        Error::Storage { source } => source.downcast_ref::<idem::redb::Error>(),
        _ => None,
    }
}

/// What an open failed with, for the operator.
pub(crate) fn open_failed(cli: &Cli, e: &Error) -> Failure {
    let file = cli.file.display();
    let msg = e.to_string();
    let io_kind = match redb_cause(e) {
        Some(idem::redb::Error::Io(io)) => Some(io.kind()),
        _ => None,
    };
    if let Error::AlreadyOpen { .. } = e {
        format!(
            "{file}: {msg}\n  another process holds this file (redb allows one process per file): \
             stop it, or run both in multi-process mode (--multi-process here, \
             StoreBuilder::multi_process(true) in the service)"
        )
    } else if let Some(failure) = not_a_store(cli, e) {
        return failure;
    } else if io_kind == Some(io::ErrorKind::PermissionDenied) {
        format!(
            "{file}: permission denied ({msg}): run idem as a user who may read the file (and, \
             for sweep, purge, compact, outbox requeue|discard, write it)"
        )
    } else {
        format!("{file}: {msg}")
    }
    .into()
}

/// The file is not a store at all (an empty file, a text file, a redb file of another program):
/// the path is wrong, which no recovery advice mends.
fn not_a_store(cli: &Cli, e: &Error) -> Option<Failure> {
    match e {
        Error::CorruptStore { reason }
            if reason.contains("not an idem store")
                || reason.contains("not a readable redb database") =>
        {
            Some(
                format!(
                    "{}: not an idem store ({reason}): check the path (--file)",
                    cli.file.display()
                )
                .into(),
            )
        }
        _ => None,
    }
}

/// The read-only commands' store: nothing is written to the file.
pub(crate) fn open_read_only(cli: &Cli) -> Result<ReadOnlyStore, Failure> {
    require_file(cli)?;
    builder(cli)
        .open_read_only(&cli.file)
        .map_err(|e| open_failed(cli, &e))
}

/// The writing commands' store. Unless `force`, a copy of the file passes redb's integrity
/// check first: a write to a file with damaged pages could spread the damage, and would alter
/// the evidence.
pub(crate) fn open_for_writing(cli: &Cli, write: &WriteArgs) -> Result<Store, Failure> {
    require_file(cli)?;
    if !write.force {
        check_before_writing(cli)?;
    }
    builder(cli)
        .open_existing(&cli.file)
        .map_err(|e| open_failed(cli, &e))
}

fn check_before_writing(cli: &Cli) -> Result<(), Failure> {
    let file = cli.file.display();
    let refuse = |why: String| -> Failure {
        format!(
            "{file}: refused: this command writes to the file, and redb's integrity check of a \
             copy of it failed ({why}). Nothing was written. Keep the file as it is (evidence), \
             run `idem check` to see the damage, then move the file away or {RESTORE}. (--force \
             skips this check of a copy, but the open for writing still refuses a file whose \
             pages fail their checksums.)"
        )
        .into()
    };
    let (copy, _) = copy_of_file(cli, "--force")?;
    let mut store = match builder(cli).open_existing(&copy.0) {
        Ok(store) => store,
        // The journal holds writes to a table of the service's own types, which the CLI cannot
        // register: not damage, and the message says what to do.
        Err(e @ Error::Config { .. }) => return Err(format!("{file}: {e}").into()),
        Err(e) => {
            return Err(not_a_store(cli, &e)
                .unwrap_or_else(|| refuse(format!("the copy does not open: {}", detail(&e)))));
        }
    };
    match store.check_integrity() {
        Ok(true) => Ok(()),
        // redb's pages are intact and only idem's expiry index disagrees with the records:
        // `sweep` repairs most of that, and `purge` is the remedy for a record that does not
        // decode. Anything else — a damaged page, a panic contained while reading — refuses.
        Err(Error::ExpiryIndexMismatch {
            repaired: false, ..
        }) => Ok(()),
        Ok(false) | Err(Error::ExpiryIndexMismatch { repaired: true, .. }) => {
            Err(refuse("redb found damage and repaired the copy".into()))
        }
        Err(e) => Err(refuse(detail(&e))),
    }
}

/// Copies the store file next to itself (for `idem check` and the check before a write),
/// without writing to it: a read-only open holds redb's shared lock meanwhile (refused while
/// another process has the file open for writing), and a file that does not open read-only (it
/// needs recovery, or it is damaged) is copied as it is, so the recovery runs on the copy.
/// In multi-process mode the lock admits writers, which may commit during the copy: a read
/// transaction held through it keeps every page of its snapshot, and of every later commit,
/// from being reused meanwhile (redb frees a page for reuse only once no reader may still see
/// it), so the commit the copied header names is copied whole.
/// Returns the copy and whether the lock was held.
/// `bypass` is the command's flag that works on the file without a copy (`--in-place` for
/// `check`, `--force` for the write commands), which the hints name.
pub(crate) fn copy_of_file(cli: &Cli, bypass: &str) -> Result<(Removed, bool), Failure> {
    require_file(cli)?;
    let file = cli.file.display();
    let lock = match builder(cli).open_read_only(&cli.file) {
        Ok(store) => Some(store),
        Err(Error::AlreadyOpen { .. }) => {
            return Err(format!(
                "{file}: another process (a service?) has this file open: stop it first; if it \
                 runs in multi-process mode, pass --multi-process (and {bypass}) to share it"
            )
            .into());
        }
        Err(_) => None,
    };
    // Without it (it failed to begin) the copy is made as before: a damage it shows is checked.
    let _snapshot = lock
        .as_ref()
        .and_then(|store| store.read_transaction().ok());
    let path = cli
        .file
        .with_extension(format!("idem-check-{}.redb", std::process::id()));
    let copy = path.display();
    // The reader's side and the writer's side fail for different reasons: say which.
    let mut from = std::fs::File::open(&cli.file).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::PermissionDenied {
            ": run idem as a user who may read it"
        } else {
            ""
        };
        format!("{file}: cannot read the file to copy it ({e}){hint}")
    })?;
    let cannot_write = |e: io::Error| -> Failure {
        let hint = match e.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
                format!("free some space next to the file, or pass {bypass}")
            }
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => format!(
                "run idem as a user who may create files in the file's directory, or pass {bypass}"
            ),
            _ => format!("pass {bypass} to work on the file itself"),
        };
        format!(
            "{copy}: cannot write a temporary copy of the file ({e}): {hint}. {file} itself \
             was not modified"
        )
        .into()
    };
    // create_new: never overwrite a file that happens to have that name.
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(cannot_write)?;
    let removed = Removed(path.clone());
    io::copy(&mut from, &mut to).map_err(cannot_write)?;
    to.flush().map_err(cannot_write)?;
    // The journal beside the file (journal mode) belongs with it: a crash may have left answers
    // there that the file lacks, which the copy's open replays.
    match std::fs::File::open(journal_path(&cli.file)) {
        Ok(mut from) => {
            let mut to = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(journal_path(&path))
                .map_err(cannot_write)?;
            io::copy(&mut from, &mut to).map_err(cannot_write)?;
            to.flush().map_err(cannot_write)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(format!(
                "{}: cannot read the store's journal to copy it ({e})",
                journal_path(&cli.file).display()
            )
            .into());
        }
    }
    Ok((removed, lock.is_some()))
}

/// A temporary copy of a store file, removed with its journal when dropped (on every path out
/// of the command).
pub(crate) struct Removed(pub(crate) PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(journal_path(&self.0));
    }
}

/// What went wrong, without the advice of `Error::CorruptStore`'s message (where the CLI
/// gives its own, about the file rather than a copy).
pub(crate) fn detail(e: &Error) -> String {
    match e {
        Error::CorruptStore { reason } => format!("damaged or not an idem store: {reason}"),
        other => other.to_string(),
    }
}

/// A failed call on an open store (a damaged page, a record that does not decode, …). redb's
/// report of a damaged page gets the advice a damaged file gets.
pub(crate) fn failed(cli: &Cli) -> impl Fn(Error) -> Failure + '_ {
    move |e| {
        let file = cli.file.display();
        if damaged_page(&e) {
            Failure::Said(format!(
                "{file}: {e}: the file is damaged; run `idem check` to see the damage (it checks a copy), then move the file away or {RESTORE}"
            ))
        } else {
            Failure::Said(format!("{file}: {e}"))
        }
    }
}

/// redb found a damaged page while reading (the file, not the call, is at fault).
fn damaged_page(e: &Error) -> bool {
    let Error::Storage { source } = e else {
        return false;
    };
    matches!(
        source.downcast_ref::<idem::redb::Error>(),
        Some(idem::redb::Error::Corrupted(_))
    ) || matches!(
        source.downcast_ref::<idem::redb::StorageError>(),
        Some(idem::redb::StorageError::Corrupted(_))
    )
}
