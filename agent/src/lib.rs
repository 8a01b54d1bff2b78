//! The StreamApp agent: a native sidecar beside the processor that reports the pod's
//! state-store health into its entry of the StreamApp's `status.pods`.
//!
//! - [`observe`]: one look at the processor (health file, `/healthz`, `/readyz`, its pid) …
//! - [`disk`]: … and at the state volume (checkpoints, WAL files, quarantines, free space).
//! - [`report`]: the pure function from an observation to the pod's status entry.
//! - [`cadence`]: when an entry is worth writing.
//! - [`status_writer`]: server-side apply of the entry, under the pod's own field manager.
//! - [`store_events`]: a Kubernetes Event per newly quarantined store and per store that backs off.
//! - [`identity`]: `/identity`, whether this pod is the current pod of its name (asked by a
//!   processor after a fence).
//! - [`metrics`]: `streamapp_agent_*` metrics, and the HTTP server (`/metrics`, `/healthz`,
//!   `/identity`).
//! - [`run`]: the loop and the SIGTERM sequence; [`cli`]: its flags.

pub mod cadence;
pub mod cli;
pub mod disk;
pub mod error;
pub mod identity;
pub mod metrics;
pub mod observe;
pub mod report;
pub mod run;
pub mod status_writer;
pub mod store_events;

pub use error::{Error, Result};
