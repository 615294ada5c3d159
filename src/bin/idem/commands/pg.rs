//! `idem pg ...`: a store on a PostgreSQL database (feature `postgres`).

use std::io::Write;

use idem::{Error, Scope};

use crate::args::{PgArgs, PgCommand};
use crate::commands::write::purge_unconfirmed;
use crate::render::{print_record, record_json, stats_json};
use crate::{Failure, Out};

/// `idem pg ...`: a store on a PostgreSQL database. Only `migrate` creates the schema; the
/// other commands refuse a database without it (nothing is created by a typo in a URL).
pub(crate) fn pg<W: Write>(
    db: &PgArgs,
    o: &mut Out<W>,
    command: &PgCommand,
) -> Result<(), Failure> {
    use idem::postgres::PgStore;
    let failed = |e: Error| Failure::Said(format!("PostgreSQL schema {}: {e}", db.schema));
    let builder = PgStore::builder(&db.url).schema(&db.schema).writers(1);
    let store = match command {
        PgCommand::Migrate => builder.open(),
        _ => builder.open_existing(),
    }
    .map_err(failed)?;
    match command {
        PgCommand::Migrate => {
            out!(o, "schema          {}", db.schema);
            out!(o, "schema_version  {}", idem::postgres::SCHEMA_VERSION);
        }
        PgCommand::Stats { json } => {
            let s = store.stats().map_err(failed)?;
            let ob = store.outbox_stats().map_err(failed)?;
            if *json {
                let mut stats = stats_json(&s, &ob);
                stats.insert("schema".into(), db.schema.clone().into());
                out!(o, "{}", serde_json::Value::Object(stats));
                return Ok(());
            }
            out!(o, "schema      {}", db.schema);
            out!(o, "records     {}", s.records);
            out!(o, "pending     {}", s.pending);
            out!(o, "completed   {}", s.completed);
            out!(o, "failed      {}", s.failed);
            out!(o, "tombstones  {}", s.tombstones);
            out!(o, "due         {}", s.due);
            out!(o, "outbox_pending {}", ob.pending);
            out!(o, "dead_letters   {}", ob.dead);
        }
        PgCommand::Get { id, body, json } => {
            let scope = Scope::new(&id.tenant, &id.op);
            match store.get(&scope, &id.key).map_err(failed)? {
                None => {
                    out!(o, "{}", if *json { "null" } else { "absent" });
                    return Err(id.absent("").into());
                }
                Some(r) if *json => {
                    let line = record_json(&id.tenant, &id.op, &id.key, &r, store.now(), *body);
                    out!(o, "{line}");
                }
                Some(r) => print_record(o, &r, store.now(), *body)?,
            }
        }
        PgCommand::Purge { id, yes } => {
            if !yes {
                return Err(purge_unconfirmed(id));
            }
            let scope = Scope::new(&id.tenant, &id.op);
            if !store.purge(&scope, &id.key).map_err(failed)? {
                out!(o, "absent");
                return Err(id.absent(": nothing was purged").into());
            }
            out!(o, "purged");
        }
        PgCommand::Sweep => {
            let r = store.sweep().map_err(failed)?;
            out!(o, "deleted     {}", r.deleted);
            out!(o, "tombstoned  {}", r.tombstoned);
            out!(o, "batches     {}", r.batches);
            out!(o, "duration_ms {}", r.duration.as_millis());
        }
    }
    Ok(())
}
