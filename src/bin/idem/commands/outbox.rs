//! `idem outbox list|requeue|discard`: the outbox's dead letters.

use std::io::Write;

use crate::args::{Cli, OutboxCommand};
use crate::open::{failed, open_for_writing, open_read_only};
use crate::render::print_dead_letter;
use crate::{Failure, Out};

/// `idem outbox ...`: list, requeue or discard dead letters.
pub(crate) fn outbox<W: Write>(
    cli: &Cli,
    o: &mut Out<W>,
    command: &OutboxCommand,
) -> Result<(), Failure> {
    let failed = failed(cli);
    let no_such =
        |seq: u64| format!("no dead letter with seq {seq} (`idem outbox list` shows them)");
    match command {
        OutboxCommand::List { limit, body } => {
            let store = open_read_only(cli)?;
            let stats = store.outbox_stats().map_err(&failed)?;
            let dead = store.dead_letters(*limit).map_err(&failed)?;
            out!(o, "dead_letters {}", stats.dead);
            let now = store.now();
            for d in &dead {
                out!(o);
                print_dead_letter(o, d, now, *body)?;
            }
            if (dead.len() as u64) < stats.dead {
                out!(o);
                out!(o, "(first {} shown; pass --limit N for more)", dead.len());
            }
        }
        OutboxCommand::Requeue { seq, write } => {
            let store = open_for_writing(cli, write)?;
            if !store.requeue_dead_letter(*seq).map_err(&failed)? {
                out!(o, "absent");
                return Err(no_such(*seq).into());
            }
            out!(o, "requeued");
        }
        OutboxCommand::Discard { seq, write } => {
            let store = open_for_writing(cli, write)?;
            if !store.discard_dead_letter(*seq).map_err(&failed)? {
                out!(o, "absent");
                return Err(no_such(*seq).into());
            }
            out!(o, "discarded");
        }
    }
    Ok(())
}
