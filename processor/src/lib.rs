//! The StreamApp processor as a library: the binary (`main.rs`) wires these together, and
//! integration tests reach the pieces they check.

pub mod changelog;
pub mod checkpoint;
pub mod engine;
pub mod faults;
pub mod http;
pub mod inspect;
pub mod metrics;
pub mod quarantine;
pub mod restore;
pub mod shared;
pub mod state_dir;
pub mod store;
pub mod topology;
