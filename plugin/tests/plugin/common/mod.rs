//! Fixed StreamApps for the plugin's tests: one in the middle of a restore, with every field
//! `status` prints.

use k8s_openapi::jiff::Timestamp;
use streamapp_api::crd::StreamApp;

/// The time the golden outputs are rendered at.
pub fn now() -> Timestamp {
    "2026-12-01T10:00:00Z".parse().unwrap()
}

/// The spec, the smallest a user writes (no operator runs in these tests, so no pod is made).
pub fn spec(name: &str) -> serde_json::Value {
    let topology = serde_json::json!({
        "inputTopic": "orders", "outputTopic": "orders-unique", "deadLetterTopic": "orders-dlq",
    });
    serde_json::json!({
        "apiVersion": "streamapp.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": { "name": name },
        "spec": {
            "image": "registry.example/streamapp:1.0",
            "replicas": 2,
            "kafka": { "bootstrapServers": "kafka.example:9092" },
            "topology": topology,
        },
    })
}

/// A status in the middle of a restore on `<name>-1`, `restored` of 10,000 records done.
/// With `times`, the fields `status` prints as ages (report times, oldest checkpoint).
pub fn status(name: &str, restored: i64, times: bool) -> serde_json::Value {
    let cond = |type_: &str, status: &str, reason: &str, message: &str| {
        serde_json::json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-12-01T09:58:00Z",
        })
    };
    let mut status = serde_json::json!({
        "phase": "Progressing",
        "replicas": 2,
        "readyReplicas": 1,
        "ready": "1/2",
        "stateHealth": "Healthy",
        "worstRestoreLag": 10000 - restored,
        "standbyCoverage": "2/3",
        "consumerGroup": format!("prod.{name}"),
        "lag": 1500,
        "lagSeconds": 12,
        "inputPartitions": 3,
        "conditions": [
            cond("Ready", "False", "PodsNotReady", "1/2 pods ready; a pod is ready once its stores are restored"),
            cond("Progressing", "True", "PodsStarting", "waiting for 1 pods to restore their stores and become ready"),
            cond("StateHealthy", "True", "StoresHealthy", ""),
            cond("Degraded", "False", "AsExpected", ""),
        ],
        "pods": [
            {
                "name": format!("{name}-0"), "phase": "Running", "processorUp": true, "ready": true,
                "lastShutdownClean": true, "drainDurationMs": 420, "freeDiskBytes": 5_368_709_120_i64,
                "quarantines": 0, "deadLetters": 3, "inputPartitions": 3,
                "tasks": [
                    { "partition": 0, "state": "Active", "committedOffset": 120_400, "changelogEnd": 90_001,
                      "restoreLag": 0, "opened": "Clean", "checkpointAgeSeconds": 2, "walFiles": 1, "walBytes": 1400 },
                    { "partition": 1, "state": "Active", "committedOffset": 118_000, "changelogEnd": 88_000,
                      "restoreLag": 1, "opened": "ReplayedTail", "checkpointAgeSeconds": 1, "walFiles": 2, "walBytes": 900_000 },
                ],
            },
            {
                "name": format!("{name}-1"), "phase": "Restoring", "processorUp": true, "ready": false,
                "lastShutdownClean": false, "freeDiskBytes": 5_000_000_000_i64, "quarantines": 1,
                "inputPartitions": 3,
                "tasks": [
                    { "partition": 2, "state": "Restoring", "restoreLag": 10000 - restored,
                      "restore": { "restored": restored, "total": 10000, "rate": 2500, "etaSeconds": (10000 - restored) / 2500 },
                      "opened": "Rebuilt", "walFiles": 1, "walBytes": 0, "quarantines": 1,
                      "lastQuarantineReason": "Corruption: block checksum mismatch" },
                ],
            },
        ],
    });
    if times {
        status["oldestCheckpoint"] = "2026-12-01T09:59:50Z".into();
        status["pods"][0]["reportedAt"] = "2026-12-01T09:59:58Z".into();
        status["pods"][1]["reportedAt"] = "2026-12-01T09:59:59Z".into();
    }
    status
}

/// The app with its status, in namespace `prod`.
pub fn app(name: &str, restored: i64) -> StreamApp {
    let mut value = spec(name);
    value["metadata"]["namespace"] = "prod".into();
    value["status"] = status(name, restored, true);
    serde_json::from_value(value).expect("a StreamApp")
}
