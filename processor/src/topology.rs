//! The dedup topology's decisions, free of Kafka and RocksDB: find the id of a record, refuse
//! what cannot be processed (no id, bad JSON, too large, stamped too far in the future), and
//! decide duplicate or first occurrence.

use streamapp_api::config::{DedupId, DedupIdSource};

use crate::json_pointer::{self, Scalar};

/// Header carrying the reason on dead-letter records.
pub const DLQ_REASON_HEADER: &str = "streamapp.dlq.reason";
/// Header carrying `topic/partition/offset` of the original record on dead-letter records.
pub const DLQ_SOURCE_HEADER: &str = "streamapp.dlq.source";
/// Header carrying the original value size on dead-letter records that carry metadata only
/// (the value was too large to be written again).
pub const DLQ_ORIGINAL_SIZE_HEADER: &str = "streamapp.dlq.original-size";
/// Header carrying what went wrong, in words (the last error of a record that failed every
/// attempt, the limit a record exceeded).
pub const DLQ_ERROR_HEADER: &str = "streamapp.dlq.error";
/// Header added to output and duplicate records: the dedup id.
pub const DEDUP_ID_HEADER: &str = "streamapp.dedup.id";

/// Why a record goes to the dead-letter topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    MissingId,
    InvalidJson(String),
    ValueTooLarge {
        size: usize,
        max: u64,
    },
    /// The record's time is further ahead of the processor's clock than `topology.maxSkew`:
    /// taken as it is, it would move stream time and expire every id.
    TooFarAhead {
        time: i64,
        limit: i64,
    },
}

impl Rejection {
    /// The value of the reason header (also the metric label).
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::MissingId => "missing-dedup-id",
            Rejection::InvalidJson(_) => "invalid-json",
            Rejection::ValueTooLarge { .. } => "value-too-large",
            Rejection::TooFarAhead { .. } => "timestamp-too-far-ahead",
        }
    }

    /// Whether the dead letter must leave the value out (it is what was too large).
    pub fn metadata_only(&self) -> bool {
        matches!(self, Rejection::ValueTooLarge { .. })
    }

    pub fn detail(&self) -> String {
        match self {
            Rejection::MissingId => "the record has no dedup id".into(),
            Rejection::InvalidJson(e) => format!("the value is not valid JSON: {e}"),
            Rejection::ValueTooLarge { size, max } => {
                format!("the value is {size} bytes, the limit is {max}")
            }
            Rejection::TooFarAhead { time, limit } => format!(
                "the record time {time} is {} ms ahead of the latest accepted time {limit} (the processor's clock plus topology.maxSkew)",
                time - limit
            ),
        }
    }
}

/// What the topology needs to know about a record.
pub struct RecordView<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// Looks a header up by name.
    pub header: &'a dyn Fn(&str) -> Option<&'a [u8]>,
}

/// Finds the dedup id, or why the record cannot be processed.
pub fn extract_id(
    record: &RecordView<'_>,
    source: &DedupId,
    max_value_bytes: u64,
) -> Result<Vec<u8>, Rejection> {
    let size = record.value.map_or(0, <[u8]>::len);
    if size as u64 > max_value_bytes {
        return Err(Rejection::ValueTooLarge {
            size,
            max: max_value_bytes,
        });
    }
    let id = match source.source {
        DedupIdSource::Key => record.key.map(<[u8]>::to_vec),
        DedupIdSource::Header => {
            let name = source.header.as_deref().unwrap_or_default();
            (record.header)(name).map(<[u8]>::to_vec)
        }
        DedupIdSource::JsonPointer => {
            let value = record.value.ok_or(Rejection::MissingId)?;
            let pointer = source.json_pointer.as_deref().unwrap_or_default();
            match json_pointer::find(value, pointer)
                .map_err(|e| Rejection::InvalidJson(e.to_string()))?
            {
                Some(Scalar::String(s)) => Some(s.into_bytes()),
                Some(Scalar::Number(n)) => Some(n.into_bytes()),
                Some(Scalar::Other) | None => None,
            }
        }
    };
    match id {
        Some(id) if !id.is_empty() => Ok(id),
        _ => Err(Rejection::MissingId),
    }
}

/// Refuses a record stamped more than `max_skew_ms` after `now_ms` (the processor's clock).
/// Stream time is the largest record time seen: one record from the year 2125 would expire
/// every id, and every later put would be expired on arrival.
pub fn check_time(time: i64, now_ms: i64, max_skew_ms: i64) -> Result<(), Rejection> {
    let limit = now_ms.saturating_add(max_skew_ms);
    if time > limit {
        Err(Rejection::TooFarAhead { time, limit })
    } else {
        Ok(())
    }
}

/// Whether a record at `time` whose id was first seen at `first_seen` is a duplicate: the id
/// is remembered for `retention_ms` of record time.
pub fn is_duplicate(first_seen: Option<i64>, time: i64, retention_ms: i64) -> bool {
    first_seen.is_some_and(|first| (time - first).abs() < retention_ms)
}

/// The sighting a store keeps for an id that was not a duplicate: the later of the one it
/// holds and the record's. A record older than the held sighting by more than the retention
/// is output (it is not a duplicate by the window's rule) but leaves the store as it is.
/// The changelog record written for it carries this time too, so the last changelog record of
/// an id (all compaction keeps) always says what the store holds.
pub fn kept_sighting(first_seen: Option<i64>, time: i64) -> i64 {
    first_seen.map_or(time, |f| f.max(time))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
        header: &'a dyn Fn(&str) -> Option<&'a [u8]>,
    ) -> RecordView<'a> {
        RecordView { key, value, header }
    }

    const NO_HEADERS: &dyn Fn(&str) -> Option<&'static [u8]> = &|_| None;

    #[test]
    fn id_from_key_header_or_json_pointer() {
        let key = DedupId::default();
        assert_eq!(
            extract_id(&view(Some(b"k1"), None, NO_HEADERS), &key, 100),
            Ok(b"k1".to_vec())
        );

        let header = DedupId {
            source: DedupIdSource::Header,
            header: Some("cmd-id".into()),
            json_pointer: None,
        };
        let headers: &dyn Fn(&str) -> Option<&'static [u8]> =
            &|n| (n == "cmd-id").then_some(b"h1".as_slice());
        assert_eq!(
            extract_id(&view(None, None, headers), &header, 100),
            Ok(b"h1".to_vec())
        );

        let pointer = DedupId {
            source: DedupIdSource::JsonPointer,
            header: None,
            json_pointer: Some("/cmd/id".into()),
        };
        let value = br#"{"cmd":{"id":"j1"}}"#;
        assert_eq!(
            extract_id(&view(None, Some(value), NO_HEADERS), &pointer, 100),
            Ok(b"j1".to_vec())
        );
        let numeric = br#"{"cmd":{"id":42}}"#;
        assert_eq!(
            extract_id(&view(None, Some(numeric), NO_HEADERS), &pointer, 100),
            Ok(b"42".to_vec())
        );
    }

    #[test]
    fn bad_records_are_rejected_with_a_reason() {
        let pointer = DedupId {
            source: DedupIdSource::JsonPointer,
            header: None,
            json_pointer: Some("/id".into()),
        };
        assert_eq!(
            extract_id(&view(None, Some(b"{not json"), NO_HEADERS), &pointer, 100)
                .unwrap_err()
                .code(),
            "invalid-json"
        );
        assert_eq!(
            extract_id(
                &view(None, Some(br#"{"other":1}"#), NO_HEADERS),
                &pointer,
                100
            ),
            Err(Rejection::MissingId)
        );
        assert_eq!(
            extract_id(&view(None, None, NO_HEADERS), &DedupId::default(), 100),
            Err(Rejection::MissingId)
        );
        assert_eq!(
            extract_id(&view(Some(b""), None, NO_HEADERS), &DedupId::default(), 100),
            Err(Rejection::MissingId)
        );
        let big: &'static [u8] = &[b'x'; 101];
        assert_eq!(
            extract_id(
                &view(Some(b"k"), Some(big), NO_HEADERS),
                &DedupId::default(),
                100
            ),
            Err(Rejection::ValueTooLarge {
                size: 101,
                max: 100
            })
        );
    }

    #[test]
    fn a_record_stamped_beyond_the_clock_plus_the_skew_is_refused_and_late_ones_are_not() {
        let now = 1_750_000_000_000;
        let skew = 300_000;
        assert_eq!(check_time(now, now, skew), Ok(()));
        assert_eq!(check_time(now + skew, now, skew), Ok(()));
        assert_eq!(
            check_time(now - 86_400_000, now, skew),
            Ok(()),
            "late is fine"
        );
        let century = 100 * 365 * 86_400_000;
        let e = check_time(now + century, now, skew).unwrap_err();
        assert_eq!(e.code(), "timestamp-too-far-ahead");
        assert!(e.detail().contains("maxSkew"), "{}", e.detail());
    }

    #[test]
    fn a_late_first_occurrence_leaves_the_later_sighting_in_place() {
        let hour = 3_600_000;
        assert_eq!(kept_sighting(None, 10), 10);
        assert_eq!(kept_sighting(Some(10 * hour), 12 * hour), 12 * hour);
        assert_eq!(
            kept_sighting(Some(10 * hour), 8 * hour),
            10 * hour,
            "two hours late: output again, but the store and its changelog keep the later one"
        );
    }

    #[test]
    fn duplicates_are_judged_by_record_time_within_the_retention() {
        assert!(!is_duplicate(None, 10, 100));
        assert!(is_duplicate(Some(10), 50, 100));
        assert!(
            is_duplicate(Some(50), 10, 100),
            "out-of-order records inside the window are duplicates too"
        );
        assert!(
            !is_duplicate(Some(10), 110, 100),
            "seen again after the window: processed again"
        );
    }
}
