//! What the operator's integration tests share: the CRD installed in the local API server, the
//! operator running in-process against one test namespace, sample StreamApps.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt, Resource};
use serde::de::DeserializeOwned;
use streamapp_api::crd::{StreamApp, StreamAppStatus};
use streamapp_operator::Settings;
use streamapp_operator::leader::LeaseSettings;
use streamapp_operator::metrics::Metrics;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The namespaced object `name` of kind `K`, if it exists. An error from the API server fails
/// the test: read as "absent" it would let a check that waits for objects to go pass falsely.
pub async fn object<K>(client: &Client, namespace: &str, name: &str) -> Option<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading {name} in {namespace}: {e}"))
}

/// Installs (or updates) the StreamApp CRD from the Rust types and waits until it is served.
pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "streamapps.streamapp.dev";
    crds.patch(
        name,
        &PatchParams::apply("streamapp-operator-tests").force(),
        &Patch::Apply(StreamApp::crd()),
    )
    .await
    .unwrap_or_else(|e| panic!("installing the StreamApp CRD: {e}"));
    testbed::kube::wait_for_streamapp_crd(client).await;
}

/// The operator running in-process, watching one namespace.
pub struct Operator {
    pub metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<streamapp_operator::Result<()>>>,
}

impl Operator {
    /// Starts an operator without leader election.
    pub fn start(client: &Client, namespace: &str) -> Operator {
        Self::start_with(client, namespace, None)
    }

    /// Starts an operator, electing a leader with `lease` when given.
    pub fn start_with(client: &Client, namespace: &str, lease: Option<LeaseSettings>) -> Operator {
        let metrics = Arc::new(Metrics::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let settings = Settings {
            metrics_port: 0,
            identity: lease
                .as_ref()
                .map_or_else(|| format!("test-{namespace}"), |l| l.identity.clone()),
            leader_election: lease,
            namespace: Some(namespace.to_string()),
        };
        let handle = tokio::spawn(streamapp_operator::run(
            client.clone(),
            settings,
            metrics.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        Operator {
            metrics,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    /// Reconciliations run so far.
    pub fn reconciliations(&self) -> u64 {
        self.metrics.reconciliations.get()
    }

    pub fn is_leader(&self) -> bool {
        self.metrics.leader.get() == 1
    }

    /// Stops the operator (it releases its lease) and returns how `run` ended.
    pub async fn stop(mut self) -> streamapp_operator::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join().await
    }

    /// Waits for `run` to return by itself.
    pub async fn join(&mut self) -> streamapp_operator::Result<()> {
        let handle = self.handle.take().expect("joined once");
        tokio::time::timeout(Duration::from_secs(30), handle)
            .await
            .expect("the operator stops within 30 s")
            .expect("the operator task does not panic")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

/// A valid StreamApp as a user writes it (JSON), with `replicas` pods.
///
/// These tests check what the operator writes, not what pods do: the pods are placed on the
/// test bed's fake (kwok) node, where they are scheduled and reported Running but nothing runs
/// and nothing is ever Ready. What needs running pods is tested on the real node (e2e/).
pub fn streamapp_json(name: &str, replicas: i32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "streamapp.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": { "name": name },
        "spec": {
            "image": "registry.example/streamapp:1.0",
            "replicas": replicas,
            "kafka": { "bootstrapServers": "kafka.example:9092" },
            "topology": { "inputTopic": "orders", "outputTopic": "orders-unique", "deadLetterTopic": "orders-dlq" },
            "pod": {
                "nodeSelector": { "type": "kwok" },
                "tolerations": [{ "key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule" }],
            },
        },
    })
}

/// Creates a StreamApp from JSON.
pub async fn create(client: &Client, namespace: &str, app: serde_json::Value) -> StreamApp {
    let app: StreamApp = serde_json::from_value(app).expect("a StreamApp");
    Api::<StreamApp>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &app)
        .await
        .unwrap_or_else(|e| panic!("creating the StreamApp: {e}"))
}

/// Merge-patches a StreamApp's spec.
pub async fn patch_spec(
    client: &Client,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) -> StreamApp {
    Api::<StreamApp>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": spec })),
        )
        .await
        .unwrap_or_else(|e| panic!("patching StreamApp {namespace}/{name}: {e}"))
}

/// Waits until the StreamApp's status satisfies `check`; returns that status.
pub async fn wait_for_status(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&StreamAppStatus) -> bool,
) -> StreamAppStatus {
    let api: Api<StreamApp> = Api::namespaced(client.clone(), namespace);
    let mut last = None;
    let found = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            if let Ok(app) = api.get(name).await {
                let status = app.status.unwrap_or_default();
                if check(&status) {
                    return status;
                }
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("timed out waiting for {what}; last status: {last:#?}"))
}

/// The status of a condition type ("True", "False", "Unknown"), with its reason.
pub fn condition(status: &StreamAppStatus, type_: &str) -> Option<(String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Polls `check` every 200 ms until it returns a value; panics after `timeout`, saying what it
/// was waiting for.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `f` with a test namespace and an in-process operator for it; deletes the namespace
/// when `f` returns (a failing test leaves it for a look).
pub async fn with_operator<F, Fut>(prefix: &str, f: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = testbed::kube::client().await;
    install_crd(&client).await;
    let ns = testbed::kube::TestNamespace::create(&client, prefix).await;
    let operator = Operator::start(&client, &ns.name);
    f(client.clone(), ns.name.clone()).await;
    operator.stop().await.expect("the operator stops cleanly");
    ns.delete().await;
}
