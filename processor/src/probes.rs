//! What `/healthz` and `/readyz` answer, decided from plain facts.
//!
//! Liveness is about the processing loop, not the process: the HTTP server runs on threads of
//! its own and would answer while the loop is stuck for good. The loop records its progress
//! (every poll, restore step, commit, and every retry while it waits for Kafka) and liveness
//! fails once none happened for `livenessTimeout`. Waiting by choice (backing off, idle
//! without records) keeps the loop polling, so it stays live.
//!
//! Readiness: the processor has its assignment and every task it owns is processing. A
//! processor that owns no task at all (more replicas than input partitions) is ready: it is
//! healthy, and it takes over when another one goes.

use std::time::Duration;

use streamapp_api::health::{StoreBackoff, TaskState};

/// `/healthz`: fails once the loop made no progress for longer than `limit`.
pub fn liveness(since_progress: Duration, limit: Duration) -> Result<(), String> {
    if since_progress > limit {
        Err(format!(
            "the processing loop has made no progress for {} s (livenessTimeout {} s)",
            since_progress.as_secs(),
            limit.as_secs()
        ))
    } else {
        Ok(())
    }
}

/// What readiness is decided from.
#[derive(Clone, Debug, Default)]
pub struct ReadinessFacts<'a> {
    /// The group's assignment has been received since the last revoke.
    pub assigned: bool,
    pub draining: bool,
    /// Each owned task: partition, state, back-off.
    pub tasks: Vec<(i32, TaskState, Option<&'a StoreBackoff>)>,
}

/// `/readyz`: `Ok` when ready, otherwise why not.
pub fn readiness(facts: &ReadinessFacts<'_>) -> Result<(), String> {
    if facts.draining {
        return Err("draining".into());
    }
    if !facts.assigned {
        return Err("waiting for the consumer group's assignment".into());
    }
    let mut why = Vec::new();
    for (partition, state, backoff) in &facts.tasks {
        match (state, backoff) {
            // A standby (or warm-up) still catching up holds no processing back.
            (TaskState::Active | TaskState::Standby | TaskState::WarmingUp, _) => {}
            (TaskState::BackingOff, Some(b)) => why.push(format!(
                "partition {partition} backs off ({:?}: {})",
                b.kind, b.reason
            )),
            (state, _) => why.push(format!("partition {partition} is {state:?}")),
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::health::StoreUnavailable;

    #[test]
    fn a_loop_without_progress_past_the_limit_is_not_live() {
        let limit = Duration::from_secs(60);
        assert_eq!(liveness(Duration::from_secs(59), limit), Ok(()));
        let e = liveness(Duration::from_secs(61), limit).unwrap_err();
        assert!(e.contains("no progress for 61 s"), "{e}");
    }

    #[test]
    fn a_processor_that_owns_no_partition_is_ready_once_assigned() {
        let idle = ReadinessFacts {
            assigned: true,
            ..Default::default()
        };
        assert_eq!(readiness(&idle), Ok(()));
        let before = ReadinessFacts::default();
        assert!(readiness(&before).unwrap_err().contains("assignment"));
    }

    #[test]
    fn every_owned_task_must_be_active_for_readiness() {
        let backoff = StoreBackoff {
            kind: StoreUnavailable::DiskFull,
            reason: "No space left on device".into(),
            since_ms: 0,
            attempts: 1,
            retry_at_ms: 1000,
        };
        let facts = ReadinessFacts {
            assigned: true,
            draining: false,
            tasks: vec![
                (0, TaskState::Active, None),
                (1, TaskState::Restoring, None),
                (2, TaskState::BackingOff, Some(&backoff)),
            ],
        };
        let why = readiness(&facts).unwrap_err();
        assert!(why.contains("partition 1 is Restoring"), "{why}");
        assert!(why.contains("partition 2 backs off (DiskFull"), "{why}");
        assert!(!why.contains("partition 0"), "{why}");
        let draining = ReadinessFacts {
            draining: true,
            ..facts
        };
        assert_eq!(readiness(&draining), Err("draining".into()));
    }

    #[test]
    fn standbys_and_warm_ups_do_not_hold_readiness_back() {
        let facts = ReadinessFacts {
            assigned: true,
            draining: false,
            tasks: vec![
                (0, TaskState::Active, None),
                (1, TaskState::Standby, None),
                (2, TaskState::WarmingUp, None),
            ],
        };
        assert_eq!(readiness(&facts), Ok(()));
    }
}
