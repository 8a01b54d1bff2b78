//! The `kubectl streamapp` plugin's tests, in one binary: its output against the files in
//! `tests/golden/`, and the binary against the test bed's API server.

mod cluster;
mod common;
mod golden;
