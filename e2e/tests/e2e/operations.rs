//! Operating StreamApps on the real node: the application reset, and what deleting a StreamApp
//! leaves in Kafka under each deletion policy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::message::Message;
use streamapp_api::status_values::{PodPhase, ResetPhase};
use streamapp_e2e::{APP, READY_TIMEOUT, Scenario, Sent};
use testbed::kafka::{self, Isolation};

/// How often each command id is in the output topic.
fn output_counts(s: &Scenario) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    kafka::read_all(&s.topics.output, Isolation::ReadCommitted, |m| {
        let value: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        *counts
            .entry(value["commandId"].as_str().unwrap().to_string())
            .or_default() += 1;
    });
    counts
}

#[tokio::test]
async fn a_reset_to_earliest_processes_the_input_again_from_empty_stores() {
    let s = Scenario::start("reset", 4).await;
    s.apply(&s.example());
    s.wait_ready(READY_TIMEOUT).await;
    let mut sent = Sent::new();
    sent.produce(&s, 600, 0.3, 0);
    s.assert_exactly_once(&sent);

    s.kubectl(&["annotate", "streamapp", APP, "streamapp.dev/reset=earliest"]);
    let status = s
        .wait_for_status("the reset to finish", Duration::from_secs(300), |st| {
            st.reset
                .as_ref()
                .is_some_and(|r| r.request == "earliest" && r.phase == ResetPhase::Done)
        })
        .await;
    assert!(status.reset.unwrap().finished_at.is_some());
    s.wait_ready(READY_TIMEOUT).await;
    // From the earliest offsets with empty stores: every id is a first sighting once more, and
    // once more only.
    s.wait_processed();
    let counts = output_counts(&s);
    let wrong: Vec<_> = counts.iter().filter(|(_, n)| **n != 2).collect();
    assert!(
        wrong.is_empty(),
        "ids not output exactly twice (once before, once after the reset): {wrong:?}"
    );
    assert_eq!(counts.len(), sent.ids.len());
    let duplicates = kafka::read_all(&s.topics.duplicates, Isolation::ReadCommitted, |_| {});
    assert_eq!(duplicates, 2 * sent.repeats());
    // New volumes (no processor ran on them before: no previous shutdown to speak of) and an
    // empty changelog: nothing was restored.
    let status = s
        .wait_for_status(
            "reports from the new stores",
            Duration::from_secs(60),
            |st| {
                st.pods.len() == 2
                    && st
                        .pods
                        .iter()
                        .all(|p| p.phase == Some(PodPhase::Running) && !p.tasks.is_empty())
            },
        )
        .await;
    for pod in &status.pods {
        assert_eq!(pod.last_shutdown_clean, None, "a new volume: {pod:?}");
        for task in &pod.tasks {
            assert!(
                task.restore.as_ref().is_none_or(|r| r.restored == 0),
                "{pod:?}"
            );
        }
    }
    s.finish().await;
}

/// Deletes the StreamApp and waits until it is gone (its finalizer, if any, done).
async fn delete_and_wait(s: &Scenario) {
    s.kubectl(&["delete", "streamapp", APP, "--wait=false"]);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let out = testbed::kube::kubectl(&["get", "streamapp", APP, "-n", &s.namespace], None);
        if !out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the StreamApp was not deleted:\n{}",
            s.diagnostics().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn deleting_a_streamapp_keeps_its_group_and_internal_topics_under_retain_and_removes_them_under_delete()
 {
    for policy in ["Retain", "Delete"] {
        let s = Scenario::start(&format!("delete-{}", policy.to_lowercase()), 2).await;
        let mut app = s.example();
        app["spec"]["deletionPolicy"] = policy.into();
        s.apply(&app);
        s.wait_ready(READY_TIMEOUT).await;
        let mut sent = Sent::new();
        sent.produce(&s, 200, 0.3, 0);
        s.assert_exactly_once(&sent);
        let group = s.application_id();
        let changelog = format!("{group}-dedup-changelog");
        let repartition = format!("{group}-dedup-repartition");
        assert!(kafka::topic_exists(&changelog));
        assert!(
            kafka::topic_exists(&repartition),
            "the example repartitions"
        );

        delete_and_wait(&s).await;
        let committed = kafka::committed_offsets(&group, &s.topics.input);
        match policy {
            "Retain" => {
                assert!(
                    committed.iter().all(Option::is_some),
                    "the group's offsets stay: {committed:?}"
                );
                assert!(kafka::topic_exists(&changelog), "the changelog stays");
                assert!(
                    kafka::topic_exists(&repartition),
                    "the repartition topic stays"
                );
            }
            _ => {
                assert!(
                    committed.iter().all(Option::is_none),
                    "the group is gone: {committed:?}"
                );
                let deadline = Instant::now() + Duration::from_secs(30);
                for topic in [&changelog, &repartition] {
                    while kafka::topic_exists(topic) {
                        assert!(
                            Instant::now() < deadline,
                            "the internal topic {topic} is still there"
                        );
                        std::thread::sleep(Duration::from_millis(300));
                    }
                }
            }
        }
        s.finish().await;
    }
}

/// A hanging transaction on the repartition topic stops the dedup stage of that partition
/// (read_committed readers stop at it): the operator's transaction doctor finds it, ends it
/// (the default `IfOwnerGone`: its producer is none of the app's pods), and the stream goes on
/// exactly once.
#[tokio::test]
async fn a_hanging_transaction_on_the_repartition_topic_is_ended_and_the_stream_goes_on_exactly_once()
 {
    let s = Scenario::start("hanging", 4).await;
    s.apply(&s.example());
    s.wait_ready(READY_TIMEOUT).await;
    let repartition = streamapp_api::config::repartition_topic(&s.application_id());
    // The route stage made the topic when the app started.
    testbed::hanging_transaction::make(&repartition, 0);
    let mut sent = Sent::new();
    sent.produce(&s, 600, 0.3, 0);
    let aborted = s
        .wait_for_event("HangingTransactionAborted", Duration::from_secs(90))
        .await;
    assert!(
        aborted.contains(&format!("on {repartition}/0")),
        "{aborted}"
    );
    s.assert_exactly_once(&sent);
    s.wait_for_status(
        "the transactions healthy again",
        Duration::from_secs(60),
        |st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "TransactionsHealthy" && c.status == "True")
        },
    )
    .await;
    s.finish().await;
}
