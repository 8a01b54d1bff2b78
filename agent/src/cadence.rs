//! When to write the pod's entry: at once when something significant changed, otherwise as a
//! coarse heartbeat, and never more often than once per [`MIN_GAP`] — an agent per pod must not
//! become a load on the API server. Failed writes back off.

use std::time::{Duration, Instant};

use streamapp_api::crd::PodStateStatus;

/// Shortest time between two writes (also the first retry delay after a failure).
pub const MIN_GAP: Duration = Duration::from_secs(2);
/// Default longest time between two writes when nothing significant changes.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);

/// The write schedule of one pod's entry.
#[derive(Debug)]
pub struct Cadence {
    heartbeat: Duration,
    /// Time and significant content (see [`crate::report::significant`]) of the last
    /// successful write.
    last_written: Option<(Instant, PodStateStatus)>,
    last_attempt: Option<Instant>,
    failures: u32,
}

impl Cadence {
    pub fn new(heartbeat: Duration) -> Self {
        Cadence {
            heartbeat: heartbeat.max(MIN_GAP),
            last_written: None,
            last_attempt: None,
            failures: 0,
        }
    }

    /// Whether an entry whose significant part is `significant` should be written at `now`.
    pub fn due(&self, significant: &PodStateStatus, now: Instant) -> bool {
        if let Some(at) = self.last_attempt
            && now < at + self.gap()
        {
            return false;
        }
        match &self.last_written {
            None => true,
            Some((at, written)) => written != significant || now >= *at + self.heartbeat,
        }
    }

    /// Records a successful write.
    pub fn written(&mut self, significant: PodStateStatus, now: Instant) {
        self.last_written = Some((now, significant));
        self.last_attempt = Some(now);
        self.failures = 0;
    }

    /// Records a failed write: the next attempt waits twice as long, up to the heartbeat.
    pub fn failed(&mut self, now: Instant) {
        self.last_attempt = Some(now);
        self.failures = self.failures.saturating_add(1);
    }

    /// Whether `significant` is what the last successful write said.
    pub fn is_current(&self, significant: &PodStateStatus) -> bool {
        self.last_written
            .as_ref()
            .is_some_and(|(_, written)| written == significant)
    }

    /// The earliest time of the next write.
    pub fn earliest_next(&self) -> Option<Instant> {
        self.last_attempt.map(|at| at + self.gap())
    }

    /// Time until the next write may happen at the earliest.
    pub fn gap(&self) -> Duration {
        MIN_GAP
            .saturating_mul(1 << self.failures.min(8))
            .min(self.heartbeat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::status_values::PodPhase;

    fn entry(phase: PodPhase) -> PodStateStatus {
        PodStateStatus {
            name: "pod-0".into(),
            phase: Some(phase),
            ..Default::default()
        }
    }

    #[test]
    fn the_first_report_is_due_at_once() {
        assert!(Cadence::new(DEFAULT_HEARTBEAT).due(&entry(PodPhase::Starting), Instant::now()));
    }

    #[test]
    fn an_unchanged_entry_waits_for_the_heartbeat() {
        let t0 = Instant::now();
        let mut c = Cadence::new(Duration::from_secs(30));
        c.written(entry(PodPhase::Running), t0);
        assert!(!c.due(&entry(PodPhase::Running), t0 + Duration::from_secs(29)));
        assert!(c.due(&entry(PodPhase::Running), t0 + Duration::from_secs(30)));
    }

    #[test]
    fn a_change_is_written_at_once_but_never_within_two_seconds_of_the_last_write() {
        let t0 = Instant::now();
        let mut c = Cadence::new(Duration::from_secs(30));
        c.written(entry(PodPhase::Running), t0);
        assert!(!c.due(&entry(PodPhase::Down), t0 + Duration::from_millis(1500)));
        assert!(c.due(&entry(PodPhase::Down), t0 + MIN_GAP));
    }

    #[test]
    fn what_was_written_last_is_known_and_the_next_write_waits_for_the_gap() {
        let t0 = Instant::now();
        let mut c = Cadence::new(DEFAULT_HEARTBEAT);
        assert_eq!(c.earliest_next(), None);
        c.written(entry(PodPhase::Drained), t0);
        assert!(c.is_current(&entry(PodPhase::Drained)));
        assert!(!c.is_current(&entry(PodPhase::Down)));
        assert_eq!(c.earliest_next(), Some(t0 + MIN_GAP));
    }

    #[test]
    fn failed_writes_back_off_up_to_the_heartbeat() {
        let t0 = Instant::now();
        let mut c = Cadence::new(Duration::from_secs(30));
        c.failed(t0);
        assert!(!c.due(&entry(PodPhase::Running), t0 + Duration::from_secs(3)));
        assert!(c.due(&entry(PodPhase::Running), t0 + Duration::from_secs(4)));
        for _ in 0..10 {
            c.failed(t0);
        }
        assert_eq!(c.gap(), Duration::from_secs(30));
        c.written(entry(PodPhase::Running), t0);
        assert_eq!(c.gap(), MIN_GAP, "a success resets the backoff");
    }
}
