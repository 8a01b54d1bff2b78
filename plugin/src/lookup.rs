//! `kubectl streamapp lookup`: the answers of an app's pods ([`streamapp_api::lookup`]) merged
//! into one verdict per id, and printed. Pure: [`crate::commands`] asks the pods.
//!
//! Every running pod of the app is asked (a pod answers for the stores it holds, active or
//! standby), so an answer survives the owner of a partition moving during a rolling restart:
//! the active's answer wins, a standby's stands in when the active did not answer.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use streamapp_api::health::TaskState;
use streamapp_api::lookup::{Answer, Found, Source};
use streamapp_api::units::format_duration;

/// A pod's name and its answer, or why it gave none.
pub type PodAnswer = (String, Result<Answer, String>);

/// What the app's stores say about one id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Remembered: a repeat now is a duplicate.
    Seen,
    /// Past the window (a repeat now is output again), not yet compacted away.
    Expired,
    /// The store of the id's partition does not hold it: never processed, dead-lettered,
    /// still in an open transaction, or expired and compacted away.
    NotSeen,
    /// No pod holding the id's partition answered.
    Unknown,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Seen => "seen",
            Verdict::Expired => "expired",
            Verdict::NotSeen => "not seen",
            Verdict::Unknown => "unknown",
        }
    }
}

/// One id's line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub id: String,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// The pod whose store answered, and the store's state there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
}

/// The pods' answers (or why a pod did not answer) merged per id, in the order asked.
pub fn merge(ids: &[String], answers: &[PodAnswer]) -> Vec<Row> {
    let answered: Vec<&Answer> = answers
        .iter()
        .filter_map(|(_, a)| a.as_ref().ok())
        .collect();
    let everyone_answered = answered.len() == answers.len();
    ids.iter()
        .map(|id| {
            let mut found: Vec<(&Answer, &Found)> = Vec::new();
            let mut partition = None;
            // Partitions whose active store was asked for the id.
            let mut asked_active = BTreeSet::new();
            for answer in &answered {
                let Some(entry) = answer.ids.iter().find(|e| &e.id == id) else {
                    continue;
                };
                partition = partition.or(entry.partition);
                found.extend(entry.found.iter().map(|f| (*answer, f)));
                for p in &entry.asked {
                    let state = answer.stores.iter().find(|s| s.partition == *p);
                    if state.and_then(|s| s.state) == Some(TaskState::Active) {
                        asked_active.insert(*p);
                    }
                }
            }
            // The active's answer first, then a standby's, then any other.
            found.sort_by_key(|(_, f)| match f.state {
                Some(TaskState::Active) => 0,
                Some(TaskState::Standby | TaskState::WarmingUp) => 1,
                _ => 2,
            });
            if let Some((answer, f)) = found.first() {
                return Row {
                    id: id.clone(),
                    verdict: if f.expired {
                        Verdict::Expired
                    } else {
                        Verdict::Seen
                    },
                    partition: Some(f.partition),
                    first_seen: Some(time(f.first_seen)),
                    expires_at: Some(time(f.expires_at)),
                    source: f.source.clone(),
                    answered_by: Some(answer.pod.clone()),
                    state: f.state,
                };
            }
            let certain = match partition {
                Some(p) => asked_active.contains(&p),
                // Any partition may hold it: every pod must have answered.
                None => everyone_answered && !asked_active.is_empty(),
            };
            Row {
                id: id.clone(),
                verdict: if certain {
                    Verdict::NotSeen
                } else {
                    Verdict::Unknown
                },
                partition,
                first_seen: None,
                expires_at: None,
                source: None,
                answered_by: None,
                state: None,
            }
        })
        .collect()
}

fn time(ms: i64) -> String {
    Timestamp::from_millisecond(ms).map_or_else(|_| ms.to_string(), |t| t.to_string())
}

/// The table `lookup` prints, with what "expired" means for this app and which pods did not
/// answer.
pub fn table(rows: &[Row], answers: &[PodAnswer]) -> String {
    let header = [
        "ID",
        "RESULT",
        "PARTITION",
        "FIRST SEEN",
        "EXPIRES",
        "SOURCE",
        "ANSWERED BY",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let dash = || "-".to_string();
            [
                r.id.clone(),
                r.verdict.word().to_string(),
                r.partition.map_or_else(dash, |p| p.to_string()),
                r.first_seen.clone().unwrap_or_else(dash),
                r.expires_at.clone().unwrap_or_else(dash),
                r.source.as_ref().map_or_else(
                    || {
                        if r.first_seen.is_some() {
                            "unknown".into()
                        } else {
                            dash()
                        }
                    },
                    |s| format!("{}/{}/{}", s.topic, s.partition, s.offset),
                ),
                match (&r.answered_by, r.state) {
                    (Some(pod), Some(state)) => format!("{pod} ({state:?})"),
                    (Some(pod), None) => pod.clone(),
                    _ => dash(),
                },
            ]
        })
        .collect();
    let mut out = crate::render::columns(header, &cells);
    if let Some(retention) = answers.iter().find_map(|(_, a)| a.as_ref().ok()) {
        let retention =
            format_duration(Duration::from_millis(retention.retention_ms.max(0) as u64));
        out += &format!(
            "\nids are remembered for {retention} of record time after their first occurrence; \
             an expired id is \"not seen\" once compacted away\n"
        );
    }
    for (pod, answer) in answers {
        if let Err(why) = answer {
            out += &format!("{pod} did not answer: {why}\n");
        }
    }
    if rows.iter().any(|r| r.verdict == Verdict::Unknown) {
        out += "unknown: no pod holding the id's partition as its active answered; ask again\n";
    }
    if rows.iter().any(|r| r.verdict == Verdict::NotSeen) {
        out += "not seen: never processed, dead-lettered (kubectl streamapp dead-letters), or its transaction not committed yet\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::lookup::{HeldStore, IdAnswer};

    fn answer(pod: &str, held: &[(i32, TaskState)], ids: Vec<IdAnswer>) -> Answer {
        Answer {
            pod: pod.into(),
            retention_ms: 3_600_000,
            stores: held
                .iter()
                .map(|&(partition, state)| HeldStore {
                    partition,
                    state: Some(state),
                })
                .collect(),
            ids,
        }
    }

    fn seen(partition: i32, state: TaskState, time: i64) -> Found {
        Found {
            partition,
            state: Some(state),
            first_seen: time,
            expires_at: time + 3_600_000,
            expired: false,
            source: Some(Source {
                topic: "orders".into(),
                partition,
                offset: 41,
            }),
        }
    }

    fn entry(id: &str, partition: i32, found: Vec<Found>) -> IdAnswer {
        IdAnswer {
            id: id.into(),
            partition: Some(partition),
            found,
            asked: vec![partition],
        }
    }

    #[test]
    fn the_active_answers_first_a_standby_stands_in_and_an_absent_owner_is_unknown() {
        let ids: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let t = 1_764_950_400_000;
        let answers = vec![
            (
                "app-0".to_string(),
                Ok(answer(
                    "app-0",
                    &[(0, TaskState::Active), (1, TaskState::Standby)],
                    vec![
                        entry("a", 0, vec![seen(0, TaskState::Active, t)]),
                        entry("b", 1, vec![seen(1, TaskState::Standby, t)]),
                        entry("c", 0, vec![]),
                    ],
                )),
            ),
            ("app-1".to_string(), Err("connection refused".to_string())),
        ];
        let rows = merge(&ids, &answers);
        assert_eq!(rows[0].verdict, Verdict::Seen);
        assert_eq!(rows[0].answered_by.as_deref(), Some("app-0"));
        assert_eq!(rows[1].verdict, Verdict::Seen, "the standby stood in");
        assert_eq!(rows[1].state, Some(TaskState::Standby));
        assert_eq!(
            rows[2].verdict,
            Verdict::NotSeen,
            "partition 0's active was asked"
        );
        let only_standby = vec![(
            "app-0".to_string(),
            Ok(answer(
                "app-0",
                &[(1, TaskState::Standby)],
                vec![entry("c", 1, vec![])],
            )),
        )];
        assert_eq!(
            merge(&["c".into()], &only_standby)[0].verdict,
            Verdict::Unknown,
            "a standby that does not hold an id may only lag"
        );
    }

    #[test]
    fn the_table_says_what_each_result_means() {
        let t = 1_764_950_400_000;
        let mut expired = seen(0, TaskState::Active, t);
        expired.expired = true;
        let answers = vec![(
            "app-0".to_string(),
            Ok(answer(
                "app-0",
                &[(0, TaskState::Active)],
                vec![
                    entry("a", 0, vec![seen(0, TaskState::Active, t)]),
                    entry("old", 0, vec![expired]),
                    entry("never", 0, vec![]),
                ],
            )),
        )];
        let ids: Vec<String> = ["a", "old", "never"].map(String::from).to_vec();
        let table = table(&merge(&ids, &answers), &answers);
        assert_eq!(
            table,
            "\
ID     RESULT    PARTITION  FIRST SEEN            EXPIRES               SOURCE       ANSWERED BY
a      seen      0          2025-12-05T16:00:00Z  2025-12-05T17:00:00Z  orders/0/41  app-0 (Active)
old    expired   0          2025-12-05T16:00:00Z  2025-12-05T17:00:00Z  orders/0/41  app-0 (Active)
never  not seen  0          -                     -                     -            -

ids are remembered for 1h of record time after their first occurrence; an expired id is \"not seen\" once compacted away
not seen: never processed, dead-lettered (kubectl streamapp dead-letters), or its transaction not committed yet
"
        );
    }
}
