//! The processor's dead-letter listing: "which records were dead-lettered, and why?"
//!
//! `GET /dead-letters?sinceMs=T&reason=R&limit=N` on the processor's HTTP port (reached
//! through the API server's pod proxy by `kubectl streamapp dead-letters`). The processor reads
//! its dead-letter topic with read_committed through a short-lived consumer that joins no
//! group and commits nothing, so the listing leaves nothing behind in Kafka. The query and the
//! answer are defined here once, for both sides.

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde::{Deserialize, Serialize};

/// The endpoint's path.
pub const PATH: &str = "/dead-letters";
/// Dead letters listed when the query does not say.
pub const DEFAULT_LIMIT: usize = 20;
/// The most one answer lists.
pub const MAX_LIMIT: usize = 1000;
/// Bytes of each value shown.
pub const VALUE_PREFIX_BYTES: usize = 64;
/// The longest reason one may filter by (reasons are short codes).
const MAX_REASON: usize = 128;

/// What to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Only records written at or after this time (ms since the epoch); all when `None`.
    pub since_ms: Option<i64>,
    /// Only records with this reason.
    pub reason: Option<String>,
    /// The latest this many.
    pub limit: usize,
}

impl Default for Query {
    fn default() -> Self {
        Query {
            since_ms: None,
            reason: None,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// Why a query is refused (HTTP 400, with this as the body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{name}={value:?} is not {what}")]
    Invalid {
        name: &'static str,
        value: String,
        what: &'static str,
    },
    #[error("limit {0}: at most {MAX_LIMIT} dead letters are listed at once")]
    LimitTooLarge(usize),
    #[error("unknown query parameter {0:?}: sinceMs, reason and limit are known")]
    UnknownParameter(String),
}

impl Query {
    /// The query string asking for this.
    pub fn to_query(&self) -> String {
        let mut parts = vec![format!("limit={}", self.limit)];
        if let Some(t) = self.since_ms {
            parts.push(format!("sinceMs={t}"));
        }
        if let Some(r) = &self.reason {
            parts.push(format!(
                "reason={}",
                utf8_percent_encode(r, NON_ALPHANUMERIC)
            ));
        }
        parts.join("&")
    }

    /// Reads a query string, checking each value.
    pub fn parse(query: Option<&str>) -> Result<Query, Refusal> {
        let mut q = Query::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
            let invalid = |name, what| Refusal::Invalid {
                name,
                value: raw.chars().take(64).collect(),
                what,
            };
            match name {
                "sinceMs" => {
                    q.since_ms = Some(
                        raw.parse()
                            .ok()
                            .filter(|t: &i64| *t >= 0)
                            .ok_or_else(|| invalid("sinceMs", "a time in ms since the epoch"))?,
                    )
                }
                "limit" => {
                    let n: usize = raw
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| invalid("limit", "a positive count"))?;
                    if n > MAX_LIMIT {
                        return Err(Refusal::LimitTooLarge(n));
                    }
                    q.limit = n;
                }
                "reason" => {
                    let reason = percent_decode_str(&raw.replace('+', " "))
                        .decode_utf8()
                        .ok()
                        .map(|r| r.into_owned())
                        .filter(|r| !r.is_empty() && r.len() <= MAX_REASON)
                        .ok_or_else(|| invalid("reason", "a reason code"))?;
                    q.reason = Some(reason);
                }
                other => {
                    return Err(Refusal::UnknownParameter(other.chars().take(64).collect()));
                }
            }
        }
        Ok(q)
    }
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub topic: String,
    /// The pod that read them.
    pub pod: String,
    /// Dead letters read (matching or not) since the query's time.
    pub scanned: u64,
    /// Every partition was read to its end; `false`: the read stopped at its time or record
    /// budget, so older matches may be missing.
    pub complete: bool,
    /// The latest matches, oldest first.
    pub dead_letters: Vec<DeadLetter>,
}

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    pub partition: i32,
    pub offset: i64,
    /// When it was written (ms since the epoch).
    pub time: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `topic/partition/offset` of the record it stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// What went wrong, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The value's size in bytes (the original's when only its metadata was written).
    pub size: u64,
    /// Its first bytes (at most [`VALUE_PREFIX_BYTES`]), as text with anything that is not
    /// printable UTF-8 escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_prefix: Option<String>,
}

/// The first bytes of a value as printable text.
pub fn value_prefix(value: &[u8]) -> String {
    let cut = &value[..value.len().min(VALUE_PREFIX_BYTES)];
    let mut out = String::new();
    for chunk in cut.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out += &format!("\\x{b:02x}");
        }
    }
    if value.len() > cut.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_makes_the_round_trip() {
        let q = Query {
            since_ms: Some(1_764_950_400_000),
            reason: Some("invalid json&more".into()),
            limit: 7,
        };
        assert_eq!(Query::parse(Some(&q.to_query())), Ok(q));
        assert_eq!(Query::parse(None), Ok(Query::default()));
    }

    #[test]
    fn bad_queries_are_refused_saying_why() {
        for (q, says) in [
            ("limit=0", "limit=\"0\" is not a positive count"),
            ("limit=1001", "at most 1000"),
            ("sinceMs=-5", "is not a time in ms since the epoch"),
            ("sinceMs=yesterday", "is not a time"),
            ("reason=", "is not a reason code"),
            ("reason=%FF", "is not a reason code"),
            ("who=me", "unknown query parameter \"who\""),
        ] {
            let refusal = Query::parse(Some(q)).unwrap_err();
            assert!(refusal.to_string().contains(says), "{q}: {refusal}");
        }
    }

    #[test]
    fn values_are_shown_printable_and_cut() {
        assert_eq!(value_prefix(b"{\"id\":1}\n"), "{\"id\":1}\\n");
        assert_eq!(value_prefix(&[0x61, 0xff, 0x62]), "a\\xffb");
        let long = vec![b'x'; 100];
        assert_eq!(value_prefix(&long), format!("{}…", "x".repeat(64)));
    }
}
