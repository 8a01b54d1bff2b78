//! The transaction doctor's loop (issue: hanging transactions): every few seconds it looks at
//! each running StreamApp's topics, finds partitions whose last stable offset has stood still
//! behind their end for the threshold, tells a hanging transaction from a slow one, ends it
//! when the policy allows ([`crate::transaction_doctor`] decides; this only reads, writes and
//! remembers), publishes a Warning event, and has the app reconciled when what it found
//! changed, so that the status's `TransactionsHealthy` condition says it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use streamapp_api::annotations::{PAUSED, is_true};
use streamapp_api::crd::StreamApp;
use streamapp_kafka_wire::transactions::Leaders;
use tracing::info;

use super::Context;
use super::objects::{list_pods, publish, read_secrets};
use crate::events::Notice;
use crate::kafka::Kafka;
use crate::metrics::AppLabels;
use crate::transaction_doctor::kafka::{Brokers, Holder};
use crate::transaction_doctor::{
    Action, Finding, HangingTransaction, StuckSince, TopicPartition, TopicRole,
    TransactionsFinding, decide, diagnose, explain, live_transactional_ids, threshold,
    watched_topics,
};

/// How often each app's partitions are looked at.
pub const LOOK_EVERY: Duration = Duration::from_secs(5);

/// Event reasons.
pub const HANGING_TRANSACTION: &str = "HangingTransaction";
pub const HANGING_TRANSACTION_ABORTED: &str = "HangingTransactionAborted";

/// What the doctor remembers of each app between looks.
#[derive(Default)]
pub struct Doctors {
    apps: Mutex<BTreeMap<(String, String), AppDoctor>>,
}

#[derive(Clone, Default)]
struct AppDoctor {
    stuck: StuckSince,
    /// When the doctor last wrote an abort marker on each partition.
    last_aborts: BTreeMap<TopicPartition, Timestamp>,
    finding: Option<TransactionsFinding>,
}

fn key(app: &StreamApp) -> (String, String) {
    (app.namespace().unwrap_or_default(), app.name_any())
}

impl Doctors {
    /// What the doctor last found for `app` (`None`: it has not looked yet).
    pub fn finding(&self, app: &StreamApp) -> Option<TransactionsFinding> {
        self.apps
            .lock()
            .unwrap()
            .get(&key(app))
            .and_then(|d| d.finding.clone())
    }

    fn state(&self, app: &StreamApp) -> AppDoctor {
        self.apps
            .lock()
            .unwrap()
            .get(&key(app))
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets the apps not in `present` (deleted); returns them.
    fn forget_all_but(&self, present: &[(String, String)]) -> Vec<(String, String)> {
        let mut apps = self.apps.lock().unwrap();
        let gone: Vec<_> = apps
            .keys()
            .filter(|k| !present.contains(k))
            .cloned()
            .collect();
        for k in &gone {
            apps.remove(k);
        }
        gone
    }

    /// Keeps `state`; returns whether the finding changed.
    fn keep(&self, app: &StreamApp, state: AppDoctor) -> bool {
        let mut apps = self.apps.lock().unwrap();
        let before = apps.get(&key(app)).and_then(|d| d.finding.clone());
        let changed = before != state.finding;
        apps.insert(key(app), state);
        changed
    }
}

/// The doctor's task, stopped when this is dropped.
pub struct Running(pub tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the doctor over the StreamApps in `apps` until it is stopped; `changed` gets each app
/// whose finding changed.
pub async fn run(
    ctx: Arc<Context>,
    apps: Store<StreamApp>,
    changed: UnboundedSender<ObjectRef<StreamApp>>,
) {
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let present: Vec<_> = apps.state().iter().map(|a| key(a)).collect();
        for (namespace, name) in ctx.doctors.forget_all_but(&present) {
            let labels = AppLabels { namespace, name };
            ctx.metrics.hanging_transactions.remove(&labels);
            ctx.metrics.hanging_transactions_aborted.remove(&labels);
        }
        for app in apps.state() {
            if app.metadata.deletion_timestamp.is_some() || is_true(app.annotations(), PAUSED) {
                continue;
            }
            if look(&ctx, &app).await {
                let _ = changed.unbounded_send(ObjectRef::from_obj(&*app));
            }
        }
    }
}

/// One look at `app`; returns whether its finding changed. The pods are listed, and the
/// suspects examined, only when a partition has been stuck for the threshold.
async fn look(ctx: &Context, app: &StreamApp) -> bool {
    let mut state = ctx.doctors.state(app);
    let previous = state.finding.clone();
    let now = Timestamp::now();
    let (finding, notices) = match examine(ctx, app, &mut state, now).await {
        Ok(Some((hanging, notices))) if !hanging.is_empty() => {
            (TransactionsFinding::Hanging(hanging), notices)
        }
        Ok(_) => (TransactionsFinding::Healthy, Vec::new()),
        Err(e) => (TransactionsFinding::Unknown(e), Vec::new()),
    };
    state.finding = Some(finding);
    // The same hanging transaction is announced once, not at every look.
    let notices = if state.finding == previous {
        Vec::new()
    } else {
        notices
    };
    let labels = AppLabels {
        namespace: app.namespace().unwrap_or_default(),
        name: app.name_any(),
    };
    let hanging = match &state.finding {
        Some(TransactionsFinding::Hanging(h)) => h.len() as i64,
        _ => 0,
    };
    ctx.metrics
        .hanging_transactions
        .get_or_create(&labels)
        .set(hanging);
    for notice in notices {
        if notice.reason == HANGING_TRANSACTION_ABORTED {
            ctx.metrics
                .hanging_transactions_aborted
                .get_or_create(&labels)
                .inc();
        }
        publish(ctx, app, notice).await;
    }
    ctx.doctors.keep(app, state)
}

/// What holds `app`'s partitions back (`None`: nothing has been stuck for the threshold), with
/// the events to publish; ends what may be ended. Updates `state`'s stuck partitions and aborts.
async fn examine(
    ctx: &Context,
    app: &StreamApp,
    state: &mut AppDoctor,
    now: Timestamp,
) -> Result<Option<(Vec<HangingTransaction>, Vec<Notice>)>, String> {
    let secrets = read_secrets(&ctx.client, app)
        .await
        .map_err(|e| e.to_string())?;
    let kafka = Kafka::for_app(app, &super::secrets_by_name(&secrets))?;
    let brokers = Brokers::new(kafka.client_config())?;
    let topics: Vec<String> = watched_topics(app).into_iter().map(|(t, _)| t).collect();
    let stuck = state.stuck.clone();
    let (brokers, leaders, stuck) = blocking(move || {
        let leaders = brokers.leaders(&topics)?;
        let stuck = stuck.observe(&brokers.offsets(&leaders)?, now);
        Ok((brokers, leaders, stuck))
    })
    .await?;
    let suspects = stuck.suspects(threshold(app), now);
    state.stuck = stuck;
    if suspects.is_empty() {
        return Ok(None);
    }
    let pods: Vec<String> = list_pods(&ctx.client, app)
        .await
        .map_err(|e| e.to_string())?
        .iter()
        .map(|p| p.name_any())
        .collect();
    let owned_app = app.clone();
    let last_aborts = state.last_aborts.clone();
    let bootstrap = kafka.bootstrap();
    let (treated, last_aborts) = blocking(move || {
        let mut last_aborts = last_aborts;
        let live = live_transactional_ids(&owned_app, &pods);
        let mut treated = Vec::new();
        for holder in brokers.holders(&leaders, &suspects)? {
            treated.extend(treat(
                &owned_app,
                &brokers,
                &leaders,
                &holder,
                &live,
                &mut last_aborts,
                &bootstrap,
                now,
            ));
        }
        Ok((treated, last_aborts))
    })
    .await?;
    state.last_aborts = last_aborts;
    Ok(Some(treated.into_iter().unzip()))
}

/// Runs blocking Kafka I/O on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("the transaction doctor panicked: {e}"))?
}

/// Diagnoses the transaction `holder` found, and ends it when [`decide`] says so: the report
/// for the status and the event to publish (`None`: it is only slow). Blocking.
#[allow(clippy::too_many_arguments)]
fn treat(
    app: &StreamApp,
    brokers: &Brokers,
    leaders: &Leaders,
    holder: &Holder,
    live: &[String],
    last_aborts: &mut BTreeMap<TopicPartition, Timestamp>,
    bootstrap: &str,
    now: Timestamp,
) -> Option<(HangingTransaction, Notice)> {
    let open = holder.open_transaction();
    let finding = diagnose(&open, &holder.partition, holder.known.as_ref());
    let Finding::Hanging { owner, reason } = &finding else {
        return None;
    };
    let (topic, partition) = holder.partition.clone();
    let role = watched_topics(app)
        .into_iter()
        .find(|(t, _)| *t == topic)
        .map_or(TopicRole::Shared, |(_, role)| role);
    let last_abort = last_aborts.get(&holder.partition).copied();
    let owner = owner
        .as_deref()
        .unwrap_or("a producer no coordinator knows");
    let why = explain(reason);
    let mut report = HangingTransaction {
        topic: topic.clone(),
        partition,
        producer_id: open.producer_id,
        start_offset: open.start_offset,
        detail: String::new(),
    };
    let policy = app.spec.kafka.abort_hanging_transactions;
    let notice = match decide(
        &finding,
        role,
        policy,
        live,
        last_abort,
        threshold(app),
        now,
    ) {
        Action::Wait => return None,
        Action::Abort => match brokers.abort(leaders, holder) {
            Ok(()) => {
                last_aborts.insert(holder.partition.clone(), now);
                report.detail = format!("{why}; its owner ({owner}) is gone: aborted");
                info!(app = %app.name_any(), topic, partition, producer = open.producer_id,
                    start_offset = open.start_offset, "aborted a hanging transaction");
                Notice {
                    warning: true,
                    reason: HANGING_TRANSACTION_ABORTED,
                    note: format!(
                        "ended the hanging transaction of producer {} on {topic}/{partition} \
                         (open since offset {}; {why}; owner {owner}) with an abort marker",
                        open.producer_id, open.start_offset
                    ),
                }
            }
            Err(e) => {
                report.detail = format!("{why}; the abort failed: {e}");
                Notice {
                    warning: true,
                    reason: HANGING_TRANSACTION,
                    note: format!(
                        "could not end the hanging transaction on {topic}/{partition}: {e}; \
                         by hand: {}",
                        report.command(bootstrap)
                    ),
                }
            }
        },
        Action::Report { why_not } => {
            report.detail = format!("{why}; not ended: {why_not}");
            Notice {
                warning: true,
                reason: HANGING_TRANSACTION,
                note: format!(
                    "a hanging transaction of producer {} holds {topic}/{partition} at \
                     offset {} ({why}); not ended: {why_not}; by hand: {}",
                    open.producer_id,
                    open.start_offset,
                    report.command(bootstrap)
                ),
            }
        }
    };
    Some((report, notice))
}
