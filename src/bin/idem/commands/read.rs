//! The commands that only read, on a store opened read-only: `stats`, `get`, `export`.

use std::io::Write;
use std::ops::ControlFlow;

use idem::Scope;

use crate::args::{Cli, KeyArgs};
use crate::open::{failed, open_read_only};
use crate::render::{export_line, file_size, print_record, record_json, stats_json};
use crate::{Failure, Out};

/// `idem stats`: counts by state, the outbox backlog and the file size.
pub(crate) fn stats<W: Write>(cli: &Cli, o: &mut Out<W>, json: bool) -> Result<(), Failure> {
    let failed = failed(cli);
    let store = open_read_only(cli)?;
    let s = store.stats().map_err(&failed)?;
    let ob = store.outbox_stats().map_err(&failed)?;
    if json {
        let file_bytes = std::fs::metadata(&cli.file).ok().map(|m| m.len());
        let mut stats = stats_json(&s, &ob);
        stats.insert("file".into(), cli.file.display().to_string().into());
        stats.insert("file_bytes".into(), file_bytes.into());
        out!(o, "{}", serde_json::Value::Object(stats));
        return Ok(());
    }
    out!(o, "file        {}", cli.file.display());
    out!(o, "file_bytes  {}", file_size(&cli.file));
    out!(o, "records     {}", s.records);
    out!(o, "pending     {}", s.pending);
    out!(o, "completed   {}", s.completed);
    out!(o, "failed      {}", s.failed);
    out!(o, "tombstones  {}", s.tombstones);
    out!(o, "due         {}", s.due);
    out!(o, "outbox_pending {}", ob.pending);
    out!(o, "dead_letters   {}", ob.dead);
    Ok(())
}

/// `idem get`: one record.
pub(crate) fn get<W: Write>(
    cli: &Cli,
    o: &mut Out<W>,
    id: &KeyArgs,
    body: bool,
    json: bool,
) -> Result<(), Failure> {
    let failed = failed(cli);
    let store = open_read_only(cli)?;
    let scope = Scope::new(&id.tenant, &id.op);
    match store.get(&scope, &id.key).map_err(&failed)? {
        None => {
            // stdout still says it, as one JSON value with --json: `jq` reads `null`
            // (and `jq -e` fails on it), while a failure to read prints nothing.
            out!(o, "{}", if json { "null" } else { "absent" });
            return Err(id.absent("").into());
        }
        Some(r) if json => {
            let line = record_json(&id.tenant, &id.op, &id.key, &r, store.now(), body);
            out!(o, "{line}");
        }
        Some(r) => print_record(o, &r, store.now(), body)?,
    }
    Ok(())
}

/// `idem export`: every record as one JSON object per line.
pub(crate) fn export<W: Write>(cli: &Cli, o: &mut Out<W>, body: bool) -> Result<(), Failure> {
    let failed = failed(cli);
    let store = open_read_only(cli)?;
    let now = store.now();
    let mut output = Ok(());
    store
        .for_each_record(|key, record| {
            output = o.line(format_args!("{}", export_line(key, record, now, body)));
            if output.is_ok() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
        .map_err(&failed)?;
    output?;
    Ok(())
}
