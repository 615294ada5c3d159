//! Store files that runs start from.

use std::fs::File;
use std::path::Path;

/// fsyncs `path` (panics if it cannot: a run must not start on unsynced pages).
pub fn sync_file(path: &Path) {
    File::open(path)
        .and_then(|f| f.sync_all())
        .unwrap_or_else(|e| panic!("sync {}: {e}", path.display()));
}

/// Copies a closed store file and syncs the copy, so the run's first fsync does not pay for
/// flushing the copy's dirty pages.
pub fn copy_synced(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    sync_file(to);
}
