//! Fault injection for tests: makes the topology fail, or the process die, right after a
//! store put, on records that ask for it.
//!
//! Off unless the environment variable `STREAMAPP_FAULTS` enables it, with a budget per fault:
//! `STREAMAPP_FAULTS=fail-after-put=2,crash-after-put=1`. A record asks with the header
//! `streamapp.fault: fail-after-put` (the downstream `enrich` stage fails, so the transaction
//! aborts and is retried) or `streamapp.fault: crash-after-put` (the process aborts on the
//! spot, like `kill -9` with the put staged) or `streamapp.fault: grow-memory-after-put` (the
//! stage allocates memory until the kernel kills the process for exceeding its memory limit:
//! how a real node reports an OOM kill). Production processors ignore the header.

use std::collections::HashMap;

pub const FAULT_HEADER: &str = "streamapp.fault";
pub const ENV: &str = "STREAMAPP_FAULTS";

#[derive(Debug, Default)]
pub struct Faults {
    budget: HashMap<String, u32>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Injected {
    /// The stage after the put fails: abort and retry.
    Fail,
}

impl Faults {
    pub fn from_env() -> Self {
        std::env::var(ENV)
            .map(|v| Self::parse(&v))
            .unwrap_or_default()
    }

    pub fn parse(spec: &str) -> Self {
        let budget = spec
            .split(',')
            .filter_map(|part| {
                let (name, n) = part.trim().split_once('=')?;
                Some((name.to_string(), n.parse().ok()?))
            })
            .collect();
        Faults { budget }
    }

    /// Called by the `enrich` stage after the store put. Dies for `crash-after-put`.
    pub fn after_put(&mut self, requested: Option<&[u8]>) -> Result<(), Injected> {
        let Some(name) = requested.and_then(|r| std::str::from_utf8(r).ok()) else {
            return Ok(());
        };
        let Some(left) = self.budget.get_mut(name).filter(|n| **n > 0) else {
            return Ok(());
        };
        *left -= 1;
        match name {
            "crash-after-put" => {
                tracing::warn!("fault injection: crashing after a store put");
                std::process::abort();
            }
            "grow-memory-after-put" => {
                tracing::warn!("fault injection: allocating memory until the OOM killer stops us");
                let mut held: Vec<Vec<u8>> = Vec::new();
                loop {
                    // Touched, so the pages are really in use.
                    held.push(vec![1u8; 16 << 20]);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
            "fail-after-put" => {
                tracing::warn!("fault injection: failing the enrich stage after a store put");
                Err(Injected::Fail)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_only_within_their_budget_and_only_when_asked() {
        let mut f = Faults::parse("fail-after-put=2");
        assert_eq!(f.after_put(None), Ok(()));
        assert_eq!(f.after_put(Some(b"fail-after-put")), Err(Injected::Fail));
        assert_eq!(f.after_put(Some(b"fail-after-put")), Err(Injected::Fail));
        assert_eq!(f.after_put(Some(b"fail-after-put")), Ok(()));
        let mut off = Faults::default();
        assert_eq!(off.after_put(Some(b"fail-after-put")), Ok(()));
    }
}
