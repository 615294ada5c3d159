//! The running journal: where the next frame goes, the LSNs, and the group sync.
//!
//! LSNs: `sealed` (j) is the last entry whose frame was assigned; `durable` (d) the last entry
//! that, with every one before it, is on disk (its frame covered by a sync that returned Ok,
//! or itself in a durable redb commit); `c`, the last checkpoint's. Always `c ≤ d ≤ j`.
//!
//! Invariants:
//! - frames are written in LSN order, at the head, and never over the live journal: the bytes
//!   from the last checkpoint's position to the head, which a crash would replay;
//! - one sync runs at a time; it covers every frame whose write returned before it began, and
//!   `durable` only ever takes the LSN of the last such frame;
//! - a failed write or sync is never retried: the journal latches, every waiter hears it.

use std::sync::atomic::{AtomicU64 as Counter, Ordering};

use crate::runtime::sync::atomic::{AtomicBool, AtomicU64};
use crate::runtime::sync::{Condvar, Mutex};
use redb::StorageBackend;

use crate::engine::journal::format::{
    ALIGN, Checksum, HEADER_LEN, KIND_ENTRY, KIND_WRAP, Row, StoreId, encode_frame, frame_len,
};
use crate::engine::maintenance::JournalMetrics;

/// Where the next frame goes.
#[derive(Debug)]
struct Head {
    /// Offset of the next frame.
    pos: u64,
    /// The checksum the next frame continues.
    chain: Checksum,
    /// LSN of the next entry.
    next: u64,
    /// Where the live journal begins: the last checkpoint's position.
    live_from: u64,
    /// Frame bytes written since the last checkpoint.
    since_checkpoint: u64,
}

#[derive(Debug, Default)]
struct Sync {
    /// The last LSN whose frame write returned Ok.
    written: u64,
    syncing: bool,
    failed: Option<String>,
}

/// What [`Journal::seal`] made of a batch's entry.
#[derive(Debug)]
pub(crate) struct Sealed {
    pub(crate) lsn: u64,
    /// The row the batch's transaction writes: the state after this entry.
    pub(crate) row: Row,
}

/// The journal of a store in journal mode.
pub(crate) struct Journal {
    file: Box<dyn StorageBackend>,
    store_id: StoreId,
    capacity: u64,
    checkpoint_bytes: u64,
    head: Mutex<Head>,
    sync: Mutex<Sync>,
    synced: Condvar,
    sealed: AtomicU64,
    durable: AtomicU64,
    /// The LSN of an unframed entry whose durable commit is running (0: none).
    unframed: AtomicU64,
    /// White-box tests only: answers do not wait for the sync (`BrokenJournal::AnswerBeforeSync`).
    #[cfg(any(test, feature = "__internal_whitebox"))]
    answer_before_sync: bool,
    /// A seal waits for the applier's next checkpoint to free journal space. Set and cleared by
    /// the sealing batch only; the applier checkpoints while it is set.
    space_wanted: AtomicBool,
    /// `Head::since_checkpoint`, readable without the head's lock.
    since_checkpoint: AtomicU64,
    replayed: u64,
    frames: Counter,
    frame_bytes: Counter,
    syncs: Counter,
    checkpoints: AtomicU64,
    unjournaled: Counter,
    /// Nanoseconds spent in the durable commits counted by `checkpoints`.
    checkpoint_nanos: Counter,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("capacity", &self.capacity)
            .field("sealed", &self.sealed.load(Ordering::Relaxed))
            .field("durable", &self.durable.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// The journal in `file` (checked and recovered), continuing after `row`'s entry.
    pub(crate) fn new(
        file: Box<dyn StorageBackend>,
        capacity: u64,
        row: Row,
        checkpoint_bytes: u64,
        replayed: u64,
    ) -> Journal {
        Journal {
            file,
            store_id: row.store_id,
            capacity,
            checkpoint_bytes,
            head: Mutex::new(Head {
                pos: row.position,
                chain: row.chain,
                next: row.lsn + 1,
                live_from: row.position,
                since_checkpoint: 0,
            }),
            sync: Mutex::new(Sync {
                written: row.lsn,
                ..Sync::default()
            }),
            synced: Condvar::new(),
            sealed: AtomicU64::new(row.lsn),
            durable: AtomicU64::new(row.lsn),
            unframed: AtomicU64::new(0),
            #[cfg(any(test, feature = "__internal_whitebox"))]
            answer_before_sync: false,
            space_wanted: AtomicBool::new(false),
            since_checkpoint: AtomicU64::new(0),
            replayed,
            frames: Counter::new(0),
            frame_bytes: Counter::new(0),
            syncs: Counter::new(0),
            checkpoints: AtomicU64::new(0),
            unjournaled: Counter::new(0),
            checkpoint_nanos: Counter::new(0),
        }
    }

    /// White-box tests only: members are answered before the sync covers their entry
    /// (`BrokenJournal::AnswerBeforeSync`), when `on`.
    #[cfg(any(test, feature = "__internal_whitebox"))]
    pub(crate) fn answering_before_sync(mut self, on: bool) -> Journal {
        self.answer_before_sync = on;
        self
    }

    /// The counters since open.
    pub(crate) fn metrics(&self) -> JournalMetrics {
        let get = |c: &Counter| c.load(Ordering::Relaxed);
        JournalMetrics {
            frames: get(&self.frames),
            frame_bytes: get(&self.frame_bytes),
            syncs: get(&self.syncs),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            replayed: self.replayed,
            unjournaled: get(&self.unjournaled),
            pending_waits: 0,
            checkpoint_time: std::time::Duration::from_nanos(get(&self.checkpoint_nanos)),
        }
    }

    /// Counts a batch committed durably because it wrote a table recovery cannot replay.
    pub(crate) fn count_unjournaled(&self) {
        self.unjournaled.fetch_add(1, Ordering::Relaxed);
    }

    /// The last sealed entry (j).
    pub(crate) fn sealed(&self) -> u64 {
        self.sealed.load(Ordering::Acquire)
    }

    /// A bound on the entries a redb read begun before this call can see: the last sealed
    /// entry, or the one before it while that entry is unframed and its durable commit still
    /// runs (redb shows a durable commit to readers only once it is durable, so a read that sees
    /// it needs nothing more; waiting for it would stall reads for a checkpoint's length).
    pub(crate) fn read_bound(&self) -> u64 {
        let sealed = self.sealed();
        if self.unframed.load(Ordering::Acquire) == sealed {
            sealed.saturating_sub(1)
        } else {
            sealed
        }
    }

    /// The last durable entry (d).
    pub(crate) fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Seals a batch's entry (`body`; `None` for a batch the journal cannot replay, or one too
    /// large for it): gives it the next LSN and either writes its frame at the head (no sync)
    /// or, without a body, leaves it unframed for a durable commit. A frame that would reach
    /// the live journal waits for the applier's next checkpoint. `Err` is a failed write, which
    /// latches.
    pub(crate) fn seal(&self, body: Option<&[u8]>) -> Result<Sealed, String> {
        self.check()?;
        let mut head = self.head.lock();
        let lsn = head.next;
        let len = body.map_or(0, |b| frame_len(b.len()));
        let mut place = match body {
            Some(_) => self.place(&head, len),
            None => None,
        };
        while place.is_none() && body.is_some() && self.fits(len) {
            // The live journal reaches the head; the applier's next checkpoint moves its
            // start (backpressure, not an unframed entry).
            let checkpoints = self.checkpoints.load(Ordering::Acquire);
            self.space_wanted.store(true, Ordering::Release);
            drop(head);
            {
                let mut s = self.sync.lock();
                self.synced.notify_all();
                while s.failed.is_none() && self.checkpoints.load(Ordering::Acquire) == checkpoints
                {
                    self.synced.wait(&mut s);
                }
            }
            self.check()?;
            head = self.head.lock();
            place = self.place(&head, len);
        }
        // Only the sealing batch (one at a time) clears its request, once it has space: a
        // checkpoint that began before the request must not clear it.
        self.space_wanted.store(false, Ordering::Release);
        let body = body.unwrap_or_default();
        let Some((wrap, at)) = place else {
            // Unframed: the durable commit is the entry's only copy. The next frame goes where
            // this one would have, continuing the same chain.
            head.next = lsn + 1;
            // Before `sealed`: a reader that sees this LSN sealed also sees it unframed.
            self.unframed.store(lsn, Ordering::Release);
            self.sealed.store(lsn, Ordering::Release);
            let row = Row {
                store_id: self.store_id,
                lsn,
                position: head.pos,
                chain: head.chain,
                clean: false,
            };
            return Ok(Sealed { lsn, row });
        };
        let mut chain = head.chain;
        let mut written = 0;
        if let Some(wrap_at) = wrap {
            let (frame, sum) = encode_frame(&self.store_id, &chain, KIND_WRAP, lsn, &[]);
            self.write(wrap_at, &frame)?;
            chain = sum;
            written += frame.len() as u64;
        }
        let (frame, sum) = encode_frame(&self.store_id, &chain, KIND_ENTRY, lsn, body);
        self.write(at, &frame)?;
        head.pos = at + len;
        if head.pos >= self.capacity {
            head.pos = HEADER_LEN;
        }
        head.chain = sum;
        head.next = lsn + 1;
        head.since_checkpoint += written + len;
        self.since_checkpoint
            .store(head.since_checkpoint, Ordering::Release);
        self.frames.fetch_add(1, Ordering::Relaxed);
        self.frame_bytes.fetch_add(written + len, Ordering::Relaxed);
        // `written` first: a reader that sees this LSN sealed finds its frame written.
        {
            let mut s = self.sync.lock();
            s.written = lsn;
            if head.since_checkpoint >= self.checkpoint_bytes {
                // A checkpoint is due: the applier makes it without waiting for a sync.
                self.synced.notify_all();
            }
        }
        self.sealed.store(lsn, Ordering::Release);
        Ok(Sealed {
            lsn,
            row: Row {
                store_id: self.store_id,
                lsn,
                position: head.pos,
                chain: sum,
                clean: false,
            },
        })
    }

    /// Whether a frame of `len` bytes may be written: at most a quarter of the area.
    pub(crate) fn fits(&self, len: u64) -> bool {
        len <= (self.capacity - HEADER_LEN) / 4
    }

    /// Whether the applier's next commit should be a checkpoint: enough
    /// frames since the last one, or a seal waiting for space.
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.space_wanted.load(Ordering::Acquire)
            || self.since_checkpoint.load(Ordering::Acquire) >= self.checkpoint_bytes
    }

    /// Waits until `ready()` holds, without syncing (the applier: the members' waits run the
    /// syncs). `ready` is checked under the sync lock, which every change it can depend on
    /// notifies under ([`Journal::wake`], a sync, a checkpoint, a failure), so no wake is lost;
    /// it must take no lock the journal holds while taking the sync lock (the head's).
    pub(crate) fn wait_until(&self, mut ready: impl FnMut() -> bool) -> Result<(), String> {
        let mut s = self.sync.lock();
        loop {
            if let Some(f) = &s.failed {
                return Err(f.clone());
            }
            if ready() {
                return Ok(());
            }
            self.synced.wait(&mut s);
        }
    }

    /// Wakes the applier if entry `lsn` is already durable: called after queuing it, under
    /// the sync lock, so either this sees the sync that covered it or that sync's wake comes
    /// after the entry was queued.
    pub(crate) fn wake_if_durable(&self, lsn: u64) {
        let _s = self.sync.lock();
        if self.durable() >= lsn {
            self.synced.notify_all();
        }
    }

    /// Wakes every thread waiting on the journal (the applier: an entry was queued, a seal
    /// wants space, the store closes).
    pub(crate) fn wake(&self) {
        let _s = self.sync.lock();
        self.synced.notify_all();
    }

    /// Where a frame of `len` bytes goes: `(wrap frame position, frame position)`, or `None`
    /// if it would reach the live journal. A gap of at least one byte always separates the
    /// head from the live journal's start when the journal has wrapped, so `pos == live_from`
    /// means empty: a frame that would end exactly at the area's end (the head then continues
    /// at its start) while the live journal starts there is refused too.
    fn place(&self, head: &Head, len: u64) -> Option<(Option<u64>, u64)> {
        let (pos, live) = (head.pos, head.live_from);
        if pos >= live {
            let end = pos + len;
            if end < self.capacity || (end == self.capacity && live > HEADER_LEN) {
                return Some((None, pos));
            }
            // Wrap: a wrap frame at the head, the frame at the area's start.
            (HEADER_LEN + len < live).then_some((Some(pos), HEADER_LEN))
        } else {
            (pos + len < live).then_some((None, pos))
        }
    }

    fn write(&self, at: u64, bytes: &[u8]) -> Result<(), String> {
        debug_assert_eq!((at - HEADER_LEN) % ALIGN, 0);
        self.file.write(at, bytes).map_err(|e| {
            let cause = format!("writing the journal failed: {e}");
            self.fail(&cause);
            cause
        })
    }

    /// Returns once entry `lsn` is durable, syncing the journal on this thread if no sync is
    /// running (a sync covers every frame written before it began, so concurrent waiters share
    /// one).
    pub(crate) fn wait_durable(&self, lsn: u64) -> Result<(), String> {
        #[cfg(any(test, feature = "__internal_whitebox"))]
        if self.answer_before_sync {
            return Ok(());
        }
        if self.durable() >= lsn {
            return Ok(());
        }
        let mut s = self.sync.lock();
        loop {
            if let Some(f) = &s.failed {
                return Err(f.clone());
            }
            if self.durable() >= lsn {
                return Ok(());
            }
            // A sync cannot help an entry without a frame (a checkpoint's commit is running:
            // `checkpointed` or `fail` wakes this), nor while another sync runs.
            if s.syncing || s.written < lsn {
                self.synced.wait(&mut s);
                continue;
            }
            s.syncing = true;
            let target = s.written;
            drop(s);
            let result = self.file.sync_data();
            s = self.sync.lock();
            s.syncing = false;
            match result {
                Ok(()) => {
                    self.syncs.fetch_add(1, Ordering::Relaxed);
                    self.durable.fetch_max(target, Ordering::AcqRel);
                }
                Err(e) => {
                    // Never retried: the kernel may have dropped the pages it could not write.
                    s.failed
                        .get_or_insert_with(|| format!("syncing the journal failed: {e}"));
                }
            }
            self.synced.notify_all();
        }
    }

    /// After the durable commit of entry `lsn` whose row is `row` returned Ok, having taken
    /// `took`: the live journal now starts at its position, and every entry up to `lsn` is
    /// durable.
    pub(crate) fn checkpointed(&self, row: &Row, took: std::time::Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.checkpoint_nanos.fetch_add(nanos, Ordering::Relaxed);
        let mut head = self.head.lock();
        head.live_from = row.position;
        head.since_checkpoint = 0;
        self.since_checkpoint.store(0, Ordering::Release);
        // Counted with the new start, under the head's lock: a seal waiting for space samples
        // the count under that lock, so it either finds the space or sees the count change
        // (counted before the lock, a seal could sample the new count, then miss the space).
        self.checkpoints.fetch_add(1, Ordering::AcqRel);
        drop(head);
        self.durable.fetch_max(row.lsn, Ordering::AcqRel);
        let _s = self.sync.lock();
        self.synced.notify_all();
    }

    /// The row of a checkpoint that covers every entry sealed so far (closing, `compact`),
    /// `clean` when nothing is live after it.
    pub(crate) fn current_row(&self, clean: bool) -> Row {
        let head = self.head.lock();
        Row {
            store_id: self.store_id,
            lsn: head.next - 1,
            position: head.pos,
            chain: head.chain,
            clean,
        }
    }

    /// Latches the journal failed: every later seal and wait fails with `cause`.
    pub(crate) fn fail(&self, cause: &str) {
        let mut s = self.sync.lock();
        s.failed.get_or_insert_with(|| cause.to_owned());
        self.synced.notify_all();
    }

    fn check(&self) -> Result<(), String> {
        match &self.sync.lock().failed {
            Some(f) => Err(f.clone()),
            None => Ok(()),
        }
    }

    /// Syncs and closes the journal file (the backend's close contract: once).
    pub(crate) fn close(&self) {
        let _ = self.file.sync_data();
        let _ = self.file.close();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use redb::BackendError;

    /// An in-memory journal file (also the loom model's, `model_check.rs`).
    #[derive(Debug, Default)]
    pub(crate) struct Mem(parking_lot::Mutex<Vec<u8>>);

    impl StorageBackend for Mem {
        fn len(&self) -> Result<u64, BackendError> {
            Ok(self.0.lock().len() as u64)
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
            let d = self.0.lock();
            out.copy_from_slice(&d[offset as usize..offset as usize + out.len()]);
            Ok(())
        }
        fn set_len(&self, len: u64) -> Result<(), BackendError> {
            self.0.lock().resize(len as usize, 0);
            Ok(())
        }
        fn sync_data(&self) -> Result<(), BackendError> {
            Ok(())
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
            let mut d = self.0.lock();
            d[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    /// A journal whose area holds exactly 8 frames, with no checkpoint due by size: frames that
    /// fill the area to its last byte from a live journal that starts at the area's start must
    /// not wrap onto it (the head back at the live start would read as empty).
    #[test]
    fn frames_filling_the_area_exactly_never_overwrite_the_live_journal() {
        let body = vec![7u8; 300];
        let len = frame_len(body.len());
        let capacity = HEADER_LEN + 8 * len;
        let file = Mem::default();
        file.set_len(capacity).unwrap();
        let row = Row {
            store_id: [1; 16],
            lsn: 0,
            position: HEADER_LEN,
            chain: [0; 8],
            clean: false,
        };
        let journal = Journal::new(Box::new(file), capacity, row, u64::MAX, 0);
        let mut framed = 0;
        // A seal without room waits for a checkpoint (none comes here): seal while there is.
        while framed < 20 && journal.place(&journal.head.lock(), len).is_some() {
            journal.seal(Some(&body)).unwrap();
            framed += 1;
        }
        assert_eq!(
            framed, 7,
            "frames written before the first refused one, in an area of 8"
        );
    }
}
