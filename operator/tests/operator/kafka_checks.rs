//! What the operator reads from a StreamApp's Kafka, against the real broker: missing topics, an
//! input whose partitions changed, more replicas than partitions, and the consumer group's lag.
//! The pods land on the fake node (nothing processes): these are the operator's own checks.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use rdkafka::producer::{BaseRecord, Producer};
use streamapp_api::crd::StreamAppStatus;
use support::*;
use testbed::kafka;

/// Topics of a test app, unique per test.
struct Topics {
    input: String,
    output: String,
    dlq: String,
}

fn topics(prefix: &str) -> Topics {
    let base = testbed::unique_name(prefix);
    Topics {
        input: format!("{base}-in"),
        output: format!("{base}-out"),
        dlq: format!("{base}-dlq"),
    }
}

fn app_json(name: &str, replicas: i32, t: &Topics) -> serde_json::Value {
    let mut app = streamapp_json(name, replicas);
    app["spec"]["kafka"]["bootstrapServers"] = kafka::bootstrap().into();
    app["spec"]["topology"] = serde_json::json!({
        "inputTopic": t.input, "outputTopic": t.output, "deadLetterTopic": t.dlq,
    });
    app
}

fn condition_message(status: &StreamAppStatus, type_: &str) -> String {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_missing_output_topic_is_a_condition_naming_it_until_the_topic_exists() {
    with_operator("topic-missing", |client, ns| async move {
        let t = topics("missing");
        kafka::create_topic(&t.input, 2).await;
        kafka::create_topic(&t.dlq, 1).await;
        create(&client, &ns, app_json("orders", 1, &t)).await;
        let status = wait_for_status(
            &client,
            &ns,
            "orders",
            "TopicsReady=False (TopicMissing)",
            |s| condition(s, "TopicsReady") == Some(("False".into(), "TopicMissing".into())),
        )
        .await;
        let message = condition_message(&status, "TopicsReady");
        assert!(
            message.contains(&t.output) && message.contains("spec.topology.outputTopic"),
            "{message}"
        );
        assert_eq!(
            condition(&status, "Degraded"),
            Some(("True".into(), "TopicMissing".into()))
        );

        // Created afterwards, nothing else changing: the operator looks again by itself.
        kafka::create_topic(&t.output, 2).await;
        let status = wait_for_status(&client, &ns, "orders", "TopicsReady=True", |s| {
            condition(s, "TopicsReady").is_some_and(|c| c.0 == "True")
        })
        .await;
        assert_eq!(status.input_partitions, Some(2));
    })
    .await;
}

#[tokio::test]
async fn an_input_with_other_partitions_than_its_changelog_is_a_condition_that_says_why() {
    with_operator("partitions", |client, ns| async move {
        let t = topics("repartitioned");
        for (topic, partitions) in [(&t.input, 6), (&t.output, 6), (&t.dlq, 1)] {
            kafka::create_topic(topic, partitions).await;
        }
        // The changelog as the processors made it when the input had 4 partitions.
        kafka::create_topic(&format!("{ns}.orders-dedup-changelog"), 4).await;
        create(&client, &ns, app_json("orders", 1, &t)).await;
        let status = wait_for_status(&client, &ns, "orders", "InputPartitionsChanged", |s| {
            condition(s, "TopicsReady") == Some(("False".into(), "InputPartitionsChanged".into()))
        })
        .await;
        let message = condition_message(&status, "TopicsReady");
        assert!(
            message.contains("6 partitions") && message.contains("made for 4"),
            "{message}"
        );
        assert!(
            message.contains("streamapp.dev/reset"),
            "says what to do: {message}"
        );
    })
    .await;
}

#[tokio::test]
async fn more_replicas_than_input_partitions_run_as_many_pods_as_partitions() {
    with_operator("capped", |client, ns| async move {
        let t = topics("capped");
        for (topic, partitions) in [(&t.input, 2), (&t.output, 2), (&t.dlq, 1)] {
            kafka::create_topic(topic, partitions).await;
        }
        create(&client, &ns, app_json("orders", 5, &t)).await;
        let status = wait_for_status(&client, &ns, "orders", "ReplicasCapped", |s| {
            condition(s, "ReplicasCapped").is_some_and(|c| c.0 == "True")
        })
        .await;
        assert!(condition_message(&status, "ReplicasCapped").contains("has 2 partitions"));
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        testbed::kube::wait_for(
            Duration::from_secs(30),
            "the StatefulSet at 2 replicas",
            || async {
                sets.get("orders")
                    .await
                    .is_ok_and(|s| s.spec.unwrap().replicas == Some(2))
            },
        )
        .await;
        assert!(
            status.ready.as_deref().is_some_and(|r| r.ends_with("/2")),
            "ready counts against the pods that run: {:?}",
            status.ready
        );
    })
    .await;
}

#[tokio::test]
async fn the_consumer_groups_lag_is_in_the_status_and_in_kubectl_get() {
    with_operator("lag", |client, ns| async move {
        let t = topics("lag");
        for (topic, partitions) in [(&t.input, 2), (&t.output, 2), (&t.dlq, 1)] {
            kafka::create_topic(topic, partitions).await;
        }
        let producer: rdkafka::producer::BaseProducer = kafka::client_config().create().unwrap();
        for i in 0..30 {
            let key = format!("cmd-{i}");
            kafka::send(&producer, BaseRecord::to(&t.input).key(&key).payload("{}"));
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        create(&client, &ns, app_json("orders", 1, &t)).await;
        // Nothing processes on the fake node: all 30 records are behind.
        let status =
            wait_for_status(&client, &ns, "orders", "a lag of 30", |s| s.lag == Some(30)).await;
        assert_eq!(status.consumer_group, Some(format!("{ns}.orders")));
        let out = testbed::kube::kubectl_ok(&["get", "streamapp", "orders", "-n", &ns], None);
        let mut lines = out.lines();
        let header: Vec<_> = lines.next().unwrap().split_whitespace().collect();
        let row: Vec<_> = lines.next().unwrap().split_whitespace().collect();
        let lag_column = header
            .iter()
            .position(|h| *h == "LAG")
            .expect("a LAG column");
        assert_eq!(row[lag_column], "30", "{out}");
    })
    .await;
}

/// A processor's static group membership as a pod holds it (nothing processes on the fake
/// node): a consumer with `group.instance.id` polling on a thread until it is killed, which,
/// like a pod that goes away, leaves the group without a LeaveGroup.
struct StaticMember {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StaticMember {
    fn join(group: &str, instance: &str, topic: &str) -> StaticMember {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = kafka::client_config()
            .set("group.id", group)
            .set("group.instance.id", instance)
            // Far longer than the test: a member removed by the operator was not expired.
            .set("session.timeout.ms", "300000")
            .create()
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                consumer.poll(Duration::from_millis(100));
            }
        });
        StaticMember {
            stop,
            thread: Some(thread),
        }
    }

    fn kill(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
    }
}

/// The group's static members (instance ids), as its coordinator lists them.
fn static_members(group: &str) -> Vec<String> {
    use streamapp_kafka_wire::{CoordinatorKind, Security, groups, open_coordinator};
    let mut coordinator = open_coordinator(
        &[kafka::bootstrap()],
        "test",
        Duration::from_secs(10),
        &Security::default(),
        CoordinatorKind::Group,
        group,
    )
    .unwrap();
    let mut members = groups::static_members(&mut coordinator, group).unwrap();
    members.sort();
    members
}

#[test]
fn a_group_the_coordinator_does_not_know_has_no_static_members() {
    // Kafka 4's coordinator answers GROUP_ID_NOT_FOUND for it; the operator asks about a group
    // before its pods joined it.
    let group = format!("t-unknown-{}", std::process::id());
    assert_eq!(static_members(&group), Vec::<String>::new());
}

#[tokio::test]
async fn a_scale_in_removes_the_scaled_away_pods_group_members_instead_of_letting_them_expire() {
    with_operator("departed", |client, ns| async move {
        let t = topics("departed");
        for (topic, partitions) in [(&t.input, 3), (&t.output, 3), (&t.dlq, 1)] {
            kafka::create_topic(topic, partitions).await;
        }
        create(&client, &ns, app_json("orders", 3, &t)).await;
        let group = format!("{ns}.orders");
        let members: Vec<StaticMember> = ["orders-0", "orders-1", "orders-2"]
            .iter()
            .map(|pod| StaticMember::join(&group, pod, &t.input))
            .collect();
        eventually(Duration::from_secs(60), "three static members", || async {
            (static_members(&group).len() == 3).then_some(())
        })
        .await;
        // The pods scaled away die with their members; the group keeps them (static
        // membership) until the session timeout of five minutes.
        let mut members = members.into_iter();
        let first = members.next().unwrap();
        members.for_each(StaticMember::kill);
        patch_spec(&client, &ns, "orders", serde_json::json!({ "replicas": 1 })).await;
        eventually(
            Duration::from_secs(60),
            "the members of the scaled-away pods removed from the group",
            || async { (static_members(&group) == ["orders-0"]).then_some(()) },
        )
        .await;
        // One Event per removal: both pods in one, or one each when the operator saw them go
        // one at a time. Published after the removal: looked for until they are there.
        let removed_in_events = || {
            let events = testbed::kube::kubectl_ok(
                &[
                    "get",
                    "events",
                    "-n",
                    &ns,
                    "--field-selector=reason=RemovedGroupMembers",
                    "-o",
                    "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
                ],
                None,
            );
            let mut removed: Vec<String> = events
                .lines()
                .filter_map(|m| {
                    m.strip_prefix("removed ")?
                        .split_once(" from consumer group ")
                })
                .inspect(|(_, rest)| assert!(rest.starts_with(&group), "{events}"))
                .flat_map(|(pods, _)| pods.split(", ").map(String::from))
                .collect();
            removed.sort();
            removed
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let removed = removed_in_events();
            if removed == ["orders-1", "orders-2"] {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Events name orders-1 and orders-2 as removed, found {removed:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        first.kill();
    })
    .await;
}
