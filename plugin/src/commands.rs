//! What each command does against the API server: reads StreamApps and pods, prints them
//! ([`crate::render`]), and applies the changes [`crate::actions`] decides.

use std::io::IsTerminal;

use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use streamapp_api::crd::StreamApp;

use crate::actions::{self, Change, ResetTo};
use crate::cli::{Cli, Command, Output};
use crate::errors::explain;
use crate::render::{self, Colour};

/// Runs the command `cli` asks for.
pub async fn run(cli: Cli) -> Result<()> {
    if let Command::Completion { shell } = cli.command {
        use clap::CommandFactory;
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "kubectl-streamapp",
            &mut std::io::stdout(),
        );
        return Ok(());
    }
    if let Command::Complete { words } = &cli.command {
        // clap takes a `-n` before the words as the global option.
        complete(words, cli.namespace.clone()).await;
        return Ok(());
    }
    let client = Client::try_default().await.map_err(|e| {
        anyhow::anyhow!(
            "no Kubernetes API server to talk to (KUBECONFIG or in-cluster config): {e}"
        )
    })?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    match cli.command {
        Command::Status {
            name,
            all_namespaces,
            output,
            watch,
        } => status(&client, &ns, name.as_deref(), all_namespaces, output, watch).await,
        Command::Inspect { pod } => inspect(&client, &ns, &pod).await,
        Command::Lookup { name, ids, output } => lookup(&client, &ns, &name, &ids, output).await,
        Command::DeadLetters {
            name,
            since,
            reason,
            limit,
            output,
        } => {
            let now_ms = Timestamp::now().as_millisecond();
            let query = crate::dead_letters::query(since.as_deref(), reason, limit, now_ms)
                .map_err(anyhow::Error::msg)?;
            dead_letters(&client, &ns, &name, &query, output).await
        }
        Command::Drain { pod } => drain(&client, &ns, &pod).await,
        Command::Pause { name } => change(&client, &ns, &name, actions::pause(&ns, &name)).await,
        Command::Resume { name } => change(&client, &ns, &name, actions::resume(&ns, &name)).await,
        Command::Restart { name } => {
            let now = Timestamp::now().to_string();
            change(&client, &ns, &name, actions::restart(&ns, &name, &now)).await
        }
        Command::Reset {
            name,
            to_earliest,
            to_latest,
            to_datetime,
            yes,
        } => {
            let to = match (to_earliest, to_latest, to_datetime) {
                (true, _, _) => ResetTo::Earliest,
                (_, true, _) => ResetTo::Latest,
                (_, _, Some(t)) => actions::parse_datetime(&t).map_err(anyhow::Error::msg)?,
                _ => bail!("say where to: --to-earliest, --to-latest or --to-datetime TIME"),
            };
            // The app must exist before anything is asked or changed.
            get_app(&client, &ns, &name).await?;
            if !yes {
                bail!(actions::reset_warning(&ns, &name, &to));
            }
            change(&client, &ns, &name, actions::reset(&ns, &name, &to)).await
        }
        Command::Completion { .. } | Command::Complete { .. } => {
            unreachable!("handled before connecting")
        }
    }
}

async fn get_app(client: &Client, ns: &str, name: &str) -> Result<StreamApp> {
    Api::<StreamApp>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!(explain(&e, "get", "streamapps", ns, Some(name))))
}

async fn list_apps(
    client: &Client,
    ns: &str,
    all: bool,
    name: Option<&str>,
) -> Result<Vec<StreamApp>> {
    if let Some(name) = name {
        return Ok(vec![get_app(client, ns, name).await?]);
    }
    let api: Api<StreamApp> = if all {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    };
    let scope = if all { "all namespaces" } else { ns };
    let mut apps = api
        .list(&ListParams::default())
        .await
        .map_err(|e| anyhow::anyhow!(explain(&e, "list", "streamapps", scope, None)))?
        .items;
    apps.sort_by_key(|a| (a.namespace(), a.name_any()));
    Ok(apps)
}

fn print(apps: &[StreamApp], output: Output) -> Result<()> {
    match output {
        Output::Text => {
            let colour = if std::io::stdout().is_terminal() {
                Colour::Ansi
            } else {
                Colour::Never
            };
            if apps.is_empty() {
                println!("no StreamApps found");
            }
            print!("{}", render::tree(apps, Timestamp::now(), colour));
        }
        Output::Json => println!("{}", serde_json::to_string_pretty(&render::data(apps))?),
        Output::Yaml => print!("{}", serde_yaml::to_string(&render::data(apps))?),
    }
    Ok(())
}

async fn status(
    client: &Client,
    ns: &str,
    name: Option<&str>,
    all: bool,
    output: Output,
    watch: bool,
) -> Result<()> {
    let mut apps = list_apps(client, ns, all, name).await?;
    print(&apps, output)?;
    if !watch {
        return Ok(());
    }
    let api: Api<StreamApp> = if all {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    };
    let mut config = watcher::Config::default();
    if let Some(name) = name {
        config = config.fields(&format!("metadata.name={name}"));
    }
    let clear = std::io::stdout().is_terminal() && matches!(output, Output::Text);
    let mut changes = watcher(api, config).applied_objects().boxed();
    while let Some(event) = changes.next().await {
        let app = event.map_err(|e| anyhow::anyhow!("watching StreamApps: {e}"))?;
        let key = (app.namespace(), app.name_any());
        let before = apps
            .iter()
            .position(|a| (a.namespace(), a.name_any()) == key);
        let changed = match before {
            Some(i)
                if apps[i].status == app.status && apps[i].annotations() == app.annotations() =>
            {
                false
            }
            Some(i) => {
                apps[i] = app;
                true
            }
            None => {
                apps.push(app);
                apps.sort_by_key(|a| (a.namespace(), a.name_any()));
                true
            }
        };
        if changed {
            if clear {
                print!("\x1b[2J\x1b[H");
            } else {
                println!("---");
            }
            print(&apps, output)?;
        }
    }
    Ok(())
}

async fn change(client: &Client, ns: &str, name: &str, change: Change) -> Result<()> {
    let api: Api<StreamApp> = Api::namespaced(client.clone(), ns);
    api.patch(name, &PatchParams::default(), &Patch::Merge(&change.patch))
        .await
        .map_err(|e| anyhow::anyhow!(explain(&e, "patch", "streamapps", ns, Some(name))))?;
    println!("{}", change.done);
    println!("watch: {}", change.next);
    Ok(())
}

async fn pod_of_app(client: &Client, ns: &str, pod: &str) -> Result<(Pod, String)> {
    let p = Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .map_err(|e| anyhow::anyhow!(explain(&e, "get", "pods", ns, Some(pod))))?;
    let Some(app) = actions::app_of_pod(p.labels()).map(str::to_string) else {
        bail!("pod {ns}/{pod} is not a StreamApp pod (no streamapp.dev/app label)");
    };
    Ok((p, app))
}

/// Asks every running pod of the app (see [`crate::lookup`]) and prints the merged answers.
async fn lookup(
    client: &Client,
    ns: &str,
    name: &str,
    ids: &[String],
    output: Output,
) -> Result<()> {
    // The processor's own limits, before anything is asked.
    let query = streamapp_api::lookup::query(ids);
    streamapp_api::lookup::parse_query(Some(&query)).map_err(|r| anyhow::anyhow!("{r}"))?;
    let running = running_pods(client, ns, name).await?;
    let path = format!("{}?{query}", streamapp_api::lookup::PATH);
    let asked = running.iter().map(|pod| async {
        let answer = proxy_get(client, ns, pod, &path).await.and_then(|text| {
            serde_json::from_str(&text).map_err(|e| {
                format!(
                    "{} answered something else than a lookup: {e}",
                    pod.name_any()
                )
            })
        });
        (pod.name_any(), answer)
    });
    let answers = futures::future::join_all(asked).await;
    if let Some((_, Err(why))) = answers.iter().find(|(_, a)| a.is_err())
        && answers.iter().all(|(_, a)| a.is_err())
    {
        bail!("no pod of {ns}/{name} answered: {why}");
    }
    let rows = crate::lookup::merge(ids, &answers);
    match output {
        Output::Text => print!("{}", crate::lookup::table(&rows, &answers)),
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Output::Yaml => print!("{}", serde_yaml::to_string(&rows)?),
    }
    Ok(())
}

/// Asks the app's running pods one after the other until one lists its dead letters.
async fn dead_letters(
    client: &Client,
    ns: &str,
    name: &str,
    query: &streamapp_api::dead_letters::Query,
    output: Output,
) -> Result<()> {
    let path = format!("{}?{}", streamapp_api::dead_letters::PATH, query.to_query());
    let mut failures = Vec::new();
    for pod in running_pods(client, ns, name).await? {
        let listing = match proxy_get(client, ns, &pod, &path).await {
            Ok(text) => serde_json::from_str::<streamapp_api::dead_letters::Listing>(&text)
                .map_err(|e| {
                    format!(
                        "{} answered something else than a listing: {e}",
                        pod.name_any()
                    )
                }),
            Err(e) => Err(e),
        };
        match listing {
            Ok(listing) => {
                match output {
                    Output::Text => print!("{}", crate::dead_letters::table(&listing)),
                    Output::Json => println!("{}", serde_json::to_string_pretty(&listing)?),
                    Output::Yaml => print!("{}", serde_yaml::to_string(&listing)?),
                }
                return Ok(());
            }
            Err(e) => failures.push(e),
        }
    }
    bail!(
        "no pod of {ns}/{name} listed its dead letters: {}",
        failures.join("; ")
    )
}

/// The app's pods that run (after checking the app exists).
async fn running_pods(client: &Client, ns: &str, name: &str) -> Result<Vec<Pod>> {
    get_app(client, ns, name).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("streamapp.dev/app={name}")))
        .await
        .map_err(|e| anyhow::anyhow!(explain(&e, "list", "pods", ns, None)))?
        .items;
    let running: Vec<Pod> = pods
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect();
    if running.is_empty() {
        bail!("no running pod of {ns}/{name} to ask (kubectl streamapp status {name} -n {ns})");
    }
    Ok(running)
}

/// `GET path` on the pod's processor (its port named `http`), through the API server's pod
/// proxy: no port-forward, and the user's own RBAC (`get` on `pods/proxy`).
async fn proxy_get(
    client: &Client,
    ns: &str,
    pod: &Pod,
    path: &str,
) -> std::result::Result<String, String> {
    let name = pod.name_any();
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("http"))
        .map(|p| p.container_port)
        .ok_or_else(|| format!("pod {name} has no port named http"))?;
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy{path}"
    ))
    .body(Vec::new())
    .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| explain(&e, "get", "pods/proxy", ns, Some(&name)))
}

async fn drain(client: &Client, ns: &str, pod: &str) -> Result<()> {
    let (_, app) = pod_of_app(client, ns, pod).await?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(pod, &DeleteParams::default())
        .await
        .map_err(|e| anyhow::anyhow!(explain(&e, "delete", "pods", ns, Some(pod))))?;
    let (done, next) = actions::drain(ns, pod, &app);
    println!("{done}");
    println!("watch: {next}");
    Ok(())
}

/// Where the operator mounts the state volume and (with `storage.walVolume`) the WAL volume
/// in the processor container.
const STATE_DIR: &str = "/var/lib/streamapp/state";
const WAL_DIR: &str = "/var/lib/streamapp/wal";

async fn inspect(client: &Client, ns: &str, pod: &str) -> Result<()> {
    let (p, _) = pod_of_app(client, ns, pod).await?;
    let has_wal_volume = p
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .filter(|c| c.name == "processor")
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .any(|m| m.mount_path == WAL_DIR);
    let mut args = vec![
        "exec",
        "-n",
        ns,
        pod,
        "-c",
        "processor",
        "--",
        "streamapp-processor",
        "inspect",
        STATE_DIR,
    ];
    if has_wal_volume {
        args.extend(["--wal-dir", WAL_DIR]);
    }
    let status = std::process::Command::new("kubectl")
        .args(&args)
        .status()
        .map_err(|e| anyhow::anyhow!("running kubectl exec: {e}"))?;
    if !status.success() {
        bail!("kubectl exec into {ns}/{pod} failed ({status})");
    }
    Ok(())
}

/// Answers kubectl's completion request; a cluster that does not answer means no names.
async fn complete(words: &[String], global_namespace: Option<String>) {
    use crate::completion::{Needs, answer, parse};
    let (namespace, needs, _) = parse(words);
    let namespace = namespace.or(global_namespace);
    let mut names = Vec::new();
    if matches!(needs, Needs::Apps | Needs::Pods)
        && let Ok(client) = Client::try_default().await
    {
        let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
        names = match needs {
            Needs::Apps => Api::<StreamApp>::namespaced(client, &ns)
                .list_metadata(&ListParams::default())
                .await
                .map(|l| l.items.iter().map(|a| a.name_any()).collect())
                .unwrap_or_default(),
            Needs::Pods => Api::<Pod>::namespaced(client, &ns)
                .list_metadata(&ListParams::default().labels("streamapp.dev/app"))
                .await
                .map(|l| l.items.iter().map(|p| p.name_any()).collect())
                .unwrap_or_default(),
            Needs::Command | Needs::Nothing => Vec::new(),
        };
    }
    print!("{}", answer(words, &names));
}
