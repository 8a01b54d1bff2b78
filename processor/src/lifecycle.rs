//! A task's lifecycle as a pure state machine: what happened to a task (an [`Event`]) moves it
//! to its next [`Phase`] and says what must be done about it ([`Command`]s). No Kafka, no
//! RocksDB, no clock of its own: the engine observes, feeds events in and carries the commands
//! out, so every rule below is a unit test.
//!
//! ```text
//!            Assigned                Opened               CaughtUp          Activated
//!  Closed ─────────────▶ Opening ─────────────▶ Restoring ─────────▶ Restored ─────────▶ Active
//!    ▲                     ▲  ▲                                                           │
//!    │ NotReassigned       │  │ Damaged: quarantine, rebuild          Revoked (any phase  │
//!    │ (close, checkpoint) │  └────────────────────────────         with an open store)  │
//!    └──── Suspended ◀─────┼──────────────────────────────────────────────────────────────┘
//!              │ Assigned  │
//!              └───────────┘ (the same open store, its tail replayed)
//!
//!  Unavailable (disk full, I/O error, lock held) in any phase with a store ──▶ BackingOff
//!  BackingOff ── Tick past retry time ──▶ Opening (the same store, reopened)
//!
//!            AssignedStandby          Opened                Assigned (promotion)
//!  Closed ───────────────────▶ Opening ─────────▶ Standby ─────────────────────▶ Restoring ─▶ …
//!  Suspended ────────────────▶ (the same store)      │ NotReassigned (close, checkpoint)
//!                                                    ▼
//!                                                  Closed
//! ```
//!
//! The rules that matter:
//! - **The checkpoint means "closed cleanly, nothing written since".** It is removed as soon as
//!   a store is opened for use, before restore writes to it; it is written only after a store
//!   is closed (a drain, or a suspended store whose partition did not come back). A revoked
//!   store is flushed and stays open, suspended, without one: a kill -9 then reads as what it
//!   is, an unclean stop.
//! - **Only damage quarantines.** A store whose files are wrong is moved aside and rebuilt; a
//!   store that is merely unavailable is released and retried later with exponential back-off,
//!   never moved or deleted. After [`MAX_REBUILDS_IN_A_ROW`] rebuilds that never became
//!   healthy, damage backs off too: the volume itself is suspect, and quarantining again would
//!   only fill it.
//! - **Old quarantines may be pruned only once a healthy store exists** (the task became active).
//! - **A standby's store is written by its follower only** (the state updater applies
//!   committed changelog records with their offset in the same batch: invariant 6 of
//!   docs/design.md).
//!   A rebalance does not revoke it: it follows until an assignment makes it active (the
//!   ordinary tail replay, then processing) or leaves it out (closed with a checkpoint).
//!   A warm-up is a standby that is a move in progress; it only reports differently.
//!
//! - **Nothing slow happens on the processing thread while a transaction may be open.**
//!   Opening a store from disk, reopening it for a new role and closing one that is not
//!   reassigned are done by the state updater's store thread (RocksDB can take minutes on a
//!   slow disk, longer than `transaction.timeout.ms`). The task waits in its phase meanwhile;
//!   what the store is for when it comes back — the task may have been revoked, closed or
//!   given another role since — is [`Lifecycle::on_arrival`]. A store's directory is opened
//!   again only once its close is done.
//!
//! The engine stays the driver: it has stores opened, hands them to the state updater and
//! feeds the facts back in.

use std::time::Duration;

use streamapp_api::health::{StoreBackoff, StoreOpen, StoreUnavailable, TaskState};

use crate::store::Fault;

/// Rebuilds of a store that never became healthy, before the task stops quarantining it.
pub const MAX_REBUILDS_IN_A_ROW: u32 = 3;
/// First back-off after a store became unavailable; it doubles with each failed retry.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest back-off between two retries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Back-off after repeated damage: a human should look at the volume.
pub const REPEATED_DAMAGE_BACKOFF: Duration = Duration::from_secs(300);

/// Where a task is.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Not (or no longer) assigned here; no store open.
    Closed,
    /// Assigned; its store is to be opened (or its suspended store resumed).
    Opening,
    /// Store open; the changelog tail is being replayed into it.
    Restoring,
    /// Caught up; joins the consumer's assignment once the open transaction committed.
    Restored,
    /// Processing records.
    Active,
    /// Revoked; the store stays open (flushed, no checkpoint) in case the partition comes back.
    Suspended,
    /// The store cannot be used for now; it is released and retried at `retry_at_ms`.
    BackingOff(StoreBackoff),
    /// A standby (or warm-up): the store follows the changelog on the state updater, nothing
    /// processes it.
    Standby,
}

/// What happened to a task.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The group assigned the partition to this process (as an active task).
    Assigned,
    /// The group assigned a standby of the partition to this process; a warm-up is a standby
    /// the task moves to once caught up.
    AssignedStandby { warm_up: bool },
    /// The store is open for use, and how it was found.
    Opened(StoreOpen),
    /// Opening, restoring, reading, applying or flushing the store failed.
    StoreFailed { fault: Fault, reason: String },
    /// Restore reached the end of the changelog partition.
    CaughtUp,
    /// The partition is in the consumer's assignment, at its committed offset.
    Activated,
    /// The group took the partition away (with the open transaction finished first).
    Revoked,
    /// The group's new assignment does not bring the partition back.
    NotReassigned,
    /// The wall clock, in Unix ms: ends back-offs.
    Tick { now_ms: i64 },
    /// The process drains: every store is closed cleanly.
    Drain,
}

/// What the engine must do for a transition, in this order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Remove the partition from the consumer's assignment.
    StopConsuming,
    /// The checkpoint vouches for a closed store only: remove it before anything writes.
    RemoveCheckpoint,
    /// Start (or start again) replaying the changelog from the store's own offset; a standby's
    /// store is taken from its follower for it.
    BeginRestore,
    /// Hand the store to the state updater to follow the changelog from its own offset.
    FollowChangelog,
    /// Flush memtables and the WAL; the store stays open.
    FlushStore,
    /// Flush and close the store, then write its checkpoint.
    CloseStore,
    /// Drop the store handle without flushing or a checkpoint (what is on disk is a
    /// consistent prefix of the changelog anyway).
    ReleaseStore,
    /// Release the store, move its files to quarantine; the next open creates an empty store.
    QuarantineStore { reason: String },
    /// A healthy store exists again: older quarantined copies may be pruned.
    PruneQuarantines,
}

/// A store opened off the processing thread, as it comes back to its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Opened from disk for a task that had no store.
    Fresh,
    /// The task's own store, closed and opened again for a role's memory budget;
    /// `role_matches`: for the role the task has now.
    Reopened { role_matches: bool },
}

/// What the engine does with a store that arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// The task waits for it: it is `Opened`.
    Open,
    /// The task's store again: it goes where the phase keeps it (the follower for a standby,
    /// the restore for a restoring task, the task itself when suspended or opening).
    Keep,
    /// Opened for the role the task had before: close it and open it again.
    Reopen,
    /// Nothing waits for it any more (revoked, not reassigned, backing off, drained): close it.
    Close,
}

/// How a store opened from disk was found: from its files and its checkpoint, read before it
/// was opened.
pub fn found(existed: bool, clean_checkpoint: bool) -> StoreOpen {
    match (existed, clean_checkpoint) {
        (false, _) => StoreOpen::FullRestore,
        (true, true) => StoreOpen::Clean,
        (true, false) => StoreOpen::ReplayedTail,
    }
}

/// Whether a store opened for a task that no longer waits for it is closed with a checkpoint
/// of what it holds. A store created empty (a new task, or a rebuild after damage) holds
/// nothing to replay or scan and says so: without a checkpoint its directory would read as an
/// unclean stop at the next start, though the process drained. One found on disk keeps what it
/// had: its checkpoint still holds, and one left by a crash is still due its scan.
pub fn checkpoints_an_unwanted_store(how: StoreOpen) -> bool {
    match how {
        StoreOpen::FullRestore | StoreOpen::Rebuilt => true,
        StoreOpen::Clean | StoreOpen::ReplayedTail | StoreOpen::Resumed => false,
    }
}

/// One task's lifecycle.
#[derive(Clone, Debug, PartialEq)]
pub struct Lifecycle {
    pub phase: Phase,
    /// The engine holds an open store handle for the task.
    store_open: bool,
    /// Rebuilds since the store was last healthy (active).
    rebuilds_in_a_row: u32,
    /// How the store was opened this time, for the health report.
    opened: Option<StoreOpen>,
    /// The current back-off episode, kept while the store is retried.
    backoff: Option<StoreBackoff>,
    /// What the group assigned: an active task or a standby (its phases up to open are the
    /// same).
    role: Role,
}

/// What a task is assigned as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Active,
    Standby { warm_up: bool },
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            phase: Phase::Closed,
            store_open: false,
            rebuilds_in_a_row: 0,
            opened: None,
            backoff: None,
            role: Role::Active,
        }
    }
}

impl Lifecycle {
    /// Applies `event` at `now_ms`; returns what the engine must do.
    pub fn on(&mut self, event: Event, now_ms: i64) -> Vec<Command> {
        use Command::*;
        use Phase::*;
        match (self.phase.clone(), event) {
            (Closed, Event::Assigned) => {
                self.role = Role::Active;
                self.phase = Opening;
                self.opened = None;
                vec![]
            }
            // The same open store comes back: it is resumed when the engine opens the task.
            (Suspended, Event::Assigned) => {
                self.role = Role::Active;
                self.phase = Opening;
                vec![]
            }
            // Promotion: the standby's store replays what it has not applied yet, then the
            // task is activated as any other.
            (Standby, Event::Assigned) => {
                self.role = Role::Active;
                self.phase = Restoring;
                vec![BeginRestore]
            }
            (_, Event::Assigned) => {
                self.role = Role::Active;
                vec![]
            }

            (Closed, Event::AssignedStandby { warm_up }) => {
                self.role = Role::Standby { warm_up };
                self.phase = Opening;
                self.opened = None;
                vec![]
            }
            (Suspended, Event::AssignedStandby { warm_up }) => {
                self.role = Role::Standby { warm_up };
                self.phase = Opening;
                vec![]
            }
            // Active here until now (the engine revokes before it assigns, so only without a
            // rebalance in between): stop processing, then follow like any standby.
            (Active, Event::AssignedStandby { warm_up }) => {
                self.role = Role::Standby { warm_up };
                self.phase = Standby;
                vec![StopConsuming, FollowChangelog]
            }
            (Restoring | Restored, Event::AssignedStandby { warm_up }) => {
                self.role = Role::Standby { warm_up };
                self.phase = Standby;
                vec![FollowChangelog]
            }
            (_, Event::AssignedStandby { warm_up }) => {
                self.role = Role::Standby { warm_up };
                vec![]
            }

            (Opening, Event::Opened(how)) => {
                self.store_open = true;
                // A store created empty after a quarantine is the rebuild of that store.
                self.opened = Some(match how {
                    StoreOpen::FullRestore if self.rebuilds_in_a_row > 0 => StoreOpen::Rebuilt,
                    how => how,
                });
                if self.role == Role::Active {
                    self.phase = Restoring;
                    vec![RemoveCheckpoint, BeginRestore]
                } else {
                    self.phase = Standby;
                    vec![RemoveCheckpoint, FollowChangelog]
                }
            }
            (Restoring, Event::CaughtUp) => {
                self.phase = Restored;
                vec![]
            }
            (Restored, Event::Activated) => {
                self.phase = Active;
                self.rebuilds_in_a_row = 0;
                self.backoff = None;
                vec![PruneQuarantines]
            }

            (Closed | Suspended, Event::StoreFailed { .. }) => {
                // Not ours any more (a flush at revoke failed): let it go.
                let commands = self.release();
                self.phase = Closed;
                commands
            }
            (BackingOff(_), Event::StoreFailed { .. }) => vec![],
            (phase, Event::StoreFailed { fault, reason }) => {
                let mut commands = if phase == Active {
                    vec![StopConsuming]
                } else {
                    vec![]
                };
                match fault {
                    Fault::Damaged if self.rebuilds_in_a_row < MAX_REBUILDS_IN_A_ROW => {
                        self.rebuilds_in_a_row += 1;
                        self.store_open = false;
                        self.phase = Opening;
                        commands.push(QuarantineStore { reason });
                    }
                    Fault::Damaged => {
                        commands.extend(self.release());
                        self.back_off(StoreUnavailable::RepeatedDamage, reason, now_ms);
                    }
                    Fault::Unavailable(kind) => {
                        commands.extend(self.release());
                        self.back_off(kind, reason, now_ms);
                    }
                }
                commands
            }

            (BackingOff(b), Event::Tick { now_ms }) if now_ms >= b.retry_at_ms => {
                self.phase = Opening;
                vec![]
            }
            (_, Event::Tick { .. }) => vec![],

            (Active, Event::Revoked) => {
                self.phase = Suspended;
                vec![StopConsuming, FlushStore]
            }
            // Standbys are not consumed from: a rebalance leaves them following (or opening, or
            // backing off) until the new assignment says what they are.
            (Standby | Opening | BackingOff(_), Event::Revoked) if self.role != Role::Active => {
                vec![]
            }
            (Opening | Restoring | Restored, Event::Revoked) if self.store_open => {
                self.phase = Suspended;
                vec![FlushStore]
            }
            (_, Event::Revoked) => {
                self.phase = Closed;
                vec![]
            }

            (Suspended | Standby, Event::NotReassigned) => {
                self.phase = Closed;
                self.store_open = false;
                vec![CloseStore]
            }
            (_, Event::NotReassigned) => vec![],

            (BackingOff(_) | Closed, Event::Drain) => {
                self.phase = Closed;
                vec![]
            }
            (phase, Event::Drain) => {
                let mut commands = if phase == Active {
                    vec![StopConsuming]
                } else {
                    vec![]
                };
                if self.store_open {
                    commands.push(CloseStore);
                }
                self.store_open = false;
                self.phase = Closed;
                commands
            }

            // Facts that do not fit the phase (a restore finishing for a task that was revoked
            // meanwhile, ...) change nothing.
            (_, Event::Opened(_) | Event::CaughtUp | Event::Activated) => vec![],
        }
    }

    fn release(&mut self) -> Vec<Command> {
        if std::mem::take(&mut self.store_open) {
            vec![Command::ReleaseStore]
        } else {
            vec![]
        }
    }

    fn back_off(&mut self, kind: StoreUnavailable, reason: String, now_ms: i64) {
        let attempts = self.backoff.as_ref().map_or(0, |b| b.attempts) + 1;
        let delay = if kind == StoreUnavailable::RepeatedDamage {
            REPEATED_DAMAGE_BACKOFF
        } else {
            backoff_delay(attempts)
        };
        let backoff = StoreBackoff {
            kind,
            reason,
            since_ms: self.backoff.as_ref().map_or(now_ms, |b| b.since_ms),
            attempts,
            retry_at_ms: now_ms + delay.as_millis() as i64,
        };
        self.backoff = Some(backoff.clone());
        self.phase = Phase::BackingOff(backoff);
    }

    /// The task's state as the health report names it; `None` once it is not owned here
    /// (suspended or closed).
    pub fn state(&self) -> Option<TaskState> {
        match self.phase {
            Phase::Closed | Phase::Suspended => None,
            Phase::Opening => Some(TaskState::Opening),
            Phase::Restoring => Some(TaskState::Restoring),
            Phase::Restored => Some(TaskState::Restored),
            Phase::Active => Some(TaskState::Active),
            Phase::BackingOff(_) => Some(TaskState::BackingOff),
            Phase::Standby => Some(match self.role {
                Role::Standby { warm_up: true } => TaskState::WarmingUp,
                _ => TaskState::Standby,
            }),
        }
    }

    /// What the group assigned the task as.
    pub fn role(&self) -> Role {
        self.role
    }

    pub fn opened(&self) -> Option<StoreOpen> {
        self.opened
    }

    /// The back-off being waited out, if any.
    pub fn backoff(&self) -> Option<&StoreBackoff> {
        match &self.phase {
            Phase::BackingOff(b) => Some(b),
            _ => None,
        }
    }

    /// The engine holds an open store for this task.
    pub fn store_open(&self) -> bool {
        self.store_open
    }

    /// Where a store opened for this task off the processing thread goes now that it arrives.
    /// A fresh store is only for a task still opening (the engine asks for one only when it
    /// holds none; a task revoked meanwhile has nothing to keep); a reopened one for a task
    /// that still holds its store (a revoke suspends it, and the task may have changed roles
    /// again meanwhile).
    pub fn on_arrival(&self, arrival: Arrival) -> Destination {
        match arrival {
            Arrival::Fresh if self.phase == Phase::Opening => Destination::Open,
            Arrival::Fresh => Destination::Close,
            Arrival::Reopened { .. } if !self.store_open => Destination::Close,
            Arrival::Reopened {
                role_matches: false,
            } if matches!(self.phase, Phase::Restoring | Phase::Standby) => Destination::Reopen,
            Arrival::Reopened { .. } => Destination::Keep,
        }
    }
}

/// Back-off before retry number `attempts` (1, 2, ...): [`BACKOFF_MIN`] doubling up to
/// [`BACKOFF_MAX`].
pub fn backoff_delay(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    (BACKOFF_MIN * 2u32.pow(doublings)).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Command::*;

    const T0: i64 = 1_000_000;

    fn damaged() -> Event {
        Event::StoreFailed {
            fault: Fault::Damaged,
            reason: "block checksum mismatch".into(),
        }
    }

    fn disk_full() -> Event {
        Event::StoreFailed {
            fault: Fault::Unavailable(StoreUnavailable::DiskFull),
            reason: "No space left on device".into(),
        }
    }

    /// A task taken through assignment, open and restore to processing.
    fn active() -> Lifecycle {
        let mut l = Lifecycle::default();
        l.on(Event::Assigned, T0);
        l.on(Event::Opened(StoreOpen::ReplayedTail), T0);
        l.on(Event::CaughtUp, T0);
        l.on(Event::Activated, T0);
        assert_eq!(l.phase, Phase::Active);
        l
    }

    #[test]
    fn an_assigned_task_opens_restores_and_becomes_active() {
        let mut l = Lifecycle::default();
        assert_eq!(l.on(Event::Assigned, T0), vec![]);
        assert_eq!(l.phase, Phase::Opening);
        assert_eq!(l.state(), Some(TaskState::Opening));
        assert_eq!(
            l.on(Event::Opened(StoreOpen::Clean), T0),
            vec![RemoveCheckpoint, BeginRestore]
        );
        assert_eq!(l.phase, Phase::Restoring);
        assert_eq!(l.on(Event::CaughtUp, T0), vec![]);
        assert_eq!(l.on(Event::Activated, T0), vec![PruneQuarantines]);
        assert_eq!(l.state(), Some(TaskState::Active));
        assert_eq!(l.opened(), Some(StoreOpen::Clean));
    }

    #[test]
    fn the_checkpoint_is_removed_as_soon_as_a_store_is_opened_before_restore_writes_to_it() {
        for how in [
            StoreOpen::Clean,
            StoreOpen::ReplayedTail,
            StoreOpen::FullRestore,
            StoreOpen::Resumed,
        ] {
            let mut l = Lifecycle::default();
            l.on(Event::Assigned, T0);
            let commands = l.on(Event::Opened(how), T0);
            assert_eq!(commands.first(), Some(&RemoveCheckpoint), "{how:?}");
            assert!(
                commands.iter().position(|c| *c == RemoveCheckpoint)
                    < commands.iter().position(|c| *c == BeginRestore)
            );
        }
    }

    #[test]
    fn a_revoked_store_is_flushed_and_kept_open_without_a_checkpoint() {
        let mut l = active();
        let commands = l.on(Event::Revoked, T0);
        assert_eq!(commands, vec![StopConsuming, FlushStore]);
        assert!(
            !commands.contains(&CloseStore),
            "no checkpoint while suspended"
        );
        assert_eq!(l.phase, Phase::Suspended);
        assert_eq!(l.state(), None, "a suspended task is not owned");
        assert!(l.store_open());
    }

    #[test]
    fn a_suspended_store_whose_partition_does_not_come_back_is_closed_with_a_checkpoint() {
        let mut l = active();
        l.on(Event::Revoked, T0);
        assert_eq!(l.on(Event::NotReassigned, T0), vec![CloseStore]);
        assert_eq!(l.phase, Phase::Closed);
        assert!(!l.store_open());
    }

    #[test]
    fn a_partition_that_comes_back_while_suspended_resumes_its_store_and_replays_the_tail() {
        let mut l = active();
        l.on(Event::Revoked, T0);
        assert_eq!(l.on(Event::Assigned, T0), vec![]);
        assert_eq!(l.phase, Phase::Opening);
        assert!(l.store_open(), "the engine resumes the open store");
        assert_eq!(
            l.on(Event::Opened(StoreOpen::Resumed), T0),
            vec![RemoveCheckpoint, BeginRestore]
        );
        assert_eq!(l.opened(), Some(StoreOpen::Resumed));
    }

    #[test]
    fn a_task_revoked_while_restoring_is_suspended_with_its_store() {
        let mut l = Lifecycle::default();
        l.on(Event::Assigned, T0);
        l.on(Event::Opened(StoreOpen::FullRestore), T0);
        assert_eq!(l.on(Event::Revoked, T0), vec![FlushStore]);
        assert_eq!(l.phase, Phase::Suspended);
        // Not opened yet: nothing to keep.
        let mut l = Lifecycle::default();
        l.on(Event::Assigned, T0);
        assert_eq!(l.on(Event::Revoked, T0), vec![]);
        assert_eq!(l.phase, Phase::Closed);
    }

    #[test]
    fn damage_quarantines_the_store_and_rebuilds_it_from_the_changelog() {
        let mut l = active();
        assert_eq!(
            l.on(damaged(), T0),
            vec![
                StopConsuming,
                QuarantineStore {
                    reason: "block checksum mismatch".into()
                }
            ]
        );
        assert_eq!(l.phase, Phase::Opening);
        assert!(!l.store_open());
        l.on(Event::Opened(StoreOpen::FullRestore), T0);
        assert_eq!(
            l.opened(),
            Some(StoreOpen::Rebuilt),
            "the empty store is the rebuild"
        );
    }

    #[test]
    fn a_full_disk_backs_off_without_quarantining_and_retries_the_same_store() {
        let mut l = active();
        assert_eq!(l.on(disk_full(), T0), vec![StopConsuming, ReleaseStore]);
        let b = l.backoff().expect("backing off").clone();
        assert_eq!(b.kind, StoreUnavailable::DiskFull);
        assert_eq!(b.attempts, 1);
        assert_eq!(b.retry_at_ms, T0 + 1000);
        assert_eq!(l.state(), Some(TaskState::BackingOff));
        // Too early: nothing happens.
        assert_eq!(l.on(Event::Tick { now_ms: T0 + 999 }, T0 + 999), vec![]);
        assert!(l.backoff().is_some());
        l.on(Event::Tick { now_ms: T0 + 1000 }, T0 + 1000);
        assert_eq!(l.phase, Phase::Opening, "reopened, not rebuilt");
        // Still full: the next wait is twice as long, the episode keeps its start.
        l.on(disk_full(), T0 + 1500);
        let b = l.backoff().unwrap();
        assert_eq!((b.attempts, b.since_ms), (2, T0));
        assert_eq!(b.retry_at_ms, T0 + 1500 + 2000);
        // Space again: the store opens and the episode ends once it is active.
        l.on(Event::Tick { now_ms: T0 + 4000 }, T0 + 4000);
        l.on(Event::Opened(StoreOpen::ReplayedTail), T0 + 4000);
        l.on(Event::CaughtUp, T0 + 4000);
        l.on(Event::Activated, T0 + 4000);
        assert_eq!(l.opened(), Some(StoreOpen::ReplayedTail));
        assert!(l.backoff().is_none());
    }

    #[test]
    fn every_unavailability_backs_off_and_none_quarantines() {
        for kind in [
            StoreUnavailable::DiskFull,
            StoreUnavailable::Locked,
            StoreUnavailable::Io,
            StoreUnavailable::Incompatible,
        ] {
            let mut l = Lifecycle::default();
            l.on(Event::Assigned, T0);
            let commands = l.on(
                Event::StoreFailed {
                    fault: Fault::Unavailable(kind),
                    reason: "x".into(),
                },
                T0,
            );
            assert!(
                !commands.iter().any(|c| matches!(c, QuarantineStore { .. })),
                "{kind:?}"
            );
            assert_eq!(l.backoff().unwrap().kind, kind);
        }
    }

    #[test]
    fn after_three_rebuilds_that_never_became_healthy_damage_backs_off_instead() {
        let mut l = active();
        for _ in 0..MAX_REBUILDS_IN_A_ROW {
            assert!(matches!(
                l.on(damaged(), T0).last(),
                Some(QuarantineStore { .. })
            ));
            l.on(Event::Opened(StoreOpen::FullRestore), T0);
        }
        let commands = l.on(damaged(), T0);
        assert_eq!(commands, vec![ReleaseStore], "no fourth quarantine");
        let b = l.backoff().unwrap();
        assert_eq!(b.kind, StoreUnavailable::RepeatedDamage);
        assert_eq!(
            b.retry_at_ms,
            T0 + REPEATED_DAMAGE_BACKOFF.as_millis() as i64
        );
    }

    #[test]
    fn a_store_that_became_healthy_again_may_be_rebuilt_again_later() {
        let mut l = active();
        for _ in 0..5 {
            assert!(matches!(
                l.on(damaged(), T0).last(),
                Some(QuarantineStore { .. })
            ));
            l.on(Event::Opened(StoreOpen::FullRestore), T0);
            l.on(Event::CaughtUp, T0);
            assert_eq!(l.on(Event::Activated, T0), vec![PruneQuarantines]);
        }
    }

    #[test]
    fn drain_closes_every_open_store_with_a_checkpoint_and_nothing_else() {
        let mut l = active();
        assert_eq!(l.on(Event::Drain, T0), vec![StopConsuming, CloseStore]);
        let mut l = active();
        l.on(Event::Revoked, T0);
        assert_eq!(
            l.on(Event::Drain, T0),
            vec![CloseStore],
            "suspended stores too"
        );
        let mut l = active();
        l.on(disk_full(), T0);
        assert_eq!(
            l.on(Event::Drain, T0),
            vec![],
            "a released store is not touched"
        );
    }

    #[test]
    fn a_task_revoked_while_backing_off_just_closes() {
        let mut l = active();
        l.on(disk_full(), T0);
        assert_eq!(l.on(Event::Revoked, T0), vec![]);
        assert_eq!(l.phase, Phase::Closed);
        assert_eq!(l.on(Event::Assigned, T0), vec![]);
        assert_eq!(l.phase, Phase::Opening);
    }

    #[test]
    fn a_failing_flush_of_a_suspended_store_releases_it() {
        let mut l = active();
        l.on(Event::Revoked, T0);
        assert_eq!(l.on(disk_full(), T0), vec![ReleaseStore]);
        assert_eq!(l.phase, Phase::Closed);
    }

    /// A task taken through a standby assignment and open to following its changelog.
    fn standby(warm_up: bool) -> Lifecycle {
        let mut l = Lifecycle::default();
        assert_eq!(l.on(Event::AssignedStandby { warm_up }, T0), vec![]);
        assert_eq!(l.phase, Phase::Opening);
        assert_eq!(
            l.on(Event::Opened(StoreOpen::ReplayedTail), T0),
            vec![RemoveCheckpoint, FollowChangelog]
        );
        assert_eq!(l.phase, Phase::Standby);
        assert!(l.store_open());
        l
    }

    #[test]
    fn a_standby_opens_its_store_and_follows_the_changelog_and_a_warm_up_says_so() {
        let l = standby(false);
        assert_eq!(l.state(), Some(TaskState::Standby));
        assert_eq!(l.role(), Role::Standby { warm_up: false });
        let mut l = standby(true);
        assert_eq!(l.state(), Some(TaskState::WarmingUp));
        // The next assignment keeps it as a plain standby: the same store follows on.
        assert_eq!(l.on(Event::AssignedStandby { warm_up: false }, T0), vec![]);
        assert_eq!(l.state(), Some(TaskState::Standby));
    }

    #[test]
    fn a_rebalance_leaves_a_standby_following() {
        let mut l = standby(false);
        assert_eq!(l.on(Event::Revoked, T0), vec![]);
        assert_eq!(l.phase, Phase::Standby);
        // Still opening, or backing off: the same.
        let mut l = Lifecycle::default();
        l.on(Event::AssignedStandby { warm_up: false }, T0);
        assert_eq!(l.on(Event::Revoked, T0), vec![]);
        assert_eq!(l.phase, Phase::Opening);
        l.on(disk_full(), T0);
        assert_eq!(l.on(Event::Revoked, T0), vec![]);
        assert!(l.backoff().is_some());
    }

    #[test]
    fn a_promoted_standby_replays_its_tail_and_becomes_active() {
        let mut l = standby(true);
        assert_eq!(l.on(Event::Assigned, T0), vec![BeginRestore]);
        assert_eq!(l.phase, Phase::Restoring);
        assert_eq!(l.role(), Role::Active);
        assert_eq!(l.on(Event::CaughtUp, T0), vec![]);
        assert_eq!(l.on(Event::Activated, T0), vec![PruneQuarantines]);
        assert_eq!(l.state(), Some(TaskState::Active));
    }

    #[test]
    fn a_standby_left_out_of_the_assignment_is_closed_with_a_checkpoint() {
        let mut l = standby(false);
        assert_eq!(l.on(Event::NotReassigned, T0), vec![CloseStore]);
        assert_eq!(l.phase, Phase::Closed);
        assert!(!l.store_open());
        let mut l = standby(false);
        assert_eq!(l.on(Event::Drain, T0), vec![CloseStore]);
    }

    #[test]
    fn an_active_task_that_stays_here_as_a_standby_keeps_its_store() {
        // Through a rebalance: revoked (suspended, flushed), then assigned as a standby.
        let mut l = active();
        l.on(Event::Revoked, T0);
        assert_eq!(l.on(Event::AssignedStandby { warm_up: false }, T0), vec![]);
        assert_eq!(l.phase, Phase::Opening);
        assert!(l.store_open(), "the engine resumes the open store");
        assert_eq!(
            l.on(Event::Opened(StoreOpen::Resumed), T0),
            vec![RemoveCheckpoint, FollowChangelog]
        );
        assert_eq!(l.state(), Some(TaskState::Standby));
        // Without one: it stops consuming first.
        let mut l = active();
        assert_eq!(
            l.on(Event::AssignedStandby { warm_up: false }, T0),
            vec![StopConsuming, FollowChangelog]
        );
        assert_eq!(l.phase, Phase::Standby);
    }

    #[test]
    fn a_damaged_standby_is_rebuilt_as_a_standby_and_never_stops_consuming() {
        let mut l = standby(false);
        let commands = l.on(damaged(), T0);
        assert!(!commands.contains(&StopConsuming), "{commands:?}");
        assert!(matches!(commands.last(), Some(QuarantineStore { .. })));
        assert_eq!(l.phase, Phase::Opening);
        assert_eq!(
            l.on(Event::Opened(StoreOpen::FullRestore), T0),
            vec![RemoveCheckpoint, FollowChangelog]
        );
        assert_eq!(l.opened(), Some(StoreOpen::Rebuilt));
        assert_eq!(l.state(), Some(TaskState::Standby));
    }

    #[test]
    fn a_store_is_found_clean_with_a_checkpoint_replayed_without_and_restored_when_new() {
        assert_eq!(found(false, false), StoreOpen::FullRestore);
        assert_eq!(
            found(false, true),
            StoreOpen::FullRestore,
            "a stray checkpoint"
        );
        assert_eq!(found(true, true), StoreOpen::Clean);
        assert_eq!(found(true, false), StoreOpen::ReplayedTail);
    }

    #[test]
    fn a_store_created_for_nothing_is_checkpointed_one_found_on_disk_keeps_what_it_had() {
        assert!(checkpoints_an_unwanted_store(StoreOpen::FullRestore));
        assert!(checkpoints_an_unwanted_store(StoreOpen::Rebuilt));
        assert!(!checkpoints_an_unwanted_store(StoreOpen::Clean));
        assert!(!checkpoints_an_unwanted_store(StoreOpen::ReplayedTail));
        assert!(!checkpoints_an_unwanted_store(StoreOpen::Resumed));
    }

    #[test]
    fn a_store_opened_off_the_processing_thread_goes_to_the_task_still_waiting_for_it() {
        let mut l = Lifecycle::default();
        l.on(Event::Assigned, T0);
        assert_eq!(l.on_arrival(Arrival::Fresh), Destination::Open);
        // Opened for the active role, the task became a standby meanwhile: it is opened all
        // the same, and its role's reopen follows from the commands.
        l.on(Event::AssignedStandby { warm_up: false }, T0);
        assert_eq!(l.on_arrival(Arrival::Fresh), Destination::Open);
        assert_eq!(
            l.on(Event::Opened(StoreOpen::Clean), T0),
            vec![RemoveCheckpoint, FollowChangelog]
        );
    }

    #[test]
    fn a_store_opened_for_a_task_that_no_longer_waits_for_it_is_closed() {
        // Revoked before its store arrived (nothing to suspend), then drained, or backing off.
        let mut l = Lifecycle::default();
        l.on(Event::Assigned, T0);
        l.on(Event::Revoked, T0);
        assert_eq!(l.phase, Phase::Closed);
        assert_eq!(l.on_arrival(Arrival::Fresh), Destination::Close);
        let mut l = Lifecycle::default();
        l.on(Event::Assigned, T0);
        l.on(Event::Drain, T0);
        assert_eq!(l.on_arrival(Arrival::Fresh), Destination::Close);
        let mut l = active();
        l.on(disk_full(), T0);
        assert_eq!(l.on_arrival(Arrival::Fresh), Destination::Close);
        // Nor does a task that got past opening.
        assert_eq!(active().on_arrival(Arrival::Fresh), Destination::Close);
        assert_eq!(
            standby(false).on_arrival(Arrival::Fresh),
            Destination::Close
        );
    }

    #[test]
    fn a_store_reopened_for_its_role_goes_back_to_where_its_phase_keeps_it() {
        let matching = Arrival::Reopened { role_matches: true };
        let stale = Arrival::Reopened {
            role_matches: false,
        };
        // A promoted standby restores; a new standby follows.
        let mut l = standby(false);
        l.on(Event::Assigned, T0);
        assert_eq!(l.on_arrival(matching), Destination::Keep);
        let l = standby(false);
        assert_eq!(l.on_arrival(matching), Destination::Keep);
        // The role changed again meanwhile: opened again for the new one.
        let mut l = standby(false);
        l.on(Event::Assigned, T0);
        assert_eq!(l.on_arrival(stale), Destination::Reopen);
        assert_eq!(standby(true).on_arrival(stale), Destination::Reopen);
        // Revoked meanwhile: the suspended task keeps it, and resumes it if assigned again.
        let mut l = standby(false);
        l.on(Event::Assigned, T0);
        l.on(Event::Revoked, T0);
        assert_eq!(l.phase, Phase::Suspended);
        assert_eq!(l.on_arrival(stale), Destination::Keep);
        l.on(Event::Assigned, T0);
        assert_eq!(l.on_arrival(stale), Destination::Keep);
    }

    #[test]
    fn a_store_reopened_for_a_task_that_let_go_of_it_is_closed() {
        let reopened = Arrival::Reopened { role_matches: true };
        let mut l = standby(false);
        l.on(Event::NotReassigned, T0);
        assert_eq!(l.on_arrival(reopened), Destination::Close);
        let mut l = standby(false);
        l.on(Event::Drain, T0);
        assert_eq!(l.on_arrival(reopened), Destination::Close);
        let mut l = standby(false);
        l.on(Event::Assigned, T0);
        l.on(disk_full(), T0);
        assert_eq!(l.on_arrival(reopened), Destination::Close);
    }

    #[test]
    fn back_off_doubles_up_to_a_minute() {
        let secs: Vec<u64> = (1..=8).map(|a| backoff_delay(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff_delay(1000), BACKOFF_MAX);
    }
}
