//! The group-commit protocol, apart from any storage: concurrent writers share one transaction
//! (and one commit, one fsync), and each caller runs its own work on its own thread, so closures
//! need neither `Send` nor `'static`. What moves between threads is the engine's transaction
//! itself, passed as a baton `B`. An engine's driver opens, runs, commits and rolls back the
//! batch (`driver.rs`, over the file engine's transaction); this file only says who leads, who
//! waits, whose turn it is, and who is answered.
//!
//! - A caller that finds fewer than `lanes` batches running becomes a leader at once: a lone
//!   request opens its transaction and commits immediately, with no timer and no hand-off
//!   (`lanes` is 1 for the file engine, whose writers serialise; a database server may run
//!   several).
//! - Otherwise it queues. Batching comes only from callers that arrive while batches run: a
//!   new leader takes the queue into its batch, and a batch about to commit may take whoever
//!   queued since ([`Group::join_late`]).
//! - When a batch ended, its last member hands leadership to the oldest queued caller
//!   ([`Group::hand_off`]), which drains the queue (up to `max_batch`) into the next batch. A
//!   committer whose queue already holds a batch as large as its own hands off before it
//!   answers its members (the next leader's wake-up then does not wait behind theirs);
//!   otherwise it answers them first, so those that call again at once join the next batch
//!   instead of queueing behind it (larger batches, fewer commits).
//! - At most `max_queue` callers queue; the next waits up to `queue_timeout` for room, then gets
//!   [`Error::Busy`]. A member marked `durable` (a flush that bounds a loss window) is never
//!   turned away.
//! - Every member is always either queued (a leader will signal it) or in a batch (the baton or
//!   the committer will): no member waits without a thread that will answer it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::runtime::sync::{Condvar, Mutex, protocol_invariant};

/// Commit-path settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupConfig {
    /// Most members in one batch.
    pub max_batch: usize,
    /// Most callers queued for a batch.
    pub max_queue: usize,
    /// How long a caller waits for room in a full queue before [`Error::Busy`].
    pub queue_timeout: Duration,
    /// Most batches running at once (at least 1).
    pub lanes: usize,
}

/// Counters of the commit path (monotonic since open).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Batches committed.
    pub commits: AtomicU64,
    /// Members of committed batches.
    pub committed_ops: AtomicU64,
    /// Batches run again without a failed member.
    pub reruns: AtomicU64,
    /// Callers turned away by a full queue.
    pub busy: AtomicU64,
}

/// What a member is told.
pub(crate) enum Signal<B> {
    /// Nothing yet.
    Wait,
    /// Lead a new batch.
    Lead,
    /// Your turn: run your work in the batch's transaction, then pass it on. Boxed: a
    /// transaction handle may be large; the baton moves by pointer.
    Turn(Box<B>),
    /// Your answer is final: the batch you ran in committed, or (the driver's judgement) your
    /// work's answer does not depend on the batch's commit — the batch wrote nothing, or you
    /// wrote nothing and read nothing it wrote.
    Committed,
    /// The batch failed, or you were turned away.
    Failed(Error),
    /// Your work, run on another member's thread, panicked: resume the panic on yours.
    Panicked(Box<dyn std::any::Any + Send + 'static>),
}

/// One caller in the protocol, with the engine's per-member data `M` (what its driver needs to
/// know of a member before its turn, e.g. the keys to lock for it).
pub(crate) struct Member<B, M> {
    signal: Mutex<Signal<B>>,
    cv: Condvar,
    /// Never turned away by a full queue, and asks for a durable commit.
    pub durable: bool,
    /// The engine's data about this member.
    // Read by the PostgreSQL driver (the keys it locks for the member).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub meta: M,
}

impl<B, M> Member<B, M> {
    /// A member not yet in the group.
    pub(crate) fn new(durable: bool, meta: M) -> Arc<Self> {
        Arc::new(Member {
            signal: Mutex::new(Signal::Wait),
            cv: Condvar::new(),
            durable,
            meta,
        })
    }

    /// Tells this member `s` and wakes it.
    pub(crate) fn send(&self, s: Signal<B>) {
        let mut slot = self.signal.lock();
        let unread = !matches!(*slot, Signal::Wait);
        *slot = s;
        drop(slot);
        self.cv.notify_one();
        // Invariant: one thread at a time may signal a member (a leader, the baton, the
        // committer), and only once the member took the last signal: nothing is overwritten.
        // Checked with the lock released, so a failed check poisons nothing.
        protocol_invariant!(
            !unread,
            "a member was signalled before it took its previous signal"
        );
    }

    /// Waits until this member is told something.
    pub(crate) fn wait(&self) -> Signal<B> {
        let mut g = self.signal.lock();
        loop {
            match std::mem::replace(&mut *g, Signal::Wait) {
                Signal::Wait => self.cv.wait(&mut g),
                s => return s,
            }
        }
    }
}

impl<B, M> Drop for Member<B, M> {
    fn drop(&mut self) {
        // Invariant: every signal sent to a member is taken by it; one left when the last
        // reference goes was sent after the member had its answer (answered twice).
        protocol_invariant!(
            matches!(*self.signal.get_mut(), Signal::Wait),
            "a member was signalled after its answer"
        );
    }
}

/// The protocol's shared state, one per store.
pub(crate) struct Group<B, M> {
    state: Mutex<GroupState<B, M>>,
    /// Signalled when queued callers are taken into a batch (room for backpressured callers).
    space: Condvar,
    pub(crate) config: GroupConfig,
    pub(crate) counters: Counters,
}

struct GroupState<B, M> {
    /// Batches being formed, run or committed (at most `lanes`).
    active: usize,
    queue: VecDeque<Arc<Member<B, M>>>,
}

impl<B, M> Group<B, M> {
    pub(crate) fn new(config: GroupConfig) -> Self {
        Group {
            state: Mutex::new(GroupState {
                active: 0,
                queue: VecDeque::new(),
            }),
            space: Condvar::new(),
            config,
            counters: Counters::default(),
        }
    }

    /// Enters the group: `Lead` if a lane is free, otherwise queued (`Wait`), waiting up to
    /// `queue_timeout` for room in a full queue.
    pub(crate) fn join(&self, me: &Arc<Member<B, M>>) -> Result<Signal<B>, Error> {
        let mut g = self.state.lock();
        let deadline = Instant::now().checked_add(self.config.queue_timeout);
        let lanes = self.config.lanes.max(1);
        loop {
            if g.active < lanes {
                g.active += 1;
                return Ok(Signal::Lead);
            }
            // A durability request (the flusher) is never turned away: it bounds the loss
            // window of a relaxed durability mode.
            if g.queue.len() < self.config.max_queue || me.durable {
                g.queue.push_back(me.clone());
                return Ok(Signal::Wait);
            }
            let timed_out = match deadline {
                Some(d) => self.space.wait_until(&mut g, d).timed_out(),
                None => {
                    self.space.wait(&mut g);
                    false
                }
            };
            if timed_out && g.active >= lanes && g.queue.len() >= self.config.max_queue {
                self.counters.busy.fetch_add(1, Ordering::Relaxed);
                crate::runtime::observe::busy();
                return Err(Error::Busy {
                    queued: g.queue.len(),
                    waited: self.config.queue_timeout,
                });
            }
        }
    }

    /// A batch ended: hands its lane to the oldest queued caller, or frees it.
    pub(crate) fn hand_off(&self) {
        let next = {
            let mut g = self.state.lock();
            let next = g.queue.pop_front();
            if next.is_none() {
                g.active = g.active.saturating_sub(1);
            }
            next
        };
        self.space.notify_all();
        if let Some(next) = next {
            next.send(Signal::Lead);
        }
    }

    /// A batch of `len` members committed: hands its lane on and runs `answer` (which wakes
    /// its members) in the order the module doc gives — the hand-off first only when the queue
    /// already holds a batch as large as this one.
    pub(crate) fn hand_off_around(&self, len: usize, answer: impl FnOnce()) {
        if self.queued() >= len {
            self.hand_off();
            answer();
        } else {
            answer();
            self.hand_off();
        }
    }

    /// The new leader `me` takes the oldest queued callers into a batch with itself first.
    pub(crate) fn form_batch(&self, me: &Arc<Member<B, M>>) -> Vec<Arc<Member<B, M>>> {
        let mut batch = vec![me.clone()];
        self.join_late(&mut batch);
        batch
    }

    /// Takes the callers queued since `batch` formed into it, oldest first, up to `max_batch`:
    /// a batch still running admits late arrivals instead of leaving them for the next commit
    /// (and a new leader's batch takes the queue this way). Returns whether it took any.
    pub(crate) fn join_late(&self, batch: &mut Vec<Arc<Member<B, M>>>) -> bool {
        let before = batch.len();
        {
            let mut g = self.state.lock();
            while batch.len() < self.config.max_batch {
                match g.queue.pop_front() {
                    Some(m) => batch.push(m),
                    None => break,
                }
            }
        }
        let took = batch.len() > before;
        if took {
            self.space.notify_all();
        }
        took
    }

    /// Callers waiting for the next batch right now.
    pub(crate) fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Puts `members` back at the head of the queue, in order (the members after a failed one,
    /// which have not run yet: they go first in the next batch).
    pub(crate) fn requeue_front(&self, members: &[Arc<Member<B, M>>]) {
        let mut g = self.state.lock();
        for m in members.iter().rev() {
            g.queue.push_front(m.clone());
        }
    }
}

/// Answers every one of `members` with the error `error` makes for each.
pub(crate) fn fail_all<B, M>(members: &[Arc<Member<B, M>>], error: impl Fn() -> Error) {
    for m in members {
        m.send(Signal::Failed(error()));
    }
}
