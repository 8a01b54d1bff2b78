//! The local test bed, seen from Rust integration tests.
//!
//! `make up` (dev/net.sh, dev/kafka.sh, dev/kube.sh, dev/node.sh) starts a real Apache Kafka
//! broker, a real Kubernetes control plane and a real node (kubelet + containerd) on this
//! machine; this crate finds them, gives each test its own topic names and namespace, and fails
//! loudly — naming the service and the command that starts it — when one is not running. Tests
//! never skip.

pub mod helm;
pub mod kafka;
pub mod kube;
pub mod node;
pub mod process;

use std::path::PathBuf;

/// `$STREAMAPP_CACHE`, where dev/ keeps downloads and builds (default
/// `$HOME/.cache/streamapp`).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("STREAMAPP_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
                .join(".cache/streamapp")
        })
}

/// `$STREAMAPP_RUN`, where dev/ keeps the services' runtime state (default
/// `$STREAMAPP_CACHE/run`).
pub fn run_dir() -> PathBuf {
    std::env::var_os("STREAMAPP_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("run"))
}

/// A name no other test (or earlier run) uses: `prefix-<8 random hex digits>`, lower case so it
/// is valid as a topic name and as a Kubernetes object name.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}
