//! Growing the state (and WAL) volumes.
//!
//! A StatefulSet's volume claim templates cannot change, so when `spec.storage.size` grows the
//! operator keeps the old template (see `statefulset::keep_claim_template_sizes`) and expands
//! each existing claim `state-<name>-<ordinal>` itself, where the storage class allows it.
//! [`plan_storage`] decides from the claims and classes; the reconciler patches.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use streamapp_api::crd::StreamApp;
use streamapp_api::units::parse_quantity;

use crate::statefulset::{STATE_VOLUME, WAL_VOLUME};

/// What to do about the claims, and what is still underway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoragePlan {
    /// Claims whose request is below the spec: (claim, new size).
    pub resize: Vec<(String, String)>,
    /// Claims requested at the spec's size whose volume has not grown yet.
    pub waiting: Vec<String>,
    /// Claims below the spec whose storage class does not allow expansion: (claim, class).
    pub not_expandable: Vec<(String, Option<String>)>,
}

/// Where the volumes stand, for the status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StorageFinding {
    /// Every claim has the size the spec asks for.
    #[default]
    Settled,
    /// These claims are being expanded.
    Resizing(Vec<String>),
    /// A claim cannot grow; the message says which and why.
    NotExpandable(String),
}

pub const STORAGE_NOT_EXPANDABLE: &str = "StorageNotExpandable";

impl StoragePlan {
    pub fn finding(&self) -> StorageFinding {
        if !self.not_expandable.is_empty() {
            let claims: Vec<_> = self
                .not_expandable
                .iter()
                .map(|(c, _)| c.as_str())
                .collect();
            let classes: BTreeSet<_> = self
                .not_expandable
                .iter()
                .map(|(_, class)| class.as_deref().unwrap_or("<none>"))
                .collect();
            return StorageFinding::NotExpandable(format!(
                "claims {} cannot grow: storage class {} does not allow volume expansion (allowVolumeExpansion). \
                 Use a class that does for new StreamApps, or move the data to larger volumes by hand",
                claims.join(", "),
                classes.into_iter().collect::<Vec<_>>().join(", "),
            ));
        }
        let mut pending: Vec<String> = self
            .resize
            .iter()
            .map(|(c, _)| c.clone())
            .chain(self.waiting.iter().cloned())
            .collect();
        if pending.is_empty() {
            return StorageFinding::Settled;
        }
        pending.sort();
        StorageFinding::Resizing(pending)
    }
}

/// The sizes the spec asks for, per claim template.
fn targets(app: &StreamApp) -> Vec<(&'static str, &str)> {
    let mut t = vec![(STATE_VOLUME, app.spec.storage.size.as_str())];
    if let Some(wal) = &app.spec.storage.wal_volume {
        t.push((WAL_VOLUME, wal.size.as_str()));
    }
    t
}

/// Compares each claim of the StreamApp (`<template>-<name>-<ordinal>`, including claims kept
/// from scaled-down ordinals) with the spec. `expandable` says whether a storage class allows
/// expansion.
pub fn plan_storage(
    app: &StreamApp,
    claims: &[PersistentVolumeClaim],
    expandable: impl Fn(&str) -> bool,
) -> StoragePlan {
    let mut plan = StoragePlan::default();
    let name = app.name_any();
    for (template, size) in targets(app) {
        let Ok(target) = parse_quantity(size) else {
            continue;
        };
        let prefix = format!("{template}-{name}-");
        for claim in claims {
            let claim_name = claim.name_any();
            let is_ours = claim_name.strip_prefix(&prefix).is_some_and(|ordinal| {
                !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit())
            });
            if !is_ours || claim.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let spec = claim.spec.as_ref();
            let requested = spec
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .and_then(|q| parse_quantity(&q.0).ok());
            let capacity = claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .and_then(|q| parse_quantity(&q.0).ok());
            let Some(requested) = requested else { continue };
            if requested < target {
                let class = spec.and_then(|s| s.storage_class_name.clone());
                if class.as_deref().is_some_and(&expandable) {
                    plan.resize.push((claim_name, size.to_string()));
                } else {
                    plan.not_expandable.push((claim_name, class));
                }
            } else if capacity.is_some_and(|c| c < target) {
                plan.waiting.push(claim_name);
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;

    fn claim(name: &str, class: &str, requested: &str, capacity: &str) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "storageClassName": class, "resources": { "requests": { "storage": requested } } },
            "status": { "capacity": { "storage": capacity } },
        }))
        .unwrap()
    }

    fn grown() -> StreamApp {
        let mut app = app();
        app.spec.storage.size = "2Gi".into();
        app
    }

    #[test]
    fn claims_below_the_spec_are_resized_when_the_class_allows_it() {
        let claims = [
            claim("state-orders-0", "local", "1Gi", "1Gi"),
            claim("state-orders-1", "local", "2Gi", "1Gi"),
            claim("state-orders-2", "local", "2Gi", "2Gi"),
            claim("state-orders-extra-0", "local", "1Gi", "1Gi"),
            claim("state-other-0", "local", "1Gi", "1Gi"),
        ];
        let plan = plan_storage(&grown(), &claims, |class| class == "local");
        assert_eq!(
            plan.resize,
            [("state-orders-0".to_string(), "2Gi".to_string())]
        );
        assert_eq!(plan.waiting, ["state-orders-1"]);
        assert!(plan.not_expandable.is_empty());
        assert_eq!(
            plan.finding(),
            StorageFinding::Resizing(vec!["state-orders-0".into(), "state-orders-1".into()])
        );
    }

    #[test]
    fn a_class_without_expansion_is_reported_not_silently_ignored() {
        let claims = [claim("state-orders-0", "fixed", "1Gi", "1Gi")];
        let plan = plan_storage(&grown(), &claims, |class| class == "local");
        assert!(plan.resize.is_empty());
        let StorageFinding::NotExpandable(message) = plan.finding() else {
            panic!("{plan:?}")
        };
        assert!(
            message.contains("state-orders-0") && message.contains("fixed"),
            "{message}"
        );
    }

    #[test]
    fn claims_at_the_spec_size_are_settled() {
        let claims = [claim("state-orders-0", "local", "1Gi", "1Gi")];
        assert_eq!(
            plan_storage(&app(), &claims, |_| true).finding(),
            StorageFinding::Settled
        );
    }

    #[test]
    fn wal_claims_follow_the_wal_volume_size() {
        let mut app = app();
        app.spec.storage.wal_volume = Some(streamapp_api::crd::WalVolumeSpec {
            size: "512Mi".into(),
            storage_class_name: None,
        });
        let claims = [claim("wal-orders-0", "local", "256Mi", "256Mi")];
        assert_eq!(
            plan_storage(&app, &claims, |_| true).resize,
            [("wal-orders-0".to_string(), "512Mi".to_string())]
        );
    }
}
