//! A retention shorter than the lease is refused at open with a typed `Error::Config` whose
//! message says which retention and what to change — for plain durations, per-operation
//! overrides and named-window policies alike. (A record must outlive its lease, or a live lease
//! could be taken from its holder.)

use std::time::Duration;

use idem::{Error, RetentionPolicy, Store, StoreBuilder};

const LEASE: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_secs(29);

#[track_caller]
fn refused(builder: StoreBuilder, mentions: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    match builder
        .lease_duration(LEASE)
        .open(dir.path().join("idem.redb"))
    {
        Err(Error::Config { reason }) => {
            for m in mentions {
                assert!(reason.contains(m), "{reason:?} does not mention {m:?}");
            }
            assert!(reason.contains("shorter than the lease"), "{reason}");
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
}

#[track_caller]
fn accepted(builder: StoreBuilder) {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = builder
        .lease_duration(LEASE)
        .open(dir.path().join("idem.redb"));
    assert!(opened.is_ok(), "{opened:?}");
}

#[test]
fn a_plain_retention_shorter_than_the_lease_is_refused() {
    refused(Store::builder().retention(SHORT), &["default retention"]);
    refused(Store::builder().retention_for("otp", SHORT), &["\"otp\""]);
    accepted(Store::builder().retention(LEASE));
}

#[test]
fn a_policy_shorter_than_the_lease_is_refused_and_names_its_longest_window() {
    refused(
        Store::builder().retention_policy(RetentionPolicy::new().client_retry(SHORT)),
        &["default retention", "client retry"],
    );
    refused(
        Store::builder().retention_policy_for(
            "webhook",
            RetentionPolicy::new()
                .client_retry(Duration::from_secs(5))
                .webhook_replay(SHORT),
        ),
        &["\"webhook\"", "webhook replay"],
    );
    // A policy with no window set keeps nothing: refused too.
    refused(
        Store::builder().retention_policy_for("empty", RetentionPolicy::new()),
        &["\"empty\""],
    );
    // One long window is enough.
    accepted(
        Store::builder().retention_policy(
            RetentionPolicy::new()
                .client_retry(SHORT)
                .operator_replay(LEASE),
        ),
    );
}

#[test]
fn the_error_says_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Store::builder()
        .lease_duration(LEASE)
        .retention(SHORT)
        .open(dir.path().join("idem.redb"))
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("lengthen the retention or shorten the lease"),
        "{text}"
    );
}

#[test]
fn sweep_settings_must_be_usable() {
    let dir = tempfile::tempdir().expect("tempdir");
    for builder in [
        Store::builder().sweep_batch(0),
        Store::builder().sweep_interval(Duration::ZERO),
    ] {
        assert!(matches!(
            builder.open(dir.path().join("idem.redb")),
            Err(Error::Config { .. })
        ));
    }
}
