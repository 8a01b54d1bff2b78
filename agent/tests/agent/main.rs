//! The agent's integration tests against the local API server, in one binary. `common` is
//! what they share; each module is one subject, described at its top.

mod common;
mod concurrent_writes;
mod end_to_end;
mod rbac;
