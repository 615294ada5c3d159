//! A small tmpfs the test mounts, to fill a disk for real (needs root: CAP_SYS_ADMIN), shared
//! by the full-disk tests. Where it cannot mount one, [`Tmpfs::mount`] says so and returns
//! `None` (the test passes), unless `IDEM_REQUIRE_MOUNT=1` (CI sets it), when it fails.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop. One at a time in a test
/// binary: a child process another test forks keeps the parent's open files until it execs
/// (close-on-exec acts only then), so a filler file written while a sibling test spawns a
/// process can outlive its unlink for a moment and keep the space taken.
pub struct Tmpfs {
    dir: tempfile::TempDir,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A tmpfs size with room for a store's journal (journal mode, the default, preallocates it)
/// and `mib` MiB more.
pub fn journal_and(mib: u64) -> String {
    format!("{}m", (idem::store::DEFAULT_JOURNAL_CAPACITY >> 20) + mib)
}

impl Tmpfs {
    pub fn mount(size: &str) -> Option<Tmpfs> {
        // A test that panicked while holding it poisons nothing this one needs.
        let guard = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = tempfile::tempdir().expect("tempdir");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if mounted {
            return Some(Tmpfs {
                dir,
                _one_at_a_time: guard,
            });
        }
        assert_ne!(
            std::env::var("IDEM_REQUIRE_MOUNT").as_deref(),
            Ok("1"),
            "IDEM_REQUIRE_MOUNT=1 but a tmpfs cannot be mounted here (needs root)"
        );
        eprintln!(
            "skipped: cannot mount a tmpfs here (needs root); IDEM_REQUIRE_MOUNT=1 fails instead"
        );
        None
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Grows (or shrinks) the file system to `size`, as an operator who adds space does.
    pub fn resize(&self, size: &str) {
        let resized = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(resized, "remount the tmpfs with size={size}");
    }

    /// Fills the file system with a filler file until a write fails; returns its path.
    pub fn fill(&self) -> PathBuf {
        let filler = self.path().join("filler");
        let mut f = std::fs::File::create(&filler).expect("filler");
        let chunk = vec![0xa5u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}
