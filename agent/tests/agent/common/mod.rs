//! Harness for the agent's integration tests: the StreamApp CRD on the local API server, a
//! StreamApp per test, the agent's RBAC as the operator creates it, a client (and a
//! kubeconfig) that acts as the agent's ServiceAccount. The processes themselves are
//! [`testbed::process::Spawned`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, CustomResourceExt};
use streamapp_api::crd::{PodStateStatus, StreamApp};
use streamapp_operator::rbac;

pub const AGENT_BIN: &str = env!("CARGO_BIN_EXE_streamapp-agent");

/// The processor binary from the same target directory (`cargo build --release -p
/// streamapp-processor`), or `$STREAMAPP_PROCESSOR_BIN`.
pub fn processor_bin() -> PathBuf {
    let path = std::env::var_os("STREAMAPP_PROCESSOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(AGENT_BIN).with_file_name("streamapp-processor"));
    assert!(
        path.is_file(),
        "no processor binary at {}: build it with `cargo build --release -p streamapp-processor` (or set STREAMAPP_PROCESSOR_BIN)",
        path.display()
    );
    path
}

/// Installs (or updates) the StreamApp CRD with server-side apply and waits until it is served.
pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = StreamApp::crd();
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(
        &name,
        &PatchParams::apply("streamapp-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap_or_else(|e| panic!("applying the StreamApp CRD: {e}"));
    let apps: Api<StreamApp> = Api::all(client.clone());
    testbed::kube::wait_for(
        Duration::from_secs(30),
        "the StreamApp CRD to be served",
        || async {
            apps.list(&kube::api::ListParams::default().limit(1))
                .await
                .is_ok()
        },
    )
    .await;
}

/// Creates StreamApp `name` in `ns` (a valid spec; nothing reconciles it in these tests).
pub async fn create_app(client: &Client, ns: &str, name: &str) -> StreamApp {
    let app: StreamApp = serde_json::from_value(serde_json::json!({
        "apiVersion": "streamapp.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": { "name": name },
        "spec": {
            "image": "streamapp:test",
            "kafka": { "bootstrapServers": "127.0.0.1:19092" },
            "topology": { "inputTopic": format!("{name}-in"), "outputTopic": format!("{name}-out"), "deadLetterTopic": format!("{name}-dlq") },
        },
    }))
    .unwrap();
    Api::<StreamApp>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &app)
        .await
        .unwrap_or_else(|e| panic!("creating StreamApp {ns}/{name}: {e}"))
}

/// The agent's ServiceAccount, Role and RoleBinding (`<app>-agent`), built by the operator's
/// own builders, as the operator creates them. Returns the ServiceAccount's name.
pub async fn create_agent_rbac(client: &Client, ns: &str, app: &str) -> String {
    let app = Api::<StreamApp>::namespaced(client.clone(), ns)
        .get(app)
        .await
        .unwrap_or_else(|e| panic!("reading StreamApp {ns}/{app}: {e}"));
    let pp = PostParams::default();
    let sa = rbac::desired_service_account(&app);
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&pp, &sa)
        .await
        .expect("creating the ServiceAccount");
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&pp, &rbac::desired_role(&app))
        .await
        .expect("creating the Role");
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&pp, &rbac::desired_role_binding(&app))
        .await
        .expect("creating the RoleBinding");
    sa.metadata.name.expect("the ServiceAccount has a name")
}

/// A kubeconfig (written into `dir`) and a client that authenticate as ServiceAccount `sa`
/// with a token from the TokenRequest API; same server and CA as the admin kubeconfig.
pub async fn service_account_client(
    client: &Client,
    ns: &str,
    sa: &str,
    dir: &Path,
) -> (Client, PathBuf) {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{sa}: {e}"))
        .status
        .expect("a TokenRequest answer has a status")
        .token;
    let admin_path = testbed::kube::kubeconfig_path();
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&admin_path).unwrap()).unwrap();
    for user in kubeconfig["users"]
        .as_sequence_mut()
        .expect("users in the admin kubeconfig")
    {
        user["user"] = serde_yaml::to_value(serde_json::json!({ "token": token })).unwrap();
    }
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&path).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("the ServiceAccount kubeconfig");
    (Client::try_from(config).unwrap(), path)
}

/// The entry of `pod` in the StreamApp's status, if any.
pub async fn pod_entry(client: &Client, ns: &str, app: &str, pod: &str) -> Option<PodStateStatus> {
    let app = Api::<StreamApp>::namespaced(client.clone(), ns)
        .get(app)
        .await
        .ok()?;
    app.status?.pods.into_iter().find(|p| p.name == pod)
}

/// One pod's entry in one StreamApp's status, as the admin sees it.
pub struct PodEntry {
    pub client: Client,
    pub ns: String,
    pub app: String,
    pub pod: String,
}

impl PodEntry {
    /// Polls the entry until `check` accepts it; panics after `timeout` with the last entry
    /// seen and `context()` (say, process logs).
    pub async fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&PodStateStatus) -> bool,
        context: impl Fn() -> String,
    ) -> PodStateStatus {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(entry) = pod_entry(&self.client, &self.ns, &self.app, &self.pod).await {
                if check(&entry) {
                    return entry;
                }
                last = Some(entry);
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for status.pods[{}] to show {what}; last entry:\n{}\n{}",
                    self.pod,
                    serde_json::to_string_pretty(&last).unwrap(),
                    context()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
