//! Failover: two instances of a system share the work on a store of many ids, each keeping a
//! standby copy of the other's tasks (or none); one is killed (-9) under live traffic and stays
//! down. Measured: the time from the kill until the survivor has committed everything sent, and
//! the changelog records the survivor restored to take the lost tasks over — what a lost pod
//! costs. Both systems use the same group session timeout, which is how long the group takes to
//! notice the loss; the rest is the takeover.

use std::time::{Duration, Instant};

use crate::Settings;
use crate::common::*;
use crate::recovery::CrashTraffic;
use crate::systems::App;

/// The group session timeout of both systems in this phase (the broker's smallest allowed).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
/// The two instances (pods); the first is the one killed.
const INSTANCES: [&str; 2] = ["bench-a", "bench-b"];

/// What losing one of two instances cost a system.
#[derive(Clone, Copy, Default)]
pub struct Failover {
    /// From the kill until every record sent is committed through every stage.
    pub caught_up_s: f64,
    /// Changelog records the survivor restored after the kill.
    pub restored: u64,
}

/// Runs `app` as two instances (`app` configured with or without standbys), loads `loaded`,
/// waits until every standby copy is caught up, kills one instance under live traffic and
/// measures the survivor's takeover. Returns the figures and the check of the output across the
/// failover (with both instances' warnings when wrong).
pub fn fail_over(
    settings: &Settings,
    app: &App,
    standby_replicas: u32,
    loaded: &Dataset,
    keying: Keying,
) -> (Failover, OutputCheck) {
    let name = app.peer.name();
    let mut instances: Vec<System> = INSTANCES
        .iter()
        .map(|instance| app.start_instance(settings, instance))
        .collect();
    for instance in &mut instances {
        instance.wait_ready();
    }
    let watcher = instances[0].offsets_watcher();
    instances[0].wait_done(&watcher, loaded.records);
    let tasks = wait_for_tasks(&mut instances, standby_replicas, loaded);
    // The instance that runs more of the stateful tasks is lost (a pod that joined the group
    // late may run none yet: its tasks warm up until a probing rebalance moves them).
    let lost_index = if tasks[1].active > tasks[0].active {
        1
    } else {
        0
    };
    let mut survivor = instances.remove(1 - lost_index);
    let lost = instances.remove(0);
    println!(
        "  {name}: {} keys loaded; tasks per instance {tasks:?}; {} is killed",
        loaded.records, INSTANCES[lost_index]
    );
    let restored_before = app.restored(&survivor);
    let logs = [lost.log.clone(), survivor.log.clone()];

    let mut traffic = CrashTraffic::new(&app.input, loaded, keying);
    let sent = traffic.live();
    lost.kill9();
    let killed = Instant::now();
    traffic.after();
    survivor.wait_done(&watcher, traffic.records);
    let failover = Failover {
        caught_up_s: killed.elapsed().as_secs_f64(),
        restored: app.restored(&survivor).saturating_sub(restored_before),
    };
    survivor.stop();
    println!(
        "  {name}, {}: {} lost with {sent} live records in flight; the survivor committed everything {:.2} s after the kill (session timeout {SESSION_TIMEOUT:?}), restoring {} changelog records",
        describe(standby_replicas),
        INSTANCES[lost_index],
        failover.caught_up_s,
        failover.restored
    );
    let mut check = app.check(&format!("  {name} (across the failover)"), &traffic.sent());
    app.explain(&mut check, &watcher, &logs);
    (failover, check)
}

/// "1 standby", "no standby": how the rows and lines name a configuration.
pub fn describe(standby_replicas: u32) -> String {
    match standby_replicas {
        0 => "no standby".into(),
        1 => "1 standby".into(),
        n => format!("{n} standbys"),
    }
}

/// Waits until every stateful task runs somewhere and the instances keep `standby_replicas`
/// copies of every task's store between them, each caught up with its changelog; returns what
/// each instance runs. A store of many ids takes a while to copy: 1 s more per 20,000 keys than
/// the usual stall limit.
fn wait_for_tasks(instances: &mut [System], standby_replicas: u32, loaded: &Dataset) -> Vec<Tasks> {
    let copies = u64::from(standby_replicas) * PARTITIONS as u64;
    let limit = STALL_TIMEOUT + Duration::from_secs(loaded.records / 20_000);
    let started = Instant::now();
    loop {
        let mut each = Vec::new();
        for instance in instances.iter_mut() {
            instance.check_alive();
            each.push(instance.tasks().unwrap_or(Tasks {
                active: 0,
                standby_copies: 0,
                standby_lag: u64::MAX / 4,
            }));
        }
        if each.iter().map(|t| t.active).sum::<u64>() == PARTITIONS as u64
            && each.iter().map(|t| t.standby_copies).sum::<u64>() == copies
            && each.iter().all(|t| t.standby_lag == 0)
        {
            return each;
        }
        assert!(
            started.elapsed() < limit,
            "{}: {PARTITIONS} active tasks and {copies} caught-up standby copies expected; after {:?} the instances report {each:?}:\n{}",
            instances[0].name,
            started.elapsed(),
            log_tail(&instances[0].log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
