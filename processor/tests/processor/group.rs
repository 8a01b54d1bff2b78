//! The processor's own group membership (`processor/src/group`, ADR 0001) against the real
//! broker: members join one consumer group with the `streamapp-v1` assignor, the leader
//! assigns active, standby and warm-up tasks from the stores each member reports, and the
//! group's moves follow the state: a member that leaves hands its tasks to their standby
//! holders, a static member back within the session timeout keeps its tasks, a new member
//! warms up before a task moves to it. And the fence that exactly-once rests on through every
//! move (KIP-447): a transaction's offsets with a stale generation are refused.
//!
//! Each pod here reports what an engine would: the tasks it was active for, and once the test
//! says it holds state, a store at the changelog end for each task it is active or standby for
//! (a warm-up's store as far as the test says). Until then the group is balanced without
//! regard to state: the first member to join would otherwise keep every task it restored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use streamapp_kafka_wire::Security;
use streamapp_processor::group::txn_offsets::{GroupGeneration, send_offsets_to_transaction};
use streamapp_processor::group::{
    Generation, GroupConfig, GroupEvent, Membership, Report, SharedState,
};
use testbed::kafka;

const TASKS: i32 = 6;
/// Partitions of the route stage's topic.
const ROUTES: i32 = 5;
/// Every task's changelog end in these tests.
const END: i64 = 1_000;

fn config(group: &str, pod: &str) -> GroupConfig {
    GroupConfig {
        bootstrap: vec![kafka::bootstrap()],
        group_id: group.to_string(),
        instance_id: pod.to_string(),
        topic: format!("{group}-in"),
        tasks: TASKS,
        // As for a repartitioning topology: the input's partitions are route tasks.
        routes: Some((format!("{group}-raw"), ROUTES)),
        session_timeout: Duration::from_secs(10),
        rebalance_timeout: Duration::from_secs(10),
        heartbeat_interval: Duration::from_millis(300),
        probing_rebalance_interval: Duration::from_secs(2),
        standby_replicas: 1,
        acceptable_lag: 100,
        security: Security::default(),
    }
}

fn group_name(test: &str) -> String {
    format!(
        "group-{test}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    )
}

struct Pod {
    name: String,
    membership: Option<Membership>,
    events: Receiver<GroupEvent>,
    state: Arc<SharedState>,
    latest: Option<Generation>,
    /// Whether the pod reports the stores of its share (see the module's doc).
    holds_state: bool,
    /// Warm-ups report their store this far behind the end (what the test says they caught up).
    warm_up_lag: i64,
}

impl Pod {
    fn start(group: &str, name: &str, stores: BTreeMap<i32, i64>, active: BTreeSet<i32>) -> Pod {
        Pod::start_with(config(group, name), stores, active)
    }

    fn start_with(cfg: GroupConfig, stores: BTreeMap<i32, i64>, active: BTreeSet<i32>) -> Pod {
        let name = cfg.instance_id.clone();
        // The membership's log, for when a test fails (RUST_LOG picks more).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .try_init();
        let state = Arc::new(SharedState::default());
        *state.changelog_ends.lock().unwrap() = (0..TASKS).map(|t| (t, END)).collect();
        *state.report.lock().unwrap() = Report {
            node: Some(format!("node-{name}")),
            stores,
            active,
            ..Default::default()
        };
        let (membership, events) = Membership::start(cfg, state.clone());
        Pod {
            name,
            membership: Some(membership),
            events,
            state,
            latest: None,
            holds_state: false,
            warm_up_lag: END,
        }
    }

    /// A pod with nothing on its volume.
    fn new(group: &str, name: &str) -> Pod {
        Pod::start(group, name, BTreeMap::new(), BTreeSet::new())
    }

    /// Takes the events that arrived; reports the stores of the latest generation's share.
    fn drain(&mut self) -> bool {
        let mut any = false;
        while let Ok(event) = self.events.try_recv() {
            any = true;
            match event {
                GroupEvent::Assigned(g) => self.latest = Some(g),
                GroupEvent::Rebalancing(_) => {}
                GroupEvent::Failed(why) => panic!("{}: the membership failed: {why}", self.name),
            }
        }
        if let Some(g) = &self.latest {
            self.report(g.share.active.clone(), &g.share.standby, &g.share.warm_up);
        }
        any
    }

    fn report(&self, active: BTreeSet<i32>, standby: &BTreeSet<i32>, warm_up: &BTreeSet<i32>) {
        let mut report = self.state.report.lock().unwrap();
        report.active = active.clone();
        if !self.holds_state {
            return;
        }
        for &t in active.iter().chain(standby) {
            report.stores.insert(t, END);
        }
        for &t in warm_up {
            report.stores.insert(t, END - self.warm_up_lag);
        }
    }

    fn share(&self) -> &Generation {
        self.latest.as_ref().expect("assigned")
    }
}

/// From now on the pods report the stores of their shares.
fn hold_state(pods: &mut [&mut Pod]) {
    for pod in pods.iter_mut() {
        pod.holds_state = true;
        pod.drain();
    }
}

/// Waits until every pod is in the same generation and nothing happened for a second.
fn settle(pods: &mut [&mut Pod], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut quiet_since = Instant::now();
    loop {
        let mut any = false;
        for pod in pods.iter_mut() {
            any |= pod.drain();
        }
        if any {
            quiet_since = Instant::now();
        }
        let generations: BTreeSet<_> = pods
            .iter()
            .map(|p| p.latest.as_ref().map(|g| g.generation_id))
            .collect();
        if generations.len() == 1
            && !generations.contains(&None)
            && quiet_since.elapsed() > Duration::from_secs(1)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle within {timeout:?}: generations {:?}",
            pods.iter()
                .map(|p| (p.name.clone(), p.latest.clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every task active exactly once, its standbys on other members, every route task once.
fn assert_covered(pods: &[&Pod]) -> BTreeMap<i32, String> {
    let mut routes: Vec<i32> = pods
        .iter()
        .flat_map(|p| p.share().share.routes.clone())
        .collect();
    routes.sort_unstable();
    assert_eq!(
        routes,
        (0..ROUTES).collect::<Vec<_>>(),
        "every route task once"
    );
    let mut active_on = BTreeMap::new();
    for pod in pods {
        for &t in &pod.share().share.active {
            assert!(
                active_on.insert(t, pod.name.clone()).is_none(),
                "task {t} is active twice: {:?}",
                pods.iter().map(|p| p.share()).collect::<Vec<_>>()
            );
        }
    }
    assert_eq!(
        active_on.keys().copied().collect::<Vec<_>>(),
        (0..TASKS).collect::<Vec<_>>(),
        "every task active once"
    );
    for pod in pods {
        for t in pod
            .share()
            .share
            .standby
            .iter()
            .chain(&pod.share().share.warm_up)
        {
            assert_ne!(
                active_on[t], pod.name,
                "task {t}'s standby sits with its active"
            );
        }
    }
    active_on
}

fn standby_holders(pods: &[&Pod]) -> BTreeMap<i32, Vec<String>> {
    let mut holders: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for pod in pods {
        for &t in &pod.share().share.standby {
            holders.entry(t).or_default().push(pod.name.clone());
        }
    }
    holders
}

const SETTLE: Duration = Duration::from_secs(60);
/// Each transactional call.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Two pods without state, settled into one generation that covers every task.
fn two_pods(group: &str) -> (Pod, Pod) {
    let mut a = Pod::new(group, "pod-a");
    let mut b = Pod::new(group, "pod-b");
    settle(&mut [&mut a, &mut b], SETTLE);
    assert_covered(&[&a, &b]);
    (a, b)
}

#[test]
fn members_share_the_tasks_with_a_standby_each_and_a_leaving_member_hands_its_tasks_to_their_standbys()
 {
    let group = group_name("leave");
    let mut a = Pod::new(&group, "pod-a");
    let mut b = Pod::new(&group, "pod-b");
    let mut c = Pod::new(&group, "pod-c");
    settle(&mut [&mut a, &mut b, &mut c], SETTLE);
    assert_covered(&[&a, &b, &c]);
    for pod in [&a, &b, &c] {
        assert_eq!(
            pod.share().share.active.len(),
            2,
            "{}: {:?}",
            pod.name,
            pod.share()
        );
    }
    let holders = standby_holders(&[&a, &b, &c]);
    for t in 0..TASKS {
        assert_eq!(
            holders.get(&t).map(Vec::len),
            Some(1),
            "task {t}: {holders:?}"
        );
    }
    let leaders = [&a, &b, &c].iter().filter(|p| p.share().leader).count();
    assert_eq!(leaders, 1);

    // The pods hold their shares' state now; pod-c leaves for good.
    hold_state(&mut [&mut a, &mut b, &mut c]);
    let c_tasks = c.share().share.active.clone();
    let left = Instant::now();
    c.membership.take().expect("running").leave();
    settle(&mut [&mut a, &mut b], SETTLE);
    // It left (LeaveGroup): the others did not wait for its session to time out.
    let session = config(&group, "pod-c").session_timeout;
    assert!(left.elapsed() < session, "took {:?}", left.elapsed());
    let active_on = assert_covered(&[&a, &b]);
    for t in &c_tasks {
        assert_eq!(
            active_on[t], holders[t][0],
            "pod-c's task {t} went to its standby holder"
        );
    }
    // Whoever led the new generation learnt from the last one's members that pod-c is gone,
    // and fenced it before handing its tasks out; nobody else was fenced.
    let leader = if a.share().leader { &a } else { &b };
    assert_eq!(
        *leader.state.fenced.lock().unwrap(),
        vec![BTreeSet::from(["pod-c".to_string()])],
        "{} led",
        leader.name
    );
    let follower = if a.share().leader { &b } else { &a };
    assert!(follower.state.fenced.lock().unwrap().is_empty());
}

#[test]
fn a_static_member_back_within_the_session_timeout_keeps_its_tasks() {
    let group = group_name("static");
    let (mut a, mut b) = two_pods(&group);
    let (a_before, b_before) = (a.share().share.clone(), b.share().share.clone());

    // pod-b stops without leaving (a restart) and comes back with the stores on its volume.
    hold_state(&mut [&mut a, &mut b]);
    drop(b.membership.take());
    let restarted = Instant::now();
    let stores = b.state.report.lock().unwrap().stores.clone();
    let mut b = Pod::start(&group, "pod-b", stores, b_before.active.clone());
    b.holds_state = true;
    settle(&mut [&mut a, &mut b], SETTLE);
    // Static membership: the coordinator took the new pod-b for the old one at once, instead
    // of keeping the old one's tasks until its session timed out.
    let session = config(&group, "pod-b").session_timeout;
    assert!(
        restarted.elapsed() < session,
        "pod-b's return took {:?}, past the session timeout {session:?}",
        restarted.elapsed()
    );
    assert_eq!(
        b.share().share.active,
        b_before.active,
        "pod-b got its tasks back"
    );
    assert_eq!(
        a.share().share.active,
        a_before.active,
        "pod-a kept its tasks"
    );
}

#[test]
fn a_new_member_warms_up_first_and_takes_its_tasks_after_a_probing_rebalance() {
    let group = group_name("warmup");
    let (mut a, mut b) = two_pods(&group);

    // Scale out: pod-c has no state, so the tasks it should get stay where their state is
    // and pod-c warms them up.
    hold_state(&mut [&mut a, &mut b]);
    let mut c = Pod::new(&group, "pod-c");
    c.holds_state = true;
    settle(&mut [&mut a, &mut b, &mut c], SETTLE);
    assert_covered(&[&a, &b, &c]);
    let warming = c.share().share.warm_up.clone();
    assert!(c.share().share.active.is_empty(), "{:?}", c.share());
    assert_eq!(warming.len(), 2, "{:?}", c.share());

    // The warm-ups catch up; the leader's probing rebalance (every 2 s here) moves them.
    c.warm_up_lag = 0;
    let deadline = Instant::now() + SETTLE;
    while c.latest.as_ref().is_none_or(|g| g.share.active != warming) {
        assert!(
            Instant::now() < deadline,
            "pod-c never took over its warmed-up tasks: {:?}",
            c.latest
        );
        for pod in [&mut a, &mut b, &mut c] {
            pod.drain();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    settle(&mut [&mut a, &mut b, &mut c], SETTLE);
    assert_covered(&[&a, &b, &c]);
    assert_eq!(c.share().share.active, warming);
    assert!(c.share().share.warm_up.is_empty(), "{:?}", c.share());
}

/// The committed offset of the group's `topic` partition 0, if any.
fn committed(group: &str, topic: &str) -> Option<i64> {
    kafka::committed_offsets(group, topic)[0]
}

#[test]
fn offsets_of_a_stale_generation_are_refused_and_the_current_one_commits() {
    let group = group_name("fence");
    let topic = format!("{group}-in");
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic(&topic, 1));
    let mut a = Pod::new(&group, "pod-a");
    settle(&mut [&mut a], SETTLE);
    let generation_of = |pod: &Pod| GroupGeneration {
        group_id: group.clone(),
        generation_id: pod.share().generation_id,
        member_id: pod.share().member_id.clone(),
        instance_id: Some(pod.name.clone()),
    };
    let first = generation_of(&a);
    let offsets = |offset: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Offset(offset))
            .unwrap();
        tpl
    };
    let producer = kafka::transactional_producer(&format!("{group}-txn"));
    producer.begin_transaction().unwrap();
    send_offsets_to_transaction(&producer, &offsets(5), &first, TIMEOUT).unwrap();
    producer.commit_transaction(TIMEOUT).unwrap();
    assert_eq!(committed(&group, &topic), Some(5));

    // pod-b joins: a new generation. What pod-a's zombie would send with the old one is
    // refused, and the transaction must be aborted; nothing of it is committed.
    let mut b = Pod::new(&group, "pod-b");
    settle(&mut [&mut a, &mut b], SETTLE);
    let second = generation_of(&a);
    assert!(second.generation_id > first.generation_id, "{second:?}");
    producer.begin_transaction().unwrap();
    let refused = send_offsets_to_transaction(&producer, &offsets(9), &first, TIMEOUT)
        .expect_err("offsets of a stale generation are refused");
    assert_eq!(
        refused.facts.code,
        Some(RDKafkaErrorCode::IllegalGeneration),
        "{refused}"
    );
    assert!(refused.requires_abort, "{refused:?}");
    producer.abort_transaction(TIMEOUT).unwrap();
    assert_eq!(committed(&group, &topic), Some(5));

    // The current generation commits.
    producer.begin_transaction().unwrap();
    send_offsets_to_transaction(&producer, &offsets(9), &second, TIMEOUT).unwrap();
    producer.commit_transaction(TIMEOUT).unwrap();
    assert_eq!(committed(&group, &topic), Some(9));
}

#[test]
fn with_a_plain_consumer_in_the_group_everyone_agrees_on_range() {
    // A rollout that turns standbys on: pods of the old template join through librdkafka with
    // the range assignor only, pods of the new one with the state-aware assignor and range.
    let group = group_name("mixed");
    let (tasks_topic, routes_topic) = (format!("{group}-in"), format!("{group}-raw"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(kafka::create_topic(&tasks_topic, TASKS));
    runtime.block_on(kafka::create_topic(&routes_topic, ROUTES));
    let plain: BaseConsumer = kafka::client_config()
        .set("group.id", &group)
        .set("group.instance.id", "plain-pod")
        .set("partition.assignment.strategy", "range")
        .set("session.timeout.ms", "10000")
        .create()
        .unwrap();
    plain.subscribe(&[&tasks_topic, &routes_topic]).unwrap();
    let mut ours = Pod::new(&group, "pod-a");

    let deadline = Instant::now() + SETTLE;
    let (active, routes) = loop {
        let _ = plain.poll(Duration::from_millis(100));
        ours.drain();
        let theirs = plain.assignment().unwrap();
        let of = |topic: &str| -> BTreeSet<i32> {
            theirs
                .elements_for_topic(topic)
                .iter()
                .map(|e| e.partition())
                .collect()
        };
        if let Some(g) = &ours.latest
            && !theirs.elements().is_empty()
        {
            let share = &g.share;
            let active: BTreeSet<i32> = share.active.union(&of(&tasks_topic)).copied().collect();
            let routes: BTreeSet<i32> = share.routes.union(&of(&routes_topic)).copied().collect();
            let disjoint = share.active.is_disjoint(&of(&tasks_topic))
                && share.routes.is_disjoint(&of(&routes_topic));
            if disjoint && active.len() == TASKS as usize && routes.len() == ROUTES as usize {
                assert!(
                    share.standby.is_empty() && share.warm_up.is_empty(),
                    "range has no standbys: {share:?}"
                );
                assert!(
                    !share.active.is_empty(),
                    "a share for each member: {share:?}"
                );
                break (active, routes);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the mixed group did not settle on one assignment: ours {:?}, theirs {:?}",
            ours.latest,
            theirs
        );
    };
    assert_eq!(active, (0..TASKS).collect::<BTreeSet<_>>());
    assert_eq!(routes, (0..ROUTES).collect::<BTreeSet<_>>());
}

/// A member whose engine takes longer than the session timeout to let go of its share (a slow
/// record, a commit retried while a broker is away) is not expired meanwhile: its heartbeats
/// go on from a thread of their own, as Kafka's consumer's do. Nobody fences it, and it stays
/// in the group.
#[test]
fn a_member_slow_to_let_go_of_its_share_keeps_heartbeating_and_is_not_expired_or_fenced() {
    let group = group_name("slowrevoke");
    // Kafka's defaults in small: the rebalance timeout (max.poll.interval.ms) far longer than
    // the session timeout.
    let cfg = |pod: &str| GroupConfig {
        session_timeout: Duration::from_secs(6),
        rebalance_timeout: Duration::from_secs(30),
        ..config(&group, pod)
    };
    let mut a = Pod::start_with(cfg("pod-a"), BTreeMap::new(), BTreeSet::new());
    let mut b = Pod::start_with(cfg("pod-b"), BTreeMap::new(), BTreeSet::new());
    settle(&mut [&mut a, &mut b], SETTLE);
    let before = a.share().generation_id;

    // A third member joins: pod-a is told to let go, and takes 10 s to (longer than its
    // session timeout); the others let go at once.
    let mut c = Pod::start_with(cfg("pod-c"), BTreeMap::new(), BTreeSet::new());
    let deadline = Instant::now() + SETTLE;
    let revoke = loop {
        match a.events.recv_timeout(Duration::from_millis(50)) {
            Ok(GroupEvent::Rebalancing(revoke)) => break revoke,
            Ok(GroupEvent::Assigned(g)) => a.latest = Some(g),
            Ok(GroupEvent::Failed(why)) => panic!("pod-a's membership failed: {why}"),
            Err(_) => {
                b.drain();
                c.drain();
                assert!(Instant::now() < deadline, "pod-a was never told to let go");
            }
        }
    };
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(10) {
        b.drain();
        c.drain();
        std::thread::sleep(Duration::from_millis(50));
    }
    revoke.done();
    settle(&mut [&mut a, &mut b, &mut c], SETTLE);

    for pod in [&a, &b, &c] {
        assert!(
            pod.state.fenced.lock().unwrap().is_empty(),
            "{} fenced {:?}: pod-a was expired while it let go",
            pod.name,
            pod.state.fenced.lock().unwrap()
        );
    }
    assert!(a.share().generation_id > before);
    assert!(
        !a.share().share.active.is_empty(),
        "pod-a is in the new generation with tasks"
    );
    assert_covered(&[&a, &b, &c]);
}
