//! Sample objects for the unit tests of the builders and the status.

use streamapp_api::crd::StreamApp;

/// `shop/orders`: 3 replicas, Balanced RocksDB, as it comes back from the API server (uid and
/// generation set).
pub fn app() -> StreamApp {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "streamapp.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": { "name": "orders", "namespace": "shop", "uid": "8d2c1c7e-0000-4000-8000-000000000001", "generation": 4 },
        "spec": {
            "image": "registry.example/streamapp:1.0",
            "replicas": 3,
            "kafka": { "bootstrapServers": "kafka:9092" },
            "topology": { "inputTopic": "orders", "outputTopic": "orders-unique", "deadLetterTopic": "orders-dlq" },
        },
    }))
    .expect("sample StreamApp")
}
