//! What redb alone can apply: the writes of `execute` claims (a record, its expiry entry, one
//! row of the caller's table) inserted into a copy of a real idem store with non-durable commits
//! (`Durability::None`, no fsync), from one thread, G claims per transaction. This is the
//! ceiling of any design that keeps redb as the store of record and applies claims to it on one
//! thread: a journal in front of redb answers at the journal's speed only while an applier keeps
//! up, so a claim rate above this one cannot be sustained (docs/design.md, "What reaches
//! furthest on redb, measured"; BENCHMARKS.md).
//!
//! ```sh
//! cargo build --release -p idem-benches --bin apply_ceiling
//! target/release/apply_ceiling STORE [SECONDS]    # STORE: an idem store file (it is copied)
//! ```
//!
//! The values are copied from the store's own rows (a record, an expiry key's shape); keys are
//! random (blake3 of a counter), as `bench-peers` claims them. Rows: G = 1, 8, 64, 256, 1024,
//! each applied in claim order and sorted by key (an applier may sort a group: redo records of
//! different keys commute).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bench_common::env_parse;
use idem::redb::{self, Database, ReadableTable, ReadableTableMetadata, TableDefinition};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");
const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");
const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("effects");

/// One synthetic claim's three writes.
struct Claim {
    record: Vec<u8>,
    expiry: Vec<u8>,
    effect: Vec<u8>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: apply_ceiling STORE [SECONDS]");
        return ExitCode::FAILURE;
    };
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    match run(Path::new(path), Duration::from_secs_f64(secs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("apply_ceiling: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &Path, window: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let copy = path.with_extension("apply-ceiling.redb");
    std::fs::copy(path, &copy)?;
    // idem's default page cache (`IDEM_CACHE_MB=N`: N MiB).
    let cache_mb: usize = env_parse("IDEM_CACHE_MB").unwrap_or(64);
    let db = Database::builder()
        .set_cache_size(cache_mb << 20)
        .open(&copy)?;
    let (record_len, value, expiry_len, expiry_prefix, records) = {
        let r = redb::ReadableDatabase::begin_read(&db)?;
        let rec = r.open_table(RECORDS)?;
        let (rk, v) = rec.first()?.ok_or("the store has no records")?;
        let exp = r.open_table(EXPIRY)?;
        let (k, _) = exp.last()?.ok_or("the store has no expiry entries")?;
        let k = k.value().to_vec();
        (
            rk.value().len(),
            v.value().to_vec(),
            k.len(),
            k[..8.min(k.len())].to_vec(),
            rec.len()?,
        )
    };
    println!(
        "apply_ceiling: {} ({records} records), record key {record_len} B, value {} B, expiry key {expiry_len} B, one thread, Durability::None, {cache_mb} MiB cache, {:.1} s per row\n",
        path.display(),
        value.len(),
        window.as_secs_f64()
    );
    println!("| claims per transaction | order | claims/s | µs per claim |");
    println!("|---:|---|---:|---:|");
    let mut counter = 0u64;
    let mut claim = || {
        counter += 1;
        let mut h = [0u8; 256];
        blake3::Hasher::new()
            .update(&counter.to_le_bytes())
            .finalize_xof()
            .fill(&mut h);
        let mut expiry = expiry_prefix.clone();
        expiry.extend_from_slice(&h[..expiry_len - expiry_prefix.len()]);
        // After every existing entry, as a new claim's expiry is.
        expiry[0] = 0xff;
        Claim {
            record: h[64..64 + record_len.min(192)].to_vec(),
            expiry,
            effect: format!(
                "{:016x}",
                u64::from_le_bytes(h[..8].try_into().unwrap_or([0; 8]))
            )
            .into_bytes(),
        }
    };
    for group in [1usize, 8, 64, 256, 1024] {
        for sorted in [false, true] {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < window {
                let mut claims: Vec<Claim> = (0..group).map(|_| claim()).collect();
                if sorted {
                    claims.sort_by(|a, b| a.record.cmp(&b.record));
                }
                let mut txn = db.begin_write()?;
                txn.set_durability(redb::Durability::None)?;
                {
                    let mut rec = txn.open_table(RECORDS)?;
                    let mut exp = txn.open_table(EXPIRY)?;
                    let mut eff = txn.open_table(EFFECTS)?;
                    for c in &claims {
                        rec.insert(c.record.as_slice(), value.as_slice())?;
                        exp.insert(c.expiry.as_slice(), 0)?;
                        eff.insert(c.effect.as_slice(), 1)?;
                    }
                }
                txn.commit()?;
                n += group as u64;
            }
            let took = start.elapsed().as_secs_f64();
            println!(
                "| {group} | {} | {:.0} | {:.1} |",
                if sorted {
                    "sorted by key"
                } else {
                    "claim order"
                },
                n as f64 / took,
                took / n as f64 * 1e6
            );
        }
    }
    drop(db);
    std::fs::remove_file(&copy)?;
    Ok(())
}
