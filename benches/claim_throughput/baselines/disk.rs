//! The disk's durable-write rate: 4 KiB overwrites, each followed by `fdatasync`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Blocks the disk row cycles over.
pub const DISK_BLOCKS: u64 = 256;
/// One overwrite.
pub const BLOCK: usize = 4096;

/// A pre-allocated, synced file of `DISK_BLOCKS` blocks at `path`.
pub fn disk_file(path: &Path) -> File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("disk file");
    // Block by block: one large write would put the file in large page-cache folios, and the
    // kernel would then account (and may write back) a whole folio per 4 KiB overwrite.
    for b in 0..DISK_BLOCKS {
        file.write_all_at(&[0u8; BLOCK], b * BLOCK as u64)
            .expect("preallocate");
    }
    file.sync_all().expect("sync");
    file
}
