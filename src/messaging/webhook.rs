//! Webhook signature verification, to run **before** anything is persisted (then call
//! [`crate::Store::receive`] with the delivery id).
//!
//! - GitHub style ([`verify_github`]): `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of
//!   the raw body.
//! - Standard Webhooks ([`StandardWebhooks`]): `webhook-id`, `webhook-timestamp`,
//!   `webhook-signature: v1,<base64> [v1,<base64> …]`, the HMAC-SHA256 of
//!   `id.timestamp.body` under the base64 secret after `whsec_`, with a timestamp tolerance
//!   (default 5 minutes, both directions).
//!
//! HMAC and SHA-256 come from RustCrypto (`hmac`, `sha2`); comparisons use `Mac::verify_slice`
//! (constant time).
//!
//! # Example
//!
//! A Standard Webhooks endpoint: verify the headers and the raw body, then record the receipt
//! under the `webhook-id` (the delivery id) with the work it causes, in one transaction. A
//! redelivery is a duplicate: answer 2xx so the sender stops. (GitHub's scheme is the same
//! with [`verify_github`] and the `X-GitHub-Delivery` id: see [`crate::Store::receive`].)
//!
//! ```
//! use idem::inbox::ReceiveAnswer;
//! use idem::redb::TableDefinition;
//! use idem::webhook::{StandardWebhooks, WebhookError};
//! use idem::{Store, Timestamp};
//!
//! const EVENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("provider_events");
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("idem.redb"))?;
//! let verifier = StandardWebhooks::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
//!
//! // The request, as received (the Standard Webhooks specification's example).
//! let (id, timestamp) = ("msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330");
//! let signature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
//! let body = br#"{"test": 2432232314}"#;
//! let now = Timestamp(1_614_265_330_000 + 30_000); // 30 s later; in a service: store.now()
//!
//! verifier.verify(Some(id), Some(timestamp), Some(signature), body, now)?;
//! let first = store.receive("acme-payments", id, |tx| {
//!     tx.open_table(EVENTS)?.insert(id, &body[..])?;
//!     Ok(())
//! })?;
//! assert!(matches!(first, ReceiveAnswer::Ran(())));
//! let again = store.receive("acme-payments", id, |_tx| Ok(()))?;
//! assert!(matches!(again, ReceiveAnswer::Duplicate { rejection: None, .. }));
//!
//! // An altered body, or a replay of the request an hour later, is rejected before any write.
//! let altered = verifier.verify(Some(id), Some(timestamp), Some(signature), b"{}", now);
//! assert_eq!(altered, Err(WebhookError::BadSignature));
//! let late = Timestamp(now.as_millis() + 3_600_000);
//! let replayed = verifier.verify(Some(id), Some(timestamp), Some(signature), body, late);
//! assert!(matches!(replayed, Err(WebhookError::OutsideTolerance { .. })));
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::model::clock::Timestamp;

type HmacSha256 = Hmac<Sha256>;

/// Why a webhook was rejected. Nothing was persisted; answer 400 or 401 and do not process it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// A required header is absent.
    #[error("the {name} header is missing: the request is not a signed webhook; reject it (401)")]
    MissingHeader {
        /// The header's name.
        name: &'static str,
    },
    /// A header does not have the documented form.
    #[error("the {name} header is malformed ({reason}); reject the request (400)")]
    Malformed {
        /// The header's name.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// No signature matched the body under the secret.
    #[error(
        "no webhook signature matches the body: the request was forged or altered, or the secret is wrong; reject it (401) and check the configured secret"
    )]
    BadSignature,
    /// The signed timestamp is too far from now (a replay of an old request, or clock skew).
    #[error(
        "the webhook timestamp is {skew:?} away from now, beyond the tolerance of {tolerance:?}: reject it (401); if the sender's clock is off, fix it or widen the tolerance"
    )]
    OutsideTolerance {
        /// How far the timestamp is from now.
        skew: Duration,
        /// The configured tolerance.
        tolerance: Duration,
    },
    /// The configured secret is unusable.
    #[error(
        "the webhook secret is invalid ({reason}): configure the secret exactly as the sender shows it"
    )]
    BadSecret {
        /// What is wrong.
        reason: String,
    },
}

/// Verifies a GitHub-style `X-Hub-Signature-256` header (`sha256=` followed by the lowercase
/// hex HMAC-SHA256 of the raw `body` under `secret`). `header` is the header's value, `None`
/// if absent. Pass the body bytes exactly as received, before any parsing.
///
/// An empty `secret` is [`WebhookError::BadSecret`] for every request, checked first: anyone
/// can compute an HMAC under the empty key, so accepting it would accept forged requests (an
/// unset environment variable is the usual cause).
///
/// # Example
///
/// GitHub's documented example: the secret `It's a Secret to Everybody` signs `Hello, World!`.
///
/// ```
/// use idem::webhook::{WebhookError, verify_github};
///
/// let secret = b"It's a Secret to Everybody";
/// let header = Some("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17");
/// assert_eq!(verify_github(secret, b"Hello, World!", header), Ok(()));
/// assert_eq!(verify_github(secret, b"Hello, World?", header), Err(WebhookError::BadSignature));
/// assert!(matches!(
///     verify_github(secret, b"Hello, World!", None),
///     Err(WebhookError::MissingHeader { name: "X-Hub-Signature-256" })
/// ));
/// assert!(matches!(verify_github(b"", b"Hello, World!", header), Err(WebhookError::BadSecret { .. })));
/// ```
pub fn verify_github(secret: &[u8], body: &[u8], header: Option<&str>) -> Result<(), WebhookError> {
    const NAME: &str = "X-Hub-Signature-256";
    let mut mac = mac(secret)?;
    let header = header.ok_or(WebhookError::MissingHeader { name: NAME })?;
    let hex = header
        .trim()
        .strip_prefix("sha256=")
        .ok_or_else(|| WebhookError::Malformed {
            name: NAME,
            reason: "it does not start with \"sha256=\"".into(),
        })?;
    let expected = decode_hex(hex).ok_or_else(|| WebhookError::Malformed {
        name: NAME,
        reason: "the signature is not 64 hex digits".into(),
    })?;
    mac.update(body);
    mac.verify_slice(&expected)
        .map_err(|_| WebhookError::BadSignature)
}

/// A Standard Webhooks verifier for one secret.
///
/// # Example
///
/// The specification's example request, checked at a time within the tolerance; during a
/// key rotation the sender signs with both secrets, and either signature is enough.
///
/// ```
/// use std::time::Duration;
/// use idem::Timestamp;
/// use idem::webhook::StandardWebhooks;
///
/// # fn main() -> Result<(), idem::webhook::WebhookError> {
/// let verifier = StandardWebhooks::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?
///     .tolerance(Duration::from_secs(60));
/// let signatures = "v1,bm90LXRoZS1uZXctc2lnbmF0dXJl v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
/// verifier.verify(
///     Some("msg_p5jXN8AQM9LWM0D4loKWxJek"), // webhook-id: the delivery id
///     Some("1614265330"),                   // webhook-timestamp
///     Some(signatures),                     // webhook-signature
///     br#"{"test": 2432232314}"#,
///     Timestamp(1_614_265_345_000),         // now: 15 s after the timestamp
/// )?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct StandardWebhooks {
    key: Vec<u8>,
    tolerance: Duration,
}

impl std::fmt::Debug for StandardWebhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandardWebhooks")
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

impl StandardWebhooks {
    /// A verifier for `secret` as the sender shows it: `whsec_` followed by base64 (the prefix
    /// is optional). Tolerance 5 minutes.
    pub fn new(secret: &str) -> Result<Self, WebhookError> {
        let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
        let key = STANDARD.decode(b64).map_err(|e| WebhookError::BadSecret {
            reason: format!("not base64 after \"whsec_\": {e}"),
        })?;
        if key.is_empty() {
            return Err(WebhookError::BadSecret {
                reason: "it is empty".into(),
            });
        }
        Ok(StandardWebhooks {
            key,
            tolerance: Duration::from_secs(300),
        })
    }

    /// How far the signed timestamp may be from now, in either direction. Default 5 minutes.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies a request: the `webhook-id`, `webhook-timestamp` (Unix seconds) and
    /// `webhook-signature` header values (`None` if absent), the raw body, and the current time
    /// (e.g. [`crate::Store::now`]). Any one `v1,` signature in the space-separated list may
    /// match (key rotation); other versions are ignored. On success, the `webhook-id` is the
    /// delivery id to pass to [`crate::Store::receive`].
    pub fn verify(
        &self,
        id: Option<&str>,
        timestamp: Option<&str>,
        signatures: Option<&str>,
        body: &[u8],
        now: Timestamp,
    ) -> Result<(), WebhookError> {
        let id = id.ok_or(WebhookError::MissingHeader { name: "webhook-id" })?;
        let ts_text = timestamp.ok_or(WebhookError::MissingHeader {
            name: "webhook-timestamp",
        })?;
        let signatures = signatures.ok_or(WebhookError::MissingHeader {
            name: "webhook-signature",
        })?;
        let ts: u64 = ts_text
            .trim()
            .parse()
            .map_err(|_| WebhookError::Malformed {
                name: "webhook-timestamp",
                reason: "not a number of seconds since the Unix epoch".into(),
            })?;
        let now_secs = now.as_millis() / 1000;
        let skew = Duration::from_secs(ts.abs_diff(now_secs));
        if skew > self.tolerance {
            return Err(WebhookError::OutsideTolerance {
                skew,
                tolerance: self.tolerance,
            });
        }
        let mut base = mac(&self.key)?;
        base.update(id.as_bytes());
        base.update(b".");
        base.update(ts_text.trim().as_bytes());
        base.update(b".");
        base.update(body);
        let mut any_v1 = false;
        for sig in signatures.split_whitespace() {
            let Some(b64) = sig.strip_prefix("v1,") else {
                continue;
            };
            any_v1 = true;
            let Ok(bytes) = STANDARD.decode(b64) else {
                continue;
            };
            if base.clone().verify_slice(&bytes).is_ok() {
                return Ok(());
            }
        }
        if any_v1 {
            Err(WebhookError::BadSignature)
        } else {
            Err(WebhookError::Malformed {
                name: "webhook-signature",
                reason: "no \"v1,<base64>\" signature in it".into(),
            })
        }
    }
}

/// The HMAC under `key`. Every verification goes through here, so an empty key (anyone can
/// sign with it) is refused for all of them.
fn mac(key: &[u8]) -> Result<HmacSha256, WebhookError> {
    if key.is_empty() {
        return Err(WebhookError::BadSecret {
            reason: "it is empty, so anyone could sign; is its setting unset?".into(),
        });
    }
    HmacSha256::new_from_slice(key).map_err(|e| WebhookError::BadSecret {
        reason: e.to_string(),
    })
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_decoding_rejects_bad_input() {
        assert_eq!(decode_hex(&"0".repeat(63)), None);
        assert_eq!(decode_hex(&"g".repeat(64)), None);
        assert_eq!(decode_hex(&"aF".repeat(32)), Some(vec![0xaf; 32]));
    }
}
