//! Retention: how long a finished intent is replayed, and how long its tombstone then keeps the
//! key bound.

use std::time::Duration;

/// How long the records of an operation are kept, stated as the windows in which a duplicate of
/// one of its requests can still arrive. The store keeps the full response for the longest
/// window (the *retention*), then a tombstone until the *tombstone horizon*.
///
/// Set every window that applies; those you leave out count as zero:
///
/// ```
/// use std::time::Duration;
/// use idem::RetentionPolicy;
///
/// const HOUR: Duration = Duration::from_secs(3600);
/// let payments = RetentionPolicy::new()
///     .client_retry(HOUR)                 // the app retries for an hour
///     .queue_redrive(4 * HOUR)            // the dead-letter queue is redriven within 4 h
///     .webhook_replay(3 * 24 * HOUR)      // the provider redelivers webhooks for 3 days
///     .settlement(7 * 24 * HOUR);         // refunds and chargebacks settle within a week
/// assert_eq!(payments.retention(), 7 * 24 * HOUR);
/// assert_eq!(payments.longest_window(), ("settlement", 7 * 24 * HOUR));
/// ```
///
/// Give it to `StoreBuilder::retention_policy` (the store's default) or
/// `StoreBuilder::retention_policy_for` (one operation). The store refuses to open if the
/// retention is shorter than the lease duration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    client_retry: Duration,
    queue_redrive: Duration,
    webhook_replay: Duration,
    operator_replay: Duration,
    settlement: Duration,
    tombstone_horizon: Option<Duration>,
}

impl RetentionPolicy {
    /// A policy with every window zero (set at least one) and the store's tombstone horizon.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a client keeps retrying a request whose answer it did not get.
    pub fn client_retry(mut self, window: Duration) -> Self {
        self.client_retry = window;
        self
    }

    /// How long after the first delivery a queue may redeliver the message (visibility
    /// timeouts, dead-letter redrive).
    pub fn queue_redrive(mut self, window: Duration) -> Self {
        self.queue_redrive = window;
        self
    }

    /// How long a webhook sender redelivers or lets you replay a delivery.
    pub fn webhook_replay(mut self, window: Duration) -> Self {
        self.webhook_replay = window;
        self
    }

    /// How long an operator may press "replay" on a failed job or message.
    pub fn operator_replay(mut self, window: Duration) -> Self {
        self.operator_replay = window;
        self
    }

    /// How long a money-moving or reserving operation can still be settled or compensated
    /// (refunds, chargebacks, reversals).
    pub fn settlement(mut self, window: Duration) -> Self {
        self.settlement = window;
        self
    }

    /// How long, counted from when the intent finished, its tombstone keeps the key bound after
    /// the response window (overrides the store's `StoreBuilder::tombstone_horizon` for this
    /// policy). A horizon not longer than the retention means no tombstone: the key is free
    /// when the response window ends.
    pub fn tombstone_horizon(mut self, horizon: Duration) -> Self {
        self.tombstone_horizon = Some(horizon);
        self
    }

    /// The windows, by name.
    pub fn windows(&self) -> [(&'static str, Duration); 5] {
        [
            ("client retry", self.client_retry),
            ("queue redrive", self.queue_redrive),
            ("webhook replay", self.webhook_replay),
            ("operator replay", self.operator_replay),
            ("settlement", self.settlement),
        ]
    }

    /// The longest window and its name (the first one named, on a tie).
    pub fn longest_window(&self) -> (&'static str, Duration) {
        self.windows()
            .into_iter()
            .fold(("client retry", Duration::ZERO), |best, w| {
                if w.1 > best.1 { w } else { best }
            })
    }

    /// The retention: the longest window. The full response is replayed for this long after
    /// the intent finished.
    pub fn retention(&self) -> Duration {
        self.longest_window().1
    }

    /// The tombstone horizon this policy sets, if any.
    pub fn horizon(&self) -> Option<Duration> {
        self.tombstone_horizon
    }
}

/// One operation's (or the default) retention as configured, with where it came from for
/// error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Retention {
    /// The response window.
    pub response: Duration,
    /// The policy's own tombstone horizon; `None`: the store's.
    pub horizon: Option<Duration>,
    /// The longest window's name when set through a [`RetentionPolicy`].
    pub window: Option<&'static str>,
}

impl Retention {
    pub(crate) fn plain(response: Duration) -> Self {
        Retention {
            response,
            horizon: None,
            window: None,
        }
    }

    pub(crate) fn of(policy: &RetentionPolicy) -> Self {
        let (window, response) = policy.longest_window();
        Retention {
            response,
            horizon: policy.horizon(),
            window: Some(window),
        }
    }
}

/// What the store writes for one finished intent: the response window, and when the key is
/// forgotten, both counted from the moment the intent finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Windows {
    /// `expires_at = now + response`.
    pub response: Duration,
    /// `forget_at = now + forget`; never shorter than `response`.
    pub forget: Duration,
}

impl Windows {
    /// The windows of `retention`, whose tombstone horizon is `default_horizon` unless it sets
    /// its own. The forget horizon is never shorter than the response window: a horizon not
    /// longer than it means no tombstone tier.
    pub(crate) fn of(retention: &Retention, default_horizon: Duration) -> Windows {
        let horizon = retention.horizon.unwrap_or(default_horizon);
        Windows {
            response: retention.response,
            forget: horizon.max(retention.response),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn retention_is_the_longest_window() {
        let p = RetentionPolicy::new()
            .client_retry(H)
            .queue_redrive(2 * H)
            .operator_replay(5 * H)
            .webhook_replay(3 * H);
        assert_eq!(p.retention(), 5 * H);
        assert_eq!(p.longest_window(), ("operator replay", 5 * H));
        assert_eq!(RetentionPolicy::new().retention(), Duration::ZERO);
        let tie = RetentionPolicy::new().queue_redrive(H).settlement(H);
        assert_eq!(tie.longest_window(), ("queue redrive", H));
    }

    #[test]
    fn retention_of_a_policy_names_its_window() {
        let r = Retention::of(
            &RetentionPolicy::new()
                .settlement(H)
                .tombstone_horizon(9 * H),
        );
        assert_eq!(r.response, H);
        assert_eq!(r.horizon, Some(9 * H));
        assert_eq!(r.window, Some("settlement"));
    }

    /// Every retention (with its own horizon shorter, equal, longer, or none) against a store
    /// horizon shorter and longer than it: the response window is the retention, the forget
    /// horizon the policy's or else the store's, never shorter than the response window.
    #[test]
    fn exhaustive_windows_table() {
        for response in [Duration::ZERO, H, 3 * H] {
            for own in [
                None,
                Some(Duration::ZERO),
                Some(H),
                Some(2 * H),
                Some(9 * H),
            ] {
                for default in [Duration::ZERO, 2 * H, 7 * 24 * H] {
                    let r = Retention {
                        response,
                        horizon: own,
                        window: None,
                    };
                    let w = Windows::of(&r, default);
                    let case = format!("response={response:?} own={own:?} default={default:?}");
                    assert_eq!(w.response, response, "{case}");
                    let horizon = own.unwrap_or(default);
                    let want = if horizon > response {
                        horizon
                    } else {
                        response
                    };
                    assert_eq!(w.forget, want, "{case}");
                    assert!(w.forget >= w.response, "{case}");
                }
            }
        }
    }
}
