//! The processor's id lookup: "was command X processed, when, and where did it come from?"
//!
//! `GET /lookup?id=A&id=B` on the processor's HTTP port (reached through the API server's pod
//! proxy by `kubectl streamapp lookup`). Each pod answers from the stores it holds, active or
//! standby, and only from what they hold on disk: committed transactions, never the staged
//! writes of an open one. The query and the answer are defined here once, for both sides.

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use crate::health::TaskState;

/// The endpoint's path.
pub const PATH: &str = "/lookup";
/// Ids one request may ask for: each is a point lookup in every store that may hold it.
pub const MAX_IDS: usize = 100;
/// The longest id one may ask for (ids are record keys, header values or JSON strings; a
/// longer one is a mistake, not an id).
pub const MAX_ID_BYTES: usize = 4096;

/// Why a query is refused (HTTP 400, with this as the body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no id: ask for one or more with ?id=ID&id=ID")]
    NoId,
    #[error("an empty id (id number {0}): ids are never empty")]
    EmptyId(usize),
    #[error("id number {index} is {bytes} bytes; the longest an id may be is {MAX_ID_BYTES}")]
    TooLong { index: usize, bytes: usize },
    #[error("{0} ids in one request; at most {MAX_IDS} (ask again for the rest)")]
    TooMany(usize),
    #[error("id number {0} is not UTF-8 once percent-decoded")]
    NotUtf8(usize),
    #[error("unknown query parameter {0:?}: only id=")]
    UnknownParameter(String),
}

/// The query asking for `ids` (percent-encoded, so any UTF-8 id survives the trip).
pub fn query(ids: &[String]) -> String {
    ids.iter()
        .map(|id| format!("id={}", utf8_percent_encode(id, NON_ALPHANUMERIC)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The ids a query asks for, checked against the limits; the whole query is refused for one
/// bad id (an answer for some of them would look like an answer for all).
pub fn parse_query(query: Option<&str>) -> Result<Vec<String>, Refusal> {
    let mut ids = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "id" {
            return Err(Refusal::UnknownParameter(name.chars().take(64).collect()));
        }
        ids.push(value); // a slice of the query: nothing is decoded before the count is known
    }
    if ids.len() > MAX_IDS {
        return Err(Refusal::TooMany(ids.len()));
    }
    if ids.is_empty() {
        return Err(Refusal::NoId);
    }
    ids.into_iter()
        .enumerate()
        .map(|(i, raw)| {
            let index = i + 1;
            // Percent-encoded length bounds the decoded one: refuse before decoding a megabyte.
            if raw.len() > 3 * MAX_ID_BYTES {
                return Err(Refusal::TooLong {
                    index,
                    bytes: raw.len(),
                });
            }
            let plus_as_space = raw.replace('+', " ");
            let id = percent_decode_str(&plus_as_space)
                .decode_utf8()
                .map_err(|_| Refusal::NotUtf8(index))?
                .into_owned();
            match id.len() {
                0 => Err(Refusal::EmptyId(index)),
                n if n > MAX_ID_BYTES => Err(Refusal::TooLong { index, bytes: n }),
                _ => Ok(id),
            }
        })
        .collect()
}

/// One pod's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// The pod that answered.
    pub pod: String,
    /// How long an id is remembered (record time).
    pub retention_ms: i64,
    /// The partitions whose stores this pod holds, and their states.
    pub stores: Vec<HeldStore>,
    /// One entry per id asked, in the order asked.
    pub ids: Vec<IdAnswer>,
}

/// A store the answering pod holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldStore {
    pub partition: i32,
    /// The task's state (`None`: the store is open but the task has not said yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
}

/// What the pod's stores say about one id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdAnswer {
    pub id: String,
    /// The partition the id belongs to, when the processor decides it (the route stage
    /// partitions by id); without the route stage, any partition may hold it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// The id's sighting in each store asked that holds it.
    pub found: Vec<Found>,
    /// The partitions asked (the id's own, or every store held).
    pub asked: Vec<i32>,
}

/// An id as one store holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    pub partition: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// The record time of the first occurrence the store keeps (ms since the epoch).
    pub first_seen: i64,
    /// When the id stops being remembered: first seen + retention, in stream time.
    pub expires_at: i64,
    /// Past the window already (a repeat now would be output), and not yet compacted away.
    pub expired: bool,
    /// The first occurrence's input record (unknown for ids stored before store format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
}

/// An input record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_utf8_id_makes_the_round_trip() {
        let ids = vec![
            "cmd-1".to_string(),
            "a b+c&d=e/%?#".to_string(),
            "zählung-注文".to_string(),
        ];
        assert_eq!(parse_query(Some(&query(&ids))), Ok(ids));
    }

    #[test]
    fn bad_queries_are_refused_saying_why() {
        let many = (0..10_000).map(|i| format!("id=x{i}")).collect::<Vec<_>>();
        let huge = format!("id={}", "a".repeat(1 << 20));
        let just_long = format!("id={}", "a".repeat(MAX_ID_BYTES + 1));
        for (q, refusal) in [
            (None, Refusal::NoId),
            (Some(""), Refusal::NoId),
            (Some("id=a&id="), Refusal::EmptyId(2)),
            (Some("id=%FF%FE"), Refusal::NotUtf8(1)),
            (Some("id=a&who=b"), Refusal::UnknownParameter("who".into())),
            (Some(many.join("&").as_str()), Refusal::TooMany(10_000)),
            (
                Some(huge.as_str()),
                Refusal::TooLong {
                    index: 1,
                    bytes: 1 << 20,
                },
            ),
            (
                Some(just_long.as_str()),
                Refusal::TooLong {
                    index: 1,
                    bytes: MAX_ID_BYTES + 1,
                },
            ),
        ] {
            assert_eq!(
                parse_query(q),
                Err(refusal.clone()),
                "{:?}",
                q.map(|q| &q[..q.len().min(40)])
            );
            assert!(!refusal.to_string().is_empty());
        }
    }

    #[test]
    fn the_limits_themselves_are_allowed() {
        let ids: Vec<String> = (0..MAX_IDS)
            .map(|i| format!("{i}-{}", "x".repeat(MAX_ID_BYTES - 8)))
            .collect();
        assert_eq!(
            parse_query(Some(&query(&ids))).map(|v| v.len()),
            Ok(MAX_IDS)
        );
    }
}
