//! The processor's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, `/health`, the
//! read-only queries `/lookup` ([`crate::lookup`]) and `/dead-letters`
//! ([`crate::dead_letters`]), and `POST /drain`.
//!
//! The drain endpoint stops processing, so it only answers callers on the loopback interface
//! (the preStop hook runs `streamapp-processor drain` inside the pod) or callers presenting
//! the token in `STREAMAPP_DRAIN_TOKEN` as a bearer token.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use streamapp_api::probe;

use crate::shared::{DrainOutcome, Shared};
use crate::{dead_letters, lookup};

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    drain_token: Option<String>,
    drain_timeout: Duration,
    liveness_timeout: Duration,
    queries: Arc<OnceLock<Queries>>,
}

/// What the read-only queries need of the app, known once its topics are checked.
pub struct Queries {
    pub lookup: lookup::Settings,
    pub dead_letters: dead_letters::Settings,
}

/// How the endpoints behave.
pub struct HttpOptions {
    /// Bearer token that allows the drain endpoint from other hosts.
    pub drain_token: Option<String>,
    pub drain_timeout: Duration,
    /// `/healthz` fails once the loop made no progress for this long.
    pub liveness_timeout: Duration,
    /// What `/lookup` and `/dead-letters` answer with, set once the topics are checked (until
    /// then they answer 503).
    pub queries: Arc<OnceLock<Queries>>,
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    options: HttpOptions,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route(probe::HEALTHZ, get(live))
        .route(probe::READYZ, get(ready))
        .route(probe::HEALTH, get(health))
        .route(probe::DRAIN, post(drain))
        .route(streamapp_api::lookup::PATH, get(look_up))
        .route(streamapp_api::dead_letters::PATH, get(list_dead_letters))
        .with_state(AppState {
            shared,
            registry,
            drain_token: options.drain_token,
            drain_timeout: options.drain_timeout,
            liveness_timeout: options.liveness_timeout,
            queries: options.queries,
        });
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &s.registry).expect("metrics encode");
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
}

async fn live(State(s): State<AppState>) -> impl IntoResponse {
    match crate::probes::liveness(s.shared.since_progress(), s.liveness_timeout) {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not live: {why}")),
    }
}

async fn ready(State(s): State<AppState>) -> impl IntoResponse {
    if s.shared.is_ready() {
        (StatusCode::OK, "ready".to_string())
    } else {
        let health = s.shared.health();
        let why = health
            .not_ready_reason
            .unwrap_or_else(|| format!("{:?}", health.phase));
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}"))
    }
}

async fn health(State(s): State<AppState>) -> impl IntoResponse {
    axum::Json(s.shared.health())
}

async fn look_up(State(s): State<AppState>, RawQuery(query): RawQuery) -> axum::response::Response {
    let ids = match streamapp_api::lookup::parse_query(query.as_deref()) {
        Ok(ids) => ids,
        Err(refusal) => return (StatusCode::BAD_REQUEST, refusal.to_string()).into_response(),
    };
    let Some(settings) = s.queries.get().map(|q| q.lookup.clone()) else {
        return starting();
    };
    let tasks = s.shared.health().tasks;
    let shared = s.shared.clone();
    // Point lookups in RocksDB: blocking, bounded by the number of ids.
    let answered = tokio::task::spawn_blocking(move || {
        lookup::answer(&ids, &settings, &shared.open_stores, &tasks)
    })
    .await;
    match answered {
        Ok(Ok(answer)) => axum::Json(answer).into_response(),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading a store: {e}"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the lookup failed: {e}"),
        )
            .into_response(),
    }
}

fn starting() -> axum::response::Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "starting: the topics are not checked yet",
    )
        .into_response()
}

async fn list_dead_letters(
    State(s): State<AppState>,
    RawQuery(query): RawQuery,
) -> axum::response::Response {
    let query = match streamapp_api::dead_letters::Query::parse(query.as_deref()) {
        Ok(q) => q,
        Err(refusal) => return (StatusCode::BAD_REQUEST, refusal.to_string()).into_response(),
    };
    let Some(settings) = s.queries.get().map(|q| q.dead_letters.clone()) else {
        return starting();
    };
    // A consumer of its own, reading for seconds at most: off the runtime's threads.
    let listed = tokio::task::spawn_blocking(move || dead_letters::list(&settings, &query)).await;
    match listed {
        Ok(Ok(listing)) => axum::Json(listing).into_response(),
        Ok(Err(e)) => (StatusCode::BAD_GATEWAY, e).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the listing failed: {e}"),
        )
            .into_response(),
    }
}

async fn drain(
    State(s): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let token_ok = s.drain_token.as_deref().is_some_and(|t| {
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {t}"))
    });
    if !peer.ip().is_loopback() && !token_ok {
        return (
            StatusCode::FORBIDDEN,
            "drain is only allowed from the pod itself or with the drain token".to_string(),
        );
    }
    let mut outcome = s
        .shared
        .request_drain(streamapp_api::health::DrainRequest::Http);
    let waited = tokio::time::timeout(s.drain_timeout, outcome.wait_for(Option::is_some)).await;
    match waited {
        Ok(Ok(o)) => match o.clone() {
            Some(DrainOutcome::Drained { duration_ms }) => {
                (StatusCode::OK, format!("drained in {duration_ms} ms"))
            }
            Some(DrainOutcome::Failed(e)) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("drain failed: {e}"),
            ),
            None => unreachable!("waited for Some"),
        },
        Ok(Err(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the processor stopped before draining".into(),
        ),
        Err(_) => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("drain did not finish within {:?}", s.drain_timeout),
        ),
    }
}
