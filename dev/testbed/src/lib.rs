//! The local test bed, seen from Rust integration tests.
//!
//! `make up` (dev/kafka.sh, dev/kube.sh) starts a real Apache Kafka broker and a real Kubernetes
//! control plane on this machine; this crate finds them, gives each test its own topic names
//! and namespace, and fails loudly — naming the service and the command that starts it — when
//! one is not running. Tests never skip.

pub mod kafka;
pub mod kube;

use std::path::PathBuf;

/// `$STREAMAPP_RUN`, where dev/ keeps the services' runtime state (default
/// `$STREAMAPP_CACHE/run`, `$HOME/.cache/streamapp/run`).
pub fn run_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STREAMAPP_RUN") {
        return dir.into();
    }
    let cache = std::env::var_os("STREAMAPP_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
                .join(".cache/streamapp")
        });
    cache.join("run")
}

/// A name no other test (or earlier run) uses: `prefix-<8 random hex digits>`, lower case so it
/// is valid as a topic name and as a Kubernetes object name.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}
