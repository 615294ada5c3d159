//! Logs (tracing-subscriber on stderr, `RUST_LOG`) and, with the `metrics` feature, the
//! Prometheus recorder behind `GET /metrics`.

use axum::Router;
#[cfg(feature = "metrics")]
use axum::http::header::CONTENT_TYPE;
#[cfg(feature = "metrics")]
use axum::routing::get;

#[cfg(feature = "metrics")]
use crate::*;

/// Logs with tracing-subscriber's fmt subscriber on stderr, filtered by `RUST_LOG` (default
/// `info`; an unreadable value falls back to it). With idem's `tracing` feature, idem's warnings
/// appear there (a failed background sweep or dispatcher round, an answer that could not be
/// recorded, a failed heartbeat), and `RUST_LOG=idem=debug` adds a line per decision (inside its
/// `execute` / `begin` / `finish` span: engine, tenant, operation, decision) and per group-commit
/// batch. The service's own lines (listening, shutting down, stopped) are printed directly and
/// come whatever the filter.
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // `try_init`: a subscriber set before (none in this binary) stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The content type of the Prometheus text exposition format.
#[cfg(feature = "metrics")]
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Histogram buckets of the latencies (`*_seconds`): 100 µs to 2.5 s.
#[cfg(feature = "metrics")]
pub(crate) const SECONDS_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// Histogram buckets of `idem_commit_batch_size`: powers of two up to the default `max_batch`.
#[cfg(feature = "metrics")]
pub(crate) const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// What the service exposes about itself besides its logs: with idem's `metrics` feature,
/// `GET /metrics` in the Prometheus text format (every counter, gauge and histogram idem
/// records, e.g. `idem_outcomes_total{call="begin",operation="POST /v1/payments",outcome="replayed"}`),
/// from metrics-exporter-prometheus's recorder; without the feature, nothing.
#[derive(Clone, Default)]
pub struct Telemetry {
    #[cfg(feature = "metrics")]
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl Telemetry {
    /// Installs the Prometheus recorder as the process's `metrics` recorder (feature `metrics`;
    /// nothing without it). Latencies and batch sizes are rendered as Prometheus histograms.
    pub fn install() -> Result<Telemetry, String> {
        #[cfg(feature = "metrics")]
        let telemetry = {
            use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("idem_commit_batch_size".into()),
                        &BATCH_BUCKETS,
                    )
                })
                .and_then(|b| b.install_recorder())
                .map_err(|e| format!("cannot install the Prometheus metrics recorder: {e}"))?;
            Telemetry {
                prometheus: Some(handle),
            }
        };
        #[cfg(not(feature = "metrics"))]
        let telemetry = Telemetry::default();
        Ok(telemetry)
    }

    /// `GET /metrics` (feature `metrics`), outside the Idempotency-Key layer and without a
    /// tenant; no route without the feature.
    pub fn routes(&self) -> Router {
        #[cfg(feature = "metrics")]
        if let Some(handle) = self.prometheus.clone() {
            return Router::new().route(
                "/metrics",
                get(move || {
                    let text = handle.render();
                    async move { ([(CONTENT_TYPE, PROMETHEUS_TEXT)], text) }
                }),
            );
        }
        Router::new()
    }

    /// Runs the recorder's upkeep (it drains histogram samples) every 5 s on the runtime.
    pub(crate) fn spawn_upkeep(&self) {
        #[cfg(feature = "metrics")]
        if let Some(handle) = self.prometheus.clone() {
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    handle.run_upkeep();
                }
            });
        }
    }
}
