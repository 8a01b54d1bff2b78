//! The application reset (`streamapp.dev/reset`), as Kafka Streams users run it by hand: stop
//! the pods, move the consumer group's input offsets (to the earliest, the latest, or the
//! first record at a time), clear the state (the pods' volumes and the internal topics), and
//! start the pods again, which rebuild nothing because there is nothing left to rebuild.
//!
//! [`plan`] is the state machine: from the annotation, the last recorded phase and what the
//! reconciler sees, the phase to be in and the one action to take now. The phase is kept in
//! `status.reset`, so an operator restarted in the middle carries on where it was.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use streamapp_api::crd::ResetStatus;
use streamapp_api::status_values::ResetPhase;

use crate::kafka::ResetTarget;

/// What the reconciler sees that the reset waits for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Pods of the StreamApp that still exist.
    pub pods: usize,
    /// The consumer group has no members (the broker allows moving its offsets only then;
    /// static members linger until their session times out).
    pub group_empty: bool,
    /// Volume claims of the StreamApp that still exist.
    pub claims: usize,
    /// Internal topics (changelog, repartition) that still exist.
    pub internal_topics: usize,
    /// Ready pods and the pods the StreamApp runs normally.
    pub ready: i32,
    pub desired: i32,
}

/// The one thing to do in this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// No reset runs: reconcile as usual.
    None,
    /// Keep the pods stopped (StatefulSet at 0 replicas) and wait.
    Wait,
    ResetOffsets(ResetTarget),
    /// Delete the claims and the internal topics (pods stay stopped).
    ClearState,
    /// Run the pods again and wait for them to be ready.
    StartPods,
}

/// The reset's status after this step, and the action.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub status: Option<ResetStatus>,
    pub action: Action,
}

impl Plan {
    /// Whether the pods must be kept stopped.
    pub fn stops_pods(&self) -> bool {
        matches!(
            self.action,
            Action::Wait | Action::ResetOffsets(_) | Action::ClearState
        )
    }
}

fn status(
    request: &str,
    phase: ResetPhase,
    message: Option<String>,
    started: Option<Time>,
) -> ResetStatus {
    ResetStatus {
        request: request.to_string(),
        phase,
        message,
        started_at: started,
        finished_at: None,
    }
}

/// The step for annotation value `requested` given the recorded `last` reset and `view`.
pub fn plan(
    requested: Option<&str>,
    last: Option<&ResetStatus>,
    view: &View,
    now: Timestamp,
) -> Plan {
    let Some(request) = requested else {
        return Plan {
            status: last.cloned(),
            action: Action::None,
        };
    };
    let now_time = || {
        Some(Time(
            Timestamp::from_second(now.as_second()).expect("a valid time"),
        ))
    };
    // A new value is a new reset; the same value once done is history.
    let current = last.filter(|l| l.request == request);
    let target = match ResetTarget::parse(request) {
        Ok(t) => t,
        Err(why) => {
            return Plan {
                status: Some(ResetStatus {
                    finished_at: current
                        .and_then(|c| c.finished_at.clone())
                        .or_else(now_time),
                    ..status(
                        request,
                        ResetPhase::Failed,
                        Some(why),
                        current.and_then(|c| c.started_at.clone()),
                    )
                }),
                action: Action::None,
            };
        }
    };
    let started = current.and_then(|c| c.started_at.clone()).or_else(now_time);
    let phase = current.map_or(&ResetPhase::StoppingPods, |c| &c.phase);
    match phase {
        ResetPhase::Done | ResetPhase::Failed => Plan {
            status: current.cloned(),
            action: Action::None,
        },
        ResetPhase::StoppingPods if view.pods > 0 || !view.group_empty => Plan {
            status: Some(status(
                request,
                ResetPhase::StoppingPods,
                Some(if view.pods > 0 {
                    format!("waiting for {} pods to drain and stop", view.pods)
                } else {
                    "waiting for the consumer group's members to time out".into()
                }),
                started,
            )),
            action: Action::Wait,
        },
        ResetPhase::StoppingPods | ResetPhase::ResettingOffsets => Plan {
            status: Some(status(request, ResetPhase::ResettingOffsets, None, started)),
            action: Action::ResetOffsets(target),
        },
        ResetPhase::ClearingState if view.claims > 0 || view.internal_topics > 0 => Plan {
            status: Some(status(
                request,
                ResetPhase::ClearingState,
                Some(format!(
                    "deleting {} volume claims and {} internal topics",
                    view.claims, view.internal_topics
                )),
                started,
            )),
            action: Action::ClearState,
        },
        ResetPhase::ClearingState | ResetPhase::StartingPods if view.ready < view.desired => Plan {
            status: Some(status(
                request,
                ResetPhase::StartingPods,
                Some(format!("{}/{} pods ready", view.ready, view.desired)),
                started,
            )),
            action: Action::StartPods,
        },
        // Started again, or a phase another version wrote that this one does not know.
        _ => Plan {
            status: Some(ResetStatus {
                finished_at: now_time(),
                ..status(request, ResetPhase::Done, None, started)
            }),
            action: Action::None,
        },
    }
}

/// The phase after an action succeeded (offsets moved: clear the state next).
pub fn after_offsets_reset(plan: &Plan) -> Option<ResetStatus> {
    plan.status.clone().map(|s| ResetStatus {
        phase: ResetPhase::ClearingState,
        message: None,
        ..s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    fn view(pods: usize, group_empty: bool, claims: usize, topics: usize, ready: i32) -> View {
        View {
            pods,
            group_empty,
            claims,
            internal_topics: topics,
            ready,
            desired: 2,
        }
    }

    /// Runs the plan the way the reconciler does, taking the status forward.
    fn step(request: &str, last: Option<&ResetStatus>, v: &View) -> Plan {
        let mut p = plan(Some(request), last, v, now());
        if let Action::ResetOffsets(_) = p.action {
            p.status = after_offsets_reset(&p);
        }
        p
    }

    #[test]
    fn a_reset_stops_the_pods_moves_the_offsets_clears_the_state_and_starts_again() {
        let s1 = step("earliest", None, &view(2, false, 2, 1, 2));
        assert_eq!(
            (s1.action.clone(), &s1.status.as_ref().unwrap().phase),
            (Action::Wait, &ResetPhase::StoppingPods)
        );
        assert!(s1.stops_pods());
        // Pods gone, but the static members linger in the group.
        let s2 = step("earliest", s1.status.as_ref(), &view(0, false, 2, 1, 0));
        assert_eq!(s2.action, Action::Wait);
        assert!(
            s2.status
                .as_ref()
                .unwrap()
                .message
                .as_ref()
                .unwrap()
                .contains("time out")
        );
        let s3 = step("earliest", s2.status.as_ref(), &view(0, true, 2, 1, 0));
        assert_eq!(s3.action, Action::ResetOffsets(ResetTarget::Earliest));
        assert_eq!(s3.status.as_ref().unwrap().phase, ResetPhase::ClearingState);
        let s4 = step("earliest", s3.status.as_ref(), &view(0, true, 2, 1, 0));
        assert_eq!(s4.action, Action::ClearState);
        assert!(s4.stops_pods());
        let s5 = step("earliest", s4.status.as_ref(), &view(0, true, 0, 0, 0));
        assert_eq!(
            (s5.action.clone(), &s5.status.as_ref().unwrap().phase),
            (Action::StartPods, &ResetPhase::StartingPods)
        );
        assert!(!s5.stops_pods());
        let s6 = step("earliest", s5.status.as_ref(), &view(2, false, 2, 1, 2));
        let done = s6.status.unwrap();
        assert_eq!((s6.action, &done.phase), (Action::None, &ResetPhase::Done));
        assert_eq!(
            done.started_at,
            s1.status.unwrap().started_at,
            "started once"
        );
        assert!(done.finished_at.is_some());
        // The same value again is history; a new value is a new reset.
        assert_eq!(
            step("earliest", Some(&done), &view(2, false, 2, 1, 2)).action,
            Action::None
        );
        assert_eq!(
            step("latest", Some(&done), &view(2, false, 2, 1, 2)).action,
            Action::Wait
        );
    }

    #[test]
    fn a_value_that_is_not_a_reset_target_fails_without_touching_anything() {
        let p = plan(Some("yesterday"), None, &view(2, false, 2, 1, 2), now());
        assert_eq!(p.action, Action::None);
        let s = p.status.unwrap();
        assert_eq!(s.phase, ResetPhase::Failed);
        assert!(s.message.unwrap().contains("RFC 3339"));
    }

    #[test]
    fn a_phase_written_by_another_version_ends_the_reset_as_done() {
        let unknown = ResetStatus {
            request: "earliest".into(),
            phase: ResetPhase::Other("VerifyingOffsets".into()),
            message: None,
            started_at: None,
            finished_at: None,
        };
        let p = step("earliest", Some(&unknown), &view(2, false, 2, 1, 2));
        assert_eq!(p.action, Action::None);
        assert_eq!(p.status.unwrap().phase, ResetPhase::Done);
    }

    #[test]
    fn without_the_annotation_nothing_runs_and_the_last_reset_is_kept() {
        let done = ResetStatus {
            request: "latest".into(),
            phase: ResetPhase::Done,
            message: None,
            started_at: None,
            finished_at: None,
        };
        let p = plan(None, Some(&done), &View::default(), now());
        assert_eq!((p.action, p.status), (Action::None, Some(done)));
    }
}
