//! Prometheus metrics (prefix `streamapp_operator`) and the HTTP server for `/metrics`,
//! `/healthz` (liveness) and `/readyz` (readiness).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::error::{Error, Result};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

/// A StreamApp.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppLabels {
    pub namespace: String,
    pub name: String,
}

/// The operator's metrics. Cheap to clone counters; share it behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    /// Reconciliations run (successful or not).
    pub reconciliations: Counter,
    /// Failed reconciliations by [`Error::metric_label`].
    pub failures: Family<ErrorLabels, Counter>,
    /// How long a reconciliation takes.
    pub duration: Histogram,
    /// 1 while this instance holds the leader lease (or runs without election).
    pub leader: Gauge,
    /// Hanging transactions the transaction doctor last found, by StreamApp.
    pub hanging_transactions: Family<AppLabels, Gauge>,
    /// Hanging transactions the transaction doctor ended, by StreamApp.
    pub hanging_transactions_aborted: Family<AppLabels, Counter>,
    /// Pods of lost nodes the operator force-deleted (spec.nodeLoss), by StreamApp.
    pub lost_node_pods_replaced: Family<AppLabels, Counter>,
    /// Liveness and readiness, for the probes.
    pub probes: Probes,
}

/// What the probes answer. Live: the election loop (leader renewing or follower retrying)
/// made an attempt recently, so it is not wedged. Ready: a follower waiting for the lease (it
/// serves metrics and is ready to take over), or a leader whose StreamApp cache is synced.
pub struct Probes {
    ready: std::sync::atomic::AtomicBool,
    last_beat: std::sync::Mutex<Instant>,
}

/// A wedged election loop is one that made no attempt for this long.
pub const LIVENESS_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for Probes {
    fn default() -> Self {
        Probes {
            ready: Default::default(),
            last_beat: std::sync::Mutex::new(Instant::now()),
        }
    }
}

impl Probes {
    pub fn beat(&self) {
        *self.last_beat.lock().unwrap() = Instant::now();
    }

    pub fn is_live(&self) -> bool {
        self.last_beat.lock().unwrap().elapsed() < LIVENESS_WINDOW
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("streamapp_operator");
        let reconciliations = Counter::default();
        let failures = Family::<ErrorLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let leader = Gauge::default();
        let hanging_transactions = Family::<AppLabels, Gauge>::default();
        let hanging_transactions_aborted = Family::<AppLabels, Counter>::default();
        let lost_node_pods_replaced = Family::<AppLabels, Counter>::default();
        registry.register(
            "hanging_transactions",
            "Transactions open on a partition of the StreamApp's topics that no coordinator will end, at the last look",
            hanging_transactions.clone(),
        );
        registry.register(
            "hanging_transactions_aborted",
            "Hanging transactions the operator ended with an abort marker",
            hanging_transactions_aborted.clone(),
        );
        registry.register(
            "lost_node_pods_replaced",
            "Pods on lost nodes the operator force-deleted so that they run elsewhere (spec.nodeLoss)",
            lost_node_pods_replaced.clone(),
        );
        registry.register(
            "reconciliations",
            "StreamApp reconciliations run",
            reconciliations.clone(),
        );
        registry.register(
            "reconcile_failures",
            "StreamApp reconciliations that failed, by error",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time a StreamApp reconciliation takes",
            duration.clone(),
        );
        registry.register(
            "leader",
            "1 while this instance is the leader and runs the controller",
            leader.clone(),
        );
        Metrics {
            registry,
            reconciliations,
            failures,
            duration,
            leader,
            hanging_transactions,
            hanging_transactions_aborted,
            lost_node_pods_replaced,
            probes: Probes::default(),
        }
    }
}

impl Metrics {
    /// Starts timing a reconciliation; the returned guard records the duration when dropped.
    pub fn reconcile_started(&self) -> ReconcileTimer<'_> {
        self.reconciliations.inc();
        ReconcileTimer {
            metrics: self,
            started: Instant::now(),
        }
    }

    pub fn reconcile_failed(&self, error: &Error) {
        self.failures
            .get_or_create(&ErrorLabels {
                error: error.metric_label().to_string(),
            })
            .inc();
    }

    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Records a reconciliation's duration when dropped.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    started: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .duration
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// Binds the metrics port (0: any free port) and returns the address and the server future.
pub async fn serve(
    port: u16,
    metrics: Arc<Metrics>,
) -> Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .await
        .map_err(|source| Error::MetricsServer { port, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| Error::MetricsServer { port, source })?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(metrics);
    Ok((addr, async move { axum::serve(listener, app).await }))
}

async fn healthz(State(metrics): State<Arc<Metrics>>) -> (axum::http::StatusCode, &'static str) {
    if metrics.probes.is_live() {
        (axum::http::StatusCode::OK, "ok")
    } else {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "the leader election loop made no attempt for a minute",
        )
    }
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> (axum::http::StatusCode, &'static str) {
    if metrics.probes.is_ready() {
        (axum::http::StatusCode::OK, "ready")
    } else {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "starting: the StreamApp cache is not synced yet",
        )
    }
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_count_reconciliations_failures_and_durations() {
        let metrics = Metrics::default();
        drop(metrics.reconcile_started());
        metrics.reconcile_failed(&Error::CrdMissing);
        let text = metrics.render();
        assert!(
            text.contains("streamapp_operator_reconciliations_total 1"),
            "{text}"
        );
        assert!(
            text.contains("streamapp_operator_reconcile_failures_total{error=\"crd_missing\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("streamapp_operator_reconcile_duration_seconds_count 1"),
            "{text}"
        );
    }
}
