//! Where a run's "bytes written per op" comes from: the block device under the temp dir, or this
//! process's page-cache accounting.

use std::path::{Path, PathBuf};

use bench_common::filesystem_of;

/// Where "bytes written per op" comes from.
pub enum WriteCounter {
    /// The block device under the temp dir: sectors written × 512 (what reached the disk,
    /// including the filesystem's journal; device-wide, so other processes' writes count too).
    Device {
        name: String,
        stat: PathBuf,
    },
    /// `/proc/self/io` `write_bytes`: bytes this process dirtied in the page cache. Counted per
    /// page-cache folio, so with large folios a 4 KiB overwrite may count as far more.
    Process,
    Unavailable,
}

impl WriteCounter {
    /// The block device under `dir` if its counter reads, else this process's, else none.
    pub fn detect(dir: &Path) -> Self {
        if let Some((dev, _, _)) = filesystem_of(dir) {
            let dev = Path::new(&dev)
                .canonicalize()
                .unwrap_or_else(|_| PathBuf::from(&dev));
            if let Some(name) = dev.file_name().and_then(|n| n.to_str()) {
                let stat = PathBuf::from(format!("/sys/class/block/{name}/stat"));
                let counter = WriteCounter::Device {
                    name: name.to_owned(),
                    stat,
                };
                if counter.read().is_some() {
                    return counter;
                }
            }
        }
        if (WriteCounter::Process).read().is_some() {
            WriteCounter::Process
        } else {
            WriteCounter::Unavailable
        }
    }

    /// The counter now, in bytes.
    pub fn read(&self) -> Option<u64> {
        match self {
            WriteCounter::Device { stat, .. } => {
                let text = std::fs::read_to_string(stat).ok()?;
                let sectors: u64 = text.split_whitespace().nth(6)?.parse().ok()?;
                Some(sectors * 512)
            }
            WriteCounter::Process => {
                let io = std::fs::read_to_string("/proc/self/io").ok()?;
                io.lines()
                    .find_map(|l| l.strip_prefix("write_bytes:"))
                    .and_then(|v| v.trim().parse().ok())
            }
            WriteCounter::Unavailable => None,
        }
    }

    /// What the header says the "written" column counts.
    pub fn describe(&self) -> String {
        match self {
            WriteCounter::Device { name, stat } => format!(
                "device {name} ({} sectors written × 512) ÷ ops: what reached the disk, journal included; device-wide, so writes by other processes during a run count too",
                stat.display()
            ),
            WriteCounter::Process => "/proc/self/io write_bytes ÷ ops (page-cache accounting; may overstate with large folios)".into(),
            WriteCounter::Unavailable => "unavailable (no block-device stat, no /proc/self/io)".into(),
        }
    }
}
