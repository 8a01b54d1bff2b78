//! The engine on the processor's own group membership (ADR 0001), used when standbys are
//! configured: the [`Membership`] thread joins the group with this process's [`Report`] (the
//! changelog offset of every store it holds), the leader runs the state-aware assignor, and
//! each generation's share arrives here as a [`GroupEvent`].
//!
//! The engine drives it the way librdkafka's callbacks drive the other membership: a
//! rebalance revokes everything (the open transaction commits with the generation it belongs
//! to, then the membership joins again); a new generation assigns active, standby and route
//! tasks. The transaction's offsets carry the member id and generation
//! ([`crate::group::txn_offsets`]), so a zombie of an older generation cannot commit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use streamapp_api::state_volume::{StateDir, checkpoint};
use tracing::{info, warn};

use super::membership::Share;
use super::{Engine, EngineConfig, EngineError, GroupConsumer};
use crate::group::txn_offsets::GroupGeneration;
use crate::group::{Generation, GroupConfig, GroupEvent, MemberState, Membership, Report};
use crate::open_transactions::HighWatermarks;
use crate::store::{ChangelogIdentity, changelog_offset_on_disk};
use crate::txn_coordinator::CoordinatorClient;
use streamapp_kafka_wire::Security;

/// The membership and what the engine keeps of it.
pub(super) struct StateAwareGroup {
    /// Dropped with the engine: a static member that goes away without leaving keeps its
    /// share for the session timeout, so a restarted pod gets it back.
    _membership: Membership,
    events: Receiver<GroupEvent>,
    report: Arc<EngineReport>,
    generation: Option<GroupGeneration>,
}

/// What the membership thread asks of the engine: its report, kept up to date by the loop,
/// and (when leading) the changelog ends, read through a client of its own.
struct EngineReport {
    report: Mutex<Report>,
    ends: Mutex<HighWatermarks>,
    tasks: i32,
    /// The producers' client settings and the application, to fence a departed member's
    /// transactional id.
    client: rdkafka::ClientConfig,
    application_id: String,
}

impl MemberState for EngineReport {
    fn report(&self) -> Report {
        self.report.lock().unwrap().clone()
    }

    fn changelog_ends(&self) -> Result<BTreeMap<i32, i64>, String> {
        let ends = self.ends.lock().unwrap();
        (0..self.tasks)
            .map(|p| {
                ends.end_offset(p)
                    .map(|end| (p, end))
                    .map_err(|e| e.to_string())
            })
            .collect()
    }

    /// Takes each departed member's transactional id over with a producer of our own, which
    /// aborts the transaction it left open (`InitProducerId` bumps the epoch and completes it)
    /// instead of leaving it to the coordinator's `transaction.timeout.ms`: until then no
    /// read_committed reader gets past it, in the changelog, the repartition topic or the
    /// outputs. A departed member that was only stalled finds its producer fenced and exits
    /// (Kubernetes starts it again); its tasks had moved on anyway.
    ///
    /// Only an id with a transaction open is fenced: a pod that restarted initialises its new
    /// producer before it joins, so between the two it is "departed" with a live producer and
    /// nothing open, and fencing that producer would make the new pod exit.
    fn fence_departed(&self, instance_ids: &BTreeSet<String>) {
        for instance in instance_ids {
            let transactional_id =
                streamapp_api::config::transactional_id(&self.application_id, instance);
            let state = CoordinatorClient::from_client(
                &self.client,
                format!("{}-fence", self.application_id),
                std::time::Duration::from_secs(10),
            )
            .and_then(|c| c.transaction_state(&transactional_id));
            match state {
                Ok(state) if state != "Ongoing" => {
                    info!(member = %instance, transactional_id, state,
                        "a departed member's transactional id has no open transaction: not fenced");
                    continue;
                }
                Ok(_) => {}
                Err(e) => warn!(member = %instance, transactional_id, error = %e,
                    "cannot ask the transaction coordinator about a departed member's transactional id: fencing it"),
            }
            let started = std::time::Instant::now();
            let fenced = self
                .client
                .clone()
                .set("transactional.id", &transactional_id)
                .create::<rdkafka::producer::BaseProducer>()
                .and_then(|p| {
                    use rdkafka::producer::Producer;
                    p.init_transactions(std::time::Duration::from_secs(10))
                });
            match fenced {
                Ok(()) => info!(
                    member = %instance,
                    transactional_id,
                    seconds = started.elapsed().as_secs_f64(),
                    "fenced a departed member's transactional id: its open transaction is aborted"
                ),
                Err(e) => warn!(
                    member = %instance,
                    transactional_id,
                    error = %e,
                    "could not fence a departed member's transactional id: its open transaction ends with its timeout"
                ),
            }
        }
    }
}

impl StateAwareGroup {
    /// Joins the group, first reporting the stores this process finds on its volume, so that
    /// a restarted pod gets its tasks back.
    pub(super) fn start(cfg: &EngineConfig, state: &StateDir) -> Result<Self, EngineError> {
        let client = &cfg.client;
        let security = Security::from_client(client).map_err(|e| {
            EngineError::Fatal(format!("the group membership's Kafka connection: {e}"))
        })?;
        let ends = HighWatermarks::new(client, &cfg.changelog_topic).map_err(|e| {
            EngineError::Fatal(format!("creating the group leader's changelog probe: {e}"))
        })?;
        let report = Arc::new(EngineReport {
            report: Mutex::new(Report {
                pod: Some(cfg.pod.clone()),
                node: cfg.group.node.clone(),
                stores: stores_on_disk(state, &cfg.changelog_topic, cfg.changelog_topic_id),
                active: BTreeSet::new(),
                members: BTreeSet::new(),
            }),
            ends: Mutex::new(ends),
            tasks: cfg.input_partitions as i32,
            client: cfg.client.clone(),
            application_id: cfg.application_id.clone(),
        });
        let bootstrap = streamapp_kafka_wire::bootstrap_servers(client);
        let timing = cfg.group.timing;
        let (membership, events) = Membership::start(
            GroupConfig {
                bootstrap,
                group_id: cfg.application_id.clone(),
                instance_id: cfg.member_id(),
                topic: cfg.dedup_input().to_string(),
                tasks: cfg.input_partitions as i32,
                routes: cfg.repartition_topic.as_ref().map(|_| {
                    (
                        cfg.topology.input_topic.clone(),
                        cfg.input_partitions as i32,
                    )
                }),
                session_timeout: timing.session_timeout,
                rebalance_timeout: timing.rebalance_timeout,
                heartbeat_interval: timing.heartbeat_interval,
                probing_rebalance_interval: timing.probing_rebalance_interval,
                standby_replicas: cfg.group.standby_replicas as usize,
                acceptable_lag: cfg.group.acceptable_recovery_lag,
                security,
            },
            report.clone(),
        );
        Ok(StateAwareGroup {
            _membership: membership,
            events,
            report,
            generation: None,
        })
    }

    /// The generation the open transaction's offsets belong to.
    pub(super) fn generation(&self) -> Option<&GroupGeneration> {
        self.generation.as_ref()
    }
}

/// The changelog offsets of the stores on the volume: what their checkpoints say for those
/// closed cleanly, what the store itself vouches for (read read-only) for one left by an
/// unclean stop. A store that cannot be read is not reported (it is opened, and judged, when
/// a task needs it).
fn stores_on_disk(
    state: &StateDir,
    changelog_topic: &str,
    topic_id: Option<[u8; 16]>,
) -> BTreeMap<i32, i64> {
    state
        .task_partitions()
        .into_iter()
        .filter_map(|p| {
            if let Some(entries) = checkpoint::read(&state.checkpoint_file(p)).ok().flatten() {
                let entry = entries
                    .iter()
                    .find(|e| e.topic == changelog_topic && e.partition == p)?;
                return Some((p, entry.offset));
            }
            let dir = state.store_dir(p);
            if !dir.join("CURRENT").exists() {
                return None;
            }
            let changelog = ChangelogIdentity {
                topic: changelog_topic.to_string(),
                partition: p,
                topic_id,
            };
            let started = Instant::now();
            match changelog_offset_on_disk(&dir, state.wal_dir(p).as_deref(), &changelog) {
                Ok(offset) => {
                    info!(partition = p, offset = ?offset, ms = started.elapsed().as_millis() as u64,
                        "a store left by an unclean stop: reporting the offset it holds");
                    offset.map(|o| (p, o))
                }
                Err(e) => {
                    warn!(partition = p, error = %e, "a store on the volume could not be read; not reporting it");
                    None
                }
            }
        })
        .collect()
}

/// What a generation's share means for the engine.
fn share(generation: &Generation, repartitions: bool) -> Share {
    let s = &generation.share;
    let mut standby: BTreeMap<i32, bool> = s.standby.iter().map(|&p| (p, false)).collect();
    standby.extend(s.warm_up.iter().map(|&p| (p, true)));
    Share {
        active: s.active.iter().copied().collect(),
        standby,
        routes: if repartitions {
            s.routes.iter().copied().collect()
        } else {
            Vec::new()
        },
    }
}

impl Engine {
    /// Takes in what the membership reported since the last tick.
    pub(super) fn take_group_events(
        &mut self,
        consumer: &GroupConsumer,
    ) -> Result<(), EngineError> {
        loop {
            let Some(group) = &self.own_group else {
                return Ok(());
            };
            let event = match group.events.try_recv() {
                Ok(event) => event,
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => {
                    return Err(EngineError::Fatal(
                        "the group membership thread ended".into(),
                    ));
                }
            };
            match event {
                GroupEvent::Rebalancing(revoke) => {
                    if self.assigned {
                        self.on_revoked(consumer, false);
                    }
                    self.report_to_group();
                    revoke.done();
                }
                GroupEvent::Assigned(generation) => {
                    // A generation without a rebalance announced before it (the membership
                    // lost its coordinator and joined again): let go of the last share first.
                    if self.assigned {
                        self.on_revoked(consumer, false);
                    }
                    info!(
                        generation = generation.generation_id,
                        leader = generation.leader,
                        "new group generation"
                    );
                    let share = share(&generation, self.cfg.repartition_topic.is_some());
                    if let Some(group) = &mut self.own_group {
                        group.generation = Some(GroupGeneration {
                            group_id: self.cfg.application_id.clone(),
                            generation_id: generation.generation_id,
                            member_id: generation.member_id,
                            instance_id: Some(self.cfg.member_id()),
                        });
                    }
                    self.on_assigned(consumer, share);
                }
                GroupEvent::Failed(why) => {
                    warn!(reason = %why, "the group membership failed");
                    return Err(EngineError::Fatal(format!("group membership: {why}")));
                }
            }
        }
    }

    /// Refreshes what the next JoinGroup tells the group: every store's changelog offset
    /// (active tasks, standbys, warm-ups and stores that are only on disk) and the active
    /// tasks.
    pub(super) fn report_to_group(&self) {
        let Some(group) = &self.own_group else { return };
        let mut report = group.report.report.lock().unwrap();
        for task in self.dedup.tasks.values() {
            if let Some(offset) = task.health.store_changelog_offset {
                report.stores.insert(task.partition, offset);
            }
        }
        report.active = self
            .dedup
            .tasks
            .values()
            .filter(|t| t.active())
            .map(|t| t.partition)
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::assignment::MemberAssignment;

    #[test]
    fn a_share_names_active_tasks_standbys_warm_ups_and_route_tasks() {
        let generation = Generation {
            generation_id: 3,
            member_id: "m".into(),
            leader: false,
            share: MemberAssignment {
                active: BTreeSet::from([0, 2]),
                standby: BTreeSet::from([1]),
                warm_up: BTreeSet::from([3]),
                routes: BTreeSet::from([1, 4]),
            },
        };
        assert_eq!(
            share(&generation, true),
            Share {
                active: vec![0, 2],
                standby: BTreeMap::from([(1, false), (3, true)]),
                routes: vec![1, 4],
            }
        );
        assert!(share(&generation, false).routes.is_empty());
    }
}
