//! The rows: which system runs which workload on which store with how many callers, their
//! labels and their stable CSV names, and the plan of a run (which rows, in which groups).

/// Who does the work: idem (by call) or a baseline.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum System {
    Idem,
    IdemSend,
    Naive,
    NaiveIndexed,
    NaiveColocated,
    NaiveDeferred,
    NaiveGroup,
    Sqlite,
    /// SQLite with its writers taking turns on an in-process mutex instead of busy-waiting.
    SqliteSerial,
    Memory,
    Disk,
}

/// What each call does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Work {
    NewKeys,
    Replay,
    Mixed,
    FlowB,
    Fsync,
}

/// The store a run starts from: a new (or the 10,000-record) one, or the pre-filled one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Fill {
    Empty,
    Prefilled,
}

/// One line of the summary: a system doing a workload on a store with some callers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Row {
    pub system: System,
    pub work: Work,
    pub fill: Fill,
    pub callers: usize,
}

impl Row {
    /// The row's name in the summary (`IDEM_BENCH_FILTER` matches pieces of it).
    pub fn label(&self) -> &'static str {
        match (self.system, self.work) {
            (System::Idem, Work::NewKeys) => "idem new keys (flow A execute)",
            (System::IdemSend, _) => "idem new keys (execute_on_writer)",
            (System::Idem, Work::Replay) => "idem replays (execute)",
            (System::Idem, Work::Mixed) => "idem mixed 90% replay / 10% new",
            (System::Idem, Work::FlowB) => "idem flow B begin + complete",
            (System::Naive, _) => "naive redb new keys (1 txn/claim)",
            (System::NaiveGroup, _) => "naive group-commit writer (1 thread)",
            (System::NaiveIndexed, _) => "naive redb + expiry-index entry",
            (System::NaiveColocated, _) => "naive redb + expiry entry in the records tree",
            (System::NaiveDeferred, _) => {
                "naive redb + expiry entries every 100 ms (not crash-safe)"
            }
            (System::Sqlite, Work::Replay) => "SQLite replays (prepared SELECT)",
            (System::Sqlite, _) => "SQLite new keys (article SQL)",
            (System::SqliteSerial, _) => "SQLite new keys, writers behind a Mutex",
            (System::Memory, _) => "Mutex<HashMap> new keys (no disk)",
            (System::Disk, _) => "disk: pwrite 4 KiB + fdatasync",
            _ => "?",
        }
    }
}

impl Row {
    /// The row's stable name in the CSV file (`scripts/claims-chart` reads it).
    pub fn id(&self) -> &'static str {
        match (self.system, self.work) {
            (System::Idem, Work::NewKeys) => "idem_execute",
            (System::IdemSend, _) => "idem_execute_send",
            (System::Idem, Work::Replay) => "idem_replays",
            (System::Idem, Work::Mixed) => "idem_mixed",
            (System::Idem, Work::FlowB) => "idem_flow_b",
            (System::Naive, _) => "naive_redb",
            (System::NaiveGroup, _) => "naive_group_commit_writer",
            (System::NaiveIndexed, _) => "naive_redb_expiry_index",
            (System::NaiveColocated, _) => "naive_redb_expiry_in_records_tree",
            (System::NaiveDeferred, _) => "naive_redb_deferred_expiry",
            (System::Sqlite, Work::Replay) => "sqlite_replays",
            (System::Sqlite, _) => "sqlite",
            (System::SqliteSerial, _) => "sqlite_mutex",
            (System::Memory, _) => "mutex_hashmap",
            (System::Disk, _) => "disk_fsync",
            _ => "?",
        }
    }
}

/// The summary's "store" column: `empty`, or the pre-filled store's size (`1000k`).
pub fn fill_name(fill: Fill, prefill: usize) -> String {
    match fill {
        Fill::Empty => "empty".into(),
        Fill::Prefilled => format!("{}k", prefill / 1000),
    }
}

/// Caller counts of the new-key rows.
pub const NEW_KEY_CALLERS: [usize; 4] = [1, 2, 8, 64];
/// Thread counts of idem's replay rows.
pub const REPLAY_THREADS: [usize; 2] = [1, 2];

/// The rows to run, in groups whose runs interleave (the disk's row first: every ×fsync ratio
/// divides by it), and every row in the summary's order. `filter` (`IDEM_BENCH_FILTER`) keeps
/// the rows whose label contains one of its pieces, and always the disk's.
pub fn plan(filter: &[String]) -> (Vec<Vec<Row>>, Vec<Row>) {
    let row = |system, work, fill, callers| Row {
        system,
        work,
        fill,
        callers,
    };
    let mut groups: Vec<Vec<Row>> = Vec::new();
    // The in-memory rows run last, in groups of their own: interleaved with the durable rows,
    // the aftermath of their hundreds of MB of small allocations made the naive redb and idem
    // runs that followed them several times slower at 8 and 64 callers.
    let mut memory_groups: Vec<Vec<Row>> = Vec::new();
    for fill in [Fill::Empty, Fill::Prefilled] {
        for c in NEW_KEY_CALLERS {
            let mut g = vec![
                row(System::Idem, Work::NewKeys, fill, c),
                row(System::Naive, Work::NewKeys, fill, c),
                row(System::Sqlite, Work::NewKeys, fill, c),
            ];
            if c <= 2 {
                g.push(row(System::NaiveIndexed, Work::NewKeys, fill, c));
                g.push(row(System::NaiveColocated, Work::NewKeys, fill, c));
                g.push(row(System::NaiveDeferred, Work::NewKeys, fill, c));
            }
            if c > 1 {
                g.push(row(System::IdemSend, Work::NewKeys, fill, c));
                g.push(row(System::NaiveGroup, Work::NewKeys, fill, c));
                g.push(row(System::SqliteSerial, Work::NewKeys, fill, c));
            }
            if fill == Fill::Empty {
                memory_groups.push(vec![row(System::Memory, Work::NewKeys, fill, c)]);
            }
            groups.push(g);
        }
        let mut g: Vec<Row> = REPLAY_THREADS
            .iter()
            .map(|&t| row(System::Idem, Work::Replay, fill, t))
            .collect();
        g.push(row(System::Sqlite, Work::Replay, fill, 1));
        groups.push(g);
        groups.push(vec![row(System::Idem, Work::Mixed, fill, 8)]);
        groups.push(vec![row(System::Idem, Work::FlowB, fill, 8)]);
    }
    let wanted = |r: &Row| {
        let label = r.label().to_lowercase();
        filter.is_empty() || filter.iter().any(|f| label.contains(f.as_str()))
    };
    // The summary shows each in-memory row next to the durable rows with its caller count.
    let display: Vec<Row> = groups
        .iter()
        .flat_map(|g| {
            let memory = memory_groups.iter().flatten().find(|m| {
                g.first().is_some_and(|r| {
                    r.work == Work::NewKeys && r.fill == m.fill && r.callers == m.callers
                })
            });
            g.iter().chain(memory).copied().collect::<Vec<_>>()
        })
        .collect();
    let mut groups: Vec<Vec<Row>> = groups
        .into_iter()
        .chain(memory_groups)
        .map(|g| g.into_iter().filter(wanted).collect::<Vec<_>>())
        .filter(|g| !g.is_empty())
        .collect();
    // The disk's rate comes first: every ×fsync ratio divides by it.
    let disk = row(System::Disk, Work::Fsync, Fill::Empty, 1);
    groups.insert(0, vec![disk]);
    let display: Vec<Row> = std::iter::once(disk).chain(display).collect();
    (groups, display)
}
