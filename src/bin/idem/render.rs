//! How the commands print what they read: records as text lines or as JSON objects, the HTTP
//! layer's stored answers decoded, dead letters, times and spans, file sizes.

use std::io::Write;
use std::path::Path;

use idem::format::{HttpEnvelope, Record, State, to_hex};
use idem::outbox::{DeadLetter, OutboxStats};
use idem::store::Stats;
use idem::{Error, Scope, Timestamp};

#[cfg(doc)]
use crate::args::RECORD_JSON_FIELDS;
use crate::{Failure, Out};

/// `stats --json`'s counts, the same for a file and for PostgreSQL; each command adds where
/// the store is.
pub(crate) fn stats_json(
    s: &Stats,
    ob: &OutboxStats,
) -> serde_json::Map<String, serde_json::Value> {
    [
        ("records", s.records),
        ("pending", s.pending),
        ("completed", s.completed),
        ("failed", s.failed),
        ("tombstones", s.tombstones),
        ("due", s.due),
        ("outbox_pending", ob.pending),
        ("dead_letters", ob.dead),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into()))
    .collect()
}

/// The size of the file at `path` in bytes, or why it is unknown.
pub(crate) fn file_size(path: &Path) -> String {
    std::fs::metadata(path).map_or_else(|e| format!("unknown ({e})"), |m| m.len().to_string())
}

pub(crate) fn print_dead_letter<W: Write>(
    o: &mut Out<W>,
    d: &DeadLetter,
    now: Timestamp,
    with_body: bool,
) -> Result<(), Failure> {
    let e = &d.event;
    out!(o, "seq          {}", e.seq);
    out!(o, "id           {}", e.id);
    out!(o, "topic        {}", e.topic);
    out!(
        o,
        "ordering_key {}",
        e.ordering_key.as_deref().unwrap_or("-")
    );
    out!(o, "attempts     {}", e.failed_attempts);
    out!(o, "created_at   {}", when(e.created_at, now));
    out!(o, "failed_at    {}", when(d.failed_at, now));
    out!(o, "error        {}", d.error.replace('\n', " "));
    out!(o, "payload_bytes {}", e.payload.len());
    out!(o, "headers      {}", e.headers.len());
    if with_body {
        for (name, value) in &e.headers {
            out!(o, "header       {name}: {value}");
        }
        out!(o, "payload      {}", String::from_utf8_lossy(&e.payload));
    }
    Ok(())
}

/// The tenant, operation and idempotency key a stored record key names (lossy UTF-8), or
/// `None` for bytes that are not a record key.
pub(crate) fn split_key(k: &[u8]) -> Option<(String, String, String)> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (tenant, operation, key) = Scope::split_record_key(k)?;
    Some((lossy(tenant), lossy(operation), lossy(key)))
}

/// One line of `export --jsonl`: the record's object ([`record_json`]), or for a record that
/// does not decode, its scope and key (as far as the stored key splits), the error and the
/// stored key in hex.
pub(crate) fn export_line(
    key: &[u8],
    record: Result<Record, Error>,
    now: Timestamp,
    with_body: bool,
) -> serde_json::Value {
    let (tenant, op, k) = split_key(key).unwrap_or_default();
    match record {
        Ok(r) => record_json(&tenant, &op, &k, &r, now, with_body),
        Err(e) => serde_json::json!({
            "tenant": tenant,
            "op": op,
            "key": k,
            "error": e.to_string(),
            "record_key_hex": to_hex(key),
        }),
    }
}

/// The JSON object of one record (`get --json`, `export --jsonl`): the fields of
/// [`RECORD_JSON_FIELDS`].
pub(crate) fn record_json(
    tenant: &str,
    op: &str,
    key: &str,
    record: &Record,
    now: Timestamp,
    with_body: bool,
) -> serde_json::Value {
    let mut line = serde_json::json!({"tenant": tenant, "op": op, "key": key});
    line["fingerprint"] = record.fingerprint.to_hex().into();
    line["created_at_ms"] = record.created_at.as_millis().into();
    line["expires_at_ms"] = record.expires_at.as_millis().into();
    line["forget_at_ms"] = record.forget_at.as_millis().into();
    line["expired"] = idem::rules::is_expired(record, now).into();
    let (state, response) = match &record.state {
        State::Pending {
            lease_deadline,
            attempt,
            ..
        } => {
            line["lease_deadline_ms"] = lease_deadline.as_millis().into();
            line["attempt"] = (*attempt).into();
            ("pending", None)
        }
        State::Completed(r) => ("completed", Some(r)),
        State::Failed(r) => ("failed", Some(r)),
        State::Tombstone(t) => {
            line["status"] = t.status().into();
            if let Some(res) = t.resource() {
                line["resource"] = serde_json::json!([res.kind, res.id]);
            }
            ("tombstone", None)
        }
    };
    line["state"] = state.into();
    if let Some(r) = response {
        line["status"] = r.status().into();
        line["body_bytes"] = answer_body_len(r.body()).into();
        line["stored_bytes"] = r.body().len().into();
        if let Some(res) = r.resource() {
            line["resource"] = serde_json::json!([res.kind, res.id]);
        }
        if with_body {
            line["body"] = String::from_utf8_lossy(r.body()).into_owned().into();
            match HttpEnvelope::decode(r.body()) {
                Ok(None) => {}
                Ok(Some(env)) => line["http"] = envelope_json(&env),
                Err(e) => line["http_error"] = e.to_string().into(),
            }
        }
    }
    line
}

/// The length of the answer's body: for an answer the HTTP layer stored, its HTTP body (not
/// the envelope around it, with the status and headers to replay); otherwise what is stored.
pub(crate) fn answer_body_len(stored: &[u8]) -> usize {
    match HttpEnvelope::decode(stored) {
        Ok(Some(env)) => env.body().len(),
        _ => stored.len(),
    }
}

/// The `http` object of a record whose body is an answer the HTTP layer stored.
fn envelope_json(env: &HttpEnvelope<'_>) -> serde_json::Value {
    let headers: Vec<_> = env
        .headers()
        .iter()
        .map(|(n, v)| serde_json::json!([String::from_utf8_lossy(n), String::from_utf8_lossy(v)]))
        .collect();
    let mut http = serde_json::json!({
        "envelope": env.magic(),
        "body_omitted": env.body_omitted(),
        "headers": headers,
    });
    if !env.body_omitted() {
        match std::str::from_utf8(env.body()) {
            Ok(text) => http["body"] = text.into(),
            Err(_) => http["body_hex"] = to_hex(env.body()).into(),
        }
    }
    http
}

pub(crate) fn print_record<W: Write>(
    o: &mut Out<W>,
    r: &Record,
    now: Timestamp,
    with_body: bool,
) -> Result<(), Failure> {
    let state = match &r.state {
        State::Pending { .. } => "pending",
        State::Completed(_) => "completed",
        State::Failed(_) => "failed",
        State::Tombstone(_) => "tombstone",
    };
    out!(o, "state        {state}");
    out!(o, "fingerprint  {}", r.fingerprint.to_hex());
    out!(o, "created_at   {}", when(r.created_at, now));
    out!(o, "expires_at   {}", when(r.expires_at, now));
    out!(o, "forget_at    {}", when(r.forget_at, now));
    match &r.state {
        State::Pending {
            lease_deadline,
            attempt,
            ..
        } => {
            out!(o, "lease_until  {}", when(*lease_deadline, now));
            out!(o, "attempt      {attempt}");
        }
        State::Completed(resp) | State::Failed(resp) => {
            out!(o, "status       {}", resp.status());
            out!(o, "body_bytes   {}", answer_body_len(resp.body()));
            out!(o, "stored_bytes {}", resp.body().len());
            if let Some(res) = resp.resource() {
                out!(o, "resource     {} {}", res.kind, res.id);
            }
            if with_body {
                print_body(o, resp.body())?;
            }
        }
        State::Tombstone(t) => {
            out!(o, "status       {}", t.status());
            if let Some(res) = t.resource() {
                out!(o, "resource     {} {}", res.kind, res.id);
            }
        }
    }
    Ok(())
}

/// `body` of `get --body`: a body that is not an answer of the HTTP layer as it is stored
/// (lossy UTF-8); an answer of the HTTP layer (an `IDH1`/`IDH2` envelope) decoded: its header
/// lines, then its body as text when it is valid UTF-8, else in hex; a damaged envelope said
/// so, and its bytes in hex.
fn print_body<W: Write>(o: &mut Out<W>, stored: &[u8]) -> Result<(), Failure> {
    let env = match HttpEnvelope::decode(stored) {
        Ok(Some(env)) => env,
        Ok(None) => {
            out!(o, "body         {}", String::from_utf8_lossy(stored));
            return Ok(());
        }
        Err(e) => {
            out!(
                o,
                "envelope     DAMAGED: {e}; the HTTP layer answers a retry of this key 500 \
                 (`idem purge` frees the key: a retry then runs again)"
            );
            out!(o, "body_hex     {}", to_hex(stored));
            return Ok(());
        }
    };
    out!(
        o,
        "envelope     {} (an answer the HTTP layer stored)",
        env.magic()
    );
    for (name, value) in env.headers() {
        out!(o, "header       {}: {}", one_line(name), one_line(value));
    }
    if env.body_omitted() {
        out!(
            o,
            "body         (not kept: the answer was over the store's max_response_bytes; a retry \
             gets these headers, an empty body and Idempotent-Body-Omitted: true)"
        );
    } else {
        match std::str::from_utf8(env.body()) {
            Ok(text) => out!(o, "body         {text}"),
            Err(_) => out!(o, "body_hex     {}", to_hex(env.body())),
        }
    }
    Ok(())
}

/// Stored bytes as one line of text: lossy UTF-8, control characters escaped (a header line
/// of a damaged or foreign envelope must not break the output into lines).
fn one_line(b: &[u8]) -> String {
    let mut line = String::new();
    for c in String::from_utf8_lossy(b).chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

/// `2026-11-30T14:45:00.123Z (in 23h59m)`: the time in RFC 3339, UTC, with milliseconds, and
/// how far it is from now. A time past what a date shows (after the year 9999: only a damaged
/// or foreign record holds one) is printed as its milliseconds.
pub(crate) fn when(t: Timestamp, now: Timestamp) -> String {
    use std::fmt::Write as _;
    let ms = t.as_millis();
    let rel = if ms >= now.as_millis() {
        format!("in {}", span(ms - now.as_millis()))
    } else {
        format!("{} ago", span(now.as_millis() - ms))
    };
    let Some(date) = i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
    else {
        return format!("{ms} ms after the Unix epoch, past the year 9999 ({rel})");
    };
    let mut text = String::new();
    // Writing into a String fails only if the Display impl does: then the milliseconds.
    if write!(text, "{date:.3} ({rel})").is_err() {
        return format!("{ms} ms after the Unix epoch ({rel})");
    }
    text
}

/// A span of `ms` milliseconds to its two largest units, truncated, days of 24 hours: `45s`,
/// `59m59s`, `23h59m`, `400d3h`.
fn span(ms: u64) -> String {
    use jiff::fmt::friendly::{Designator, Spacing, SpanPrinter};
    use jiff::{RoundMode, Span, SpanRound, Unit};
    const PRINTER: SpanPrinter = SpanPrinter::new()
        .designator(Designator::Compact)
        .spacing(Spacing::None);
    let smallest = match ms / 1000 {
        0..3600 => Unit::Second,
        3600..86_400 => Unit::Minute,
        _ => Unit::Hour,
    };
    let round = SpanRound::new()
        .largest(Unit::Day)
        .smallest(smallest)
        .mode(RoundMode::Trunc)
        .days_are_24_hours();
    let rounded = i64::try_from(ms)
        .ok()
        .and_then(|ms| Span::new().try_milliseconds(ms).ok())
        .and_then(|span| span.round(round).ok());
    match rounded {
        Some(span) => PRINTER.span_to_string(&span),
        // Over about 20 000 years: only between a damaged time and now.
        None => format!("{}d", ms / 86_400_000),
    }
}
