//! The operator's Helm chart (charts/streamapp-operator), checked with the real `helm` against
//! the local control plane: it lints clean, carries the generated CRD, renders manifests the
//! API server accepts (with defaults and with every optional feature), installs and runs the
//! operator as a pod on the test bed's real node (from the image built here), grants it enough
//! to reconcile, and uninstalls without leftovers except the CRD, which is kept by design.
//!
//! ServiceMonitor, PodMonitor and PrometheusRule have no CRD on the local API server, and
//! installing the prometheus-operator's CRDs into the shared test cluster for a dry run would
//! check little (their schemas are permissive) while changing the cluster for every other
//! test. So those documents are parsed and checked here instead: required fields, that their
//! selectors and ports match what the chart and the operator really create, and that every
//! metric their queries name is one the programs export.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::Role;
use kube::Api;
use kube::api::ListParams;
use serde::Deserialize;
use serde_json::Value;
use streamapp_api::crd::StreamApp;
use support::*;
use testbed::helm::{helm, helm_ok};
use testbed::kube::{TestNamespace, kubectl, kubectl_ok, wait_for};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart_dir() -> PathBuf {
    repo_root().join("charts/streamapp-operator")
}

fn all_features_values() -> PathBuf {
    chart_dir().join("ci/all-features-values.yaml")
}

/// The API server's version, so `helm template` renders for the cluster it is checked against
/// (helm's offline default is older than the chart's kubeVersion).
async fn server_version() -> String {
    testbed::kube::client()
        .await
        .apiserver_version()
        .await
        .expect("reading the API server's version")
        .git_version
}

/// `helm template` of the chart as release `release` in `namespace`, with `extra` arguments.
async fn render(release: &str, namespace: &str, extra: &[&str]) -> String {
    let version = server_version().await;
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
        "--kube-version",
        &version,
    ];
    args.extend_from_slice(extra);
    helm_ok(&args)
}

/// The YAML documents of a multi-document stream, as JSON values (empty documents dropped).
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("helm renders valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

fn only<'a>(docs: &'a [Value], kind_: &str) -> &'a Value {
    let found: Vec<_> = docs.iter().filter(|d| kind(d) == kind_).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind_}, found {}",
        found.len()
    );
    found[0]
}

fn to_yaml_stream(docs: &[&Value]) -> String {
    docs.iter()
        .map(|d| format!("---\n{}", serde_yaml::to_string(d).unwrap()))
        .collect()
}

/// Server-side dry run: the API server validates every document (schemas, unknown fields,
/// RBAC rules) without storing anything.
fn assert_api_server_accepts(docs: &[&Value]) {
    let stream = to_yaml_stream(docs);
    let out = kubectl(
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "--field-manager=streamapp-chart-test",
            "-f",
            "-",
        ],
        Some(&stream),
    );
    assert!(
        out.status.success(),
        "the API server refused the rendered chart:\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stream
    );
    let applied = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        applied
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count(),
        docs.len(),
        "every document is dry-run applied:\n{applied}"
    );
}

/// One permission: API group, resource, verb.
type Permission = (&'static str, &'static str, &'static str);

/// What the operator needs on StreamApps and the objects it owns (see operator/src/reconcile.rs
/// and operator/src/rbac.rs), in the namespaces it watches.
fn namespaced_permissions() -> Vec<Permission> {
    let mut needed = vec![
        ("streamapp.dev", "streamapps", "get"),
        ("streamapp.dev", "streamapps", "list"),
        ("streamapp.dev", "streamapps", "watch"),
        ("streamapp.dev", "streamapps", "patch"),
        ("streamapp.dev", "streamapps/status", "get"),
        ("streamapp.dev", "streamapps/status", "patch"),
        ("streamapp.dev", "streamapps/finalizers", "update"),
        ("apps", "statefulsets", "delete"),
        ("apps", "statefulsets/scale", "patch"),
        ("", "configmaps", "delete"),
        ("networking.k8s.io", "networkpolicies", "delete"),
        ("", "persistentvolumeclaims", "get"),
        ("", "persistentvolumeclaims", "list"),
        ("", "persistentvolumeclaims", "watch"),
        ("", "persistentvolumeclaims", "patch"),
        ("", "persistentvolumeclaims", "delete"),
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "delete"),
        ("", "secrets", "get"),
        ("", "secrets", "list"),
        ("", "secrets", "watch"),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
    ];
    for (group, resource) in [
        ("apps", "statefulsets"),
        ("", "services"),
        ("", "configmaps"),
        ("", "serviceaccounts"),
        ("policy", "poddisruptionbudgets"),
        ("networking.k8s.io", "networkpolicies"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
    ] {
        for verb in ["get", "list", "watch", "create", "patch"] {
            needed.push((group, resource, verb));
        }
    }
    needed
}

/// Every permission the rules grant is one the operator uses (`needed`): no verb it never
/// calls.
fn assert_grants_only(role: &Value, needed: &[Permission]) {
    for rule in role["rules"].as_array().expect("rules") {
        let strings = |field: &str| -> Vec<String> {
            rule[field]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    assert!(
                        needed
                            .iter()
                            .any(|(g, r, v)| *g == group && *r == resource && *v == verb),
                        "{} grants {verb} on {group}/{resource}, which the operator never uses",
                        name(role)
                    );
                }
            }
        }
    }
}

/// Whether a Role or ClusterRole's rules allow `permission` (without resourceNames).
fn rules_allow(role: &Value, (group, resource, verb): Permission) -> bool {
    role["rules"].as_array().into_iter().flatten().any(|rule| {
        let has = |field: &str, want: &str| {
            rule[field]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x == want))
        };
        rule.get("resourceNames").is_none()
            && has("apiGroups", group)
            && has("resources", resource)
            && has("verbs", verb)
    })
}

/// What the operator needs of cluster-scoped objects, whatever it watches: whether a
/// StorageClass allows expansion, which nodes are Ready and where a local volume lives
/// (spec.nodeLoss).
fn cluster_scoped_permissions() -> Vec<Permission> {
    vec![
        ("storage.k8s.io", "storageclasses", "get"),
        ("", "nodes", "list"),
        ("", "persistentvolumes", "get"),
    ]
}

/// No wildcard, and none of the verbs that would let the operator grant what it does not
/// hold.
fn assert_least_privilege(role: &Value) {
    for rule in role["rules"].as_array().expect("rules") {
        for field in ["apiGroups", "resources", "verbs"] {
            assert!(
                !rule[field].as_array().unwrap().iter().any(|x| x == "*"),
                "wildcard in {}: {rule}",
                name(role)
            );
        }
        for verb in ["bind", "escalate", "impersonate"] {
            assert!(
                !rule["verbs"].as_array().unwrap().iter().any(|x| x == verb),
                "{} holds {verb}: {rule}",
                name(role)
            );
        }
    }
}

/// The metric names each program exports, as they appear in queries (`_total` on counters;
/// `_bucket`, `_sum` and `_count` on histograms). The operator's come from its real metrics
/// registry; the processor's and the agent's from their registrations in source (linking
/// those programs here would build RocksDB into the operator's tests).
fn exported_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let metrics = streamapp_operator::metrics::Metrics::default();
    // A labelled family is not rendered until it has a member.
    metrics.reconcile_failed(&streamapp_operator::Error::CrdMissing);
    let text = metrics.render();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, type_) = (parts.next().unwrap(), parts.next().unwrap());
            match type_ {
                "counter" => names.insert(format!("{name}_total")),
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                    true
                }
                _ => names.insert(name.to_string()),
            };
        }
    }
    assert!(
        names.contains("streamapp_operator_leader"),
        "the operator's registry lists its metrics: {names:?}"
    );
    for (prefix, file) in [
        ("streamapp_processor", "processor/src/metrics.rs"),
        ("streamapp_agent", "agent/src/metrics.rs"),
    ] {
        let source = std::fs::read_to_string(repo_root().join(file))
            .unwrap_or_else(|e| panic!("reading {file}: {e}"));
        assert!(
            source.contains(&format!("\"{prefix}\"")),
            "{file} registers under {prefix}"
        );
        let registered: Vec<&str> = source
            .split("register(")
            .skip(1)
            .filter_map(|after| after.trim_start().strip_prefix('"')?.split('"').next())
            .collect();
        assert!(
            !registered.is_empty(),
            "no metric registrations found in {file}"
        );
        for metric in registered {
            // The metric's type is not in the registration: accept each exposition form.
            for suffix in ["", "_total", "_bucket", "_sum", "_count"] {
                names.insert(format!("{prefix}_{metric}{suffix}"));
            }
        }
    }
    names
}

/// Every `streamapp_{operator,processor,agent}_*` metric name a query text mentions.
fn referenced_metrics(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = text.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut start = 0;
    while let Some(at) = text[start..].find("streamapp_") {
        let begin = start + at;
        let mut end = begin;
        while end < bytes.len() && is_word(bytes[end]) {
            end += 1;
        }
        let word = &text[begin..end];
        let at_boundary = begin == 0 || !is_word(bytes[begin - 1]);
        if at_boundary
            && [
                "streamapp_operator_",
                "streamapp_processor_",
                "streamapp_agent_",
            ]
            .iter()
            .any(|p| word.starts_with(p))
        {
            found.insert(word.to_string());
        }
        start = end.max(begin + 1);
    }
    found
}

fn assert_metrics_exist(what: &str, text: &str, exported: &BTreeSet<String>) -> BTreeSet<String> {
    let used = referenced_metrics(text);
    let unknown: Vec<_> = used.difference(exported).collect();
    assert!(
        unknown.is_empty(),
        "{what} queries metrics no program exports: {unknown:?} (exported: {exported:?})"
    );
    used
}

fn is_prometheus_duration(s: &str) -> bool {
    let mut rest = s;
    let mut any = false;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ms", "s", "m", "h", "d", "w", "y"]
            .into_iter()
            .find(|u| rest.starts_with(u))
        else {
            return false;
        };
        rest = &rest[unit.len()..];
        any = true;
    }
    any
}

fn selector_labels(doc: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(doc["spec"]["selector"]["matchLabels"].clone())
        .expect("a matchLabels selector")
}

fn labels_of(meta_holder: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(meta_holder["metadata"]["labels"].clone()).unwrap_or_default()
}

fn is_subset(small: &BTreeMap<String, String>, big: &BTreeMap<String, String>) -> bool {
    small.iter().all(|(k, v)| big.get(k) == Some(v))
}

/// A StreamApp as a user writes it, typed, for asking the operator what it creates.
fn sample_app() -> StreamApp {
    let mut json = streamapp_json("orders", 1);
    json["metadata"]["namespace"] = "apps".into();
    json["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001".into();
    serde_json::from_value(json).unwrap()
}

#[test]
fn helm_lint_is_clean_in_strict_mode_with_defaults_and_with_every_feature() {
    let chart = chart_dir();
    let all = all_features_values();
    for extra in [vec![], vec!["-f", all.to_str().unwrap()]] {
        let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
        args.extend(extra.iter());
        let out = helm_ok(&args);
        assert!(out.contains("0 chart(s) failed"), "{out}");
        assert!(
            !out.contains("[WARNING]") && !out.contains("[ERROR]"),
            "helm lint {extra:?} reports problems:\n{out}"
        );
    }
}

#[test]
fn the_charts_crd_is_byte_identical_to_the_generated_one() {
    let generated = repo_root().join(streamapp_operator::crd_yaml::CRD_PATH);
    let copy = chart_dir().join("crds/streamapp.dev_streamapps.yaml");
    let generated_bytes = std::fs::read(&generated).expect("reading the generated CRD");
    let copy_bytes = std::fs::read(&copy).expect("reading the chart's CRD");
    assert!(
        generated_bytes == copy_bytes,
        "{} differs from {}: after `make crds`, copy it: cp {} {}",
        copy.display(),
        generated.display(),
        streamapp_operator::crd_yaml::CRD_PATH,
        "charts/streamapp-operator/crds/"
    );
}

#[tokio::test]
async fn the_values_schema_refuses_unknown_mistyped_and_unsafe_values() {
    let version = server_version().await;
    let chart = chart_dir();
    for (set, expected) in [
        ("metrics.serviceMonitr.enabled=true", "serviceMonitr"),
        ("replicas=two", "replicas"),
        ("logFormat=xml", "logFormat"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("watchNamespace=Not_A_Namespace", "watchNamespace"),
        ("prometheusRule.restoreStuckAfter=soon", "restoreStuckAfter"),
        // Two reconcilers without a leader would fight over every StreamApp.
        (
            "replicas=2,leaderElection.enabled=false",
            "replicas > 1 needs leaderElection.enabled",
        ),
    ] {
        let out = helm(&[
            "template",
            "t",
            chart.to_str().unwrap(),
            "--kube-version",
            &version,
            "--set",
            set,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {set} was accepted");
        assert!(
            stderr.contains(expected),
            "--set {set}: the error does not name {expected}:\n{stderr}"
        );
    }
}

#[tokio::test]
async fn default_values_render_least_privilege_manifests_the_api_server_accepts() {
    let client = testbed::kube::client().await;
    let ns = TestNamespace::create(&client, "chart-defaults").await;
    let release = testbed::unique_name("op");
    let rendered = render(&release, &ns.name, &["--include-crds"]).await;
    let docs = documents(&rendered);

    let kinds: BTreeSet<&str> = docs.iter().map(kind).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]),
        "optional objects are off by default"
    );

    // Cluster-wide by default: one ClusterRole with everything, no wildcard.
    let cluster_role = only(&docs, "ClusterRole");
    assert_least_privilege(cluster_role);
    let cluster_needed: Vec<Permission> = namespaced_permissions()
        .into_iter()
        .chain(cluster_scoped_permissions())
        .collect();
    assert_grants_only(cluster_role, &cluster_needed);
    for permission in cluster_needed {
        assert!(
            rules_allow(cluster_role, permission),
            "the ClusterRole lacks {permission:?}"
        );
    }
    // The only Role is the Lease's, in the release namespace.
    let lease_role = only(&docs, "Role");
    assert_eq!(lease_role["metadata"]["namespace"], ns.name.as_str());
    assert!(rules_allow(
        lease_role,
        ("coordination.k8s.io", "leases", "create")
    ));

    let deployment = only(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"], "ghcr.io/streamapp-dev/streamapp:0.1.0",
        "the default tag is the appVersion"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--leader-election=true"), "{args:?}");
    assert!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "watches every namespace by default: {args:?}"
    );
    let env = container["env"].as_array().unwrap();
    let pod_namespace = env.iter().find(|e| e["name"] == "POD_NAMESPACE").unwrap();
    assert_eq!(
        pod_namespace["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert!(env.iter().any(|e| e["name"] == "RUST_LOG"));
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "metrics");
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));

    assert!(
        !docs.iter().any(|d| kind(d) == "PodDisruptionBudget"),
        "one replica: no disruption budget (it would block every node drain)"
    );
    let all: Vec<&Value> = docs.iter().collect();
    assert_api_server_accepts(&all);

    // Several replicas without an affinity of the user's: they prefer different nodes.
    let rendered = render("ha", &ns.name, &["--set", "replicas=3"]).await;
    let docs = documents(&rendered);
    let deployment = only(&docs, "Deployment");
    let term = &deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    let anti: BTreeMap<String, String> =
        serde_json::from_value(term["labelSelector"]["matchLabels"].clone()).unwrap();
    assert!(is_subset(
        &anti,
        &labels_of(&deployment["spec"]["template"])
    ));
    assert_eq!(
        only(&docs, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        1
    );
    ns.delete().await;
}

#[tokio::test]
async fn every_optional_feature_renders_and_each_document_checks_out() {
    let client = testbed::kube::client().await;
    let ns = TestNamespace::create(&client, "chart-features").await;
    let release = testbed::unique_name("op");
    let values = all_features_values();
    let rendered = render(
        &release,
        &ns.name,
        &[
            "-f",
            values.to_str().unwrap(),
            "--set",
            &format!("watchNamespace={}", ns.name),
        ],
    )
    .await;
    let docs = documents(&rendered);
    let (monitoring, core): (Vec<&Value>, Vec<&Value>) = docs.iter().partition(|d| {
        d["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .starts_with("monitoring.coreos.com/")
    });
    let monitoring_kinds: BTreeSet<&str> = monitoring.iter().map(|d| kind(d)).collect();
    assert_eq!(
        monitoring_kinds,
        BTreeSet::from(["PodMonitor", "PrometheusRule", "ServiceMonitor"])
    );

    // Watching one namespace: the operator's rules become a Role there; the only cluster-wide
    // permissions left are those on cluster-scoped objects.
    let cluster_role = only(&docs, "ClusterRole");
    assert_grants_only(cluster_role, &cluster_scoped_permissions());
    for permission in cluster_scoped_permissions() {
        assert!(
            rules_allow(cluster_role, permission),
            "the ClusterRole lacks {permission:?}"
        );
    }
    let operator_role = docs
        .iter()
        .find(|d| kind(d) == "Role" && !name(d).ends_with("-leader-election"))
        .expect("a Role for the watched namespace");
    assert_eq!(operator_role["metadata"]["namespace"], ns.name.as_str());
    assert_least_privilege(operator_role);
    assert_grants_only(operator_role, &namespaced_permissions());
    for permission in namespaced_permissions() {
        assert!(
            rules_allow(operator_role, permission),
            "the Role lacks {permission:?}"
        );
    }
    let deployment = only(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    // Two replicas: a disruption budget that keeps one, over the operator's own pods.
    let pod_labels = labels_of(&deployment["spec"]["template"]);
    let pdb = only(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(is_subset(&selector_labels(pdb), &pod_labels), "{pdb}");
    let policy = only(&docs, "NetworkPolicy");
    let policy_selector: BTreeMap<String, String> =
        serde_json::from_value(policy["spec"]["podSelector"]["matchLabels"].clone()).unwrap();
    assert!(is_subset(&policy_selector, &pod_labels), "{policy}");
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let ingress = &policy["spec"]["ingress"][0];
    assert_eq!(ingress["ports"][0]["port"], "metrics");
    assert_eq!(
        ingress["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains(&format!("--namespace={}", ns.name)), "{args}");
    assert!(args.contains("--log-format=json"), "{args}");

    // The ServiceMonitor selects the chart's metrics Service, on a port it has.
    let service = only(&docs, "Service");
    let service_monitor = only(&docs, "ServiceMonitor");
    assert!(is_subset(
        &selector_labels(service_monitor),
        &labels_of(service)
    ));
    let service_ports: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["name"])
        .collect();
    let endpoint = &service_monitor["spec"]["endpoints"][0];
    assert!(service_ports.contains(&&endpoint["port"]), "{endpoint}");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(
        service_monitor["spec"]["namespaceSelector"]["matchNames"][0],
        ns.name.as_str()
    );
    assert_eq!(
        service_monitor["metadata"]["labels"]["release"],
        "prometheus"
    );

    // The PodMonitor selects the pods the operator really creates, on their processor port,
    // and the relabeling reads the StreamApp label the operator really sets.
    let pod_monitor = only(&docs, "PodMonitor");
    let app = sample_app();
    let sts = streamapp_operator::statefulset::desired_statefulset(&app, "hash", None);
    let template = sts.spec.unwrap().template;
    let pod_labels = template.metadata.unwrap().labels.unwrap();
    assert!(
        is_subset(&selector_labels(pod_monitor), &pod_labels),
        "the PodMonitor does not select StreamApp pods (labels {pod_labels:?})"
    );
    let processor = template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .find(|c| c.name == streamapp_operator::statefulset::PROCESSOR_CONTAINER)
        .unwrap();
    let port_names: Vec<String> = processor
        .ports
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    let app_label_meta = format!(
        "__meta_kubernetes_pod_label_{}",
        streamapp_operator::owned::APP_LABEL.replace(['.', '/', '-'], "_")
    );
    let endpoints = pod_monitor["spec"]["podMetricsEndpoints"]
        .as_array()
        .unwrap();
    assert_eq!(endpoints.len(), 2, "processor and agent");
    for endpoint in endpoints {
        let port = endpoint["port"].as_str().unwrap();
        assert!(
            port_names.iter().any(|p| p == port),
            "port {port} not in {port_names:?}"
        );
        assert!(
            endpoint["relabelings"]
                .to_string()
                .contains(&app_label_meta),
            "{endpoint}"
        );
    }
    assert_eq!(
        pod_monitor["spec"]["namespaceSelector"]["matchNames"][0],
        ns.name.as_str()
    );

    // The alerts: well-formed, and querying only metrics that exist.
    let exported = exported_metrics();
    let rule = only(&docs, "PrometheusRule");
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        assert!(group["name"].as_str().is_some_and(|n| !n.is_empty()));
        for r in group["rules"].as_array().unwrap() {
            let alert = r["alert"].as_str().expect("every rule is an alert");
            assert!(alerts.insert(alert.to_string()), "{alert} twice");
            let expr = r["expr"].as_str().expect("an expr");
            used.extend(assert_metrics_exist(alert, expr, &exported));
            if let Some(for_) = r.get("for") {
                assert!(
                    is_prometheus_duration(for_.as_str().unwrap()),
                    "{alert}: for {for_}"
                );
            }
            let severity = r["labels"]["severity"].as_str().unwrap_or_default();
            assert!(
                ["warning", "critical"].contains(&severity),
                "{alert}: {severity}"
            );
            assert_eq!(r["labels"]["team"], "streaming", "{alert}: alertLabels");
            for annotation in ["summary", "description"] {
                assert!(
                    r["annotations"][annotation]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "{alert} has no {annotation}"
                );
            }
        }
    }
    for required in [
        "StreamAppProcessorUnhealthy",
        "StreamAppCheckpointStale",
        "StreamAppRestoreStuck",
        "StreamAppStoreQuarantined",
        "StreamAppOperatorNotLeading",
    ] {
        assert!(
            alerts.contains(required),
            "{required} missing from {alerts:?}"
        );
    }

    // The dashboard: valid JSON for the Grafana sidecar, over all three programs' metrics.
    let dashboard_map = core
        .iter()
        .find(|d| kind(d) == "ConfigMap")
        .expect("the dashboard ConfigMap");
    assert_eq!(
        dashboard_map["metadata"]["labels"]["grafana_dashboard"],
        "1"
    );
    let dashboard: Value = serde_json::from_str(
        dashboard_map["data"]["streamapp.json"]
            .as_str()
            .expect("the dashboard JSON"),
    )
    .expect("the dashboard is valid JSON");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["uid"].as_str().is_some_and(|t| !t.is_empty()));
    let mut exprs = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(panel["gridPos"].is_object(), "{}", panel["title"]);
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push_str(target["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    let in_dashboard = assert_metrics_exist("the dashboard", &exprs, &exported);
    for prefix in [
        "streamapp_operator_",
        "streamapp_processor_",
        "streamapp_agent_",
    ] {
        assert!(
            in_dashboard.iter().any(|m| m.starts_with(prefix)),
            "the dashboard shows no {prefix}* metric"
        );
    }
    assert!(used.iter().any(|m| m.starts_with("streamapp_agent_")));

    assert_api_server_accepts(&core);
    ns.delete().await;
}

/// `kubectl auth can-i` as the chart's ServiceAccount.
fn can_i(service_account: &str, namespace: &str, verb: &str, resource: &str) -> bool {
    let out = kubectl(
        &[
            "auth",
            "can-i",
            verb,
            resource,
            "--namespace",
            namespace,
            "--as",
            service_account,
        ],
        None,
    );
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// Names (`kind/name`) of every object labelled `selector`, in `namespace` (namespaced kinds)
/// or cluster-wide (None: cluster-scoped kinds).
fn objects_labelled(selector: &str, namespace: Option<&str>) -> Vec<String> {
    let scope = format!("--namespaced={}", namespace.is_some());
    let kinds = kubectl_ok(
        &["api-resources", "--verbs=list", &scope, "-o", "name"],
        None,
    );
    let kinds: Vec<&str> = kinds.lines().filter(|k| !k.is_empty()).collect();
    assert!(kinds.len() > 10, "api-resources lists the kinds: {kinds:?}");
    let kinds = kinds.join(",");
    let mut args = vec!["get", kinds.as_str(), "-l", selector, "-o", "name"];
    if let Some(ns) = namespace {
        args.extend(["--namespace", ns]);
    }
    kubectl_ok(&args, None)
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// `--set` arguments that run the chart's operator from the image built here (the node has it;
/// nothing is pulled).
fn local_image_values() -> Vec<String> {
    let image = testbed::node::app_image();
    let (repository, tag) = image.rsplit_once(':').expect("the image has a tag");
    vec![
        "--set".into(),
        format!("image.repository={repository}"),
        "--set".into(),
        format!("image.tag={tag}"),
        "--set".into(),
        "image.pullPolicy=Never".into(),
    ]
}

/// `helm install` of the chart into `ns`, watching only `ns`, from the local image.
fn install_release(release: &str, ns: &str, extra: &[&str]) {
    let chart = chart_dir();
    let watch = format!("watchNamespace={ns}");
    let values = local_image_values();
    let mut args = vec![
        "install",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        ns,
        "--set",
        &watch,
    ];
    args.extend(values.iter().map(String::as_str));
    args.extend_from_slice(extra);
    helm_ok(&args);
}

#[tokio::test]
async fn helm_install_runs_the_operator_pod_on_the_node_and_uninstall_leaves_only_the_crd() {
    let client = testbed::kube::client().await;
    testbed::node::require_ready(&client).await;
    let ns = TestNamespace::create(&client, "chart-install").await;
    let release = testbed::unique_name("op");
    // --wait returns once the pod is Ready: the kubelet ran the operator from the image and
    // its readiness probe passed.
    install_release(&release, &ns.name, &["--wait", "--timeout", "120s"]);

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let selector = format!("app.kubernetes.io/instance={release}");
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items;
    assert_eq!(listed.len(), 1, "one operator pod");
    let pod = &listed[0];
    let node = pod.spec.as_ref().unwrap().node_name.as_deref();
    assert!(
        testbed::node::is_real(node),
        "the pod runs on a real node: {node:?}"
    );
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let container = &status.container_statuses.as_ref().unwrap()[0];
    assert!(
        container.ready && container.state.as_ref().unwrap().running.is_some(),
        "the operator container runs and is ready: {container:?}"
    );
    assert_eq!(container.restart_count, 0, "{container:?}");

    // The API server's authorizer agrees with the chart's intent.
    let sa = format!(
        "system:serviceaccount:{}:{release}-streamapp-operator",
        ns.name
    );
    for (verb, resource) in [
        ("create", "statefulsets.apps"),
        ("patch", "streamapps.streamapp.dev/status"),
        ("create", "roles.rbac.authorization.k8s.io"),
        ("patch", "persistentvolumeclaims"),
        ("create", "events.events.k8s.io"),
        ("create", "leases.coordination.k8s.io"),
    ] {
        assert!(
            can_i(&sa, &ns.name, verb, resource),
            "{sa} cannot {verb} {resource}"
        );
    }
    assert!(can_i(
        &sa,
        "default",
        "get",
        "storageclasses.storage.k8s.io"
    ));
    for (namespace, verb, resource) in [
        (ns.name.as_str(), "create", "secrets"),
        ("default", "delete", "pods"),
        ("default", "delete", "nodes"),
        ("default", "create", "statefulsets.apps"),
        ("default", "list", "streamapps.streamapp.dev"),
    ] {
        assert!(
            !can_i(&sa, namespace, verb, resource),
            "{sa} may {verb} {resource} in {namespace}"
        );
    }

    // What the release created, found the way the leftover check below looks: proof that the
    // check would see them.
    let before = objects_labelled(&selector, Some(&ns.name));
    for expected in [
        "deployment.apps/",
        "serviceaccount/",
        "service/",
        "role.rbac.authorization.k8s.io/",
        "rolebinding.rbac.authorization.k8s.io/",
        "pod/",
    ] {
        assert!(
            before.iter().any(|o| o.starts_with(expected)),
            "no {expected} found before uninstall: {before:?}"
        );
    }
    let cluster_before = objects_labelled(&selector, None);
    assert_eq!(
        cluster_before.len(),
        2,
        "ClusterRole and binding: {cluster_before:?}"
    );

    helm_ok(&[
        "uninstall",
        &release,
        "--namespace",
        &ns.name,
        "--wait",
        "--timeout",
        "120s",
    ]);

    // Pods and ReplicaSets go with the garbage collector, shortly after the Deployment.
    let mut left = Vec::new();
    wait_for(
        Duration::from_secs(60),
        "the release's objects to be gone",
        || {
            left = objects_labelled(&selector, Some(&ns.name));
            left.extend(objects_labelled(&selector, None));
            left.extend(objects_labelled(
                &format!("owner=helm,name={release}"),
                Some(&ns.name),
            ));
            let done = left.is_empty();
            async move { done }
        },
    )
    .await;
    assert!(left.is_empty(), "left behind: {left:?}");
    // The CRD is kept by design (deleting it would delete every StreamApp).
    kubectl_ok(&["get", "crd", "streamapps.streamapp.dev"], None);
    ns.delete().await;
}

#[tokio::test]
async fn the_operator_pod_reconciles_a_streamapp_with_only_the_charts_permissions() {
    let client = testbed::kube::client().await;
    testbed::node::require_ready(&client).await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "chart-rbac").await;
    let release = testbed::unique_name("op");
    // The operator runs in its pod with the chart's ServiceAccount, so every call it makes is
    // authorised by the chart's RBAC alone.
    install_release(&release, &ns.name, &["--wait", "--timeout", "120s"]);
    let deployment = format!("deployment/{release}-streamapp-operator");
    let log = || {
        let out = kubectl(&["logs", "--namespace", &ns.name, &deployment], None);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    create(&client, &ns.name, streamapp_json("orders", 1)).await;
    // The log says what was refused when the status never comes.
    let apps: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while apps
        .get_status("orders")
        .await
        .ok()
        .and_then(|a| a.status)
        .and_then(|s| s.phase)
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the operator did not report the StreamApp's status in 90 s; its log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It created the StatefulSet and the agent's Role: granting that Role needs no escalate,
    // because the chart gives the operator every permission the Role holds.
    Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get("orders")
        .await
        .unwrap_or_else(|e| panic!("the StatefulSet exists ({e}); log:\n{}", log()));
    Api::<Role>::namespaced(client.clone(), &ns.name)
        .get("orders-agent")
        .await
        .unwrap_or_else(|e| panic!("the agent Role exists ({e}); log:\n{}", log()));
    // It won the Lease with the chart's leader-election Role: its holder is the operator pod.
    let lease = kubectl_ok(
        &[
            "get",
            "lease",
            "streamapp-operator",
            "--namespace",
            &ns.name,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    );
    assert!(
        lease.starts_with(&format!("{release}-streamapp-operator-")),
        "the Lease is held by the operator pod, not {lease:?}; log:\n{}",
        log()
    );
    let log = log();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused something:\n{log}"
    );

    helm_ok(&["uninstall", &release, "--namespace", &ns.name, "--wait"]);
    ns.delete().await;
}
