//! `kubectl streamapp dead-letters`: the latest dead letters of an app, as a processor of the
//! app lists them ([`streamapp_api::dead_letters`]), printed. Pure: [`crate::commands`] asks.

use k8s_openapi::jiff::Timestamp;
use streamapp_api::dead_letters::{Listing, Query};
use streamapp_api::units::parse_duration;

/// The query of `--since`, `--reason` and `--limit`, at `now_ms`.
pub fn query(
    since: Option<&str>,
    reason: Option<String>,
    limit: usize,
    now_ms: i64,
) -> Result<Query, String> {
    let since_ms = since
        .map(|s| {
            parse_duration(s)
                .map(|d| now_ms.saturating_sub(d.as_millis() as i64).max(0))
                .map_err(|e| format!("--since {s:?}: {e} (e.g. 30m, 1h, 7d)"))
        })
        .transpose()?;
    let q = Query {
        since_ms,
        reason,
        limit,
    };
    // The processor's own checks, before anything is asked.
    Query::parse(Some(&q.to_query())).map_err(|e| e.to_string())
}

/// The table: one line per dead letter, oldest first, and what was read.
pub fn table(listing: &Listing) -> String {
    let header = ["TIME", "REASON", "SOURCE", "SIZE", "VALUE"];
    let dash = || "-".to_string();
    let rows: Vec<[String; 5]> = listing
        .dead_letters
        .iter()
        .map(|d| {
            [
                Timestamp::from_millisecond(d.time)
                    .map_or_else(|_| d.time.to_string(), |t| t.to_string()),
                d.reason.clone().unwrap_or_else(dash),
                d.source.clone().unwrap_or_else(dash),
                d.size.to_string(),
                d.value_prefix
                    .clone()
                    .unwrap_or_else(|| "(not kept: only the metadata)".into()),
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no dead letters match\n".to_string()
    } else {
        crate::render::columns(header, &rows)
    };
    out += &format!(
        "\n{} dead letters read from {} by {}",
        listing.scanned, listing.topic, listing.pod
    );
    if !listing.complete {
        out += " (stopped at the read budget: older ones may be missing; narrow with --since)";
    }
    out += "\n";
    for d in &listing.dead_letters {
        if let Some(error) = &d.error {
            out += &format!("{}/{}: {error}\n", d.partition, d.offset);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_duration_back_from_now() {
        let q = query(Some("1h"), Some("invalid-json".into()), 5, 10_000_000).unwrap();
        assert_eq!(q.since_ms, Some(10_000_000 - 3_600_000));
        assert_eq!(q.reason.as_deref(), Some("invalid-json"));
        assert!(
            query(Some("an hour"), None, 5, 0)
                .unwrap_err()
                .contains("--since")
        );
        assert!(
            query(None, None, 5000, 0)
                .unwrap_err()
                .contains("at most 1000")
        );
    }
}
