//! Webhooks: signatures verified against the published test vectors (GitHub's documented
//! example, the Standard Webhooks spec's example), rejections persist nothing, a replayed
//! delivery id is a duplicate with one effect.
#![cfg(feature = "webhooks")]

use crate::common;

use std::time::Duration;

use common::{Harness, bump, effects};
use idem::Timestamp;
use idem::inbox::ReceiveAnswer;
use idem::webhook::{StandardWebhooks, WebhookError, verify_github};

const GH_SECRET: &[u8] = b"It's a Secret to Everybody";
const GH_BODY: &[u8] = b"Hello, World!";
const GH_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TS: &str = "1614265330";
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn at(secs: u64) -> Timestamp {
    Timestamp(secs * 1000)
}

#[test]
fn github_documented_example_verifies() {
    verify_github(GH_SECRET, GH_BODY, Some(GH_SIG)).unwrap();
    let upper = GH_SIG.replace("757107ea", "757107EA");
    verify_github(GH_SECRET, GH_BODY, Some(&upper)).unwrap();
}

#[test]
fn github_bad_or_missing_signatures_are_rejected() {
    assert_eq!(
        verify_github(GH_SECRET, b"Hello, World?", Some(GH_SIG)),
        Err(WebhookError::BadSignature)
    );
    assert_eq!(
        verify_github(b"wrong secret", GH_BODY, Some(GH_SIG)),
        Err(WebhookError::BadSignature)
    );
    assert!(matches!(
        verify_github(GH_SECRET, GH_BODY, None),
        Err(WebhookError::MissingHeader { .. })
    ));
    for bad in [
        "757107ea",
        "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "sha256=zz",
        "sha256=",
    ] {
        assert!(
            matches!(
                verify_github(GH_SECRET, GH_BODY, Some(bad)),
                Err(WebhookError::Malformed { .. })
            ),
            "{bad}"
        );
    }
}

/// `verify_github` accepted an empty secret, so anyone could sign a forged
/// request (the HMAC under the empty key). It is refused like `StandardWebhooks::new("")`,
/// before the header is even looked at, whatever the request carries.
#[test]
fn an_empty_github_secret_is_refused_as_a_bad_secret() {
    use hmac::Mac;
    // A request "signed" with the empty key: what a forger would send.
    let mut forged = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"").unwrap();
    forged.update(b"{\"action\":\"refund\"}");
    let hex: String = forged
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let header = format!("sha256={hex}");
    for (body, header) in [
        (&b"{\"action\":\"refund\"}"[..], Some(header.as_str())),
        (GH_BODY, Some(GH_SIG)),
        (GH_BODY, None),
        (GH_BODY, Some("garbage")),
    ] {
        assert!(
            matches!(
                verify_github(b"", body, header),
                Err(WebhookError::BadSecret { .. })
            ),
            "{header:?}"
        );
    }
    let message = verify_github(b"", GH_BODY, Some(GH_SIG))
        .unwrap_err()
        .to_string();
    assert!(message.contains("empty"), "{message}");
    // The Standard Webhooks twin, for symmetry.
    for secret in ["", "whsec_"] {
        assert!(matches!(
            StandardWebhooks::new(secret),
            Err(WebhookError::BadSecret { .. })
        ));
    }
}

#[test]
fn standard_webhooks_spec_example_verifies() {
    let v = StandardWebhooks::new(SW_SECRET).unwrap();
    v.verify(
        Some(SW_ID),
        Some(SW_TS),
        Some(SW_SIG),
        SW_BODY,
        at(1_614_265_330),
    )
    .unwrap();
    // Key rotation: several signatures, one of them valid, other versions ignored.
    let rotated = format!("v1,bm90IHRoZSByaWdodCBvbmU= v1a,xyz {SW_SIG}");
    v.verify(
        Some(SW_ID),
        Some(SW_TS),
        Some(&rotated),
        SW_BODY,
        at(1_614_265_330),
    )
    .unwrap();
}

#[test]
fn standard_webhooks_rejections() {
    let v = StandardWebhooks::new(SW_SECRET).unwrap();
    let now = at(1_614_265_330);
    let check = |id: Option<&str>, ts: Option<&str>, sig: Option<&str>, body: &[u8], now| {
        v.verify(id, ts, sig, body, now)
    };
    assert_eq!(
        check(
            Some(SW_ID),
            Some(SW_TS),
            Some(SW_SIG),
            br#"{"test": 2432232315}"#,
            now
        ),
        Err(WebhookError::BadSignature)
    );
    assert_eq!(
        check(Some("msg_other"), Some(SW_TS), Some(SW_SIG), SW_BODY, now),
        Err(WebhookError::BadSignature)
    );
    for (id, ts, sig) in [
        (None, Some(SW_TS), Some(SW_SIG)),
        (Some(SW_ID), None, Some(SW_SIG)),
        (Some(SW_ID), Some(SW_TS), None),
    ] {
        assert!(matches!(
            check(id, ts, sig, SW_BODY, now),
            Err(WebhookError::MissingHeader { .. })
        ));
    }
    assert!(matches!(
        check(Some(SW_ID), Some("yesterday"), Some(SW_SIG), SW_BODY, now),
        Err(WebhookError::Malformed { .. })
    ));
    assert!(matches!(
        check(Some(SW_ID), Some(SW_TS), Some("v2,abc"), SW_BODY, now),
        Err(WebhookError::Malformed { .. })
    ));
    // Tolerance: 5 minutes in both directions.
    for skew in [301i64, -301] {
        let now = at((1_614_265_330i64 + skew) as u64);
        assert!(matches!(
            check(Some(SW_ID), Some(SW_TS), Some(SW_SIG), SW_BODY, now),
            Err(WebhookError::OutsideTolerance { .. })
        ));
    }
    for skew in [300i64, -300] {
        let now = at((1_614_265_330i64 + skew) as u64);
        check(Some(SW_ID), Some(SW_TS), Some(SW_SIG), SW_BODY, now).unwrap();
    }
    let tight = StandardWebhooks::new(SW_SECRET)
        .unwrap()
        .tolerance(Duration::from_secs(10));
    assert!(
        tight
            .verify(
                Some(SW_ID),
                Some(SW_TS),
                Some(SW_SIG),
                SW_BODY,
                at(1_614_265_341)
            )
            .is_err()
    );
    assert!(matches!(
        StandardWebhooks::new("whsec_***"),
        Err(WebhookError::BadSecret { .. })
    ));
}

/// A webhook endpoint: verify, then record the receipt with the effect.
fn handle(
    store: &idem::Store,
    verifier: &StandardWebhooks,
    sig: &str,
    body: &[u8],
) -> Result<ReceiveAnswer<()>, String> {
    verifier
        .verify(Some(SW_ID), Some(SW_TS), Some(sig), body, at(1_614_265_330))
        .map_err(|e| e.to_string())?;
    store
        .receive("standard", SW_ID, |tx| bump(tx, "webhook"))
        .map_err(|e| e.to_string())
}

#[test]
fn a_replayed_delivery_is_a_duplicate_and_a_forged_one_persists_nothing() {
    let h = Harness::new();
    let store = h.store();
    let v = StandardWebhooks::new(SW_SECRET).unwrap();
    assert!(handle(store, &v, "v1,AAAA", SW_BODY).is_err());
    assert_eq!(effects(store, "webhook"), 0);
    assert_eq!(store.stats().unwrap().records, 0);
    // No receipt was written for the forged request: the genuine one is accepted.
    assert_eq!(
        handle(store, &v, SW_SIG, SW_BODY),
        Ok(ReceiveAnswer::Ran(()))
    );
    assert!(matches!(
        handle(store, &v, SW_SIG, SW_BODY),
        Ok(ReceiveAnswer::Duplicate { .. })
    ));
    assert_eq!(effects(store, "webhook"), 1);
    // Receipts are scoped by source, and separate from consumer inbox marks.
    assert_eq!(
        store
            .receive("github", SW_ID, |tx| bump(tx, "webhook"))
            .unwrap(),
        ReceiveAnswer::Ran(())
    );
    assert_eq!(store.inbox_mark("standard", SW_ID).unwrap(), None);
}

/// A redelivered webhook whose first delivery was rejected (terminal) is
/// answered with the same response, not a 2xx: `ReceiveAnswer::Duplicate` carries it. An accepted
/// delivery's duplicate carries none (answer 2xx).
#[test]
fn a_redelivered_rejected_webhook_answers_with_the_first_rejection() {
    let h = Harness::new();
    let store = h.store();
    let reject = |tx: &idem::Tx<'_>| -> Result<(), idem::Abort> {
        bump(tx, "webhook")?;
        Err(idem::Abort::terminal(idem::Response::new(
            422,
            "unknown event type",
        )))
    };
    let first = store.receive("github", "d-rejected", reject).unwrap();
    let ReceiveAnswer::Rejected(response) = first else {
        panic!("expected Rejected, got {first:?}")
    };
    assert_eq!(response.status(), 422);
    let again = store.receive("github", "d-rejected", reject).unwrap();
    assert_eq!(
        again,
        ReceiveAnswer::Duplicate {
            received_at: common::T0,
            rejection: Some(response),
        }
    );
    assert_eq!(effects(store, "webhook"), 1);
    let accept = |tx: &idem::Tx<'_>| bump(tx, "webhook");
    assert_eq!(
        store.receive("github", "d-ok", accept).unwrap(),
        ReceiveAnswer::Ran(())
    );
    assert!(matches!(
        store.receive("github", "d-ok", accept).unwrap(),
        ReceiveAnswer::Duplicate {
            rejection: None,
            ..
        }
    ));
}
