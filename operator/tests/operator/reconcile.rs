//! The operator against the real local API server: owned objects, status, configuration
//! changes, storage growth, blocked rollouts and garbage collection. Each test has its own
//! namespace and its own in-process operator watching only it. The pods land on the test bed's
//! fake node, where nothing runs them: what needs running pods (readiness, rollouts waiting
//! for it, scaling, drains, crashes) is tested on the real node, in e2e/.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use streamapp_api::config::ProcessorConfig;
use streamapp_api::crd::StreamApp;
use streamapp_api::status_values::{AppPhase, StateHealth};
use support::*;
use testbed::kube::{kubectl, wait_for};

async fn statefulset(client: &Client, ns: &str, name: &str) -> StatefulSet {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    eventually(
        Duration::from_secs(60),
        &format!("StatefulSet {name}"),
        || async { api.get_opt(name).await.ok().flatten() },
    )
    .await
}

fn processor_image(sts: &StatefulSet) -> String {
    sts.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap()
}

/// The configuration ConfigMap a pod template (or pod spec) mounts.
fn config_map_of(spec: &k8s_openapi::api::core::v1::PodSpec) -> String {
    spec.volumes
        .iter()
        .flatten()
        .find_map(|v| v.config_map.as_ref().map(|c| c.name.clone()))
        .expect("a ConfigMap volume")
}

fn template_config_map(sts: &StatefulSet) -> String {
    config_map_of(sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap())
}

fn config_hash(sts: &StatefulSet) -> String {
    sts.spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()["streamapp.dev/config-hash"]
        .clone()
}

async fn event_reasons(client: &Client, ns: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test]
async fn creating_a_streamapp_creates_every_owned_object_with_the_expected_fields() {
    with_operator("create", |client, ns| async move {
        let app = create(&client, &ns, streamapp_json("orders", 1)).await;
        let uid = app.metadata.uid.clone().unwrap();
        let sts = statefulset(&client, &ns, "orders").await;

        let owned_by_app = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            let owner = &meta.owner_references.as_ref().expect("owner references")[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
                ("StreamApp", uid.as_str(), Some(true))
            );
            let labels = meta.labels.as_ref().unwrap();
            assert_eq!(labels["app.kubernetes.io/name"], "streamapp");
            assert_eq!(labels["app.kubernetes.io/instance"], "orders");
            assert_eq!(labels["app.kubernetes.io/managed-by"], "streamapp-operator");
            assert_eq!(labels["streamapp.dev/app"], "orders");
        };
        owned_by_app(&sts.metadata);
        let spec = sts.spec.as_ref().unwrap();
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        let pod = spec.template.spec.as_ref().unwrap();
        let agent = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            (agent.name.as_str(), agent.restart_policy.as_deref()),
            ("agent", Some("Always"))
        );
        assert_eq!(pod.service_account_name.as_deref(), Some("orders-agent"));
        assert_eq!(pod.termination_grace_period_seconds, Some(75));

        let svc = Api::<Service>::namespaced(client.clone(), &ns)
            .get("orders")
            .await
            .unwrap();
        owned_by_app(&svc.metadata);
        assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("None"));

        let cm_name = template_config_map(&sts);
        assert_eq!(
            cm_name,
            format!("orders-config-{}", &config_hash(&sts)[..10])
        );
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get(&cm_name)
            .await
            .unwrap();
        owned_by_app(&cm.metadata);
        assert_eq!(cm.immutable, Some(true));
        let yaml = &cm.data.as_ref().unwrap()["processor.yaml"];
        let config: ProcessorConfig = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(config.application_id, format!("{ns}.orders"));
        assert_eq!(config.topology.input_topic, "orders");
        assert_eq!(config.state_dir, "/var/lib/streamapp/state");
        use sha2::Digest;
        assert_eq!(
            config_hash(&sts),
            hex::encode(sha2::Sha256::digest(yaml.as_bytes()))
        );

        let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
            .get("orders")
            .await
            .unwrap();
        owned_by_app(&pdb.metadata);
        assert_eq!(pdb.spec.unwrap().max_unavailable, Some(IntOrString::Int(1)));

        let policy = Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
            .get("orders")
            .await
            .unwrap();
        owned_by_app(&policy.metadata);
        let ports: Vec<_> = policy.spec.unwrap().ingress.unwrap()[0]
            .ports
            .iter()
            .flatten()
            .map(|p| p.port.clone().unwrap())
            .collect();
        assert_eq!(ports, [IntOrString::Int(8080), IntOrString::Int(8081)]);

        let sa = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .get("orders-agent")
            .await
            .unwrap();
        owned_by_app(&sa.metadata);
        let role = Api::<Role>::namespaced(client.clone(), &ns)
            .get("orders-agent")
            .await
            .unwrap();
        owned_by_app(&role.metadata);
        let status_rule = role
            .rules
            .unwrap()
            .into_iter()
            .find(|r| r.resources == Some(vec!["streamapps/status".into()]))
            .unwrap();
        assert_eq!(status_rule.resource_names, Some(vec!["orders".to_string()]));
        let binding = Api::<RoleBinding>::namespaced(client.clone(), &ns)
            .get("orders-agent")
            .await
            .unwrap();
        owned_by_app(&binding.metadata);
        assert_eq!(binding.subjects.unwrap()[0].name, "orders-agent");

        // The agent's RBAC works as intended: it may patch its own StreamApp's status only.
        let as_agent = format!("system:serviceaccount:{ns}:orders-agent");
        let can = |args: &[&str]| {
            let out = kubectl(
                &[&["auth", "can-i", "-n", &ns, "--as", &as_agent][..], args].concat(),
                None,
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(
            can(&["patch", "streamapps/orders", "--subresource=status"]),
            "yes"
        );
        assert_eq!(
            can(&["patch", "streamapps/other", "--subresource=status"]),
            "no"
        );
        assert_eq!(can(&["patch", "streamapps/orders"]), "no");
        assert_eq!(can(&["get", "streamapps/orders"]), "yes");

        let status = wait_for_status(&client, &ns, "orders", "the first status", |s| {
            s.observed_generation.is_some()
        })
        .await;
        assert_eq!(status.selector.as_deref(), Some("streamapp.dev/app=orders"));
        assert_eq!(
            status.config_hash.as_deref(),
            Some(config_hash(&sts).as_str())
        );
        assert!(
            event_reasons(&client, &ns)
                .await
                .contains(&"Created".to_string())
        );
    })
    .await;
}

/// Every ConfigMap a pod mounts exists, and no other configuration ConfigMap than the current
/// one does.
async fn assert_config_maps_follow_the_pods(client: &Client, ns: &str, app: &str, current: &str) {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("streamapp.dev/app={app}")))
        .await
        .unwrap()
        .items;
    let used: Vec<String> = pods
        .iter()
        .map(|p| config_map_of(p.spec.as_ref().unwrap()))
        .collect();
    let configs = Api::<ConfigMap>::namespaced(client.clone(), ns);
    wait_for(
        Duration::from_secs(30),
        "configuration ConfigMaps no pod uses to be deleted",
        || async {
            let existing: Vec<String> = configs
                .list(&ListParams::default().labels(&format!(
                    "streamapp.dev/app={app},streamapp.dev/component=processor-config"
                )))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|c| c.metadata.name.unwrap())
                .collect();
            existing.iter().all(|c| c == current || used.contains(c))
                && used.iter().all(|u| existing.contains(u))
                && existing.iter().any(|c| c == current)
        },
    )
    .await;
}

#[tokio::test]
async fn a_configuration_change_rolls_the_template_and_a_rollback_brings_the_old_configuration_back()
 {
    with_operator("tuning", |client, ns| async move {
        create(&client, &ns, streamapp_json("clicks", 1)).await;
        let first = wait_for_status(&client, &ns, "clicks", "a config hash", |s| {
            s.config_hash.is_some()
        })
        .await;
        let old_hash = first.config_hash.unwrap();
        let configs = Api::<ConfigMap>::namespaced(client.clone(), &ns);
        let old_name = template_config_map(&statefulset(&client, &ns, "clicks").await);
        let old_yaml =
            configs.get(&old_name).await.unwrap().data.unwrap()["processor.yaml"].clone();

        patch_spec(
            &client,
            &ns,
            "clicks",
            serde_json::json!({ "rocksdb": { "blockCacheSize": "64Mi" } }),
        )
        .await;
        let status = wait_for_status(&client, &ns, "clicks", "a new config hash", |s| {
            s.config_hash.as_deref().is_some_and(|h| h != old_hash)
        })
        .await;
        let new_hash = status.config_hash.unwrap();
        let sts = statefulset(&client, &ns, "clicks").await;
        assert_eq!(
            config_hash(&sts),
            new_hash,
            "the pod template rolls with the configuration"
        );
        let new_name = template_config_map(&sts);
        assert_ne!(new_name, old_name, "a new configuration is a new ConfigMap");
        let cm = configs.get(&new_name).await.unwrap();
        assert_eq!(cm.immutable, Some(true));
        let config: ProcessorConfig =
            serde_yaml::from_str(&cm.data.unwrap()["processor.yaml"]).unwrap();
        assert_eq!(config.rocksdb.block_cache_size.as_deref(), Some("64Mi"));
        // A pod that has not rolled yet still finds the configuration it started with.
        assert_config_maps_follow_the_pods(&client, &ns, "clicks", &new_name).await;

        // Going back to the earlier spec goes back to the earlier configuration, unchanged.
        patch_spec(
            &client,
            &ns,
            "clicks",
            serde_json::json!({ "rocksdb": { "blockCacheSize": null } }),
        )
        .await;
        wait_for_status(&client, &ns, "clicks", "the old config hash again", |s| {
            s.config_hash.as_deref() == Some(old_hash.as_str())
        })
        .await;
        let sts = statefulset(&client, &ns, "clicks").await;
        assert_eq!(template_config_map(&sts), old_name);
        assert_eq!(
            configs.get(&old_name).await.unwrap().data.unwrap()["processor.yaml"],
            old_yaml
        );
        assert_config_maps_follow_the_pods(&client, &ns, "clicks", &old_name).await;
    })
    .await;
}

#[tokio::test]
async fn a_changed_kafka_credential_rolls_the_pod_template() {
    with_operator("secret", |client, ns| async move {
        let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns);
        let secret = |password: &str| -> k8s_openapi::api::core::v1::Secret {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "kafka-user" },
                "stringData": { "username": "orders", "password": password },
            }))
            .unwrap()
        };
        secrets
            .create(&Default::default(), &secret("one"))
            .await
            .unwrap();
        let mut app = streamapp_json("payments", 1);
        app["spec"]["kafka"]["sasl"] = serde_json::json!({ "secretName": "kafka-user" });
        create(&client, &ns, app).await;
        let hash_of = |sts: &StatefulSet| {
            sts.spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap()
                .annotations
                .as_ref()
                .unwrap()
                .get("streamapp.dev/secrets-hash")
                .cloned()
        };
        let first = eventually(
            Duration::from_secs(30),
            "a secrets hash in the pod template",
            || async { hash_of(&statefulset(&client, &ns, "payments").await) },
        )
        .await;

        secrets
            .patch(
                "kafka-user",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "stringData": { "password": "two" } })),
            )
            .await
            .unwrap();
        // The Secret is watched: the change rolls the template now, not at the next resync.
        wait_for(Duration::from_secs(20), "a new secrets hash", || async {
            hash_of(&statefulset(&client, &ns, "payments").await).is_some_and(|h| h != first)
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn an_agents_pods_entry_written_with_its_own_field_manager_survives_operator_reconciles() {
    with_operator("agent-entry", |client, ns| async move {
        create(&client, &ns, streamapp_json("search", 1)).await;
        wait_for_status(&client, &ns, "search", "the operator's first status", |s| s.phase.is_some()).await;

        // What the agent of search-0 writes, under its own field manager.
        let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns);
        let entry = serde_json::json!({
            "apiVersion": "streamapp.dev/v1alpha1",
            "kind": "StreamApp",
            "status": { "pods": [{
                "name": "search-0", "reportedAt": "2026-12-01T10:00:00Z", "phase": "Running", "processorUp": true, "ready": true,
                "tasks": [{ "partition": 0, "restoreLag": 42, "checkpointAgeSeconds": 130, "opened": "Clean" }],
            }] },
        });
        api.patch_status("search", &PatchParams::apply("streamapp-agent-search-0"), &Patch::Apply(&entry)).await.unwrap();

        let status = wait_for_status(&client, &ns, "search", "the operator to aggregate the report", |s| {
            s.worst_restore_lag == Some(42)
        })
        .await;
        assert_eq!(
            status.oldest_checkpoint.as_ref().map(|t| t.0.to_string()).as_deref(),
            Some("2026-12-01T09:57:50Z"),
            "reported at 10:00:00 as committed 130 s before"
        );
        assert_eq!(status.state_health, Some(StateHealth::Healthy));
        assert_eq!(condition(&status, "StateHealthy").unwrap(), ("True".into(), "StoresHealthy".into()));

        // More reconciles, each applying the status: the entry stays.
        let generation = patch_spec(&client, &ns, "search", serde_json::json!({ "image": "registry.example/streamapp:2.0" }))
            .await
            .metadata
            .generation;
        let status = wait_for_status(&client, &ns, "search", "the new generation observed", |s| s.observed_generation == generation).await;
        assert_eq!(status.pods.len(), 1, "{status:#?}");
        assert_eq!(status.pods[0].name, "search-0");
        assert_eq!(status.pods[0].tasks[0].restore_lag, Some(42));

        let app = api.get("search").await.unwrap();
        let managers: Vec<_> = app.metadata.managed_fields.unwrap().into_iter().filter_map(|m| m.manager).collect();
        assert!(managers.contains(&"streamapp-agent-search-0".to_string()), "{managers:?}");
        assert!(managers.contains(&"streamapp-operator".to_string()), "{managers:?}");
    })
    .await;
}

#[tokio::test]
async fn growing_the_storage_expands_the_claims_and_the_bound_volumes() {
    with_operator("storage", |client, ns| async move {
        create(&client, &ns, streamapp_json("archive", 1)).await;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let capacity = |c: &PersistentVolumeClaim| {
            c.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .map(|c| c["storage"].0.clone())
                .unwrap_or_default()
        };
        wait_for(
            Duration::from_secs(90),
            "claim state-archive-0 bound at 1Gi",
            || async {
                claims
                    .get_opt("state-archive-0")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|c| {
                        c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                            && capacity(&c) == "1Gi"
                    })
            },
        )
        .await;
        // Start from the steady state of a pod on the fake node (Running, never Ready): the
        // StatefulSet's pod scheduled and started, nothing degraded. A pod still on its way there
        // (scheduled a moment after its claim binds) must not be mistaken for the resize's doing.
        wait_for_status(
            &client,
            &ns,
            "archive",
            "the pod started, nothing degraded",
            |s| {
                condition(s, "Progressing").is_some_and(|c| c.1 == "PodsStarting")
                    && condition(s, "Degraded").is_some_and(|c| c.0 == "False")
            },
        )
        .await;

        let generation = patch_spec(
            &client,
            &ns,
            "archive",
            serde_json::json!({ "storage": { "size": "2Gi" } }),
        )
        .await
        .metadata
        .generation;
        wait_for(
            Duration::from_secs(90),
            "claim state-archive-0 to grow to 2Gi",
            || async {
                claims
                    .get_opt("state-archive-0")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|c| {
                        c.spec
                            .as_ref()
                            .unwrap()
                            .resources
                            .as_ref()
                            .unwrap()
                            .requests
                            .as_ref()
                            .unwrap()["storage"]
                            .0
                            == "2Gi"
                            && capacity(&c) == "2Gi"
                    })
            },
        )
        .await;
        // The StatefulSet keeps its (immutable) claim template, and applying it still works: the
        // status returns to where it was before the resize.
        let status = wait_for_status(&client, &ns, "archive", "the resize to settle", |s| {
            s.observed_generation == generation
                && condition(s, "Progressing").is_some_and(|c| c.1 == "PodsStarting")
        })
        .await;
        assert_eq!(
            condition(&status, "Degraded").unwrap().0,
            "False",
            "{status:#?}"
        );
        let sts = statefulset(&client, &ns, "archive").await;
        let template = &sts.spec.unwrap().volume_claim_templates.unwrap()[0];
        assert_eq!(
            template
                .spec
                .as_ref()
                .unwrap()
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap()["storage"]
                .0,
            "1Gi"
        );
        wait_for(
            Duration::from_secs(30),
            "the StorageResizing and StorageResized events",
            || async {
                let reasons = event_reasons(&client, &ns).await;
                reasons.contains(&"StorageResizing".to_string())
                    && reasons.contains(&"StorageResized".to_string())
            },
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_memory_limit_below_the_rocksdb_budget_is_degraded_and_not_rolled_out() {
    with_operator("memory", |client, ns| async move {
        create(&client, &ns, streamapp_json("billing", 1)).await;
        let before = statefulset(&client, &ns, "billing").await;

        patch_spec(
            &client,
            &ns,
            "billing",
            serde_json::json!({ "image": "registry.example/streamapp:9.9", "resources": { "limits": { "memory": "256Mi" } } }),
        )
        .await;
        let status = wait_for_status(&client, &ns, "billing", "Degraded (MemoryBudgetExceeded)", |s| {
            condition(s, "Degraded").is_some_and(|c| c.1 == "MemoryBudgetExceeded")
        })
        .await;
        assert_eq!(status.phase, Some(AppPhase::Degraded));
        let message = &status.conditions.iter().find(|c| c.type_ == "Degraded").unwrap().message;
        assert!(message.contains("114 MiB over") && message.contains("rocksdb.blockCacheSize"), "{message}");
        assert_eq!(condition(&status, "Progressing").unwrap().1, "RolloutBlocked");
        let sts = statefulset(&client, &ns, "billing").await;
        assert_eq!(processor_image(&sts), processor_image(&before), "nothing rolls out while the budget is exceeded");
        assert!(event_reasons(&client, &ns).await.contains(&"Degraded".to_string()));

        patch_spec(&client, &ns, "billing", serde_json::json!({ "resources": { "limits": { "memory": "1Gi" } } })).await;
        wait_for_status(&client, &ns, "billing", "Degraded to clear", |s| {
            condition(s, "Degraded").is_some_and(|c| c.0 == "False")
        })
        .await;
        assert_eq!(processor_image(&statefulset(&client, &ns, "billing").await), "registry.example/streamapp:9.9");
        wait_for(Duration::from_secs(30), "the Recovered event", || async {
            event_reasons(&client, &ns).await.contains(&"Recovered".to_string())
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn deleting_the_streamapp_garbage_collects_its_objects() {
    with_operator("delete", |client, ns| async move {
        create(&client, &ns, streamapp_json("audit", 1)).await;
        let cm_name = template_config_map(&statefulset(&client, &ns, "audit").await);
        wait_for(Duration::from_secs(30), "the ConfigMap", || async {
            object::<ConfigMap>(&client, &ns, &cm_name).await.is_some()
        })
        .await;

        Api::<StreamApp>::namespaced(client.clone(), &ns)
            .delete("audit", &DeleteParams::background())
            .await
            .unwrap();
        let gone = |c: Client, ns: String| async move {
            object::<StatefulSet>(&c, &ns, "audit").await.is_none()
                && object::<Service>(&c, &ns, "audit").await.is_none()
                && Api::<ConfigMap>::namespaced(c.clone(), &ns)
                    .list(&ListParams::default().labels("streamapp.dev/app=audit"))
                    .await
                    .unwrap()
                    .items
                    .is_empty()
                && object::<ConfigMap>(&c, &ns, "audit-config").await.is_none()
                && object::<PodDisruptionBudget>(&c, &ns, "audit")
                    .await
                    .is_none()
                && object::<ServiceAccount>(&c, &ns, "audit-agent")
                    .await
                    .is_none()
                && object::<Role>(&c, &ns, "audit-agent").await.is_none()
                && object::<RoleBinding>(&c, &ns, "audit-agent")
                    .await
                    .is_none()
        };
        wait_for(
            Duration::from_secs(60),
            "every owned object to be garbage-collected",
            || gone(client.clone(), ns.clone()),
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_paused_streamapp_applies_no_spec_change_until_unpaused_and_a_restart_rolls_the_template()
{
    with_operator("pause", |client, ns| async move {
        create(&client, &ns, streamapp_json("ledger", 1)).await;
        statefulset(&client, &ns, "ledger").await;
        let annotate = |kv: &str| {
            let out = kubectl(
                &["annotate", "--overwrite", "-n", &ns, "streamapp/ledger", kv],
                None,
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        annotate("streamapp.dev/paused=true");
        let generation = patch_spec(
            &client,
            &ns,
            "ledger",
            serde_json::json!({ "image": "registry.example/streamapp:2.0" }),
        )
        .await
        .metadata
        .generation;
        // The operator saw the new generation (it reports it) and left the StatefulSet alone.
        let status = wait_for_status(
            &client,
            &ns,
            "ledger",
            "the paused status of the new generation",
            |s| {
                s.observed_generation == generation
                    && condition(s, "ReconciliationPaused")
                        .is_some_and(|c| c == ("True".into(), "Paused".into()))
            },
        )
        .await;
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "ReconciliationPaused"
                    && c.message.contains("streamapp.dev/paused")),
            "{status:?}"
        );
        assert_eq!(
            processor_image(&statefulset(&client, &ns, "ledger").await),
            "registry.example/streamapp:1.0"
        );

        annotate("streamapp.dev/paused-");
        wait_for(
            Duration::from_secs(30),
            "the new image once unpaused",
            || async {
                processor_image(&statefulset(&client, &ns, "ledger").await)
                    == "registry.example/streamapp:2.0"
            },
        )
        .await;
        wait_for_status(&client, &ns, "ledger", "ReconciliationPaused False", |s| {
            condition(s, "ReconciliationPaused").is_some_and(|c| c.0 == "False")
        })
        .await;

        annotate("streamapp.dev/restart=2026-12-01T10:00:00Z");
        wait_for(
            Duration::from_secs(30),
            "the restart request in the pod template",
            || async {
                let sts = statefulset(&client, &ns, "ledger").await;
                sts.spec
                    .unwrap()
                    .template
                    .metadata
                    .unwrap()
                    .annotations
                    .unwrap()
                    .get("streamapp.dev/restart")
                    .map(String::as_str)
                    == Some("2026-12-01T10:00:00Z")
            },
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_statefulset_made_with_ordered_ready_is_replaced_without_restarting_its_pods() {
    let client = testbed::kube::client().await;
    install_crd(&client).await;
    let ns = testbed::kube::TestNamespace::create(&client, "migrate").await;
    let app = create(&client, &ns.name, streamapp_json("legacy", 1)).await;
    // The StatefulSet (and the ServiceAccount its pods run as) as an earlier operator version
    // made it.
    Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
        .patch(
            "legacy-agent",
            &PatchParams::apply("streamapp-operator").force(),
            &Patch::Apply(&streamapp_operator::rbac::desired_service_account(&app)),
        )
        .await
        .unwrap();
    // Same pod template as the current operator renders: only the policy differs.
    let hash = streamapp_operator::processor_config::render(&app)
        .unwrap()
        .hash;
    let mut old = streamapp_operator::statefulset::desired_statefulset(&app, &hash, None);
    old.spec.as_mut().unwrap().pod_management_policy = Some("OrderedReady".into());
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    sets.patch(
        "legacy",
        &PatchParams::apply("streamapp-operator").force(),
        &Patch::Apply(&old),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod = eventually(Duration::from_secs(60), "pod legacy-0 Running", || async {
        pods.get_opt("legacy-0")
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let old_sts_uid = sets.get("legacy").await.unwrap().metadata.uid.unwrap();

    let operator = Operator::start(&client, &ns.name);
    let new = eventually(
        Duration::from_secs(60),
        "a Parallel StatefulSet",
        || async {
            sets.get_opt("legacy").await.ok().flatten().filter(|s| {
                s.spec.as_ref().unwrap().pod_management_policy.as_deref() == Some("Parallel")
            })
        },
    )
    .await;
    assert_ne!(
        new.metadata.uid.clone().unwrap(),
        old_sts_uid,
        "a new StatefulSet"
    );
    // The pod was orphaned and adopted, never deleted: the same pod, owned by the new one.
    wait_for(
        Duration::from_secs(30),
        "the new StatefulSet to adopt legacy-0",
        || async {
            pods.get_opt("legacy-0")
                .await
                .ok()
                .flatten()
                .is_some_and(|p| {
                    p.metadata.uid == pod.metadata.uid
                        && p.metadata.owner_references.iter().flatten().any(|o| {
                            o.kind == "StatefulSet" && Some(&o.uid) == new.metadata.uid.as_ref()
                        })
                })
        },
    )
    .await;
    assert!(
        event_reasons(&client, &ns.name)
            .await
            .contains(&"ReplacingStatefulSet".to_string())
    );
    operator.stop().await.expect("a clean stop");
    ns.delete().await;
}

#[tokio::test]
async fn the_reports_of_pods_scaled_away_are_removed_from_the_status() {
    with_operator("prune", |client, ns| async move {
        create(&client, &ns, streamapp_json("search", 1)).await;
        wait_for_status(&client, &ns, "search", "the operator's first status", |s| {
            s.phase.is_some()
        })
        .await;
        let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns);
        // Two agents report, each with its own field manager: search-0 (a pod that exists, on
        // the fake node) and search-5 (a pod of an earlier, larger scale that is gone).
        for pod in ["search-0", "search-5"] {
            let entry = serde_json::json!({
                "apiVersion": "streamapp.dev/v1alpha1", "kind": "StreamApp",
                "status": { "pods": [{ "name": pod, "phase": "Running" }] },
            });
            api.patch_status(
                "search",
                &PatchParams::apply(&format!("streamapp-agent-{pod}")),
                &Patch::Apply(&entry),
            )
            .await
            .unwrap();
        }
        wait_for(Duration::from_secs(60), "pod search-0 to exist", || async {
            object::<Pod>(&client, &ns, "search-0").await.is_some()
        })
        .await;
        let status = wait_for_status(&client, &ns, "search", "search-5's entry to go", |s| {
            s.pods.iter().all(|p| p.name != "search-5")
        })
        .await;
        assert_eq!(
            status
                .pods
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["search-0"]
        );
    })
    .await;
}

/// An old pod's agent (its node came back after the pod was replaced) writes over the entry
/// of the pod of the same name: the entry carries the old pod's UID, so the operator neither
/// counts it nor keeps it; the current pod's own report is kept.
#[tokio::test]
async fn a_report_from_an_older_pod_of_the_same_name_is_not_counted_and_is_removed() {
    with_operator("stale-uid", |client, ns| async move {
        create(&client, &ns, streamapp_json("search", 1)).await;
        let pod = eventually(Duration::from_secs(60), "pod search-0 to exist", || async {
            object::<Pod>(&client, &ns, "search-0").await
        })
        .await;
        let live_uid = pod.metadata.uid.clone().unwrap();
        let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns);
        let report = |uid: &str, restore_lag: i64| {
            serde_json::json!({
                "apiVersion": "streamapp.dev/v1alpha1", "kind": "StreamApp",
                "status": { "pods": [{
                    "name": "search-0", "uid": uid, "phase": "Running", "processorUp": true, "ready": true,
                    "tasks": [{ "partition": 0, "restoreLag": restore_lag }],
                }] },
            })
        };
        let write = |entry: serde_json::Value| {
            let api = api.clone();
            async move {
                api.patch_status(
                    "search",
                    &PatchParams::apply("streamapp-agent/search-0").force(),
                    &Patch::Apply(&entry),
                )
                .await
                .unwrap();
            }
        };
        // The current pod's agent: counted.
        write(report(&live_uid, 42)).await;
        wait_for_status(&client, &ns, "search", "the live pod's report counted", |s| {
            s.worst_restore_lag == Some(42)
        })
        .await;
        // The old pod's agent writes over it: never counted, and removed.
        write(report("uid-of-the-replaced-pod", 7)).await;
        let status = wait_for_status(&client, &ns, "search", "the stale entry removed", |s| {
            s.pods.iter().all(|p| p.uid.as_deref() != Some("uid-of-the-replaced-pod"))
        })
        .await;
        assert_ne!(
            status.worst_restore_lag,
            Some(7),
            "the stale report was counted: {status:#?}"
        );
        // The current pod's agent writes again: counted again.
        write(report(&live_uid, 43)).await;
        let status = wait_for_status(&client, &ns, "search", "the live pod's report counted", |s| {
            s.worst_restore_lag == Some(43)
        })
        .await;
        assert_eq!(status.pods.len(), 1);
        assert_eq!(status.pods[0].uid.as_deref(), Some(live_uid.as_str()));
    })
    .await;
}

#[tokio::test]
async fn kubectl_scale_still_works_while_a_rollout_is_blocked() {
    with_operator("scale-blocked", |client, ns| async move {
        create(&client, &ns, streamapp_json("billing", 1)).await;
        statefulset(&client, &ns, "billing").await;
        patch_spec(
            &client,
            &ns,
            "billing",
            serde_json::json!({ "image": "registry.example/streamapp:9.9", "resources": { "limits": { "memory": "256Mi" } } }),
        )
        .await;
        wait_for_status(&client, &ns, "billing", "the blocked rollout", |s| {
            condition(s, "Degraded").is_some_and(|c| c.1 == "MemoryBudgetExceeded")
        })
        .await;
        let out = kubectl(&["scale", "streamapp", "billing", "--replicas=3", "-n", &ns], None);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        wait_for(Duration::from_secs(30), "the StatefulSet to scale to 3", || async {
            statefulset(&client, &ns, "billing").await.spec.unwrap().replicas == Some(3)
        })
        .await;
        assert_eq!(
            processor_image(&statefulset(&client, &ns, "billing").await),
            "registry.example/streamapp:1.0",
            "the rest of the spec still waits for the memory budget"
        );
    })
    .await;
}

#[tokio::test]
async fn turning_the_network_policy_off_deletes_it_and_the_budget_follows_the_spec() {
    with_operator("netpol", |client, ns| async move {
        create(&client, &ns, streamapp_json("ledger", 1)).await;
        let policies = Api::<NetworkPolicy>::namespaced(client.clone(), &ns);
        wait_for(Duration::from_secs(30), "the NetworkPolicy", || async {
            policies.get_opt("ledger").await.unwrap().is_some()
        })
        .await;
        patch_spec(
            &client,
            &ns,
            "ledger",
            serde_json::json!({
                "networkPolicy": { "enabled": false },
                "disruptionBudget": { "maxUnavailable": "50%" },
            }),
        )
        .await;
        wait_for(
            Duration::from_secs(30),
            "the NetworkPolicy to be deleted",
            || async { policies.get_opt("ledger").await.unwrap().is_none() },
        )
        .await;
        let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns);
        wait_for(Duration::from_secs(30), "maxUnavailable 50%", || async {
            budgets
                .get("ledger")
                .await
                .unwrap()
                .spec
                .unwrap()
                .max_unavailable
                == Some(IntOrString::String("50%".into()))
        })
        .await;
    })
    .await;
}
