//! Annotations that operate a StreamApp: a user (or `kubectl streamapp`) sets them on the
//! StreamApp, the operator acts on them. Values are plain strings so `kubectl annotate` is
//! enough.

/// `"true"`: the operator stops changing the StreamApp's objects (spec edits, scaling and
/// restarts wait) until the annotation is removed or set to anything else. The status keeps
/// being reported; its `ReconciliationPaused` condition says so.
pub const PAUSED: &str = "streamapp.dev/paused";

/// Any new value (by convention the time of the request, RFC 3339): the pods restart one at a
/// time, each stopping with a drain, without a spec change — the value is copied into the pod
/// template, like `kubectl rollout restart` does.
pub const RESTART: &str = "streamapp.dev/restart";

/// `earliest`, `latest`, or an RFC 3339 time: the application reset. The operator stops the
/// pods, moves the consumer group's input offsets there, clears the stores (volumes) and the
/// internal topics, and starts the pods again. It runs once per value; `status.reset` tracks
/// it.
pub const RESET: &str = "streamapp.dev/reset";

/// Whether a StreamApp's annotation `name` is set to `"true"`.
pub fn is_true(annotations: &std::collections::BTreeMap<String, String>, name: &str) -> bool {
    annotations.get(name).is_some_and(|v| v == "true")
}
