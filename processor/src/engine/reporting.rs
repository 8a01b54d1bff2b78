//! What an engine tells the rest of the process and the outside: the tasks in the health
//! report (store sizes, WAL files, states, changelog ends), readiness, and the per-thread
//! shares of the metrics (assigned tasks, back-offs, memtables, stage lag).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use streamapp_api::health::{ProcessorPhase, StoreUnavailable};
use streamapp_api::state_volume::wal_files;
use tracing::{info, warn};

use super::Engine;
use crate::lifecycle::Phase;
use crate::log_ends::LogEnds;
use crate::metrics::{GaugeShare, Metrics};
use crate::open_transactions::TransactionWait;
use crate::shared::now_ms;
use crate::store::MemoryRole;

/// How long past a commit interval a task's input may stand at an open transaction before the
/// task says so: its own route stage's transaction is open for about a commit interval.
const INPUT_WAIT_REPORTED_AFTER: Duration = Duration::from_secs(5);

/// An engine's parts of the gauges that count for the whole process (see [`GaugeShare`]).
pub(super) struct ThreadGauges {
    assigned: GaugeShare,
    backing_off: BTreeMap<StoreUnavailable, GaugeShare>,
    stage_lag: BTreeMap<&'static str, GaugeShare>,
}

impl ThreadGauges {
    pub(super) fn new(metrics: &Metrics) -> Self {
        ThreadGauges {
            assigned: GaugeShare::new(metrics.assigned_tasks.clone()),
            backing_off: BTreeMap::new(),
            stage_lag: BTreeMap::new(),
        }
    }

    fn backing_off(&mut self, metrics: &Metrics, kind: StoreUnavailable) -> &mut GaugeShare {
        self.backing_off.entry(kind).or_insert_with(|| {
            GaugeShare::new(
                metrics
                    .tasks_backing_off
                    .get_or_create(&Metrics::kind(kind))
                    .clone(),
            )
        })
    }

    fn stage_lag(&mut self, metrics: &Metrics, stage: &'static str) -> &mut GaugeShare {
        self.stage_lag.entry(stage).or_insert_with(|| {
            GaugeShare::new(
                metrics
                    .stage_lag
                    .get_or_create(&Metrics::stage(stage))
                    .clone(),
            )
        })
    }
}

impl Engine {
    /// Refreshes the tasks in the health report (store sizes, WAL files, states).
    pub(super) fn publish_tasks(&mut self, force: bool) {
        self.last_publish = Instant::now();
        let mut reports = Vec::new();
        let mut backing_off: BTreeMap<StoreUnavailable, i64> = BTreeMap::new();
        let now = now_ms();
        for (role, label) in [
            (MemoryRole::Active, "active"),
            (MemoryRole::Standby, "standby"),
        ] {
            let label = Metrics::role(label);
            let used = self.memory.memtable_bytes(role) as i64;
            let budget = self.memory.memtable_budget(role) as i64;
            self.metrics.memtable_bytes.get_or_create(&label).set(used);
            self.metrics
                .memtable_budget_bytes
                .get_or_create(&label)
                .set(budget);
        }
        // Only the copies kept now have a series: a promoted or closed one drops out.
        self.metrics.standby_lag.clear();
        for task in self.dedup.tasks.values_mut() {
            let Some(state) = task.lifecycle.state() else {
                continue; // suspended: not ours
            };
            task.health.state = Some(state);
            task.health.opened = task.lifecycle.opened();
            task.health.backoff = task.lifecycle.backoff().cloned();
            if let Some(b) = &task.health.backoff {
                *backing_off.entry(b.kind).or_default() += 1;
            }
            let label = Metrics::partition(task.partition);
            if let Some(store) = &task.store {
                task.health.store_keys = store.estimated_keys();
                task.health.store_bytes = store.sst_bytes();
                task.health.wal = wal_files(store.wal_dir()).at(now);
                task.health.store_changelog_offset = store.meta().changelog_offset;
            }
            if task.is(&Phase::Standby) {
                // Its store is with the state updater: the offset comes from its reports.
                let lag = task
                    .health
                    .changelog_end_offset
                    .zip(task.health.store_changelog_offset)
                    .map_or(0, |(end, at)| (end - at).max(0));
                self.metrics.standby_lag.get_or_create(&label).set(lag);
            }
            self.metrics
                .store_keys
                .get_or_create(&label)
                .set(task.health.store_keys as i64);
            self.metrics
                .store_bytes
                .get_or_create(&label)
                .set(task.health.store_bytes as i64);
            self.metrics
                .wal_bytes
                .get_or_create(&label)
                .set(task.health.wal.bytes as i64);
            task.health.quarantines = self
                .quarantines
                .get(&task.partition)
                .cloned()
                .unwrap_or_default();
            reports.push(task.health.clone());
        }
        for kind in [
            StoreUnavailable::DiskFull,
            StoreUnavailable::Locked,
            StoreUnavailable::Io,
            StoreUnavailable::Incompatible,
            StoreUnavailable::RepeatedDamage,
        ] {
            self.gauges
                .backing_off(&self.metrics, kind)
                .set(backing_off.get(&kind).copied().unwrap_or(0));
        }
        self.gauges.assigned.set(reports.len() as i64);
        self.shared.set_tasks(self.cfg.thread, force, reports);
        self.report_to_group();
    }

    /// Readiness from the tasks (see [`crate::probes::readiness`]).
    pub(super) fn refresh_readiness(&self) {
        let facts = crate::probes::ReadinessFacts {
            assigned: self.assigned,
            draining: self.draining || self.stopped,
            tasks: self
                .dedup
                .tasks
                .values()
                .filter_map(|t| Some((t.partition, t.lifecycle.state()?, t.lifecycle.backoff())))
                .collect(),
        };
        let readiness = crate::probes::readiness(&facts);
        let process_ready = self.shared.set_readiness(self.cfg.thread, readiness);
        if process_ready
            && matches!(
                self.shared.phase(),
                ProcessorPhase::Starting | ProcessorPhase::Restoring
            )
        {
            self.shared.set_phase(ProcessorPhase::Running);
        }
    }

    /// Asks the log-ends reader ([`crate::log_ends`]) for the ends of every partition this
    /// engine reports on: the changelog of each task with a store (standbys included), the
    /// dedup stage's input and the route stage's. Called on a slow timer by the loop; the
    /// answer is taken in by [`Self::take_log_ends`].
    pub fn ask_log_ends(&mut self) {
        let request = crate::log_ends::Request {
            changelog: self
                .dedup
                .tasks
                .values()
                .filter(|t| t.store.is_some() || t.is(&Phase::Standby))
                .map(|t| t.partition)
                .collect(),
            dedup_input: self.dedup.tasks.keys().copied().collect(),
            route_input: self.routes.positions().map(|(p, _)| p).collect(),
        };
        self.log_ends.ask(request);
    }

    /// Takes in the log-ends reader's answer, if one came: the changelog ends in the health
    /// report, the stage lag, and the tasks held at an open transaction.
    pub fn take_log_ends(&mut self) {
        if let Some(ends) = self.log_ends.answer() {
            self.report_changelog_ends(&ends);
            self.report_lag(&ends);
        }
    }

    /// Each task's changelog end, in the health report.
    fn report_changelog_ends(&mut self, ends: &LogEnds) {
        for task in self.dedup.tasks.values_mut() {
            // A standby's store is with the state updater, which reports its offset.
            let offset = match &task.store {
                Some(store) => store.meta().changelog_offset,
                None if task.is(&Phase::Standby) => task.health.store_changelog_offset,
                None => continue,
            };
            if let Some(&end) = ends.changelog.get(&task.partition) {
                // Right after our own commit the log ends with its marker, which holds no
                // data: the store is caught up, not one record behind.
                let caught_up = task.at_commit_marker && offset == Some(end - 1);
                task.health.changelog_end_offset = Some(if caught_up { end - 1 } else { end });
            }
        }
    }

    /// Sets the lag of each stage on the partitions this process owns (last stable offsets
    /// minus positions: the consumer reads committed), and whether an active task's input is
    /// held by an open transaction (its real end beyond the stable one while it stands).
    fn report_lag(&mut self, ends: &LogEnds) {
        let now = Instant::now();
        let report_after = self.cfg.topology.commit_interval + INPUT_WAIT_REPORTED_AFTER;
        let mut dedup = 0;
        // Consumption paused after produce failures: nobody is held, all wait.
        let paused = self.paused_until.is_some();
        let topic = self.cfg.dedup_input();
        for t in self.dedup.tasks.values_mut() {
            let Some(input) = ends.dedup_input.get(&t.partition) else {
                continue;
            };
            let position = t.position.next().unwrap_or(input.low);
            dedup += (input.stable - position).max(0);
            let was = t.health.input_waiting_for_transaction_at;
            // A task that is consumed and does not get on while something is open: held.
            t.input_wait = if t.active() && !paused {
                match input.end {
                    Some(end) => {
                        TransactionWait::observe(t.input_wait, position, input.stable, end, now)
                    }
                    // Asked again next time.
                    None => t.input_wait,
                }
            } else {
                None
            };
            let waiting = t.input_wait.and_then(|w| w.reported(now, report_after));
            t.health.input_waiting_for_transaction_at = waiting;
            match (was, waiting) {
                (None, Some(at)) => warn!(
                    topic,
                    partition = t.partition,
                    offset = at,
                    "the dedup stage reads nothing past offset {at} of {topic}/{p}: a \
                     transaction open there has not ended (its coordinator aborts a live one \
                     after transaction.timeout.ms; one that hangs, as a broker crash can leave, \
                     the operator's transaction doctor ends, see the condition \
                     TransactionsHealthy; by hand: kafka-transactions.sh abort --topic {topic} \
                     --partition {p} --start-offset {at})",
                    p = t.partition
                ),
                (Some(at), None) => info!(
                    topic,
                    partition = t.partition,
                    "the open transaction at offset {at} of {topic}/{p} ended; the dedup \
                     stage reads on",
                    p = t.partition
                ),
                _ => {}
            }
        }
        self.gauges.stage_lag(&self.metrics, "dedup").set(dedup);
        if self.cfg.repartition_topic.is_some() {
            let route: i64 = self
                .routes
                .positions()
                .filter_map(|(p, next)| {
                    let input = ends.route_input.get(&p)?;
                    Some((input.stable - next.unwrap_or(input.low)).max(0))
                })
                .sum();
            self.gauges.stage_lag(&self.metrics, "route").set(route);
        }
    }
}
