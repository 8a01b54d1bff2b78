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
mod tests {
    use super::*;
    use crate::testing::app;
    use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
    use streamapp_api::crd::{
        AgentSpec, PodOverrides, SaslSecret, TlsSecret, VolumeRetentionPolicy, WalVolumeSpec,
    };

    fn pod_spec(sts: &StatefulSet) -> &PodSpec {
        sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn container<'a>(sts: &'a StatefulSet, name: &str) -> &'a Container {
        let spec = pod_spec(sts);
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .unwrap()
    }

    fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a EnvVar> {
        c.env.as_ref().unwrap().iter().find(|e| e.name == name)
    }

    fn env_str<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
        env_value(c, name).and_then(|e| e.value.as_deref())
    }

    fn mount_path<'a>(c: &'a Container, volume: &str) -> Option<&'a str> {
        c.volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == volume)
            .map(|m| m.mount_path.as_str())
    }

    #[test]
    fn extra_environment_is_added_but_never_replaces_the_operators() {
        let mut app = app();
        app.spec.pod = Some(PodOverrides {
            env: vec![
                EnvVar {
                    name: "RUST_LOG".into(),
                    value: Some("debug".into()),
                    ..Default::default()
                },
                EnvVar {
                    name: "POD_NAME".into(),
                    value: Some("impostor".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let sts = desired_statefulset(&app, "h1", None);
        let p = container(&sts, "processor");
        assert_eq!(env_str(p, "RUST_LOG"), Some("debug"));
        let pod_names: Vec<_> = p
            .env
            .as_ref()
            .unwrap()
            .iter()
            .filter(|e| e.name == "POD_NAME")
            .collect();
        assert_eq!(pod_names.len(), 1);
        assert!(
            pod_names[0].value_from.is_some(),
            "the operator's POD_NAME stays"
        );
        let agent = container(&sts, "agent");
        assert_eq!(
            env_str(agent, "RUST_LOG"),
            None,
            "only the processor gets them"
        );
    }

    #[test]
    fn processor_runs_with_the_contracted_command_env_port_and_probes() {
        let sts = desired_statefulset(&app(), "h1", None);
        let p = container(&sts, "processor");
        assert_eq!(p.image.as_deref(), Some("registry.example/streamapp:1.0"));
        assert_eq!(
            p.command.as_deref().unwrap(),
            ["streamapp-processor", "run"]
        );
        let pod_name = env_value(p, "POD_NAME")
            .unwrap()
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap();
        assert_eq!(pod_name.field_path, "metadata.name");
        assert_eq!(
            env_str(p, "STREAMAPP_CONFIG"),
            Some("/etc/streamapp/processor.yaml")
        );
        assert_eq!(
            env_str(p, "STREAMAPP_STATE_DIR"),
            Some("/var/lib/streamapp/state")
        );
        assert_eq!(env_str(p, "STREAMAPP_HTTP_PORT"), Some("8080"));
        assert!(env_value(p, "STREAMAPP_WAL_DIR").is_none());
        assert!(env_value(p, "KAFKA_SASL_USERNAME").is_none());
        assert!(env_value(p, "STREAMAPP_KAFKA_TLS_DIR").is_none());
        let port = &p.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("http"), 8080)
        );
        let ready = p
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(ready.path.as_deref(), Some("/readyz"));
        let live = p.liveness_probe.as_ref().unwrap();
        assert_eq!(
            live.http_get.as_ref().unwrap().path.as_deref(),
            Some("/healthz")
        );
        assert!(
            live.failure_threshold.unwrap() * live.period_seconds.unwrap() >= 60,
            "generous liveness"
        );
        assert_eq!(mount_path(p, "state"), Some("/var/lib/streamapp/state"));
        assert_eq!(mount_path(p, "config"), Some("/etc/streamapp"));
    }

    #[test]
    fn pre_stop_drains_within_the_grace_period() {
        let mut app = app();
        app.spec.shutdown.drain_timeout = "2m".into();
        let sts = desired_statefulset(&app, "h1", None);
        let hook = container(&sts, "processor")
            .lifecycle
            .as_ref()
            .unwrap()
            .pre_stop
            .as_ref()
            .unwrap();
        assert_eq!(
            hook.exec.as_ref().unwrap().command.as_deref().unwrap(),
            ["streamapp-processor", "drain", "--timeout", "2m"]
        );
        assert_eq!(pod_spec(&sts).termination_grace_period_seconds, Some(135));
    }

    #[test]
    fn agent_is_a_native_sidecar_with_its_contracted_env() {
        let mut app = app();
        app.spec.agent = Some(AgentSpec {
            heartbeat: Some("30s".into()),
            ..Default::default()
        });
        let sts = desired_statefulset(&app, "h1", None);
        let spec = pod_spec(&sts);
        let agent = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(agent.name, "agent");
        assert_eq!(agent.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            agent.command.as_deref().unwrap(),
            ["streamapp-agent", "run"]
        );
        assert_eq!(
            agent.image.as_deref(),
            Some("registry.example/streamapp:1.0"),
            "defaults to spec.image"
        );
        for (name, field) in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        ] {
            let f = env_value(agent, name)
                .unwrap()
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap();
            assert_eq!(f.field_path, field);
        }
        assert_eq!(env_str(agent, "STREAMAPP_NAME"), Some("orders"));
        assert_eq!(
            env_str(agent, "STREAMAPP_STATE_DIR"),
            Some("/var/lib/streamapp/state")
        );
        assert_eq!(env_str(agent, "STREAMAPP_PROCESSOR_PORT"), Some("8080"));
        assert_eq!(env_str(agent, "STREAMAPP_HEARTBEAT"), Some("30s"));
        assert_eq!(mount_path(agent, "state"), Some("/var/lib/streamapp/state"));

        app.spec.agent = Some(AgentSpec {
            image: Some("registry.example/agent:2".into()),
            ..Default::default()
        });
        let sts = desired_statefulset(&app, "h1", None);
        let agent = container(&sts, "agent");
        assert_eq!(agent.image.as_deref(), Some("registry.example/agent:2"));
        assert!(env_value(agent, "STREAMAPP_HEARTBEAT").is_none());
    }

    #[test]
    fn both_containers_are_locked_down() {
        let sts = desired_statefulset(&app(), "h1", None);
        for name in ["processor", "agent"] {
            let sc = container(&sts, name).security_context.as_ref().unwrap();
            assert_eq!(sc.run_as_non_root, Some(true), "{name}");
            assert_eq!(
                (sc.run_as_user, sc.run_as_group),
                (Some(65532), Some(65532)),
                "{name}"
            );
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_deref().unwrap(),
                ["ALL"],
                "{name}"
            );
            assert_eq!(
                sc.seccomp_profile.as_ref().unwrap().type_,
                "RuntimeDefault",
                "{name}"
            );
        }
    }

    #[test]
    fn rollouts_are_ordered_and_wait_for_readiness() {
        let sts = desired_statefulset(&app(), "h1", None);
        let spec = sts.spec.as_ref().unwrap();
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(
            spec.update_strategy.as_ref().unwrap().type_.as_deref(),
            Some("RollingUpdate")
        );
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.service_name.as_deref(), Some("orders"));
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap()["streamapp.dev/app"],
            "orders"
        );
    }

    #[test]
    fn state_claim_template_has_the_spec_size_and_class_and_volumes_are_retained_by_default() {
        let mut app = app();
        app.spec.storage.size = "5Gi".into();
        app.spec.storage.storage_class_name = Some("fast".into());
        let sts = desired_statefulset(&app, "h1", None);
        let spec = sts.spec.as_ref().unwrap();
        let templates = spec.volume_claim_templates.as_ref().unwrap();
        assert_eq!(templates.len(), 1);
        assert_eq!(templates[0].metadata.name.as_deref(), Some("state"));
        assert_eq!(claim_template_size(&templates[0]).unwrap().0, "5Gi");
        assert_eq!(
            templates[0]
                .spec
                .as_ref()
                .unwrap()
                .storage_class_name
                .as_deref(),
            Some("fast")
        );
        let retention = spec
            .persistent_volume_claim_retention_policy
            .as_ref()
            .unwrap();
        assert_eq!(
            (
                retention.when_deleted.as_deref(),
                retention.when_scaled.as_deref()
            ),
            (Some("Retain"), Some("Retain"))
        );

        app.spec.storage.retention_policy = Some(VolumeRetentionPolicy {
            when_deleted: RetainOrDelete::Delete,
            when_scaled: RetainOrDelete::Retain,
        });
        let sts = desired_statefulset(&app, "h1", None);
        let retention = sts
            .spec
            .unwrap()
            .persistent_volume_claim_retention_policy
            .unwrap();
        assert_eq!(retention.when_deleted.as_deref(), Some("Delete"));
    }

    #[test]
    fn a_wal_volume_adds_a_claim_a_mount_and_the_wal_dir() {
        let mut app = app();
        app.spec.storage.wal_volume = Some(WalVolumeSpec {
            size: "2Gi".into(),
            storage_class_name: Some("nvme".into()),
        });
        let sts = desired_statefulset(&app, "h1", None);
        let templates = sts
            .spec
            .as_ref()
            .unwrap()
            .volume_claim_templates
            .as_ref()
            .unwrap();
        let wal = templates
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some("wal"))
            .unwrap();
        assert_eq!(claim_template_size(wal).unwrap().0, "2Gi");
        let p = container(&sts, "processor");
        assert_eq!(
            env_str(p, "STREAMAPP_WAL_DIR"),
            Some("/var/lib/streamapp/wal")
        );
        assert_eq!(mount_path(p, "wal"), Some("/var/lib/streamapp/wal"));
        let agent = container(&sts, "agent");
        assert_eq!(
            env_str(agent, "STREAMAPP_WAL_DIR"),
            Some("/var/lib/streamapp/wal")
        );
        assert_eq!(mount_path(agent, "wal"), Some("/var/lib/streamapp/wal"));
    }

    #[test]
    fn sasl_and_tls_secrets_reach_the_processor() {
        let mut app = app();
        app.spec.kafka.sasl = Some(SaslSecret {
            secret_name: "kafka-user".into(),
            username_key: "user".into(),
            password_key: "pass".into(),
        });
        app.spec.kafka.tls = Some(TlsSecret {
            secret_name: "kafka-ca".into(),
        });
        let sts = desired_statefulset(&app, "h1", None);
        let p = container(&sts, "processor");
        let user = env_value(p, "KAFKA_SASL_USERNAME")
            .unwrap()
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (user.name.as_str(), user.key.as_str()),
            ("kafka-user", "user")
        );
        let pass = env_value(p, "KAFKA_SASL_PASSWORD")
            .unwrap()
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (pass.name.as_str(), pass.key.as_str()),
            ("kafka-user", "pass")
        );
        assert_eq!(
            env_str(p, "STREAMAPP_KAFKA_TLS_DIR"),
            Some("/etc/streamapp/kafka-tls")
        );
        assert_eq!(mount_path(p, "kafka-tls"), Some("/etc/streamapp/kafka-tls"));
        let volume = pod_spec(&sts)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "kafka-tls")
            .unwrap();
        assert_eq!(
            volume.secret.as_ref().unwrap().secret_name.as_deref(),
            Some("kafka-ca")
        );
    }

    #[test]
    fn pod_template_carries_the_config_hash_and_the_users_overrides() {
        let mut app = app();
        app.spec.resources = Some(ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity("1Gi".into()))].into()),
            ..Default::default()
        });
        app.spec.pod = Some(PodOverrides {
            labels: [
                ("team".to_string(), "payments".to_string()),
                ("streamapp.dev/app".to_string(), "hijack".to_string()),
            ]
            .into(),
            annotations: [("prometheus.io/scrape".to_string(), "true".to_string())].into(),
            node_selector: [("disk".to_string(), "ssd".to_string())].into(),
            tolerations: vec![Toleration {
                key: Some("dedicated".into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            priority_class_name: Some("high".into()),
            service_account_name: Some("custom".into()),
            ..Default::default()
        });
        let sts = desired_statefulset(&app, "cafe", None);
        let template = &sts.spec.as_ref().unwrap().template;
        let meta = template.metadata.as_ref().unwrap();
        assert_eq!(
            meta.annotations.as_ref().unwrap()["streamapp.dev/config-hash"],
            "cafe"
        );
        assert_eq!(
            meta.annotations.as_ref().unwrap()["prometheus.io/scrape"],
            "true"
        );
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "payments");
        assert_eq!(
            labels["streamapp.dev/app"], "orders",
            "the selector label cannot be overridden"
        );
        assert_eq!(labels["app.kubernetes.io/managed-by"], "streamapp-operator");
        let spec = pod_spec(&sts);
        assert_eq!(spec.node_selector.as_ref().unwrap()["disk"], "ssd");
        assert_eq!(
            spec.tolerations.as_ref().unwrap()[0].key.as_deref(),
            Some("dedicated")
        );
        assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
        assert_eq!(spec.service_account_name.as_deref(), Some("custom"));
        assert_eq!(
            container(&sts, "processor")
                .resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()["memory"]
                .0,
            "1Gi"
        );
        assert_eq!(
            pod_spec(&desired_statefulset(&self::app(), "h", None))
                .service_account_name
                .as_deref(),
            Some("orders-agent")
        );
    }

    #[test]
    fn statefulset_is_owned_and_labelled() {
        let sts = desired_statefulset(&app(), "h1", None);
        assert_eq!(sts.metadata.name.as_deref(), Some("orders"));
        assert_eq!(sts.metadata.namespace.as_deref(), Some("shop"));
        let owner = &sts.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("StreamApp", Some(true))
        );
        let labels = sts.metadata.labels.as_ref().unwrap();
        for (k, v) in [
            ("app.kubernetes.io/name", "streamapp"),
            ("app.kubernetes.io/instance", "orders"),
            ("app.kubernetes.io/managed-by", "streamapp-operator"),
            ("streamapp.dev/app", "orders"),
        ] {
            assert_eq!(labels[k], v);
        }
    }

    #[test]
    fn an_existing_statefulset_keeps_its_claim_template_sizes() {
        let live = desired_statefulset(&app(), "h1", None);
        let mut grown = app();
        grown.spec.storage.size = "10Gi".into();
        let mut desired = desired_statefulset(&grown, "h1", None);
        keep_claim_template_sizes(&mut desired, &live);
        let templates = desired
            .spec
            .as_ref()
            .unwrap()
            .volume_claim_templates
            .as_ref()
            .unwrap();
        assert_eq!(claim_template_size(&templates[0]).unwrap().0, "1Gi");
    }

    #[test]
    fn pods_spread_over_zones_and_nodes_unless_told_otherwise() {
        let sts = desired_statefulset(&app(), "h", None);
        let spread = pod_spec(&sts).topology_spread_constraints.clone().unwrap();
        let keys: Vec<_> = spread.iter().map(|c| c.topology_key.as_str()).collect();
        assert_eq!(
            keys,
            ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
        );
        assert!(spread.iter().all(|c| {
            c.when_unsatisfiable == "ScheduleAnyway"
                && c.label_selector
                    .as_ref()
                    .unwrap()
                    .match_labels
                    .as_ref()
                    .unwrap()["streamapp.dev/app"]
                    == "orders"
        }));

        let mut app = app();
        app.spec.pod = Some(PodOverrides {
            topology_spread_constraints: Some(vec![]),
            ..Default::default()
        });
        let sts = desired_statefulset(&app, "h", None);
        assert_eq!(pod_spec(&sts).topology_spread_constraints, None);
    }
}
