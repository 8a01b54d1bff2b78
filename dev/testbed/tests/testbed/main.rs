//! The test bed's own checks, in one binary: the services are up and answer as the other
//! crates' tests expect.

mod kafka_smoke;
mod kube_smoke;
mod preflight;
