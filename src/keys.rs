//! Downstream keys: stable idempotency keys for the calls a step makes, derived with blake3's
//! `derive_key` under a fixed context, so every retry of the same step sends the same key.

use crate::fingerprint::DownstreamKey;

/// blake3 `derive_key` context of step keys.
const CTX_STEP_KEY: &str = "idem 2026-11-30 downstream step key v1";

/// The key of step `step` under `parent` (a [`crate::Lease::downstream_key`], a workflow id,
/// an outbox event id, …): the same inputs always give the same key, different steps of one
/// parent get unrelated keys. The encoding is unambiguous (the parent's length is part of
/// the input), so `("ab", "c")` and `("a", "bc")` differ.
pub fn derive_key(parent: impl AsRef<[u8]>, step: impl AsRef<[u8]>) -> DownstreamKey {
    let parent = parent.as_ref();
    let mut h = blake3::Hasher::new_derive_key(CTX_STEP_KEY);
    h.update(&(parent.len() as u64).to_be_bytes());
    h.update(parent);
    h.update(step.as_ref());
    DownstreamKey::from_raw(*h.finalize().as_bytes())
}

/// The key of activity `activity_id` of workflow run `workflow_id` (Temporal's advice:
/// workflow run id + activity id), identical on every retry of the activity.
pub fn activity_key(workflow_id: impl AsRef<[u8]>, activity_id: impl AsRef<[u8]>) -> DownstreamKey {
    let workflow = derive_key(workflow_id, b"workflow");
    derive_key(workflow.as_bytes(), activity_id)
}

/// The key of the compensation of the step whose key is `forward`: distinct from `forward`
/// (a provider never confuses the undo with the do) and stable across retries of the
/// compensation, so a compensation that runs twice has one effect.
pub fn compensation_key(forward: &DownstreamKey) -> DownstreamKey {
    derive_key(forward.as_bytes(), b"\0compensate")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_separated() {
        assert_eq!(derive_key("p", "s"), derive_key("p", "s"));
        assert_ne!(derive_key("p", "s"), derive_key("p", "t"));
        assert_ne!(derive_key("ab", "c"), derive_key("a", "bc"));
        let fwd = activity_key("wf-1", "charge");
        assert_eq!(fwd, activity_key("wf-1", "charge"));
        assert_ne!(fwd, activity_key("wf-2", "charge"));
        assert_ne!(compensation_key(&fwd), fwd);
        assert_eq!(compensation_key(&fwd), compensation_key(&fwd));
    }

    /// Keys are sent to other systems and must never change between releases.
    #[test]
    fn derivation_is_pinned() {
        assert_eq!(
            derive_key("p", "s").to_hex(),
            "e3874a553e444eddb6847dfc645d4586e26393c6df9d77ef5f08cd3fbd8a802c"
        );
    }
}
