//! Checks that CEL in the CRD cannot make, run before anything is rolled out: the rendered
//! processor configuration must validate, and RocksDB's memory must fit in the processor's
//! memory limit. A failed check blocks the rollout (pods keep the last good configuration) and
//! becomes a `Degraded` condition with a reason.

use streamapp_api::config::{ProcessorConfig, ResolvedRocksDb, process_overhead_bytes};
use streamapp_api::crd::StreamApp;
use streamapp_api::units::parse_quantity;

/// Why a spec cannot be rolled out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// Condition reason (CamelCase).
    pub reason: &'static str,
    /// What is wrong and what to change.
    pub message: String,
}

pub const INVALID_CONFIG: &str = "InvalidConfig";
pub const MEMORY_BUDGET_EXCEEDED: &str = "MemoryBudgetExceeded";

const MIB: u64 = 1 << 20;

/// Runs every check; the first that fails blocks the rollout. An invalid configuration is
/// reported with every field that must change.
pub fn preflight(app: &StreamApp, config: &ProcessorConfig) -> Result<(), Blocker> {
    let resolved = config.resolve().map_err(|errors| Blocker {
        reason: INVALID_CONFIG,
        message: errors
            .iter()
            .map(|e| format!("{}: {}", spec_field(&e.field), e.message))
            .collect::<Vec<_>>()
            .join("; "),
    })?;
    check_memory_budget(app, &resolved.rocksdb, resolved.processing_threads)
}

/// Compares the memory the processor needs ([`ResolvedRocksDb::container_memory_bytes`]) with
/// the processor container's memory limit. Without a limit there is nothing to exceed.
pub fn check_memory_budget(
    app: &StreamApp,
    rocksdb: &ResolvedRocksDb,
    processing_threads: u32,
) -> Result<(), Blocker> {
    let Some(limit) = app
        .spec
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
    else {
        return Ok(());
    };
    // A limit in a notation the check does not read (e.g. `1e9`) is left to the kubelet.
    let Ok(limit_bytes) = parse_quantity(&limit.0) else {
        return Ok(());
    };
    let needed = rocksdb.container_memory_bytes(processing_threads);
    if needed <= limit_bytes {
        return Ok(());
    }
    let over_mib = (needed - limit_bytes).div_ceil(MIB);
    Err(Blocker {
        reason: MEMORY_BUDGET_EXCEEDED,
        message: format!(
            "the processor needs {} MiB (RocksDB block cache {} MiB + memtable budget {} MiB + {} MiB for the process with {processing_threads} processing thread(s)) \
             but resources.limits.memory is {}: {over_mib} MiB over. Lower rocksdb.blockCacheSize or \
             rocksdb.memtableBudget (or choose rocksdb.profile LowMemory), or raise resources.limits.memory; \
             the pods keep their current configuration until then",
            needed.div_ceil(MIB),
            rocksdb.block_cache_bytes.div_ceil(MIB),
            rocksdb.memtable_budget_bytes.div_ceil(MIB),
            process_overhead_bytes(processing_threads) / MIB,
            limit.0,
        ),
    })
}

/// Configuration errors name fields of the processor's file; users know them under `spec`.
fn spec_field(field: &str) -> String {
    match field {
        "drainTimeout" => "spec.shutdown.drainTimeout".into(),
        "applicationId" => "metadata.name".into(),
        other => format!("spec.{other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor_config::processor_config;
    use crate::testing::app;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn with_memory_limit(limit: &str) -> StreamApp {
        let mut app = app();
        app.spec.resources = Some(ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity(limit.into()))].into()),
            ..Default::default()
        });
        app
    }

    #[test]
    fn balanced_profile_fits_in_512_mebibytes() {
        let app = with_memory_limit("512Mi");
        assert_eq!(preflight(&app, &processor_config(&app)), Ok(()));
    }

    #[test]
    fn memory_limit_below_the_rocksdb_budget_blocks_with_the_overshoot_and_the_knobs() {
        // Balanced: 50 MiB cache + 128 MiB memtables + 192 MiB process = 370 MiB.
        let app = with_memory_limit("256Mi");
        let blocker = preflight(&app, &processor_config(&app)).unwrap_err();
        assert_eq!(blocker.reason, "MemoryBudgetExceeded");
        assert!(
            blocker.message.contains("needs 370 MiB"),
            "{}",
            blocker.message
        );
        assert!(
            blocker.message.contains("114 MiB over"),
            "{}",
            blocker.message
        );
        assert!(
            blocker.message.contains("rocksdb.blockCacheSize"),
            "{}",
            blocker.message
        );
        assert!(
            blocker.message.contains("rocksdb.memtableBudget"),
            "{}",
            blocker.message
        );
    }

    #[test]
    fn each_processing_thread_adds_its_kafka_clients_not_rocksdb_memory() {
        // Balanced with 3 threads: 50 + 128 + 112 + 3 x 80 MiB = 530 MiB.
        let mut app = with_memory_limit("512Mi");
        app.spec.processing_threads = 3;
        let blocker = preflight(&app, &processor_config(&app)).unwrap_err();
        assert!(
            blocker.message.contains("needs 530 MiB")
                && blocker.message.contains("with 3 processing thread(s)"),
            "{}",
            blocker.message
        );
        app.spec.processing_threads = 2;
        assert_eq!(preflight(&app, &processor_config(&app)), Ok(()));
    }

    #[test]
    fn no_memory_limit_means_nothing_to_exceed() {
        let app = app();
        assert_eq!(preflight(&app, &processor_config(&app)), Ok(()));
    }

    #[test]
    fn invalid_configuration_blocks_and_names_the_spec_field() {
        let mut app = app();
        app.spec.rocksdb.memtable_budget = Some("1Mi".into());
        app.spec.rocksdb.write_buffer_size = Some("4Mi".into());
        let blocker = preflight(&app, &processor_config(&app)).unwrap_err();
        assert_eq!(blocker.reason, "InvalidConfig");
        assert!(
            blocker.message.starts_with("spec.rocksdb.memtableBudget:"),
            "{}",
            blocker.message
        );
    }

    #[test]
    fn every_invalid_field_is_named_at_once() {
        let mut app = app();
        app.spec.rocksdb.compaction_style = Some(streamapp_api::config::CompactionStyle::Fifo);
        let mut config = processor_config(&app);
        config.drain_timeout = "soon".into();
        let blocker = preflight(&app, &config).unwrap_err();
        assert_eq!(blocker.reason, "InvalidConfig");
        assert!(
            blocker
                .message
                .starts_with("spec.rocksdb.compactionStyle: Fifo")
                && blocker
                    .message
                    .contains("; spec.shutdown.drainTimeout: \"soon\" is not a duration"),
            "{}",
            blocker.message
        );
    }
}
