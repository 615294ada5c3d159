//! `idem check`: redb's integrity check, every record decoded, the expiry index against the
//! records; on a copy of the file unless `--in-place`.

use std::io::Write;
use std::ops::ControlFlow;

use idem::Error;
use idem::format::to_hex;

use crate::args::Cli;
use crate::open::{Removed, builder, copy_of_file, detail, open_failed, require_file};
use crate::render::split_key;
use crate::{Failure, Out, RESTORE};

/// `idem check`: redb's integrity check, then every record, then the expiry index; it stops
/// after a failed integrity check (the records of a file with damaged pages are not worth
/// decoding, and redb may not be able to read them).
pub(crate) fn check<W: Write>(cli: &Cli, o: &mut Out<W>, in_place: bool) -> Result<(), Failure> {
    let file = cli.file.display();
    // Declared first so that it outlives the store opened on it.
    let mut copy: Option<Removed> = None;
    let (mut store, subject) = if in_place {
        require_file(cli)?;
        let store = builder(cli)
            .open_existing(&cli.file)
            .map_err(|e| open_failed(cli, &e))?;
        (store, format!("the file itself ({file})"))
    } else {
        let (removed, locked) = copy_of_file(cli, "--in-place")?;
        let path = copy.insert(removed).0.clone();
        let note = if locked {
            ""
        } else {
            " of a file that was not closed cleanly or does not open read-only"
        };
        out!(
            o,
            "checking    a copy{note} ({}); the file itself is not written",
            path.display()
        );
        let subject = format!("the temporary copy ({})", path.display());
        match builder(cli).open_existing(&path) {
            Ok(store) => (store, subject),
            // The journal holds writes to a table of the service's own types, which the CLI
            // cannot register: not damage, and the message says what to do.
            Err(e @ Error::Config { .. }) => {
                out!(o, "file_integrity NOT CHECKED");
                out!(o, "  {file} itself was not modified; the copy was removed");
                return Err(format!("{file}: {e}").into());
            }
            Err(e) => {
                out!(o, "file_integrity FAILED");
                out!(o, "  {subject} does not open as a store: {}", detail(&e));
                out!(o, "  {file} itself was not modified; the copy was removed");
                return Err(format!(
                    "{file} does not open as an idem store: it is damaged or is not one (above); if it should be one, move it away or {RESTORE}"
                )
                .into());
            }
        }
    };
    // redb's full integrity check first (it needs the only handle, which this is), with idem's
    // expiry-index check: a mismatch there leaves redb's verdict as it was (no fail-stop) and is
    // reported after the records.
    let (integrity, index) = match store.check_integrity() {
        Err(Error::ExpiryIndexMismatch { reason, repaired }) => (Ok(!repaired), Err(reason)),
        other => (other, Ok(())),
    };
    let verdict = match &integrity {
        Ok(true) => "ok",
        Ok(false) => "REPAIRED",
        Err(_) => "FAILED",
    };
    out!(o, "file_integrity {verdict}");
    match &integrity {
        Ok(true) => {}
        Ok(false) => out!(o, "  redb found damage in {subject} and repaired it"),
        Err(e) => out!(o, "  {subject}: {}", detail(e)),
    }
    if integrity.is_err() {
        if in_place {
            out!(
                o,
                "  this was the file itself: it is damaged, and an open that checks its pages (the default) refuses it"
            );
        } else {
            out!(
                o,
                "  this is the result for the temporary copy, which was removed; {file} itself was not modified"
            );
        }
        return Err(format!(
            "{file} is damaged (above): keep it as it is (evidence), and move it away or \
             {RESTORE}; a service that opens it may fail on the damaged pages"
        )
        .into());
    }
    let mut ok = 0u64;
    let mut bad = Vec::new();
    let walked = store.for_each_record(|key, record| {
        match (split_key(key), record) {
            (Some(_), Ok(_)) => ok += 1,
            (_, Err(e)) => bad.push(format!("{}: {e}", to_hex(key))),
            (None, Ok(_)) => bad.push(format!("{}: malformed record key", to_hex(key))),
        }
        ControlFlow::Continue(())
    });
    out!(o, "records_ok   {ok}");
    out!(o, "records_bad  {}", bad.len());
    for b in bad.iter().take(20) {
        out!(o, "  {b}");
    }
    if let Err(e) = &walked {
        out!(o, "  reading the records stopped: {e}");
    }
    out!(
        o,
        "expiry_index {}",
        index.as_ref().map_or("MISMATCH", |()| "ok")
    );
    if let Err(detail) = &index {
        out!(o, "  {detail}");
    }
    if !bad.is_empty() || walked.is_err() || index.is_err() {
        return Err(format!(
            "the store has problems (above): `idem get` / `idem purge` the keys, `idem sweep` \
             repairs the expiry index, or move {file} away or {RESTORE}"
        )
        .into());
    }
    if !matches!(integrity, Ok(true)) {
        return Err(format!("redb repaired damage in {subject} (above)").into());
    }
    Ok(())
}
