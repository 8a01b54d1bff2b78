//! The processor's own membership in its consumer group (ADR 0001): the classic group protocol
//! (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) with StreamApp's state-aware assignor
//! ([`assignment`]) on the leader, each member's stores in its subscription.
//!
//! A [`Membership`] is a thread that finds the group coordinator, joins with the member's
//! current [`Report`] (static membership: `group.instance.id` = the pod name), assigns when it
//! leads, heartbeats, and rejoins when the group rebalances. Each generation it takes part in
//! arrives as a [`GroupEvent`]; the member id and generation are what a transaction's offsets
//! carry for zombie fencing (KIP-447).
//!
//! The engine drives it when standbys are configured ([`crate::engine`]'s
//! `state_aware_group`): the member waits for the engine to let go of its share before it
//! joins again ([`Revoke`]), and the engine's transactions carry the generation's fence
//! ([`txn_offsets`]). Members also offer Kafka's range assignor, so plain consumers and these
//! can share a group during a rollout.
//!
//! What to do after a failed request is decided by [`after_error`], a pure function.

pub mod assignment;
mod codec;
pub mod txn_offsets;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, info, warn};

use assignment::{Facts, MemberAssignment};
pub use codec::{ASSIGNOR, Assigned, RANGE, Report, Topics};
use streamapp_kafka_wire::{Connection, CoordinatorKind, WireError};

/// How long to wait before trying again after a failed request (a rebalance is not one).
const RETRY_BACKOFF: Duration = Duration::from_millis(200);
/// Connecting and every request other than JoinGroup.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What a membership needs to know.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Brokers to find the coordinator through (host:port).
    pub bootstrap: Vec<String>,
    pub group_id: String,
    /// `group.instance.id`: the pod name (static membership).
    pub instance_id: String,
    /// The topic whose partitions are the tasks.
    pub topic: String,
    /// How many tasks there are (the topic's partitions).
    pub tasks: i32,
    /// The route stage's topic and its partitions, when the topology repartitions (its
    /// partitions are spread over the members beside the tasks).
    pub routes: Option<(String, i32)>,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub heartbeat_interval: Duration,
    /// While warm-ups exist, the leader rebalances this often to move them once caught up.
    pub probing_rebalance_interval: Duration,
    pub standby_replicas: usize,
    /// A store this many records behind its changelog end counts as caught up.
    pub acceptable_lag: u64,
    /// TLS and SASL of the connections, as the processor's Kafka clients have them.
    pub security: streamapp_kafka_wire::Security,
}

impl GroupConfig {
    /// Partitions of the route stage's topic (0 without one).
    fn route_partitions(&self) -> i32 {
        self.routes.as_ref().map_or(0, |(_, n)| *n)
    }

    fn topics(&self) -> Topics<'_> {
        Topics {
            tasks: &self.topic,
            routes: self.routes.as_ref().map(|(t, _)| t.as_str()),
        }
    }
}

/// What the member tells the group, and what the leader asks about the changelog.
pub trait MemberState: Send + Sync + 'static {
    /// The member's report for its next JoinGroup.
    fn report(&self) -> Report;
    /// Every task's changelog end offset (asked when this member leads).
    fn changelog_ends(&self) -> Result<BTreeMap<i32, i64>, String>;
    /// Members (instance ids) of the last generation that are not in this one: the leader asks
    /// for their transactions to be ended before it hands their tasks out.
    fn fence_departed(&self, _instance_ids: &BTreeSet<String>) {}
}

/// One generation this member takes part in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    pub generation_id: i32,
    pub member_id: String,
    pub leader: bool,
    pub share: MemberAssignment,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupEvent {
    /// A new generation began and this is the member's share of it.
    Assigned(Generation),
    /// The group is rebalancing: the share of the last generation holds until the next one
    /// (its transactions fail from then on with the old generation). The member joins again
    /// once the receiver says it let go of its share ([`Revoke::done`], or dropping it), so
    /// that its last transaction commits with the generation it belongs to — at most the
    /// rebalance timeout later.
    Rebalancing(Revoke),
    /// The membership ended for good (another member took this instance id, the group
    /// refuses this member): the engine must stop.
    Failed(String),
}

/// The receiver's answer to [`GroupEvent::Rebalancing`]: it let go of its share.
#[derive(Clone, Debug)]
pub struct Revoke(Sender<()>);

impl Revoke {
    /// The share is let go (the open transaction committed or aborted): join again now.
    pub fn done(self) {
        let _ = self.0.send(());
    }
}

/// Every `Revoke` is the same event; what it carries is only the way back.
impl PartialEq for Revoke {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Revoke {}

/// What to do after a response with an error, or a broken connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Join again with the same member id.
    Rejoin,
    /// Join again as a new member (the coordinator forgot this one).
    RejoinAsNew,
    /// Find the coordinator again, then join again.
    Rediscover,
    /// Stop: the membership cannot go on.
    Fail(String),
}

/// What an error code means for a member of a classic group.
pub fn after_error(code: i16) -> Next {
    match ResponseError::try_from_code(code) {
        None => Next::Rejoin, // no error: the caller does not ask
        Some(ResponseError::RebalanceInProgress | ResponseError::IllegalGeneration) => Next::Rejoin,
        Some(ResponseError::UnknownMemberId) => Next::RejoinAsNew,
        Some(
            ResponseError::NotCoordinator
            | ResponseError::CoordinatorNotAvailable
            | ResponseError::CoordinatorLoadInProgress
            | ResponseError::RequestTimedOut
            | ResponseError::UnknownServerError,
        ) => Next::Rediscover,
        Some(ResponseError::FencedInstanceId) => Next::Fail(
            "another member joined with this pod's group.instance.id: only one may run".into(),
        ),
        Some(ResponseError::InconsistentGroupProtocol) => Next::Fail(format!(
            "the group's members use another assignor than {ASSIGNOR} (plain consumers or an older processor)"
        )),
        Some(e) => Next::Fail(format!("the group refused this member: {e} (code {code})")),
    }
}

/// A running membership; dropping it stops the thread without leaving the group (a static
/// member back within the session timeout keeps its share) and without waiting for it.
pub struct Membership {
    leave: Arc<AtomicBool>,
    thread: StoppableThread,
}

impl Membership {
    /// Starts the membership; its generations arrive on the returned receiver.
    pub fn start(
        cfg: GroupConfig,
        state: Arc<dyn MemberState>,
    ) -> (Membership, Receiver<GroupEvent>) {
        let (events, receiver) = channel();
        let leave = Arc::new(AtomicBool::new(false));
        let left = leave.clone();
        let thread = StoppableThread::spawn("group-member", move |stop| {
            Member {
                cfg,
                state,
                events,
                stop,
                leave: left,
                connection: None,
                member_id: String::new(),
                generation: None,
                last_members: BTreeSet::new(),
                probing_due: None,
            }
            .run()
        });
        (Membership { leave, thread }, receiver)
    }

    /// Leaves the group (its share is reassigned at once) and stops: what a pod that goes away
    /// for good does, such as one removed by a scale-in.
    pub fn leave(mut self) {
        self.leave.store(true, Ordering::SeqCst);
        self.thread.stop_and_join();
    }
}

/// A thread told to stop through a flag. Dropping the handle raises the flag without waiting:
/// a request under way (a JoinGroup can take up to the rebalance timeout) ends on its own, and
/// nothing else is sent after it.
struct StoppableThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StoppableThread {
    fn spawn(name: &str, run: impl FnOnce(Arc<AtomicBool>) + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(flag))
            .unwrap_or_else(|e| panic!("starting the {name} thread: {e}"));
        StoppableThread {
            stop,
            thread: Some(thread),
        }
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for StoppableThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take()
            && thread.is_finished()
        {
            let _ = thread.join();
        }
    }
}

/// The membership thread's state.
struct Member {
    cfg: GroupConfig,
    state: Arc<dyn MemberState>,
    events: Sender<GroupEvent>,
    stop: Arc<AtomicBool>,
    leave: Arc<AtomicBool>,
    connection: Option<Connection>,
    member_id: String,
    generation: Option<Generation>,
    /// The members of the last generation, as its assignment named them (reported on joining).
    last_members: BTreeSet<String>,
    /// When the leader rebalances to move caught-up warm-ups.
    probing_due: Option<Instant>,
}

enum Failure {
    /// The membership goes on after `Next`.
    Retry(Next),
    /// The thread was asked to stop.
    Stopped,
}

impl From<WireError> for Failure {
    fn from(e: WireError) -> Self {
        match &e {
            WireError::Io { .. } => debug!(error = %e, "group coordinator connection failed"),
            WireError::Protocol { .. } => warn!(error = %e, "group coordinator request failed"),
            WireError::Security { .. } => {
                warn!(error = %e, "group coordinator connection refused: check the TLS and SASL settings")
            }
        }
        Failure::Retry(Next::Rediscover)
    }
}

impl Member {
    fn run(&mut self) {
        let mut next = Next::Rediscover;
        while !self.stop.load(Ordering::SeqCst) {
            let result = match next {
                Next::Rediscover => {
                    self.connection = None;
                    self.join()
                }
                Next::Rejoin => self.join(),
                Next::RejoinAsNew => {
                    self.member_id.clear();
                    self.join()
                }
                Next::Fail(why) => {
                    warn!(reason = %why, "the group membership ends");
                    let _ = self.events.send(GroupEvent::Failed(why));
                    return;
                }
            };
            next = match result.and_then(|()| self.heartbeat_until_rebalance()) {
                Ok(()) => Next::Rejoin,
                Err(Failure::Stopped) => break,
                Err(Failure::Retry(n)) => {
                    // Not a tight loop of requests when the coordinator keeps refusing.
                    std::thread::sleep(RETRY_BACKOFF);
                    n
                }
            };
        }
        if self.leave.load(Ordering::SeqCst) {
            self.leave_group();
        }
    }

    fn check_stop(&self) -> Result<(), Failure> {
        if self.stop.load(Ordering::SeqCst) {
            Err(Failure::Stopped)
        } else {
            Ok(())
        }
    }

    fn group_id(&self) -> GroupId {
        GroupId(StrBytes::from_string(self.cfg.group_id.clone()))
    }

    fn instance_id(&self) -> Option<StrBytes> {
        Some(StrBytes::from_string(self.cfg.instance_id.clone()))
    }

    /// The connection to the coordinator, found through the bootstrap brokers if need be.
    fn coordinator(&mut self) -> Result<&mut Connection, Failure> {
        if self.connection.is_none() {
            self.connection = Some(self.find_coordinator()?);
        }
        Ok(self.connection.as_mut().expect("just set"))
    }

    fn find_coordinator(&self) -> Result<Connection, Failure> {
        let client_id = format!("{}-group", self.cfg.instance_id);
        let mut last = None;
        for broker in &self.cfg.bootstrap {
            self.check_stop()?;
            let mut connection =
                match Connection::open(broker, &client_id, REQUEST_TIMEOUT, &self.cfg.security) {
                    Ok(c) => c,
                    Err(e) => {
                        last = Some(e.to_string());
                        continue;
                    }
                };
            let address = match connection
                .find_coordinator(CoordinatorKind::Group, &self.cfg.group_id)?
            {
                Ok(address) => address,
                // Its own errors say to look again, unless the group refuses this member.
                Err(code) => {
                    return Err(Failure::Retry(match after_error(code) {
                        Next::Fail(why) => Next::Fail(format!("finding the coordinator: {why}")),
                        _ => Next::Rediscover,
                    }));
                }
            };
            if address == connection.address() {
                return Ok(connection);
            }
            return Ok(Connection::open(
                &address,
                &client_id,
                REQUEST_TIMEOUT,
                &self.cfg.security,
            )?);
        }
        debug!(error = ?last, "no bootstrap broker answered");
        Err(Failure::Retry(Next::Rediscover))
    }

    /// JoinGroup, then SyncGroup (with the assignment, when this member leads).
    fn join(&mut self) -> Result<(), Failure> {
        self.check_stop()?;
        let mut report = self.state.report();
        report.members = self.last_members.clone();
        let metadata = codec::subscription(self.cfg.topics(), &report);
        let request = JoinGroupRequest::default()
            .with_group_id(self.group_id())
            .with_session_timeout_ms(self.cfg.session_timeout.as_millis() as i32)
            .with_rebalance_timeout_ms(self.cfg.rebalance_timeout.as_millis() as i32)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.instance_id())
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            // The state-aware assignor first; range too, so that a group that still has plain
            // consumers (a rollout turning standbys on or off) agrees on range meanwhile.
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str(ASSIGNOR))
                    .with_metadata(metadata.clone()),
                JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str(RANGE))
                    .with_metadata(metadata),
            ]);
        let rebalance_timeout = self.cfg.rebalance_timeout;
        let coordinator = self.coordinator()?;
        // The coordinator answers once every member joined, within the rebalance timeout.
        coordinator.set_timeout(rebalance_timeout + REQUEST_TIMEOUT)?;
        let joined = coordinator.send(&request);
        coordinator.set_timeout(REQUEST_TIMEOUT)?;
        let joined = joined?;
        if joined.error_code != 0 {
            if ResponseError::try_from_code(joined.error_code)
                == Some(ResponseError::MemberIdRequired)
            {
                self.member_id = joined.member_id.to_string();
                return Err(Failure::Retry(Next::Rejoin));
            }
            return Err(Failure::Retry(after_error(joined.error_code)));
        }
        self.member_id = joined.member_id.to_string();
        let leader = joined.leader.as_str() == joined.member_id.as_str();
        let generation_id = joined.generation_id;
        // Range while some member offers nothing else (before version 7 the response does not
        // say, and only a group of ours can have agreed: they offer the state-aware one first).
        let protocol = match joined.protocol_name.as_ref().map(|p| p.as_str()) {
            Some(RANGE) => RANGE,
            _ => ASSIGNOR,
        };
        // A static leader back in a stable group keeps the current assignment (KIP-814): the
        // coordinator says to skip assigning, and answers the SyncGroup with its share.
        let assignments = match (leader && !joined.skip_assignment, protocol) {
            (false, _) => Vec::new(),
            (true, RANGE) => self.lead_range(&joined.members),
            (true, _) => self.lead(generation_id, &joined.members)?,
        };
        let mut request = SyncGroupRequest::default()
            .with_group_id(self.group_id())
            .with_generation_id(generation_id)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.instance_id())
            .with_assignments(assignments);
        let coordinator = self.coordinator()?;
        if coordinator.version(ApiKey::SyncGroup) >= 5 {
            request = request
                .with_protocol_type(Some(StrBytes::from_static_str("consumer")))
                .with_protocol_name(Some(StrBytes::from_static_str(protocol)));
        }
        let synced = coordinator.send(&request)?;
        if synced.error_code != 0 {
            return Err(Failure::Retry(after_error(synced.error_code)));
        }
        let Assigned { share, members } =
            match codec::read_assignment(self.cfg.topics(), protocol, synced.assignment) {
                Ok(assigned) => assigned,
                Err(e) => {
                    return Err(Failure::Retry(Next::Fail(format!(
                        "the leader's assignment: {e}"
                    ))));
                }
            };
        let generation = Generation {
            generation_id,
            member_id: self.member_id.clone(),
            leader,
            share,
        };
        info!(
            generation = generation_id,
            leader,
            assignor = protocol,
            active = ?generation.share.active,
            standby = ?generation.share.standby,
            warm_up = ?generation.share.warm_up,
            routes = ?generation.share.routes,
            "joined the group"
        );
        self.generation = Some(generation.clone());
        self.last_members = members;
        let _ = self.events.send(GroupEvent::Assigned(generation));
        Ok(())
    }

    /// The leader's part: every member's share, from their reports.
    fn lead(
        &mut self,
        generation_id: i32,
        members: &[kafka_protocol::messages::join_group_response::JoinGroupResponseMember],
    ) -> Result<Vec<SyncGroupRequestAssignment>, Failure> {
        // Reading the changelog ends and fencing departed members take broker round trips of
        // up to seconds each: the session goes on meanwhile.
        let _heartbeats = self.heartbeats(generation_id);
        let mut reports = Vec::new();
        let mut member_ids = BTreeMap::new();
        let mut last_generation = BTreeSet::new();
        for m in members {
            let report = match codec::read_subscription(m.metadata.clone()) {
                Ok(r) => r,
                Err(e) => {
                    return Err(Failure::Retry(Next::Fail(format!(
                        "member {} sent a subscription this assignor cannot read: {e}",
                        m.member_id.as_str()
                    ))));
                }
            };
            // Members are known by instance id: stable across restarts, unlike member ids.
            let id = m
                .group_instance_id
                .as_ref()
                .map_or_else(|| m.member_id.to_string(), |i| i.to_string());
            member_ids.insert(id.clone(), m.member_id.to_string());
            last_generation.extend(report.members);
            reports.push(assignment::Member {
                id,
                pod: report.pod,
                node: report.node,
                stores: report.stores,
                active: report.active,
            });
        }
        let changelog_ends = self.state.changelog_ends().map_err(|e| {
            warn!(error = %e, "the leader could not read the changelog ends: joining again");
            Failure::Retry(Next::Rejoin)
        })?;
        let decided = assignment::assign(
            &reports,
            &Facts {
                changelog_ends,
                standby_replicas: self.cfg.standby_replicas,
                acceptable_lag: self.cfg.acceptable_lag,
                route_partitions: self.cfg.route_partitions(),
            },
        );
        self.probing_due = decided
            .probing_rebalance
            .then(|| Instant::now() + self.cfg.probing_rebalance_interval);
        let members: BTreeSet<String> = member_ids.keys().cloned().collect();
        let departed: BTreeSet<String> = last_generation.difference(&members).cloned().collect();
        if !departed.is_empty() {
            self.state.fence_departed(&departed);
        }
        Ok(decided
            .members
            .iter()
            .map(|(id, share)| {
                SyncGroupRequestAssignment::default()
                    .with_member_id(StrBytes::from_string(member_ids[id].clone()))
                    .with_assignment(codec::assignment(self.cfg.topics(), share, &members))
            })
            .collect())
    }

    /// The leader's part while the group agreed on range: Kafka's range assignment over the
    /// member ids, what a plain consumer leading would hand out.
    fn lead_range(
        &self,
        members: &[kafka_protocol::messages::join_group_response::JoinGroupResponseMember],
    ) -> Vec<SyncGroupRequestAssignment> {
        let ids: Vec<String> = members.iter().map(|m| m.member_id.to_string()).collect();
        assignment::range(&ids, self.cfg.tasks, self.cfg.route_partitions())
            .iter()
            .map(|(id, share)| {
                SyncGroupRequestAssignment::default()
                    .with_member_id(StrBytes::from_string(id.clone()))
                    // Members ignore the user data under range.
                    .with_assignment(codec::assignment(
                        self.cfg.topics(),
                        share,
                        &BTreeSet::new(),
                    ))
            })
            .collect()
    }

    /// Heartbeats until the group rebalances (`Ok`: join again) or something fails.
    fn heartbeat_until_rebalance(&mut self) -> Result<(), Failure> {
        let generation_id = self.generation.as_ref().map_or(-1, |g| g.generation_id);
        loop {
            let next_beat = Instant::now() + self.cfg.heartbeat_interval;
            while Instant::now() < next_beat {
                self.check_stop()?;
                if self.probing_due.is_some_and(|t| Instant::now() >= t) {
                    self.probing_due = None;
                    info!("probing rebalance: warm-ups may have caught up");
                    self.announce_rebalance();
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let request = HeartbeatRequest::default()
                .with_group_id(self.group_id())
                .with_generation_id(generation_id)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_group_instance_id(self.instance_id());
            let response = self.coordinator()?.send(&request)?;
            match response.error_code {
                0 => {}
                code => {
                    self.announce_rebalance();
                    return match after_error(code) {
                        Next::Rejoin => Ok(()),
                        other => Err(Failure::Retry(other)),
                    };
                }
            }
        }
    }

    /// Tells the receiver the group rebalances and waits until it let go of its share (or
    /// dropped the event), at most the rebalance timeout: the coordinator waits that long for
    /// members to join anyway.
    fn announce_rebalance(&self) {
        // The engine may take longer than the session timeout to let go (a slow record, a
        // commit retried while a broker is away): the member must not be expired meanwhile.
        let generation_id = self.generation.as_ref().map_or(-1, |g| g.generation_id);
        let _heartbeats = self.heartbeats(generation_id);
        let (revoked, wait) = channel();
        if self
            .events
            .send(GroupEvent::Rebalancing(Revoke(revoked)))
            .is_err()
        {
            return;
        }
        let deadline = Instant::now() + self.cfg.rebalance_timeout;
        while Instant::now() < deadline && !self.stop.load(Ordering::SeqCst) {
            match wait.recv_timeout(Duration::from_millis(100)) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => return, // done, or the receiver dropped it
            }
        }
        warn!(
            "the member did not let go of its share within the rebalance timeout: joining anyway"
        );
    }

    /// Heartbeats of `generation_id` from a thread and connection of their own, until the
    /// returned value is dropped; nothing when there is no coordinator connection yet.
    fn heartbeats(&self, generation_id: i32) -> Option<StoppableThread> {
        let coordinator = self.connection.as_ref()?.address().to_string();
        Some(background_heartbeats(
            self.cfg.clone(),
            coordinator,
            HeartbeatRequest::default()
                .with_group_id(self.group_id())
                .with_generation_id(generation_id)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_group_instance_id(self.instance_id()),
        ))
    }

    fn leave_group(&mut self) {
        let request = LeaveGroupRequest::default()
            .with_group_id(self.group_id())
            .with_members(vec![
                MemberIdentity::default()
                    .with_member_id(StrBytes::from_string(self.member_id.clone()))
                    .with_group_instance_id(self.instance_id()),
            ]);
        match self.coordinator().map(|c| c.send(&request)) {
            Ok(Ok(r)) if r.error_code == 0 => info!("left the group"),
            Ok(Ok(r)) => warn!(code = r.error_code, "leaving the group failed"),
            Ok(Err(e)) => warn!(error = %e, "leaving the group failed"),
            Err(_) => warn!("leaving the group failed: no coordinator"),
        }
    }
}

/// Heartbeats sent while the membership thread waits on something slow (the engine letting go
/// of its share, the leader's broker round trips): the coordinator expires a member silent
/// for `session.timeout.ms`, rebalance or not, and Kafka's own consumer heartbeats from a
/// thread of its own for this reason. Answers are not acted on: a rebalance in progress is
/// what the waiting thread handles anyway, and any other error shows on its next request.
fn background_heartbeats(
    cfg: GroupConfig,
    coordinator: String,
    request: HeartbeatRequest,
) -> StoppableThread {
    StoppableThread::spawn("group-heartbeat", move |stopped| {
        let client_id = format!("{}-heartbeat", cfg.instance_id);
        let mut connection: Option<Connection> = None;
        loop {
            let next = Instant::now() + cfg.heartbeat_interval;
            while Instant::now() < next {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if connection.is_none() {
                connection =
                    Connection::open(&coordinator, &client_id, REQUEST_TIMEOUT, &cfg.security)
                        .map_err(|e| debug!(error = %e, "heartbeat connection failed"))
                        .ok();
            }
            if let Some(c) = connection.as_mut() {
                match c.send(&request) {
                    Ok(r) => debug!(code = r.error_code, "heartbeat while waiting"),
                    Err(e) => {
                        debug!(error = %e, "heartbeat while waiting failed");
                        connection = None;
                    }
                }
            }
        }
    })
}

/// A shared, settable [`MemberState`]: what the tests hand a membership (the engine reports
/// from its tasks instead).
#[derive(Default)]
pub struct SharedState {
    pub report: Mutex<Report>,
    pub changelog_ends: Mutex<BTreeMap<i32, i64>>,
    /// The departed members this member was asked to fence, in order.
    pub fenced: Mutex<Vec<BTreeSet<String>>>,
}

impl MemberState for SharedState {
    fn report(&self) -> Report {
        self.report.lock().unwrap().clone()
    }
    fn changelog_ends(&self) -> Result<BTreeMap<i32, i64>, String> {
        Ok(self.changelog_ends.lock().unwrap().clone())
    }
    fn fence_departed(&self, instance_ids: &BTreeSet<String>) {
        self.fenced.lock().unwrap().push(instance_ids.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_lead_to_a_rejoin_a_new_member_a_new_coordinator_or_the_end() {
        assert_eq!(after_error(27), Next::Rejoin, "rebalance in progress");
        assert_eq!(after_error(22), Next::Rejoin, "illegal generation");
        assert_eq!(after_error(25), Next::RejoinAsNew, "unknown member id");
        for code in [14, 15, 16, 7, -1] {
            assert_eq!(after_error(code), Next::Rediscover, "code {code}");
        }
        for code in [82, 23, 30, 81] {
            assert!(matches!(after_error(code), Next::Fail(_)), "code {code}");
        }
        let Next::Fail(why) = after_error(82) else {
            unreachable!()
        };
        assert!(why.contains("group.instance.id"), "{why}");
    }
}
