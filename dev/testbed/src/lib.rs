//! The local test bed, seen from Rust integration tests.
//!
//! `make up` (dev/net.sh, dev/kafka.sh, dev/kube.sh, dev/node.sh) starts a real Apache Kafka
//! broker, a real Kubernetes control plane and a real node (kubelet + containerd) on this
//! machine; this crate finds them, gives each test its own topic names and namespace, and fails
//! loudly — naming the service and the command that starts it — when one is not running. Tests
//! never skip.

pub mod hanging_transaction;
pub mod helm;
pub mod kafka;
pub mod kube;
pub mod node;
pub mod process;
pub mod store_damage;

use std::path::PathBuf;

/// The repository's `dev/` directory, with the scripts that run the test bed.
///
/// Found from the crate under test (cargo sets `CARGO_MANIFEST_DIR` when it runs a test), so
/// that a test binary built from another checkout of the same sources, which cargo may reuse,
/// still runs this checkout's scripts; the path this crate was built at is the fallback.
pub fn dev_dir() -> PathBuf {
    let running = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    running
        .iter()
        .flat_map(|dir| dir.ancestors())
        .map(|dir| dir.join("dev"))
        .find(|dev| dev.join("kafka.sh").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
}

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
