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
    assert_eq!(
        env_str(p, "STREAMAPP_AGENT_PORT"),
        env_str(container(&sts, "agent"), "STREAMAPP_AGENT_METRICS_PORT"),
        "the processor asks the agent on the port the agent serves"
    );
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
