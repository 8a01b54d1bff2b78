//! The StateHealthy condition from the agents' reports: the worst pod decides.

use streamapp_api::crd::PodStateStatus;
use streamapp_api::status_values::{PodPhase, StoreOpen};

pub const NO_REPORTS: &str = "NoReports";
pub const PROCESSOR_FAILED: &str = "ProcessorFailed";
pub const PROCESSOR_DOWN: &str = "ProcessorDown";
pub const REBUILDING: &str = "Rebuilding";
pub const STORES_HEALTHY: &str = "StoresHealthy";

/// The StateHealthy condition: its status, reason and message.
pub(super) struct StateHealthy {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The StateHealthy condition from the agents' reports: the worst pod decides.
pub(super) fn state_healthy(reports: &[&PodStateStatus], desired: i32) -> StateHealthy {
    if reports.is_empty() {
        return StateHealthy {
            status: "Unknown",
            reason: NO_REPORTS,
            message: "no agent has reported yet".into(),
        };
    }
    let with_phase = |phase: PodPhase| -> Vec<String> {
        reports
            .iter()
            .filter(|p| p.phase.as_ref() == Some(&phase))
            .map(|p| match &p.message {
                Some(m) => format!("{}: {m}", p.name),
                None => p.name.clone(),
            })
            .collect()
    };
    let failed = with_phase(PodPhase::Failed);
    if !failed.is_empty() {
        return StateHealthy {
            status: "False",
            reason: PROCESSOR_FAILED,
            message: format!("processor failed on {}", failed.join("; ")),
        };
    }
    let down = with_phase(PodPhase::Down);
    if !down.is_empty() {
        return StateHealthy {
            status: "False",
            reason: PROCESSOR_DOWN,
            message: format!("no processor running on {}", down.join("; ")),
        };
    }
    let rebuilding: Vec<String> = reports
        .iter()
        .flat_map(|p| p.tasks.iter().map(move |t| (p, t)))
        .filter(|(_, t)| t.opened == Some(StoreOpen::Rebuilt) && t.restore.is_some())
        .map(|(p, t)| {
            let progress = t
                .restore
                .as_ref()
                .map(|r| format!(" ({} of {} records restored)", r.restored, r.total))
                .unwrap_or_default();
            let why = t
                .last_quarantine_reason
                .as_deref()
                .map(|r| format!(" after quarantining its store: {r}"))
                .unwrap_or_default();
            format!(
                "pod {} is rebuilding partition {} from the changelog{why}{progress}",
                p.name, t.partition
            )
        })
        .collect();
    if !rebuilding.is_empty() {
        return StateHealthy {
            status: "False",
            reason: REBUILDING,
            message: rebuilding.join("; "),
        };
    }
    if let Some(message) = crate::task_reports::stores_backing_off(reports) {
        return StateHealthy {
            status: "False",
            reason: crate::task_reports::STORE_BACKING_OFF,
            message,
        };
    }
    let mut message = format!("{} of {desired} pods report healthy stores", reports.len());
    if let Some(idle) = crate::task_reports::idle_replicas(desired, reports) {
        message = format!("{message}; {idle}");
    }
    StateHealthy {
        status: "True",
        reason: STORES_HEALTHY,
        message,
    }
}
