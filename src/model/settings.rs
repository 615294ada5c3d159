//! The settings every engine shares — retention, tombstone horizon, leases, limits, the
//! response cap, sweeps, the inbox retention — with their documented defaults and the checks
//! an open makes on them ([`Config::validate`]). Each engine's builder holds one [`Config`] and
//! gets the same setter methods from [`common_settings!`] (so the defaults, the docs and the
//! refusals are written once); its own settings (a file's cache and durability, a server's
//! connection pool) are its own.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::Error;
use crate::model::retention::{Retention, Windows};
use crate::model::scope::Limits;

/// Ceiling for `max_response_bytes`: records are meant to be small.
pub(crate) const MAX_RESPONSE_CEILING: usize = 16 * 1024 * 1024;

/// Settings, fixed when the store opens. Defaults in [`Config::default`] (and in each
/// builder's table).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub retention: Retention,
    pub retention_overrides: HashMap<String, Retention>,
    pub tombstone_horizon: Duration,
    pub lease_duration: Duration,
    pub retry_after_cap: Duration,
    pub limits: Limits,
    pub max_response_bytes: usize,
    pub sweep_interval: Option<Duration>,
    pub sweep_batch: usize,
    pub inbox_retention: Duration,
}

impl Default for Config {
    /// Retention 24 h (Stripe keeps keys ≥ 24 h), tombstone horizon 7 days, lease 30 s,
    /// `retry_after` cap 1 s, default limits, 64 KiB responses, no background sweeper, 1,000
    /// records per sweep batch, inbox marks kept 7 days.
    fn default() -> Self {
        Config {
            retention: Retention::plain(Duration::from_secs(24 * 3600)),
            retention_overrides: HashMap::new(),
            tombstone_horizon: Duration::from_secs(7 * 24 * 3600),
            lease_duration: Duration::from_secs(30),
            retry_after_cap: Duration::from_secs(1),
            limits: Limits::default(),
            max_response_bytes: 64 * 1024,
            sweep_interval: None,
            sweep_batch: 1000,
            inbox_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl Config {
    /// The response window and the forget horizon of `operation`'s records, counted from the
    /// moment an intent finishes. The horizon is never shorter than the response window.
    pub(crate) fn windows_for(&self, operation: &str) -> Windows {
        let r = self
            .retention_overrides
            .get(operation)
            .unwrap_or(&self.retention);
        Windows::of(r, self.tombstone_horizon)
    }

    /// The checks every engine makes at open: limits, a lease that can finish, every
    /// retention at least the lease (a record must outlive its lease), an inbox retention, a
    /// sweep that can make progress, a response cap under the ceiling.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let c = self;
        c.limits.validate()?;
        if c.lease_duration.is_zero() {
            return Err(Error::Config {
                reason: "lease_duration is zero; give leases time to finish (default 30 s)".into(),
            });
        }
        let retentions = std::iter::once((None, &c.retention)).chain(
            c.retention_overrides
                .iter()
                .map(|(op, r)| (Some(op.as_str()), r)),
        );
        for (operation, r) in retentions {
            if r.response < c.lease_duration {
                let whose = match operation {
                    None => "the default retention".to_owned(),
                    Some(op) => format!("the retention of operation {op:?}"),
                };
                let window = match r.window {
                    Some(_) if r.response.is_zero() => " (its policy sets no window)".to_owned(),
                    Some(w) => format!(" (its longest window is {w})"),
                    None => String::new(),
                };
                return Err(Error::Config {
                    reason: format!(
                        "{whose} is {:?}{window}, shorter than the lease duration ({:?}): a record must outlive its lease; lengthen the retention or shorten the lease",
                        r.response, c.lease_duration
                    ),
                });
            }
        }
        if c.inbox_retention.is_zero() {
            return Err(Error::Config {
                reason: "inbox_retention is zero; inbox marks must outlive the broker's redelivery window (default 7 days)".into(),
            });
        }
        if c.sweep_batch == 0 {
            return Err(Error::Config {
                reason: "sweep_batch is 0; a sweep must be allowed at least one record per transaction (default 1,000)".into(),
            });
        }
        if c.sweep_interval.is_some_and(|i| i.is_zero()) {
            return Err(Error::Config {
                reason: "sweep_interval is zero; give the background sweeper a period (e.g. one minute), or leave it unset and call Store::sweep".into(),
            });
        }
        if c.max_response_bytes > MAX_RESPONSE_CEILING {
            return Err(Error::Config {
                reason: format!(
                    "max_response_bytes is {}; the ceiling is {MAX_RESPONSE_CEILING}: store a pointer instead of a large body",
                    c.max_response_bytes
                ),
            });
        }
        Ok(())
    }
}

/// The setter methods of the settings every engine shares, for a builder with a `config:
/// Config` field (written once, so both engines' builders take, document and refuse them
/// alike). Expanded inside the builder's `impl` block.
macro_rules! common_settings {
    () => {
        /// How long a finished record is replayed in full after it finished (its response
        /// window); then it is a tombstone until the [`tombstone_horizon`](Self::tombstone_horizon).
        /// Choose the longest of your client-retry, queue-redrive, webhook-replay, operator-replay
        /// and settlement windows, or state them with [`retention_policy`](Self::retention_policy).
        /// Must be at least the lease duration. Default 24 h.
        pub fn retention(mut self, retention: std::time::Duration) -> Self {
            self.config.retention = $crate::model::retention::Retention::plain(retention);
            self
        }

        /// A retention for one operation, overriding [`retention`](Self::retention). Its tombstone
        /// horizon is the store's.
        pub fn retention_for(
            mut self,
            operation: impl Into<String>,
            retention: std::time::Duration,
        ) -> Self {
            self.config.retention_overrides.insert(
                operation.into(),
                $crate::model::retention::Retention::plain(retention),
            );
            self
        }

        /// The default retention as named windows: the longest one is the retention. A horizon set
        /// on the policy replaces the store's [`tombstone_horizon`](Self::tombstone_horizon) for
        /// operations without an override.
        pub fn retention_policy(mut self, policy: $crate::RetentionPolicy) -> Self {
            self.config.retention = $crate::model::retention::Retention::of(&policy);
            self
        }

        /// The retention of one operation as named windows, overriding the default.
        pub fn retention_policy_for(
            mut self,
            operation: impl Into<String>,
            policy: $crate::RetentionPolicy,
        ) -> Self {
            self.config.retention_overrides.insert(
                operation.into(),
                $crate::model::retention::Retention::of(&policy),
            );
            self
        }

        /// How long after an intent finished its key stays bound, counted like the retention.
        /// After the response window the record is a tombstone (fingerprint, status, resource
        /// pointer, no body) until this horizon: a late retry gets [`ExecuteAnswer::Expired`](crate::ExecuteAnswer::Expired)
        /// instead of running again, and a different payload is still
        /// [`Error::PayloadMismatch`](crate::Error::PayloadMismatch). After it the key is free. A
        /// horizon not longer than an operation's retention means no tombstone phase for it.
        /// Default 7 days.
        pub fn tombstone_horizon(mut self, horizon: std::time::Duration) -> Self {
            self.config.tombstone_horizon = horizon;
            self
        }

        /// Runs a sweep pass (the store's `sweep`) every `interval` on a background thread,
        /// which stops when the last handle to the store is dropped. Default: no background
        /// sweeper.
        pub fn sweep_interval(mut self, interval: std::time::Duration) -> Self {
            self.config.sweep_interval = Some(interval);
            self
        }

        /// The most records one sweep write transaction shrinks or deletes (a claim waits behind
        /// at most one such batch). Default 1,000.
        pub fn sweep_batch(mut self, records: usize) -> Self {
            self.config.sweep_batch = records;
            self
        }

        /// How long a flow-B lease lives without a heartbeat. Default 30 s.
        pub fn lease_duration(mut self, lease: std::time::Duration) -> Self {
            self.config.lease_duration = lease;
            self
        }

        /// The longest `retry_after` hint given with an in-flight answer (the hint is the lease's
        /// remaining time, capped by this). Default 1 s.
        pub fn retry_after_cap(mut self, cap: std::time::Duration) -> Self {
            self.config.retry_after_cap = cap;
            self
        }

        /// Size limits on tenant, operation and key. Default: key ≤ 255 B, tenant ≤ 128 B,
        /// operation ≤ 128 B.
        pub fn limits(mut self, limits: $crate::store::Limits) -> Self {
            self.config.limits = limits;
            self
        }

        /// The largest stored response (body plus resource pointer), in bytes. Default 64 KiB.
        pub fn max_response_bytes(mut self, bytes: usize) -> Self {
            self.config.max_response_bytes = bytes;
            self
        }

        /// How long an inbox mark (`process`) or a webhook receipt (`receive`) keeps answering
        /// `Duplicate` after the message was processed; then a sweep removes it and a
        /// redelivery would be processed again. Choose it longer than the longest redelivery
        /// window of the broker or webhook sender (GitHub: 3 days). Default 7 days.
        pub fn inbox_retention(mut self, retention: std::time::Duration) -> Self {
            self.config.inbox_retention = retention;
            self
        }
    };
}
pub(crate) use common_settings;
