//! Prometheus metrics of the processor, all prefixed `streamapp_processor_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// `active` or `standby`: whose RocksDB memtable budget.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    pub role: String,
}

/// Every metric the processor exports.
#[derive(Clone)]
pub struct Metrics {
    pub records_in: Counter,
    pub records_out: Counter,
    pub duplicates: Counter,
    pub dead_letters: Family<ReasonLabel, Counter>,
    pub transactions_committed: Counter,
    pub transactions_aborted: Counter,
    pub commit_seconds: Histogram,
    pub restore_records: Counter,
    pub restore_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    pub quarantines: Counter,
    pub store_bytes: Family<PartitionLabel, Gauge>,
    pub store_keys: Family<PartitionLabel, Gauge>,
    pub wal_bytes: Family<PartitionLabel, Gauge>,
    pub assigned_tasks: Gauge,
    pub input_partitions: Gauge,
    pub record_failures: Family<KindLabel, Counter>,
    pub store_backoffs: Family<KindLabel, Counter>,
    pub tasks_backing_off: Family<KindLabel, Gauge>,
    pub transaction_timeouts: Counter,
    pub records_repartitioned: Counter,
    pub miskeyed_records: Counter,
    pub changelog_records_skipped: Counter,
    pub stage_lag: Family<StageLabel, Gauge>,
    /// Per standby or warm-up copy: changelog records it has not applied yet.
    pub standby_lag: Family<PartitionLabel, Gauge>,
    pub store_verifications: Family<OutcomeLabel, Counter>,
    /// Memtable bytes counted against each budget (active stores, standby and warm-up ones).
    pub memtable_bytes: Family<RoleLabel, Gauge>,
    pub memtable_budget_bytes: Family<RoleLabel, Gauge>,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Metrics {
            records_in: Counter::default(),
            records_out: Counter::default(),
            duplicates: Counter::default(),
            dead_letters: Family::default(),
            transactions_committed: Counter::default(),
            transactions_aborted: Counter::default(),
            commit_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            restore_records: Counter::default(),
            restore_seconds: Counter::default(),
            quarantines: Counter::default(),
            store_bytes: Family::default(),
            store_keys: Family::default(),
            wal_bytes: Family::default(),
            assigned_tasks: Gauge::default(),
            input_partitions: Gauge::default(),
            record_failures: Family::default(),
            store_backoffs: Family::default(),
            tasks_backing_off: Family::default(),
            stage_lag: Family::default(),
            standby_lag: Family::default(),
            store_verifications: Family::default(),
            memtable_bytes: Family::default(),
            memtable_budget_bytes: Family::default(),
            transaction_timeouts: Counter::default(),
            records_repartitioned: Counter::default(),
            miskeyed_records: Counter::default(),
            changelog_records_skipped: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("streamapp_processor");
        r.register(
            "records_in",
            "Input records processed (committed or not)",
            m.records_in.clone(),
        );
        r.register(
            "records_out",
            "First occurrences written to the output topic",
            m.records_out.clone(),
        );
        r.register(
            "duplicates",
            "Records recognised as duplicates",
            m.duplicates.clone(),
        );
        r.register(
            "dead_letters",
            "Records sent to the dead-letter topic (committed), by reason",
            m.dead_letters.clone(),
        );
        r.register(
            "record_failures",
            "Failed attempts at a record that retrying does not fix (processing, produce): each aborts its transaction",
            m.record_failures.clone(),
        );
        r.register(
            "transactions_committed",
            "Kafka transactions committed",
            m.transactions_committed.clone(),
        );
        r.register(
            "transactions_aborted",
            "Kafka transactions aborted",
            m.transactions_aborted.clone(),
        );
        r.register(
            "commit_seconds",
            "Time to commit a transaction and apply it to the stores",
            m.commit_seconds.clone(),
        );
        r.register(
            "restore_records",
            "Changelog records replayed into stores",
            m.restore_records.clone(),
        );
        r.register(
            "restore_seconds",
            "Time spent restoring stores",
            m.restore_seconds.clone(),
        );
        r.register(
            "standby_lag",
            "Changelog records a standby (or warm-up) copy of the partition's store has not applied yet",
            m.standby_lag.clone(),
        );
        r.register(
            "memtable_bytes",
            "RocksDB memtable bytes of all stores of the process, by budget (active, standby)",
            m.memtable_bytes.clone(),
        );
        r.register(
            "memtable_budget_bytes",
            "The memtable budget of the process's stores, by role (active, standby): writers stall rather than exceed it",
            m.memtable_budget_bytes.clone(),
        );
        r.register(
            "quarantines",
            "Damaged stores moved to quarantine",
            m.quarantines.clone(),
        );
        r.register(
            "store_bytes",
            "Bytes of live SST files per store",
            m.store_bytes.clone(),
        );
        r.register(
            "store_keys",
            "Estimated keys per store",
            m.store_keys.clone(),
        );
        r.register(
            "wal_bytes",
            "Bytes of WAL files per store",
            m.wal_bytes.clone(),
        );
        r.register(
            "assigned_tasks",
            "Tasks (input partitions) owned by this process",
            m.assigned_tasks.clone(),
        );
        r.register(
            "input_partitions",
            "Partitions of the input topic (a process owns none when replicas exceed them)",
            m.input_partitions.clone(),
        );
        r.register(
            "store_backoffs",
            "Times a store became unavailable (disk full, I/O error, lock held) and backed off, by kind",
            m.store_backoffs.clone(),
        );
        r.register(
            "tasks_backing_off",
            "Tasks whose store backs off now, by kind",
            m.tasks_backing_off.clone(),
        );
        r.register(
            "transaction_timeouts",
            "Transactions the coordinator aborted on transaction.timeout.ms (recovered by a new producer)",
            m.transaction_timeouts.clone(),
        );
        r.register(
            "records_repartitioned",
            "Input records the route stage wrote to the repartition topic, keyed by their dedup id",
            m.records_repartitioned.clone(),
        );
        r.register(
            "miskeyed_records",
            "With topology.repartition Never: records whose key is not their dedup id (committed); a repeat of such an id on another partition is not caught",
            m.miskeyed_records.clone(),
        );
        r.register(
            "changelog_records_skipped",
            "Changelog records a restore or standby skipped: not written by the processor (no key, or a value that is not a time)",
            m.changelog_records_skipped.clone(),
        );
        r.register(
            "stage_lag",
            "Records not yet processed on the partitions this process owns, by stage (route: the input when repartitioning; dedup: the topic the dedup stage reads)",
            m.stage_lag.clone(),
        );
        r.register(
            "store_verifications",
            "Background checksum scans of stores that ended, by outcome (passed; damaged: the store was quarantined and rebuilt; unavailable: an I/O error backed it off)",
            m.store_verifications.clone(),
        );
        m
    }

    pub fn outcome(outcome: &str) -> OutcomeLabel {
        OutcomeLabel {
            outcome: outcome.to_string(),
        }
    }

    pub fn stage(stage: &str) -> StageLabel {
        StageLabel {
            stage: stage.to_string(),
        }
    }

    pub fn partition(p: i32) -> PartitionLabel {
        PartitionLabel {
            partition: p.to_string(),
        }
    }

    pub fn role(role: &str) -> RoleLabel {
        RoleLabel { role: role.into() }
    }

    pub fn kind(kind: impl std::fmt::Debug) -> KindLabel {
        KindLabel {
            kind: format!("{kind:?}"),
        }
    }
}

/// One processing thread's part of a gauge that counts for the whole process (tasks assigned,
/// tasks backing off, a stage's lag): each thread adds what it has, the gauge shows the sum.
/// Dropping the part (an engine stopping) takes it out of the sum.
pub struct GaugeShare {
    gauge: Gauge,
    mine: i64,
}

impl GaugeShare {
    pub fn new(gauge: Gauge) -> Self {
        GaugeShare { gauge, mine: 0 }
    }

    pub fn set(&mut self, value: i64) {
        self.gauge.inc_by(value - self.mine);
        self.mine = value;
    }
}

impl Drop for GaugeShare {
    fn drop(&mut self) {
        self.gauge.dec_by(self.mine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_shared_by_threads_shows_the_sum_of_their_parts() {
        let gauge = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        let mut a = GaugeShare::new(gauge.clone());
        let mut b = GaugeShare::new(gauge.clone());
        a.set(3);
        b.set(2);
        assert_eq!(gauge.get(), 5);
        a.set(1);
        assert_eq!(gauge.get(), 3);
        drop(b);
        assert_eq!(gauge.get(), 1, "a stopped thread's part leaves the sum");
    }
}
