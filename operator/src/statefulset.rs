//! The StatefulSet of a StreamApp: one pod per replica, each with the processor, the agent as a
//! native sidecar, and its own state volume.
//!
//! The pod contract here is what the processor and agent binaries (and the local demo) rely
//! on: commands, environment, mount points, port and probes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy,
    StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    ExecAction, HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
    TopologySpreadConstraint, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use streamapp_api::crd::{RetainOrDelete, StreamApp};
use streamapp_api::units::parse_duration;

use crate::network_policy::AGENT_METRICS_PORT;
use crate::owned;
use crate::processor_config::{
    CONFIG_DIR, CONFIG_PATH, HTTP_PORT, KAFKA_TLS_DIR, STATE_DIR, WAL_DIR,
};

/// Pod template annotation with the SHA-256 of `processor.yaml`: a new configuration is a new
/// pod template, so the StatefulSet rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "streamapp.dev/config-hash";

/// The configuration hash a StatefulSet's pod template carries ([`CONFIG_HASH_ANNOTATION`]).
pub fn config_hash(sts: &StatefulSet) -> Option<&str> {
    sts.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(CONFIG_HASH_ANNOTATION)
        .map(String::as_str)
}
/// Pod template annotation with a hash of the Secrets the pods read (Kafka SASL credentials,
/// TLS material): a changed credential rolls the pods like a changed configuration.
pub const SECRETS_HASH_ANNOTATION: &str = "streamapp.dev/secrets-hash";
/// Claim template of the state volume; claims are named `state-<name>-<ordinal>`.
pub const STATE_VOLUME: &str = "state";
/// Claim template of the optional WAL volume; claims are named `wal-<name>-<ordinal>`.
pub const WAL_VOLUME: &str = "wal";
pub const PROCESSOR_CONTAINER: &str = "processor";
/// The StatefulSet's podManagementPolicy. It cannot change on a live StatefulSet: one made
/// with another (earlier operator versions used OrderedReady) is replaced (see `rollout`).
pub const POD_MANAGEMENT_POLICY: &str = "Parallel";
pub const AGENT_CONTAINER: &str = "agent";
/// The non-root user and group both containers run as (distroless' `nonroot`).
pub const RUN_AS: i64 = 65532;
/// Added to the drain timeout for terminationGracePeriodSeconds: the processor's own exit
/// and the agent's final report happen after the drain.
pub const GRACE_MARGIN: Duration = Duration::from_secs(15);
const DEFAULT_DRAIN: Duration = Duration::from_secs(60);

/// The StatefulSet the spec asks for, with the configuration `config_hash` (and the hash of
/// the Secrets it reads, when it reads any) in its pod template. When the StatefulSet already
/// exists, pass it through [`keep_claim_template_sizes`] before applying: claim templates
/// cannot change.
pub fn desired_statefulset(
    app: &StreamApp,
    config_hash: &str,
    secrets_hash: Option<&str>,
) -> StatefulSet {
    let spec = &app.spec;
    let pod = spec.pod.clone().unwrap_or_default();

    // User labels first: ours win, so the selector always matches.
    let mut pod_labels = pod.labels.clone();
    pod_labels.extend(owned::labels(app));
    let mut pod_annotations = pod.annotations.clone();
    pod_annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string());
    if let Some(hash) = secrets_hash {
        pod_annotations.insert(SECRETS_HASH_ANNOTATION.to_string(), hash.to_string());
    }
    // A restart request is a new pod template: the StatefulSet replaces the pods one by one.
    if let Some(restart) = app.annotations().get(streamapp_api::annotations::RESTART) {
        pod_annotations.insert(
            streamapp_api::annotations::RESTART.to_string(),
            restart.clone(),
        );
    }

    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: owned::config_map_name(app, config_hash),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if let Some(tls) = &spec.kafka.tls {
        volumes.push(Volume {
            name: "kafka-tls".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(tls.secret_name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }

    let mut claims = vec![claim_template(
        app,
        STATE_VOLUME,
        &spec.storage.size,
        spec.storage.storage_class_name.as_deref(),
    )];
    if let Some(wal) = &spec.storage.wal_volume {
        claims.push(claim_template(
            app,
            WAL_VOLUME,
            &wal.size,
            wal.storage_class_name.as_deref(),
        ));
    }

    let drain = parse_duration(&spec.shutdown.drain_timeout).unwrap_or(DEFAULT_DRAIN);
    let retention = spec.storage.retention_policy.clone().unwrap_or_default();

    StatefulSet {
        metadata: owned::metadata(app, owned::workload_name(app)),
        spec: Some(StatefulSetSpec {
            replicas: Some(spec.replicas),
            selector: LabelSelector {
                match_labels: Some(owned::selector_labels(app)),
                ..Default::default()
            },
            service_name: Some(owned::workload_name(app)),
            // Parallel: pods are created and removed together when scaling (scale-up is not
            // serial), and a pod that never becomes Ready does not block the others (see
            // `rollout` for stuck rollouts). Rollouts stay one pod at a time (RollingUpdate):
            // from the highest ordinal, each new pod Ready (its stores restored) before the next.
            pod_management_policy: Some(POD_MANAGEMENT_POLICY.into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(0),
                    ..Default::default()
                }),
            }),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(retain_or_delete(retention.when_deleted)),
                    when_scaled: Some(retain_or_delete(retention.when_scaled)),
                },
            ),
            revision_history_limit: Some(10),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    init_containers: Some(vec![agent_container(app)]),
                    containers: vec![processor_container(app)],
                    volumes: Some(volumes),
                    termination_grace_period_seconds: Some(
                        (drain + GRACE_MARGIN).as_secs_f64().ceil() as i64,
                    ),
                    service_account_name: Some(
                        pod.service_account_name
                            .clone()
                            .unwrap_or_else(|| owned::agent_name(app)),
                    ),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS),
                        run_as_group: Some(RUN_AS),
                        // The volumes become writable by the non-root user; OnRootMismatch avoids
                        // a recursive chown of a large state volume at every start.
                        fs_group: Some(RUN_AS),
                        fs_group_change_policy: Some("OnRootMismatch".into()),
                        seccomp_profile: Some(runtime_default_seccomp()),
                        ..Default::default()
                    }),
                    node_selector: non_empty(pod.node_selector),
                    tolerations: non_empty_vec(pod.tolerations),
                    affinity: pod.affinity,
                    topology_spread_constraints: topology_spread(
                        app,
                        pod.topology_spread_constraints,
                    ),
                    image_pull_secrets: non_empty_vec(pod.image_pull_secrets),
                    priority_class_name: pod.priority_class_name,
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(claims),
            ..Default::default()
        }),
        status: None,
    }
}

/// Runs `replicas` pods instead of `spec.replicas` (capped at the input's partitions, or 0 while
/// a reset stops the pods).
pub fn set_replicas(sts: &mut StatefulSet, replicas: i32) {
    if let Some(spec) = sts.spec.as_mut() {
        spec.replicas = Some(replicas);
    }
}

/// Claim templates of a StatefulSet cannot change. Keeps the live object's requested sizes in
/// `desired`, so applying it succeeds after `storage.size` grew; the claims themselves are
/// expanded directly (see `storage`).
pub fn keep_claim_template_sizes(desired: &mut StatefulSet, live: &StatefulSet) {
    let live_templates = live
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref());
    let desired_templates = desired
        .spec
        .as_mut()
        .and_then(|s| s.volume_claim_templates.as_mut());
    let (Some(live_templates), Some(desired_templates)) = (live_templates, desired_templates)
    else {
        return;
    };
    for template in desired_templates.iter_mut() {
        let live_size = live_templates
            .iter()
            .find(|t| t.metadata.name == template.metadata.name)
            .and_then(|t| claim_template_size(t).cloned());
        if let (Some(size), Some(spec)) = (live_size, template.spec.as_mut()) {
            spec.resources.get_or_insert_with(Default::default).requests =
                Some(BTreeMap::from([("storage".to_string(), size)]));
        }
    }
}

/// The requested storage of a claim template.
pub fn claim_template_size(template: &PersistentVolumeClaim) -> Option<&Quantity> {
    template
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
}

fn claim_template(
    app: &StreamApp,
    name: &str,
    size: &str,
    class: Option<&str>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(owned::labels(app)),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: class.map(str::to_string),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

fn processor_container(app: &StreamApp) -> Container {
    let spec = &app.spec;
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        // Where standbys are placed: on other nodes than their active task first.
        field_env("NODE_NAME", "spec.nodeName"),
        plain_env("STREAMAPP_CONFIG", CONFIG_PATH),
        plain_env("STREAMAPP_STATE_DIR", STATE_DIR),
    ];
    if spec.storage.wal_volume.is_some() {
        env.push(plain_env("STREAMAPP_WAL_DIR", WAL_DIR));
    }
    env.push(plain_env("STREAMAPP_HTTP_PORT", &HTTP_PORT.to_string()));
    // After a fence, the processor asks the agent whether this pod is still the current one
    // of its name before it joins again (streamapp_api::identity).
    env.push(plain_env(
        "STREAMAPP_AGENT_PORT",
        &AGENT_METRICS_PORT.to_string(),
    ));
    if let Some(sasl) = &spec.kafka.sasl {
        env.push(secret_env(
            "KAFKA_SASL_USERNAME",
            &sasl.secret_name,
            &sasl.username_key,
        ));
        env.push(secret_env(
            "KAFKA_SASL_PASSWORD",
            &sasl.secret_name,
            &sasl.password_key,
        ));
    }
    let mut mounts = vec![
        mount(STATE_VOLUME, STATE_DIR, false),
        mount("config", CONFIG_DIR, true),
    ];
    if spec.storage.wal_volume.is_some() {
        mounts.push(mount(WAL_VOLUME, WAL_DIR, false));
    }
    if spec.kafka.tls.is_some() {
        env.push(plain_env("STREAMAPP_KAFKA_TLS_DIR", KAFKA_TLS_DIR));
        mounts.push(mount("kafka-tls", KAFKA_TLS_DIR, true));
    }
    // The user's extra variables, after ours; one of ours of the same name wins.
    let extra: Vec<EnvVar> = spec
        .pod
        .iter()
        .flat_map(|p| p.env.iter())
        .filter(|e| !env.iter().any(|ours| ours.name == e.name))
        .cloned()
        .collect();
    env.extend(extra);
    Container {
        name: PROCESSOR_CONTAINER.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        command: Some(vec!["streamapp-processor".into(), "run".into()]),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(HTTP_PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // Ready only once every store is restored: the StatefulSet rollout waits for it.
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        // Generous: a long restore keeps /healthz answering, but a busy node should not get a
        // processor killed mid-restore (which would start the restore over).
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(10),
            ..http_probe("/healthz", 10, 6)
        }),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        "streamapp-processor".into(),
                        "drain".into(),
                        "--timeout".into(),
                        spec.shutdown.drain_timeout.clone(),
                    ]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        security_context: Some(container_security_context()),
        resources: spec.resources.clone(),
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// The agent runs as a native sidecar (an init container with `restartPolicy: Always`): it
/// starts before the processor and stops after it, so it can report the final drain.
fn agent_container(app: &StreamApp) -> Container {
    let spec = &app.spec;
    let agent = spec.agent.clone().unwrap_or_default();
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_UID", "metadata.uid"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        plain_env("STREAMAPP_NAME", &app.name_any()),
        plain_env("STREAMAPP_STATE_DIR", STATE_DIR),
        plain_env("STREAMAPP_PROCESSOR_PORT", &HTTP_PORT.to_string()),
        // The port the processor asks /identity on (and the NetworkPolicy admits /metrics on).
        plain_env(
            "STREAMAPP_AGENT_METRICS_PORT",
            &AGENT_METRICS_PORT.to_string(),
        ),
    ];
    if let Some(heartbeat) = &agent.heartbeat {
        env.push(plain_env("STREAMAPP_HEARTBEAT", heartbeat));
    }
    // The agent only inspects the volumes; it never writes to them.
    let mut mounts = vec![mount(STATE_VOLUME, STATE_DIR, true)];
    if spec.storage.wal_volume.is_some() {
        // It counts and ages the WAL files, wherever they are.
        env.push(plain_env("STREAMAPP_WAL_DIR", WAL_DIR));
        mounts.push(mount(WAL_VOLUME, WAL_DIR, true));
    }
    Container {
        name: AGENT_CONTAINER.into(),
        image: Some(agent.image.unwrap_or_else(|| spec.image.clone())),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        restart_policy: Some("Always".into()),
        command: Some(vec!["streamapp-agent".into(), "run".into()]),
        env: Some(env),
        security_context: Some(container_security_context()),
        resources: agent.resources,
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

fn container_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..Default::default()
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn retain_or_delete(v: RetainOrDelete) -> String {
    match v {
        RetainOrDelete::Retain => "Retain".into(),
        RetainOrDelete::Delete => "Delete".into(),
    }
}

fn plain_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn field_env(name: &str, field: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn non_empty<K, V>(map: BTreeMap<K, V>) -> Option<BTreeMap<K, V>> {
    (!map.is_empty()).then_some(map)
}

/// The user's spread constraints, or by default an even spread across zones and nodes that the
/// scheduler prefers but never waits for (`ScheduleAnyway`): losing a node or a zone then costs
/// as few stores as it can, and a one-node cluster still runs every pod.
fn topology_spread(
    app: &StreamApp,
    configured: Option<Vec<TopologySpreadConstraint>>,
) -> Option<Vec<TopologySpreadConstraint>> {
    let constraints = configured.unwrap_or_else(|| {
        ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
            .into_iter()
            .map(|key| TopologySpreadConstraint {
                max_skew: 1,
                topology_key: key.to_string(),
                when_unsatisfiable: "ScheduleAnyway".to_string(),
                label_selector: Some(LabelSelector {
                    match_labels: Some(owned::selector_labels(app)),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect()
    });
    non_empty_vec(constraints)
}

fn non_empty_vec<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests;
