//! The processor's configuration file, rendered from a StreamApp's spec into the ConfigMap
//! `<name>-config` (key `processor.yaml`), and its hash, which the pod template carries so a
//! configuration change rolls the pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use sha2::{Digest, Sha256};
use streamapp_api::config::{
    GroupSettings, KafkaClient, ProcessorConfig, default_liveness_timeout,
};
use streamapp_api::crd::StreamApp;

use crate::owned;

/// Key of the configuration file in the ConfigMap.
pub const CONFIG_FILE: &str = "processor.yaml";
/// Where the ConfigMap is mounted in the processor container.
pub const CONFIG_DIR: &str = "/etc/streamapp";
/// `STREAMAPP_CONFIG` of the processor.
pub const CONFIG_PATH: &str = "/etc/streamapp/processor.yaml";
/// Mount point of the state volume (claim template `state`).
pub const STATE_DIR: &str = "/var/lib/streamapp/state";
/// Mount point of the optional WAL volume (claim template `wal`).
pub const WAL_DIR: &str = "/var/lib/streamapp/wal";
/// Where the Kafka TLS Secret is mounted.
pub const KAFKA_TLS_DIR: &str = "/etc/streamapp/kafka-tls";
/// The processor's HTTP port: /metrics, /healthz, /readyz, drain.
pub const HTTP_PORT: u16 = 8080;

/// The rendered file and its SHA-256 (hex).
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedConfig {
    pub config: ProcessorConfig,
    pub yaml: String,
    pub hash: String,
}

/// The application id: names the consumer group, the changelog topic and the transactional
/// ids. Namespace-qualified, so two teams' StreamApps of the same name in different
/// namespaces never share a consumer group or fence each other's transactions on a shared
/// Kafka cluster.
pub fn application_id(app: &StreamApp) -> String {
    format!("{}.{}", app.namespace().unwrap_or_default(), app.name_any())
}

/// The processor configuration the spec asks for. SASL credentials and TLS material are not
/// in it: they come from Secrets, through environment variables and a mounted volume.
pub fn processor_config(app: &StreamApp) -> ProcessorConfig {
    let spec = &app.spec;
    ProcessorConfig {
        application_id: application_id(app),
        kafka: KafkaClient {
            bootstrap_servers: spec.kafka.bootstrap_servers.clone(),
            properties: spec.kafka.properties.clone(),
        },
        topology: spec.topology.clone(),
        rocksdb: spec.rocksdb.clone(),
        state_dir: STATE_DIR.to_string(),
        wal_dir: spec
            .storage
            .wal_volume
            .as_ref()
            .map(|_| WAL_DIR.to_string()),
        http_port: HTTP_PORT,
        drain_timeout: spec.shutdown.drain_timeout.clone(),
        liveness_timeout: default_liveness_timeout(),
        group: GroupSettings {
            standby_replicas: spec.standby_replicas.max(0) as u32,
            ..GroupSettings::default()
        },
        processing_threads: spec.processing_threads.max(1) as u32,
    }
}

/// Renders [`processor_config`] as YAML and hashes it.
pub fn render(app: &StreamApp) -> Result<RenderedConfig, serde_yaml::Error> {
    let config = processor_config(app);
    let yaml = serde_yaml::to_string(&config)?;
    let hash = hex::encode(Sha256::digest(yaml.as_bytes()));
    Ok(RenderedConfig { config, yaml, hash })
}

/// The immutable ConfigMap `<name>-config-<hash>` with `processor.yaml`.
pub fn desired_config_map(app: &StreamApp, rendered: &RenderedConfig) -> ConfigMap {
    let mut metadata = owned::metadata(app, owned::config_map_name(app, &rendered.hash));
    metadata.labels.get_or_insert_with(BTreeMap::new).insert(
        owned::COMPONENT_LABEL.to_string(),
        owned::PROCESSOR_CONFIG.to_string(),
    );
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([(
            CONFIG_FILE.to_string(),
            rendered.yaml.clone(),
        )])),
        immutable: Some(true),
        ..ConfigMap::default()
    }
}

/// The processor configuration ConfigMaps to delete: every one of the StreamApp's that is
/// neither the current one nor used by a pod (a pod of an older revision keeps reading its own
/// until it is replaced).
pub fn stale_config_maps(
    existing: &[String],
    current: &str,
    used_by_pods: &[String],
) -> Vec<String> {
    existing
        .iter()
        .filter(|name| name.as_str() != current && !used_by_pods.contains(name))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;

    #[test]
    fn config_map_holds_the_processor_yaml_that_the_processor_reads_back() {
        let app = app();
        let rendered = render(&app).unwrap();
        let cm = desired_config_map(&app, &rendered);
        assert_eq!(
            cm.metadata.name,
            Some(format!("orders-config-{}", &rendered.hash[..10]))
        );
        assert_eq!(cm.immutable, Some(true));
        assert_eq!(
            cm.metadata.labels.as_ref().unwrap()["streamapp.dev/component"],
            "processor-config"
        );
        let yaml = &cm.data.unwrap()[CONFIG_FILE];
        let parsed: ProcessorConfig = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(parsed, processor_config(&app));
        assert_eq!(parsed.application_id, "shop.orders");
        assert_eq!(parsed.state_dir, STATE_DIR);
        assert_eq!(parsed.wal_dir, None);
        assert_eq!(parsed.topology.input_topic, "orders");
        parsed.validate().unwrap();
    }

    #[test]
    fn a_config_map_is_kept_while_it_is_current_or_a_pod_uses_it() {
        let existing = ["a-config-1", "a-config-2", "a-config-3", "a-config"].map(String::from);
        let stale = stale_config_maps(&existing, "a-config-3", &["a-config-2".into()]);
        assert_eq!(stale, ["a-config-1", "a-config"]);
    }

    #[test]
    fn wal_dir_is_set_only_with_a_wal_volume() {
        let mut app = app();
        app.spec.storage.wal_volume = Some(streamapp_api::crd::WalVolumeSpec {
            size: "2Gi".into(),
            storage_class_name: None,
        });
        assert_eq!(processor_config(&app).wal_dir.as_deref(), Some(WAL_DIR));
    }

    #[test]
    fn hash_changes_with_rocksdb_tuning_and_not_otherwise() {
        let app1 = app();
        let mut app2 = app();
        assert_eq!(render(&app1).unwrap().hash, render(&app2).unwrap().hash);
        app2.spec.rocksdb.block_cache_size = Some("64Mi".into());
        assert_ne!(render(&app1).unwrap().hash, render(&app2).unwrap().hash);
        assert_eq!(render(&app1).unwrap().hash.len(), 64, "sha256 hex");
    }

    #[test]
    fn config_map_is_owned_by_the_streamapp_and_labelled() {
        let cm = desired_config_map(&app(), &render(&app()).unwrap());
        let owner = &cm.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("StreamApp", "orders", Some(true))
        );
        assert_eq!(cm.metadata.labels.unwrap()["streamapp.dev/app"], "orders");
    }
}
