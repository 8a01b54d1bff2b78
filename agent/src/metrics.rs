//! The agent's own metrics (`streamapp_agent_*`) and its HTTP endpoints: `/metrics`,
//! `/healthz` and `/identity` (crate::identity).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::error::{Error, Result};
use crate::identity::IdentitySource;

/// Prefix of every metric of the agent.
pub const PREFIX: &str = "streamapp_agent";

/// What the agent counts.
pub struct Metrics {
    registry: Registry,
    /// Status entries written.
    pub reports_written: Counter,
    /// Status writes that failed.
    pub report_errors: Counter,
    /// Unix time of the last successful write, in seconds.
    pub last_report_time: Gauge<f64, AtomicU64>,
    /// Whether the processor answered /healthz at the last look (1 or 0).
    pub processor_up: Gauge,
    /// StoreQuarantined Events published.
    pub quarantine_events: Counter,
    /// StoreBackingOff Events published.
    pub backoff_events: Counter,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let reports_written = Counter::default();
        let report_errors = Counter::default();
        let last_report_time = Gauge::<f64, AtomicU64>::default();
        let processor_up = Gauge::default();
        let quarantine_events = Counter::default();
        let backoff_events = Counter::default();
        registry.register(
            "reports_written",
            "Status entries written to the StreamApp",
            reports_written.clone(),
        );
        registry.register(
            "report_errors",
            "Status writes that failed",
            report_errors.clone(),
        );
        registry.register(
            "last_report_timestamp_seconds",
            "Unix time of the last successful status write",
            last_report_time.clone(),
        );
        registry.register(
            "processor_up",
            "Whether the processor answered /healthz at the last look",
            processor_up.clone(),
        );
        registry.register(
            "quarantine_events",
            "StoreQuarantined Events published",
            quarantine_events.clone(),
        );
        registry.register(
            "backoff_events",
            "StoreBackingOff Events published",
            backoff_events.clone(),
        );
        Metrics {
            registry,
            reports_written,
            report_errors,
            last_report_time,
            processor_up,
            quarantine_events,
            backoff_events,
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut body = String::new();
        prometheus_client::encoding::text::encode(&mut body, &self.registry)
            .expect("writing to a String cannot fail");
        body
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Binds `0.0.0.0:port` and serves `/metrics`, `/healthz` and `/identity` until the process
/// ends.
pub async fn serve(port: u16, metrics: Arc<Metrics>, identity: Arc<IdentitySource>) -> Result<()> {
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })?;
    let app = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics)
        .merge(
            Router::new()
                .route(streamapp_api::identity::PATH, get(crate::identity::page))
                .with_state(identity),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics server stopped");
        }
    });
    Ok(())
}

async fn metrics_page(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_carry_the_agent_prefix() {
        let m = Metrics::new();
        m.reports_written.inc();
        m.last_report_time.set(1.5);
        let text = m.encode();
        assert!(
            text.contains("streamapp_agent_reports_written_total 1"),
            "{text}"
        );
        assert!(
            text.contains("streamapp_agent_report_errors_total 0"),
            "{text}"
        );
        assert!(
            text.contains("streamapp_agent_last_report_timestamp_seconds 1.5"),
            "{text}"
        );
    }
}
