//! The local Kubernetes control plane: a client from the admin kubeconfig, and a namespace per
//! test.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use streamapp_api::crd::StreamApp;

const HOW_TO_START: &str = "start it with `make up` (or `dev/kube.sh start`)";

/// The admin kubeconfig dev/kube.sh writes (`$STREAMAPP_KUBECONFIG` overrides it).
pub fn kubeconfig_path() -> PathBuf {
    std::env::var_os("STREAMAPP_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::run_dir().join("kube/admin.kubeconfig"))
}

/// A client for the local API server, as cluster admin. Panics, naming the service, when the
/// kubeconfig is missing or the API server does not answer.
pub async fn client() -> Client {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!(
            "no kubeconfig for the local kube-apiserver at {} ({e}): {HOW_TO_START}",
            path.display()
        )
    });
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("reading the local kubeconfig");
    let url = config.cluster_url.clone();
    let client = Client::try_from(config).expect("creating a Kubernetes client");
    if let Err(e) = tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .unwrap_or_else(|_| {
            panic!("the kube-apiserver at {url} did not answer in 10 s: {HOW_TO_START}")
        })
    {
        panic!("the kube-apiserver at {url} is not reachable ({e}): {HOW_TO_START}");
    }
    client
}

/// A namespace that exists for one test. Call [`TestNamespace::delete`] at the end of a passing
/// test; a failing test leaves it behind for a look.
pub struct TestNamespace {
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `t-<prefix>-<random>`.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let name = crate::unique_name(&format!("t-{prefix}"));
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "streamapp.dev/test": "true" } }
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        // The controller-manager creates the default ServiceAccount shortly after; pods are
        // refused until it exists.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        crate::kube::wait_for(
            Duration::from_secs(30),
            "the default ServiceAccount",
            || async { sas.get_opt("default").await.ok().flatten().is_some() },
        )
        .await;
        TestNamespace {
            name,
            client: client.clone(),
        }
    }

    /// Deletes the namespace (and so everything in it).
    pub async fn delete(self) {
        let _ = Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::background())
            .await;
    }
}

/// Polls `check` every 200 ms until it returns true; panics after `timeout`, saying what it
/// was waiting for.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (up to 30 s) until the API server has established the StreamApp CRD just installed
/// and serves StreamApps. Asked through the API: `kubectl wait --for=condition=Established`
/// fails at once, instead of waiting, when it reads the CRD before the server has written any
/// condition (seen in a CI run).
pub async fn wait_for_streamapp_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for(
        Duration::from_secs(30),
        "the StreamApp CRD to be established",
        || async {
            let established = crds
                .get("streamapps.streamapp.dev")
                .await
                .ok()
                .and_then(|crd| crd.status)
                .and_then(|s| s.conditions)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            established
                && Api::<StreamApp>::all(client.clone())
                    .list(&ListParams::default().limit(1))
                    .await
                    .is_ok()
        },
    )
    .await;
}

/// The `kubectl` the dev scripts installed (`$STREAMAPP_CACHE/kube-*/bin/kubectl`), else the
/// one on PATH.
pub fn kubectl_program() -> PathBuf {
    let cache = crate::run_dir()
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let from_cache = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/kubectl"))
        .find(|p| {
            p.parent()
                .and_then(|b| b.parent())
                .and_then(|d| d.file_name())
                .is_some_and(|n| n.to_string_lossy().starts_with("kube-"))
                && p.exists()
        });
    from_cache.unwrap_or_else(|| PathBuf::from("kubectl"))
}

/// Runs the real `kubectl` against the local control plane (admin kubeconfig), with `stdin`
/// as its input (see [`kubectl_program`]).
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let program = kubectl_program();
    let mut child = Command::new(&program)
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "running {} ({e}): install it with `make setup`",
                program.display()
            )
        });
    let mut input = child.stdin.take().expect("piped stdin");
    if let Some(stdin) = stdin {
        input
            .write_all(stdin.as_bytes())
            .expect("writing kubectl's input");
    }
    drop(input);
    child.wait_with_output().expect("waiting for kubectl")
}

/// Runs kubectl and returns its standard output; panics with its error output when it fails.
pub fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(args, stdin);
    assert!(
        out.status.success(),
        "kubectl {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
