//! The StreamApp agent: a native sidecar beside the processor that reports the pod's
//! state-store health into its entry of the StreamApp's `status.pods`.
//!
//! - [`observe`]: one look at the processor (health file, `/healthz`, `/readyz`, its pid) …
//! - [`disk`]: … and at the state volume (checkpoints, WAL files, quarantines, free space).
//! - [`report`]: the pure function from an observation to the pod's status entry.
//! - [`cadence`]: when an entry is worth writing.
//! - [`status_writer`]: server-side apply of the entry, under the pod's own field manager.
//! - [`store_events`]: a Kubernetes Event per newly quarantined store and per store that backs off.
//! - [`metrics`]: `streamapp_agent_*` metrics, `/metrics` and `/healthz`.
//! - [`run`]: the loop and the SIGTERM sequence; [`cli`]: its flags.

pub mod cadence;
pub mod cli;
pub mod disk;
pub mod error;
pub mod metrics;
pub mod observe;
pub mod report;
pub mod run;
pub mod status_writer;
pub mod store_events;

pub use error::{Error, Result};
