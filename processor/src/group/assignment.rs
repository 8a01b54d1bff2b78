//! The state-aware assignor of [ADR 0001](../../../docs/adr/0001-state-aware-assignment.md): what
//! the group leader decides from what each member reports, as a pure function. No Kafka here:
//! the processor's own group membership ([`crate::group`]) calls [`assign`] when it leads, with
//! the stores each member put in its subscription.
//!
//! The rules, after Kafka Streams' KIP-441:
//! 1. A balanced placement is worked out first (each member gets its share of the tasks, give
//!    or take one), preferring for each task the member it was active on, then members that
//!    hold its state, the most caught-up first.
//! 2. A task goes active where that placement puts it only if the member is caught up (within
//!    `acceptable_lag` records of the changelog end: its store's lag, or the whole changelog
//!    when it holds none, as KIP-441 counts it) or no member is. Otherwise it
//!    stays active on the most caught-up member that is, and the placement's member gets a
//!    **warm-up** (a standby that is a move in progress); the leader then asks for a probing
//!    rebalance, and once the warm-up is within the acceptable lag the task moves.
//! 3. Each task gets up to `standby_replicas` standbys on other pods than its active (and
//!    its warm-up), at most one per pod, preferring pods on other nodes than the active's (a
//!    standby on the active's node is lost with it, however caught up), then members that
//!    hold its state, then the least loaded.
//! 4. A repartitioning topology's route stage (input partitions, no state) is spread evenly
//!    over the members, the same way for the same members.
//!
//! A pod with several processing threads is several members, which share one state directory
//! (ADR 0001, "Processing threads"): what one of them reports holding, each of them holds, so a
//! task moves between the threads of one pod without a warm-up, and a pod never keeps a standby
//! of a task it runs (there is one store directory per task in a pod).
//!
//! While the group also has members that only know Kafka's `range` assignor (a rollout that
//! turns standbys on or off), the coordinator picks `range`, and a leader of ours computes it
//! with [`range`].

use std::collections::{BTreeMap, BTreeSet};

/// What one member reports in its subscription.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    /// The pod it runs in (its processing threads are members of their own); `None` from a
    /// member that does not say, which is then a pod of its own.
    pub pod: Option<String>,
    /// The Kubernetes node it runs on, if known (standbys go to other nodes first).
    pub node: Option<String>,
    /// The changelog offset each store it holds has applied (active, standby or left on its
    /// volume).
    pub stores: BTreeMap<i32, i64>,
    /// The tasks it was active for in the previous assignment.
    pub active: BTreeSet<i32>,
}

/// What the leader knows besides the members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// Every task's changelog end offset (the tasks are its keys).
    pub changelog_ends: BTreeMap<i32, i64>,
    pub standby_replicas: usize,
    /// A store at most this many records behind its changelog end counts as caught up.
    pub acceptable_lag: u64,
    /// Partitions of the route stage's topic (the input, when the topology repartitions; 0
    /// when it does not).
    pub route_partitions: i32,
}

/// One member's share.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberAssignment {
    pub active: BTreeSet<i32>,
    pub standby: BTreeSet<i32>,
    /// Standbys that are moves in progress: the task goes active here once caught up.
    pub warm_up: BTreeSet<i32>,
    /// Route-stage tasks (input partitions of a repartitioning topology).
    pub routes: BTreeSet<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// By member id.
    pub members: BTreeMap<String, MemberAssignment>,
    /// Warm-ups exist: rebalance again after the probing interval.
    pub probing_rebalance: bool,
}

/// Records the member's store of `task` is behind the changelog end; `None` if it holds none.
fn lag(member: &Member, task: i32, facts: &Facts) -> Option<u64> {
    member
        .stores
        .get(&task)
        .map(|&offset| changelog_end(task, facts).saturating_sub(offset).max(0) as u64)
}

/// Records the member would restore before it could process `task`: its store's lag, or the
/// whole changelog when it holds no store (as Kafka Streams counts it, KIP-441). A member
/// without a store of a task whose changelog is within the acceptable lag is caught up: a new
/// deployment's pods share the tasks at once, whichever joined first.
fn restore_lag(member: &Member, task: i32, facts: &Facts) -> u64 {
    lag(member, task, facts).unwrap_or_else(|| changelog_end(task, facts).max(0) as u64)
}

fn changelog_end(task: i32, facts: &Facts) -> i64 {
    facts.changelog_ends.get(&task).copied().unwrap_or(0)
}

/// The pod a member runs in.
fn pod(member: &Member) -> &str {
    member.pod.as_deref().unwrap_or(&member.id)
}

/// The members as the assignor sees them: each holds every store its pod's members report,
/// at the furthest offset any of them reports (they share the pod's state directory).
fn pooled_by_pod(members: &[Member]) -> Vec<Member> {
    let mut stores: BTreeMap<&str, BTreeMap<i32, i64>> = BTreeMap::new();
    for m in members {
        let pooled = stores.entry(pod(m)).or_default();
        for (&task, &offset) in &m.stores {
            let held = pooled.entry(task).or_insert(offset);
            *held = (*held).max(offset);
        }
    }
    members
        .iter()
        .map(|m| Member {
            stores: stores[pod(m)].clone(),
            ..m.clone()
        })
        .collect()
}

/// Decides the active, standby and warm-up tasks of every member. Deterministic: the same
/// reports give the same assignment.
pub fn assign(members: &[Member], facts: &Facts) -> Assignment {
    let pooled = pooled_by_pod(members);
    let mut members: Vec<&Member> = pooled.iter().collect();
    members.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = Assignment {
        members: members
            .iter()
            .map(|m| (m.id.clone(), MemberAssignment::default()))
            .collect(),
        probing_rebalance: false,
    };
    if members.is_empty() {
        return out;
    }
    let tasks: Vec<i32> = facts.changelog_ends.keys().copied().collect();
    let caught_up = |m: &Member, t: i32| restore_lag(m, t, facts) <= facts.acceptable_lag;

    // 1. The balanced placement: every member gets `floor` tasks, `extra` of them one more.
    let floor = tasks.len() / members.len();
    let mut extra = tasks.len() % members.len();
    let mut placed: BTreeMap<i32, usize> = BTreeMap::new();
    let mut load = vec![0usize; members.len()];
    let preference = |i: usize, t: i32| {
        let m = members[i];
        // Lower sorts first: its previous active member, then state by lag, then none.
        if m.active.contains(&t) {
            (0, 0)
        } else {
            match lag(m, t, facts) {
                Some(l) => (1, l),
                None => (2, 0),
            }
        }
    };
    for &t in &tasks {
        let best = (0..members.len())
            .filter(|&i| load[i] < floor || (load[i] == floor && extra > 0))
            .min_by_key(|&i| (preference(i, t), load[i], i))
            .expect("the shares cover every task");
        if load[best] == floor {
            extra -= 1;
        }
        placed.insert(t, best);
        load[best] += 1;
    }

    // 2. Active only where caught up (or nobody is); else a warm-up there.
    let mut active_of: BTreeMap<i32, usize> = BTreeMap::new();
    let mut warm_up_of: BTreeMap<i32, usize> = BTreeMap::new();
    for &t in &tasks {
        let target = placed[&t];
        let holder = (0..members.len())
            .filter(|&i| caught_up(members[i], t))
            .min_by_key(|&i| {
                (
                    !members[i].active.contains(&t),
                    restore_lag(members[i], t, facts),
                    i,
                )
            });
        match holder {
            Some(h) if !caught_up(members[target], t) => {
                active_of.insert(t, h);
                warm_up_of.insert(t, target);
                out.probing_rebalance = true;
            }
            _ => {
                active_of.insert(t, target);
            }
        }
    }

    // 3. Standbys on other pods, one per pod: other nodes first, then state, then the least
    // loaded.
    let mut standby_load = vec![0usize; members.len()];
    let mut standbys: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for &t in &tasks {
        let active = active_of[&t];
        let warm = warm_up_of.get(&t).copied();
        let active_node = members[active].node.as_deref();
        let mut taken_pods: BTreeSet<&str> = [Some(active), warm]
            .into_iter()
            .flatten()
            .map(|i| pod(members[i]))
            .collect();
        let mut candidates: Vec<usize> = (0..members.len())
            .filter(|&i| !taken_pods.contains(pod(members[i])))
            .collect();
        candidates.sort_by_key(|&i| {
            let m = members[i];
            let same_node = active_node.is_some() && m.node.as_deref() == active_node;
            (
                same_node,
                lag(m, t, facts).unwrap_or(u64::MAX),
                standby_load[i],
                i,
            )
        });
        let chosen: Vec<usize> = candidates
            .into_iter()
            .filter(|&i| taken_pods.insert(pod(members[i])))
            .take(facts.standby_replicas)
            .collect();
        for &i in &chosen {
            standby_load[i] += 1;
        }
        standbys.insert(t, chosen);
    }

    for &t in &tasks {
        let id = |i: usize| members[i].id.clone();
        out.members
            .get_mut(&id(active_of[&t]))
            .expect("member")
            .active
            .insert(t);
        if let Some(&w) = warm_up_of.get(&t) {
            out.members
                .get_mut(&id(w))
                .expect("member")
                .warm_up
                .insert(t);
        }
        for &s in &standbys[&t] {
            out.members
                .get_mut(&id(s))
                .expect("member")
                .standby
                .insert(t);
        }
    }

    // 4. Route tasks have no state: round robin over the members in id order.
    for r in 0..facts.route_partitions {
        let m = members[r as usize % members.len()];
        out.members.get_mut(&m.id).expect("member").routes.insert(r);
    }
    out
}

/// Kafka's range assignor, as plain consumers run it: per topic, the members in id order each
/// get a run of consecutive partitions, the first ones one more when the count does not divide
/// evenly. No standbys, no warm-ups.
pub fn range(
    member_ids: &[String],
    tasks: i32,
    route_partitions: i32,
) -> BTreeMap<String, MemberAssignment> {
    let mut ids: Vec<&String> = member_ids.iter().collect();
    ids.sort();
    let mut out: BTreeMap<String, MemberAssignment> = ids
        .iter()
        .map(|id| ((*id).clone(), MemberAssignment::default()))
        .collect();
    if ids.is_empty() {
        return out;
    }
    let runs = |partitions: i32| -> Vec<std::ops::Range<i32>> {
        let (n, m) = (partitions.max(0) as usize, ids.len());
        let mut start = 0;
        (0..m)
            .map(|i| {
                let len = n / m + usize::from(i < n % m);
                let run = start as i32..(start + len) as i32;
                start += len;
                run
            })
            .collect()
    };
    for (id, run) in ids.iter().zip(runs(tasks)) {
        out.get_mut(*id).expect("member").active.extend(run);
    }
    for (id, run) in ids.iter().zip(runs(route_partitions)) {
        out.get_mut(*id).expect("member").routes.extend(run);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(tasks: i32, end: i64, standby_replicas: usize) -> Facts {
        Facts {
            changelog_ends: (0..tasks).map(|t| (t, end)).collect(),
            standby_replicas,
            acceptable_lag: 100,
            route_partitions: 0,
        }
    }

    fn member(id: &str, active: &[i32], stores: &[(i32, i64)]) -> Member {
        Member {
            id: id.into(),
            pod: None,
            node: Some(format!("node-{id}")),
            stores: stores.iter().copied().collect(),
            active: active.iter().copied().collect(),
        }
    }

    fn active(a: &Assignment, id: &str) -> Vec<i32> {
        a.members[id].active.iter().copied().collect()
    }

    fn every_task_once(a: &Assignment, tasks: i32) {
        let mut seen = BTreeSet::new();
        for m in a.members.values() {
            for &t in &m.active {
                assert!(seen.insert(t), "task {t} active twice: {a:?}");
                assert!(!m.standby.contains(&t) && !m.warm_up.contains(&t));
            }
        }
        assert_eq!(seen, (0..tasks).collect(), "{a:?}");
    }

    #[test]
    fn caught_up_members_keep_their_tasks() {
        let members = [
            member("a", &[0, 1], &[(0, 1000), (1, 990)]),
            member("b", &[2, 3], &[(2, 1000), (3, 1000)]),
        ];
        let a = assign(&members, &facts(4, 1000, 0));
        every_task_once(&a, 4);
        assert_eq!(active(&a, "a"), [0, 1]);
        assert_eq!(active(&a, "b"), [2, 3]);
        assert!(!a.probing_rebalance);
    }

    #[test]
    fn a_new_member_warms_up_first_and_takes_its_share_once_caught_up() {
        let mut members = vec![
            member("a", &[0, 1], &[(0, 1000), (1, 1000)]),
            member("b", &[2, 3], &[(2, 1000), (3, 1000)]),
            member("c", &[], &[]),
        ];
        let f = facts(4, 1000, 0);
        let first = assign(&members, &f);
        every_task_once(&first, 4);
        assert!(
            active(&first, "c").is_empty(),
            "no active task without state: {first:?}"
        );
        let warm: Vec<i32> = first.members["c"].warm_up.iter().copied().collect();
        assert_eq!(warm.len(), 1, "c's share, warming up: {first:?}");
        assert!(first.probing_rebalance);

        // The probing rebalance after c caught up: the task moves, nothing warms up any more.
        let moved = warm[0];
        members[2].stores.insert(moved, 950);
        for m in &mut members {
            m.active = first.members[&m.id].active.clone();
        }
        let second = assign(&members, &f);
        every_task_once(&second, 4);
        assert_eq!(active(&second, "c"), [moved]);
        assert!(!second.probing_rebalance, "{second:?}");
    }

    #[test]
    fn a_member_without_state_is_caught_up_on_a_changelog_within_the_acceptable_lag() {
        // A new deployment: a joined first and restored every (short) changelog; b holds
        // nothing yet but would restore no more than the acceptable lag.
        let members = [
            member("a", &[0, 1, 2, 3], &[(0, 40), (1, 40), (2, 40), (3, 40)]),
            member("b", &[], &[]),
        ];
        let a = assign(&members, &facts(4, 40, 0));
        every_task_once(&a, 4);
        assert_eq!(active(&a, "b").len(), 2, "b's share at once: {a:?}");
        assert!(a.members["b"].warm_up.is_empty());
        assert!(!a.probing_rebalance);
        // One record more than the acceptable lag: b's share warms up first.
        let a = assign(&members, &facts(4, 101, 0));
        assert!(active(&a, "b").is_empty(), "{a:?}");
        assert_eq!(a.members["b"].warm_up.len(), 2);
        assert!(a.probing_rebalance);
    }

    #[test]
    fn with_nobody_caught_up_the_most_state_wins() {
        let members = [member("a", &[], &[(0, 100)]), member("b", &[], &[(0, 800)])];
        let a = assign(&members, &facts(1, 1000, 0));
        assert_eq!(active(&a, "b"), [0]);
        assert!(!a.probing_rebalance, "no caught-up member to wait on");
    }

    #[test]
    fn a_lost_member_s_tasks_go_to_the_holders_of_their_standbys() {
        // c is gone; a held a standby of 4, b of 5.
        let members = [
            member("a", &[0, 1], &[(0, 1000), (1, 1000), (4, 995)]),
            member("b", &[2, 3], &[(2, 1000), (3, 1000), (5, 990)]),
        ];
        let a = assign(&members, &facts(6, 1000, 1));
        every_task_once(&a, 6);
        assert_eq!(active(&a, "a"), [0, 1, 4]);
        assert_eq!(active(&a, "b"), [2, 3, 5]);
        // One standby each, on the other member.
        for (id, other) in [("a", "b"), ("b", "a")] {
            for t in &a.members[id].active {
                assert!(a.members[other].standby.contains(t), "{a:?}");
            }
        }
    }

    #[test]
    fn standbys_never_share_a_member_with_their_active_and_prefer_other_nodes() {
        let mut members = vec![
            member("a", &[0], &[(0, 1000)]),
            member("b", &[1], &[(1, 1000)]),
            member("c", &[2], &[(2, 1000)]),
        ];
        members[1].node = Some("node-a".into()); // a and b share a node
        let a = assign(&members, &facts(3, 1000, 1));
        every_task_once(&a, 3);
        let standby_of = |t: i32| -> Vec<&str> {
            a.members
                .iter()
                .filter(|(_, m)| m.standby.contains(&t))
                .map(|(id, _)| id.as_str())
                .collect()
        };
        assert_eq!(standby_of(0), ["c"], "not on b, a's node: {a:?}");
        assert_eq!(standby_of(1), ["c"], "not on a, b's node: {a:?}");
        assert_eq!(standby_of(2).len(), 1);
        assert_ne!(standby_of(2), ["c"]);
    }

    #[test]
    fn a_standby_goes_to_another_node_even_when_a_member_on_the_actives_node_holds_the_state() {
        // a and b share a node, and b holds a caught-up copy of a's task; c, on another node,
        // holds nothing.
        let mut members = vec![
            member("a", &[0], &[(0, 1000)]),
            member("b", &[1], &[(0, 1000), (1, 1000)]),
            member("c", &[2], &[(2, 1000)]),
        ];
        members[1].node = Some("node-a".into());
        let a = assign(&members, &facts(3, 1000, 1));
        every_task_once(&a, 3);
        assert!(
            a.members["c"].standby.contains(&0),
            "task 0's standby is on another node than its active: {a:?}"
        );
        assert!(!a.members["b"].standby.contains(&0), "{a:?}");
        // With the state on another node, the state wins among the other nodes' members.
        let members = vec![
            member("a", &[0], &[(0, 1000)]),
            member("b", &[1], &[(1, 1000)]),
            member("c", &[2], &[(0, 990), (2, 1000)]),
        ];
        let a = assign(&members, &facts(3, 1000, 1));
        assert!(a.members["c"].standby.contains(&0), "{a:?}");
    }

    /// Member `id` as processing thread of `pod`.
    fn thread_of(pod: &str, id: &str, active: &[i32], stores: &[(i32, i64)]) -> Member {
        Member {
            pod: Some(pod.into()),
            node: Some(format!("node-{pod}")),
            ..member(id, active, stores)
        }
    }

    #[test]
    fn standbys_go_to_another_pod_never_to_a_thread_of_the_actives_pod() {
        // Two pods of two threads; each pod holds caught-up copies of every task, so only the
        // pod rule keeps a standby off its active's pod.
        let all: Vec<(i32, i64)> = (0..4).map(|t| (t, 1000)).collect();
        let members = [
            thread_of("a", "a", &[0], &all),
            thread_of("a", "a-thread-1", &[1], &all),
            thread_of("b", "b", &[2], &all),
            thread_of("b", "b-thread-1", &[3], &all),
        ];
        let a = assign(&members, &facts(4, 1000, 1));
        every_task_once(&a, 4);
        let pod_of = |id: &str| id.split("-thread-").next().unwrap().to_string();
        for t in 0..4 {
            let holders = |f: fn(&MemberAssignment) -> &BTreeSet<i32>| -> Vec<String> {
                a.members
                    .iter()
                    .filter(|(_, m)| f(m).contains(&t))
                    .map(|(id, _)| pod_of(id))
                    .collect()
            };
            let (active, standby) = (holders(|m| &m.active), holders(|m| &m.standby));
            assert_eq!(standby.len(), 1, "task {t}: {a:?}");
            assert_ne!(
                active, standby,
                "task {t}'s standby on its active's pod: {a:?}"
            );
        }
        // Each thread keeps its task; each pod keeps the other's two standbys, one per thread.
        assert_eq!(active(&a, "a-thread-1"), [1]);
        for id in ["a", "a-thread-1", "b", "b-thread-1"] {
            assert_eq!(a.members[id].standby.len(), 1, "{id}: {a:?}");
        }
        // Three standbys asked of two pods: one pod besides the active's, so one each.
        let a = assign(&members, &facts(4, 1000, 3));
        let standbys: usize = a.members.values().map(|m| m.standby.len()).sum();
        assert_eq!(standbys, 4, "{a:?}");
    }

    #[test]
    fn a_pods_threads_share_its_stores_so_a_task_moves_between_them_without_a_warm_up() {
        // pod a ran alone with one thread holding both tasks; its second thread starts and
        // reports nothing of its own (the store directories are the first thread's so far).
        let members = [
            thread_of("a", "a", &[0, 1], &[(0, 1000), (1, 1000)]),
            thread_of("a", "a-thread-1", &[], &[]),
        ];
        let a = assign(&members, &facts(2, 1000, 1));
        every_task_once(&a, 2);
        assert_eq!(active(&a, "a"), [0]);
        assert_eq!(active(&a, "a-thread-1"), [1], "moved at once: {a:?}");
        assert!(!a.probing_rebalance, "no warm-up inside one pod: {a:?}");
        assert!(
            a.members.values().all(|m| m.standby.is_empty()),
            "no other pod for a standby: {a:?}"
        );
        // A member of another pod without the state still warms up first.
        let members = [
            thread_of("a", "a", &[0, 1], &[(0, 1000), (1, 1000)]),
            thread_of("b", "b", &[], &[]),
        ];
        let a = assign(&members, &facts(2, 1000, 0));
        assert_eq!(active(&a, "a"), [0, 1]);
        assert_eq!(a.members["b"].warm_up.len(), 1, "{a:?}");
    }

    #[test]
    fn standbys_are_capped_by_the_other_members() {
        let members = [member("a", &[0], &[]), member("b", &[], &[])];
        let a = assign(&members, &facts(1, 0, 3));
        let standbys: usize = a.members.values().map(|m| m.standby.len()).sum();
        assert_eq!(standbys, 1);
    }

    #[test]
    fn the_same_reports_give_the_same_assignment() {
        let members = [
            member("b", &[], &[(0, 10)]),
            member("a", &[1], &[(1, 1000)]),
            member("c", &[], &[]),
        ];
        let f = facts(5, 1000, 1);
        let mut reversed = members.clone();
        reversed.reverse();
        assert_eq!(assign(&members, &f), assign(&reversed, &f));
    }

    #[test]
    fn route_tasks_are_spread_evenly_and_each_once() {
        let members = [
            member("b", &[], &[]),
            member("a", &[], &[]),
            member("c", &[], &[]),
        ];
        let f = Facts {
            route_partitions: 8,
            ..facts(8, 0, 0)
        };
        let a = assign(&members, &f);
        let mut all: Vec<i32> = a.members.values().flat_map(|m| m.routes.clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        let loads: Vec<usize> = a.members.values().map(|m| m.routes.len()).collect();
        assert_eq!(loads, [3, 3, 2], "a, b, c in id order");
        assert!(
            assign(&members, &facts(8, 0, 0))
                .members
                .values()
                .all(|m| m.routes.is_empty()),
            "none without a route stage"
        );
    }

    #[test]
    fn range_gives_each_member_a_run_of_partitions_the_first_ones_one_more() {
        let ids = ["m-b".to_string(), "m-a".to_string(), "m-c".to_string()];
        let shares = range(&ids, 8, 2);
        let runs: Vec<(Vec<i32>, Vec<i32>)> = shares
            .values()
            .map(|s| {
                assert!(s.standby.is_empty() && s.warm_up.is_empty());
                (
                    s.active.iter().copied().collect(),
                    s.routes.iter().copied().collect(),
                )
            })
            .collect();
        assert_eq!(
            runs,
            [
                (vec![0, 1, 2], vec![0]),
                (vec![3, 4, 5], vec![1]),
                (vec![6, 7], vec![]),
            ],
            "m-a, m-b, m-c in id order"
        );
        assert!(range(&[], 4, 0).is_empty());
    }
}
