//! Leader election with a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! only one reconciles.
//!
//! The same algorithm as client-go's leader election: a candidate takes the lease when it does
//! not exist, when its holder released it, or when its record has not changed for a whole lease
//! duration as measured on the candidate's own clock (so clock skew between nodes does not
//! matter). Writes use the lease's resourceVersion, so two candidates never both win. The
//! leader renews periodically and steps down when it cannot renew within the deadline, even
//! while a request hangs (see [`Elector::hold`]).
//!
//! Hand-written rather than a crate: the maintained lease crates (kube-lease-manager,
//! kube-leader-election) pin older kube and k8s-openapi releases than this workspace's, and the
//! second one compares wall-clock timestamps across nodes, which is what this algorithm avoids.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use std::sync::Arc;

/// Name of the Lease the operator replicas compete for.
pub const LEASE_NAME: &str = "streamapp-operator";

/// Timing of the election.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This candidate's identity, unique among the candidates.
    pub identity: String,
    /// How long a lease that is not renewed keeps others out.
    pub lease_duration: Duration,
    /// How often the leader renews.
    pub renew_interval: Duration,
    /// The leader steps down when it has not renewed for this long.
    pub renew_deadline: Duration,
    /// How often a follower tries to acquire.
    pub retry_interval: Duration,
}

impl LeaseSettings {
    /// Client-go's defaults: 15 s lease, renew every 2 s with a 10 s deadline, retry every 2 s.
    pub fn new(namespace: String, identity: String) -> Self {
        LeaseSettings {
            namespace,
            name: LEASE_NAME.to_string(),
            identity,
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(10),
            retry_interval: Duration::from_secs(2),
        }
    }
}

/// The fields of a lease that change when its holder renews or changes.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    lease_duration_seconds: Option<i32>,
    transitions: Option<i32>,
}

impl Record {
    fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity,
            renew_time: spec.renew_time,
            lease_duration_seconds: spec.lease_duration_seconds,
            transitions: spec.lease_transitions,
        }
    }
}

/// One candidate in the election.
pub struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// Each attempt is a liveness beat.
    metrics: Arc<Metrics>,
    /// The lease record last seen and when (on this clock) it was first seen.
    observed: Option<(Record, Instant)>,
}

impl Elector {
    pub fn new(client: Client, settings: LeaseSettings, metrics: Arc<Metrics>) -> Self {
        Elector {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            metrics,
            observed: None,
        }
    }

    pub fn lease(&self) -> String {
        format!("{}/{}", self.settings.namespace, self.settings.name)
    }

    /// Waits until this candidate holds the lease.
    pub async fn acquire(&mut self) {
        info!(lease = %self.lease(), identity = %self.settings.identity, "waiting to become leader");
        loop {
            // A hung request must not stall the candidate: the next round tries again.
            let attempt =
                tokio::time::timeout(self.settings.renew_deadline, self.try_acquire_or_renew());
            match attempt.await {
                Ok(Ok(true)) => {
                    info!(lease = %self.lease(), identity = %self.settings.identity, "became leader");
                    return;
                }
                Ok(Ok(false)) => debug!(lease = %self.lease(), "lease held by another instance"),
                Ok(Err(e)) => {
                    warn!(lease = %self.lease(), error = %e, "could not acquire the lease")
                }
                Err(_) => warn!(lease = %self.lease(), "acquiring the lease timed out"),
            }
            tokio::time::sleep(self.settings.retry_interval).await;
        }
    }

    /// Renews the lease until that fails; returns why leadership was lost. The caller must stop
    /// leading at once.
    ///
    /// Leadership ends at the renew deadline, counted from when the last successful renewal was
    /// *sent*, whatever a request is doing meanwhile: each attempt only gets the time that is
    /// left, so a hung request cannot keep this instance leading after another could take the
    /// lease (which it can only once the lease duration, longer than the deadline, has passed
    /// since it saw the last renewal).
    pub async fn hold(&mut self) -> Error {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.settings.renew_interval).await;
            let left = self
                .settings
                .renew_deadline
                .saturating_sub(renewed.elapsed());
            let sent = Instant::now();
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed = sent,
                Ok(Ok(false)) => {
                    return Error::LeadershipLost {
                        lease: self.lease(),
                        why: "another instance holds it".into(),
                    };
                }
                Err(_) => {
                    return Error::LeadershipLost {
                        lease: self.lease(),
                        why: format!(
                            "not renewed within the renew deadline of {:?}: the API server did not answer in time",
                            self.settings.renew_deadline
                        ),
                    };
                }
                Ok(Err(e)) if renewed.elapsed() >= self.settings.renew_deadline => {
                    return Error::LeadershipLost {
                        lease: self.lease(),
                        why: format!("not renewed for {:?}: {e}", renewed.elapsed()),
                    };
                }
                Ok(Err(e)) => {
                    warn!(lease = %self.lease(), error = %e, "renewing the lease failed; retrying")
                }
            }
        }
    }

    /// Gives the lease up so another candidate takes over at once (on a clean shutdown).
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.settings.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.lease(), "released the lease"),
            Err(e) => {
                warn!(lease = %self.lease(), error = %e, "could not release the lease; it expires by itself")
            }
        }
    }

    /// One round: Ok(true) when this candidate holds the lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        self.metrics.probes.beat();
        let now = MicroTime(Timestamp::now());
        let me = self.settings.identity.clone();
        let duration_secs =
            i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self
            .api
            .get_opt(&self.settings.name)
            .await
            .map_err(Error::kube(format!("reading lease {}", self.lease())))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((Record::of(&created), Instant::now()));
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(Error::kube(format!("creating lease {}", self.lease()))(e)),
            };
        };

        let record = Record::of(&lease);
        let now_seen = Instant::now();
        let since = first_seen(self.observed.as_ref(), &record, now_seen);
        self.observed = Some((record.clone(), since));
        let transition = match decide(
            &record,
            &me,
            now_seen.duration_since(since),
            self.settings.lease_duration,
        ) {
            Decision::Wait => return Ok(false),
            Decision::Renew => false,
            Decision::Take { expired_holder } => {
                if expired_holder.is_some() {
                    info!(lease = %self.lease(), previous = ?expired_holder, "lease expired; taking it over");
                }
                true
            }
        };
        let spec = lease.spec.take().unwrap_or_default();
        lease.spec = Some(claimed(spec, &me, now, duration_secs, transition));
        // `lease` carries the resourceVersion read above: if anyone wrote in between, this fails
        // with a conflict instead of overwriting them.
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observed = Some((Record::of(&updated), Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("updating lease {}", self.lease()))(e)),
        }
    }
}

/// What a candidate does with the lease record it read.
#[derive(Debug, PartialEq)]
enum Decision {
    /// Another candidate holds it and has renewed within its lease duration.
    Wait,
    /// It is this candidate's: renew it.
    Renew,
    /// Take it: it is free, or its holder (`expired_holder`) has not renewed it for a whole
    /// lease duration.
    Take { expired_holder: Option<String> },
}

/// When `record` was first seen unchanged, on this candidate's own clock: `now` unless it is
/// the record `observed` last.
fn first_seen(observed: Option<&(Record, Instant)>, record: &Record, now: Instant) -> Instant {
    match observed {
        Some((seen, since)) if seen == record => *since,
        _ => now,
    }
}

/// The election's rule (client-go's): a lease held by another candidate is taken only once its
/// record has stayed unchanged for a whole lease duration (the lease's own, else ours), as
/// measured on this candidate's clock (`unchanged_for`), so clock skew between nodes does not
/// matter.
fn decide(record: &Record, me: &str, unchanged_for: Duration, our_duration: Duration) -> Decision {
    match record.holder.as_deref() {
        Some(holder) if holder == me => Decision::Renew,
        None | Some("") => Decision::Take {
            expired_holder: None,
        },
        Some(holder) => {
            let duration = record
                .lease_duration_seconds
                .map_or(our_duration, |s| Duration::from_secs(s.max(0) as u64));
            if unchanged_for < duration {
                Decision::Wait
            } else {
                Decision::Take {
                    expired_holder: Some(holder.to_string()),
                }
            }
        }
    }
}

/// The lease's spec once `me` holds it at `now`: a `transition` (another holder before, or
/// none) counts one more transition and sets the acquire time; a renewal keeps both.
fn claimed(
    mut spec: LeaseSpec,
    me: &str,
    now: MicroTime,
    duration_secs: i32,
    transition: bool,
) -> LeaseSpec {
    if transition {
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.holder_identity = Some(me.to_string());
    spec.lease_duration_seconds = Some(duration_secs);
    spec.renew_time = Some(now);
    spec
}

/// A candidate identity: the pod name (or host name) plus a random suffix, so two processes on
/// one host, or a restarted pod, never pass for each other.
pub fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "streamapp-operator".to_string());
    format!("{base}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: Option<&str>, duration_secs: Option<i32>) -> Record {
        Record {
            holder: holder.map(String::from),
            renew_time: None,
            lease_duration_seconds: duration_secs,
            transitions: Some(3),
        }
    }

    const OURS: Duration = Duration::from_secs(15);

    #[test]
    fn a_free_lease_is_taken_and_our_own_renewed() {
        for free in [None, Some("")] {
            assert_eq!(
                decide(&held_by(free, Some(15)), "me", Duration::ZERO, OURS),
                Decision::Take {
                    expired_holder: None
                }
            );
        }
        assert_eq!(
            decide(&held_by(Some("me"), Some(15)), "me", Duration::ZERO, OURS),
            Decision::Renew
        );
    }

    #[test]
    fn another_holders_lease_is_taken_only_after_a_whole_duration_unchanged_on_our_clock() {
        let theirs = held_by(Some("other"), Some(15));
        assert_eq!(
            decide(&theirs, "me", Duration::from_secs(14), OURS),
            Decision::Wait
        );
        assert_eq!(
            decide(&theirs, "me", Duration::from_secs(15), OURS),
            Decision::Take {
                expired_holder: Some("other".into())
            }
        );
        // The lease's own duration counts, not ours; ours only when it has none.
        let long = held_by(Some("other"), Some(60));
        assert_eq!(
            decide(&long, "me", Duration::from_secs(30), OURS),
            Decision::Wait
        );
        assert_eq!(
            decide(
                &held_by(Some("other"), None),
                "me",
                Duration::from_secs(15),
                OURS
            ),
            Decision::Take {
                expired_holder: Some("other".into())
            }
        );
    }

    #[test]
    fn a_record_is_timed_from_when_it_was_first_seen_unchanged() {
        let start = Instant::now();
        let later = start + Duration::from_secs(5);
        let record = held_by(Some("other"), Some(15));
        let seen = (record.clone(), start);
        assert_eq!(first_seen(Some(&seen), &record, later), start);
        // A renewal (any change of the record) starts the count again.
        let renewed = Record {
            renew_time: Some(MicroTime(Timestamp::now())),
            ..record
        };
        assert_eq!(first_seen(Some(&seen), &renewed, later), later);
        assert_eq!(first_seen(None, &renewed, later), later);
    }

    #[test]
    fn taking_the_lease_counts_a_transition_and_renewing_keeps_the_acquire_time() {
        let acquired = MicroTime(Timestamp::from_second(1_000).unwrap());
        let now = MicroTime(Timestamp::from_second(2_000).unwrap());
        let before = LeaseSpec {
            holder_identity: Some("other".into()),
            acquire_time: Some(acquired.clone()),
            lease_transitions: Some(3),
            ..Default::default()
        };
        let taken = claimed(before.clone(), "me", now.clone(), 15, true);
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(now.clone()));
        assert_eq!(taken.renew_time, Some(now.clone()));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        let renewed = claimed(
            LeaseSpec {
                holder_identity: Some("me".into()),
                ..before
            },
            "me",
            now.clone(),
            15,
            false,
        );
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, Some(acquired));
        assert_eq!(renewed.renew_time, Some(now));
    }
}
