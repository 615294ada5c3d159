//! The commands that write to the file, on a store opened for writing (after a check of a copy
//! unless `--force`): `purge`, `sweep`, `recover`, `compact`.

use std::io::Write;

use idem::Scope;

use crate::args::{Cli, KeyArgs, WriteArgs};
use crate::open::{builder, failed, open_failed, open_for_writing, require_file};
use crate::render::file_size;
use crate::{Failure, Out, say};

/// `idem purge`: removes one record, only with `--yes`.
pub(crate) fn purge<W: Write>(
    cli: &Cli,
    o: &mut Out<W>,
    id: &KeyArgs,
    yes: bool,
    write: &WriteArgs,
) -> Result<(), Failure> {
    let failed = failed(cli);
    if !yes {
        return Err(purge_unconfirmed(id));
    }
    let store = open_for_writing(cli, write)?;
    let scope = Scope::new(&id.tenant, &id.op);
    if !store.purge(&scope, &id.key).map_err(&failed)? {
        out!(o, "absent");
        return Err(id.absent(": nothing was purged").into());
    }
    out!(o, "purged");
    Ok(())
}

/// `purge` without `--yes`: what it would do, and that nothing was done.
pub(crate) fn purge_unconfirmed(id: &KeyArgs) -> Failure {
    format!(
        "purge frees the key {:?} (tenant {:?}, operation {:?}): a retry of that intent will RUN \
         AGAIN (a second payment, a second email). Nothing was done; pass --yes to purge it",
        id.key, id.tenant, id.op
    )
    .into()
}

/// `idem sweep`: one sweep pass, its progress on stderr.
pub(crate) fn sweep<W: Write>(cli: &Cli, o: &mut Out<W>, write: &WriteArgs) -> Result<(), Failure> {
    let failed = failed(cli);
    let store = open_for_writing(cli, write)?;
    // Progress on stderr, once per second on a long pass (stdout stays the summary).
    let mut last = std::time::Instant::now();
    let r = store
        .sweep_with_progress(|so_far| {
            if last.elapsed() >= std::time::Duration::from_secs(1) {
                last = std::time::Instant::now();
                say(&format!(
                    "sweeping: {} deleted, {} tombstoned, {} batches, {} ms",
                    so_far.deleted,
                    so_far.tombstoned,
                    so_far.batches,
                    so_far.duration.as_millis()
                ));
            }
        })
        .map_err(&failed)?;
    let m = store.metrics();
    out!(o, "deleted     {}", r.deleted);
    out!(o, "tombstoned  {}", r.tombstoned);
    out!(o, "repaired    {}", r.repaired);
    out!(o, "batches     {}", r.batches);
    out!(o, "duration_ms {}", r.duration.as_millis());
    out!(o, "commits     {}", m.commits);
    Ok(())
}

/// `idem recover`: the crash recovery of one open for writing, then a clean close.
pub(crate) fn recover<W: Write>(cli: &Cli, o: &mut Out<W>) -> Result<(), Failure> {
    require_file(cli)?;
    let store = builder(cli)
        .open_existing(&cli.file)
        .map_err(|e| open_failed(cli, &e))?;
    let repaired = store.repair_time();
    drop(store);
    match repaired {
        Some(took) => out!(o, "recovered    in {:.3} s", took.as_secs_f64()),
        None => out!(o, "clean        nothing to recover"),
    }
    Ok(())
}

/// `idem compact`: gives free space back to the file system.
pub(crate) fn compact<W: Write>(
    cli: &Cli,
    o: &mut Out<W>,
    write: &WriteArgs,
) -> Result<(), Failure> {
    let before = file_size(&cli.file);
    let mut store = open_for_writing(cli, write)?;
    let moved = store.compact().map_err(|e| {
        Failure::Said(format!(
            "{}: {e}. Compaction stopped part-way, which leaves the file needing crash \
             recovery: the next open for writing makes it (start the service, or run \
             `idem recover` once space is back); read commands answer \"needs crash \
             recovery\" until then",
            cli.file.display()
        ))
    })?;
    drop(store);
    out!(o, "compacted   {moved}");
    out!(o, "bytes_before {before}");
    out!(o, "bytes_after  {}", file_size(&cli.file));
    Ok(())
}
