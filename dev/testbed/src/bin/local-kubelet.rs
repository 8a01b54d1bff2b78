//! A stand-in kubelet for the pods of StreamApps on the local test bed.
//!
//! kwok schedules pods onto a fake node and reports them Running, but runs no container. For the
//! demo, this program runs the real containers' programs as local processes instead — the
//! processor and its agent, for every StreamApp pod on the node — the way a kubelet would:
//!
//! - the same commands and environment as the pod spec (field and secret references resolved),
//!   the ConfigMap's `processor.yaml` as the configuration file, and the hostPath directory of
//!   the pod's bound `state-<pod>` volume as the state directory (ports are remapped, since all
//!   pods share one host);
//! - the agent runs with a token of the pod's ServiceAccount, so it has the RBAC it would have;
//! - the pod's Ready condition follows the processor's `/readyz`, like a readiness probe;
//! - a process that exits is restarted (restartPolicy Always);
//! - when the pod goes away, the preStop hook (`streamapp-processor drain`) runs, then both
//!   processes are stopped, the agent last.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use tracing::{info, warn};

#[derive(Parser)]
#[command(
    about = "Runs the processes of StreamApp pods scheduled on the local test bed's fake node"
)]
struct Args {
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Directory with the streamapp-processor and streamapp-agent binaries.
    #[arg(long)]
    bin_dir: PathBuf,
    /// Where per-pod configuration, tokens and logs are written.
    #[arg(long)]
    run_dir: PathBuf,
    /// First local port handed out to processors and agents.
    #[arg(long, default_value_t = 18080)]
    base_port: u16,
    /// Only run pods of this namespace (default: every namespace).
    #[arg(long)]
    namespace: Option<String>,
}

/// The local processes of one pod.
struct PodProcesses {
    namespace: String,
    name: String,
    uid: String,
    processor_port: u16,
    dir: PathBuf,
    processor: Launch,
    agent: Launch,
    ready: Option<bool>,
}

/// How to (re)start one container's process, and the running child.
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    next_start: Instant,
}

impl Launch {
    fn ensure_running(&mut self, what: &str) -> Result<()> {
        if let Some(child) = &mut self.child {
            match child.try_wait()? {
                None => return Ok(()),
                Some(status) => {
                    warn!(what, %status, log = %self.log.display(), "process exited; restarting it");
                    self.child = None;
                    self.next_start = Instant::now() + Duration::from_secs(2);
                }
            }
        }
        if Instant::now() < self.next_start {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::var("HOME").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        info!(what, pid = child.id(), log = %self.log.display(), "started");
        self.child = Some(child);
        Ok(())
    }

    /// SIGTERM, then SIGKILL after `grace`.
    fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let config =
        Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let mut pods: BTreeMap<String, PodProcesses> = BTreeMap::new();
    let mut next_port = args.base_port;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    info!("local kubelet running");
    loop {
        if let Err(e) = sync(&client, &kubeconfig, &args, &mut pods, &mut next_port).await {
            warn!(error = %format!("{e:#}"), "sync failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    info!("stopping every pod's processes");
    for (_, p) in std::mem::take(&mut pods) {
        stop_pod(&args, p).await;
    }
    Ok(())
}

async fn sync(
    client: &Client,
    kubeconfig: &Kubeconfig,
    args: &Args,
    running: &mut BTreeMap<String, PodProcesses>,
    next_port: &mut u16,
) -> Result<()> {
    let api: Api<Pod> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = api
        .list(&ListParams::default().labels("streamapp.dev/app"))
        .await?;
    let mut live = Vec::new();
    for pod in list.items {
        let key = format!(
            "{}/{}/{}",
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            pod.uid().unwrap_or_default()
        );
        let scheduled = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some();
        let running_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if pod.metadata.deletion_timestamp.is_some() || !scheduled || !running_phase {
            continue;
        }
        live.push(key.clone());
        if !running.contains_key(&key) {
            match prepare(client, kubeconfig, args, &pod, next_port).await {
                Ok(p) => {
                    running.insert(key.clone(), p);
                }
                Err(e) => {
                    info!(pod = %key, reason = %format!("{e:#}"), "not starting yet");
                    continue;
                }
            }
        }
        let p = running.get_mut(&key).expect("inserted above");
        // A native sidecar starts before the main container.
        p.agent.ensure_running("agent")?;
        p.processor.ensure_running("processor")?;
        let ready = streamapp_api_ready(p.processor_port);
        if p.ready != Some(ready) {
            testbed::kube::try_set_pod_ready(client, &p.namespace, &p.name, ready).await?;
            info!(pod = %p.name, ready, "readiness changed");
            p.ready = Some(ready);
        }
    }
    let gone: Vec<String> = running
        .keys()
        .filter(|k| !live.contains(k))
        .cloned()
        .collect();
    for key in gone {
        let p = running.remove(&key).expect("listed");
        info!(pod = %key, "pod gone: running its preStop drain and stopping it");
        stop_pod(args, p).await;
    }
    Ok(())
}

fn streamapp_api_ready(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let probe = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500));
    probe.is_ok() && http_status(addr, "/readyz") == Some(200)
}

fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resolves what a kubelet would for this pod: configuration, volumes, environment, token.
async fn prepare(
    client: &Client,
    kubeconfig: &Kubeconfig,
    args: &Args,
    pod: &Pod,
    next_port: &mut u16,
) -> Result<PodProcesses> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let spec = pod.spec.as_ref().context("pod without spec")?;
    let dir = args.run_dir.join("pods").join(&ns).join(&name);
    std::fs::create_dir_all(&dir)?;

    // The ConfigMap mounted as `config` becomes a local file.
    let config_map = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "config")
        .and_then(|v| v.config_map.as_ref())
        .map(|c| c.name.clone())
        .context("pod has no config volume")?;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get(&config_map)
        .await?;
    let yaml = cm
        .data
        .and_then(|d| d.get("processor.yaml").cloned())
        .context("ConfigMap without processor.yaml")?;
    let config_file = dir.join("processor.yaml");
    std::fs::write(&config_file, yaml)?;

    // Volumes: the hostPath of the bound PersistentVolume of each claim.
    let state_dir = claim_host_path(client, &ns, &format!("state-{name}")).await?;
    let wal_dir = claim_host_path(client, &ns, &format!("wal-{name}"))
        .await
        .ok();

    let processor_port = *next_port;
    let agent_port = *next_port + 1;
    *next_port += 2;

    let containers = &spec.containers;
    let processor = containers
        .iter()
        .find(|c| c.name == "processor")
        .context("no processor container")?;
    let agent = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "agent")
        .context("no agent sidecar")?;
    let mut overrides: Vec<(String, String)> = vec![
        ("STREAMAPP_CONFIG".into(), config_file.display().to_string()),
        (
            "STREAMAPP_STATE_DIR".into(),
            state_dir.display().to_string(),
        ),
        ("STREAMAPP_HTTP_PORT".into(), processor_port.to_string()),
        (
            "STREAMAPP_PROCESSOR_PORT".into(),
            processor_port.to_string(),
        ),
        (
            "STREAMAPP_AGENT_METRICS_PORT".into(),
            agent_port.to_string(),
        ),
    ];
    if let Some(w) = &wal_dir {
        overrides.push(("STREAMAPP_WAL_DIR".into(), w.display().to_string()));
    }
    let sa = spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| "default".into());
    let agent_kubeconfig = service_account_kubeconfig(client, kubeconfig, &ns, &sa, &dir).await?;

    let launch = |c: &Container, env: Vec<(String, String)>, log: &str| -> Result<Launch> {
        let command = c.command.clone().unwrap_or_default();
        let (program, rest) = command
            .split_first()
            .context("container without a command")?;
        let mut all_args = rest.to_vec();
        all_args.extend(c.args.clone().unwrap_or_default());
        Ok(Launch {
            program: args.bin_dir.join(program),
            args: all_args,
            env,
            log: dir.join(log),
            child: None,
            next_start: Instant::now(),
        })
    };
    let mut processor_env = container_env(client, pod, processor).await?;
    apply_overrides(&mut processor_env, &overrides);
    let mut agent_env = container_env(client, pod, agent).await?;
    apply_overrides(&mut agent_env, &overrides);
    agent_env.push(("KUBECONFIG".into(), agent_kubeconfig.display().to_string()));
    Ok(PodProcesses {
        namespace: ns,
        name,
        uid: pod.uid().unwrap_or_default(),
        processor_port,
        processor: launch(processor, processor_env, "processor.log")?,
        agent: launch(agent, agent_env, "agent.log")?,
        dir,
        ready: None,
    })
}

fn apply_overrides(env: &mut Vec<(String, String)>, overrides: &[(String, String)]) {
    for (k, v) in overrides {
        match env.iter_mut().find(|(name, _)| name == k) {
            Some(e) => e.1 = v.clone(),
            None if k != "STREAMAPP_WAL_DIR" => env.push((k.clone(), v.clone())),
            None => {}
        }
    }
}

/// The container's environment with field and secret references resolved.
async fn container_env(client: &Client, pod: &Pod, c: &Container) -> Result<Vec<(String, String)>> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = Vec::new();
    for e in c.env.iter().flatten() {
        let value = if let Some(v) = &e.value {
            v.clone()
        } else if let Some(from) = &e.value_from {
            if let Some(field) = &from.field_ref {
                match field.field_path.as_str() {
                    "metadata.name" => pod.name_any(),
                    "metadata.namespace" => ns.clone(),
                    other => bail!("unsupported fieldRef {other}"),
                }
            } else if let Some(secret) = &from.secret_key_ref {
                let s = Api::<Secret>::namespaced(client.clone(), &ns)
                    .get(&secret.name)
                    .await?;
                let bytes = s
                    .data
                    .and_then(|d| d.get(&secret.key).cloned())
                    .context("secret key missing")?;
                String::from_utf8(bytes.0)?
            } else {
                bail!("unsupported valueFrom in {}", e.name)
            }
        } else {
            String::new()
        };
        out.push((e.name.clone(), value));
    }
    Ok(out)
}

async fn claim_host_path(client: &Client, ns: &str, claim: &str) -> Result<PathBuf> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get(claim)
        .await?;
    let volume = pvc
        .spec
        .and_then(|s| s.volume_name)
        .filter(|v| !v.is_empty())
        .context("claim not bound yet")?;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await?;
    let path = pv
        .spec
        .and_then(|s| s.host_path)
        .map(|h| h.path)
        .context("volume is not a hostPath")?;
    Ok(PathBuf::from(path))
}

/// A kubeconfig with a token of the pod's ServiceAccount (what the projected token volume
/// gives a real pod).
async fn service_account_kubeconfig(
    client: &Client,
    admin: &Kubeconfig,
    ns: &str,
    sa: &str,
    dir: &Path,
) -> Result<PathBuf> {
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": { "audiences": [], "expirationSeconds": 86400 }
    }))?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let token = sas
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .with_context(|| format!("token for service account {ns}/{sa}"))?
        .status
        .context("token request without status")?
        .token;
    let cluster = admin
        .clusters
        .first()
        .context("kubeconfig without cluster")?
        .cluster
        .clone()
        .context("empty cluster")?;
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "local", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{ "name": sa, "user": { "token": token } }],
        "contexts": [{ "name": "local", "context": { "cluster": "local", "user": sa, "namespace": ns } }],
        "current-context": "local",
    });
    let path = dir.join("agent.kubeconfig");
    std::fs::write(&path, serde_json::to_string_pretty(&kc)?)?;
    Ok(path)
}

/// preStop (drain), then the processor, then the agent (a native sidecar stops last).
async fn stop_pod(args: &Args, mut p: PodProcesses) {
    let drain = Command::new(args.bin_dir.join("streamapp-processor"))
        .args([
            "drain",
            "--port",
            &p.processor_port.to_string(),
            "--timeout",
            "60s",
        ])
        .output();
    match drain {
        Ok(out) => {
            info!(pod = %p.name, uid = %p.uid, ok = out.status.success(), output = %String::from_utf8_lossy(&out.stdout).trim(), "preStop drain")
        }
        Err(e) => warn!(pod = %p.name, error = %e, "preStop drain could not run"),
    }
    p.processor.stop(Duration::from_secs(30));
    p.agent.stop(Duration::from_secs(30));
    info!(pod = %p.name, dir = %p.dir.display(), "stopped");
}
