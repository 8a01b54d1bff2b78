//! Kafka-Streams-style `.checkpoint` files: a drain writes one per task once its store is
//! closed, and the processor removes it when the task starts processing again. A checkpoint is
//! evidence of a clean shutdown (the next start replays nothing), never the source of truth:
//! the store's own offsets are.
//!
//! Format: line 1 the version `0`, line 2 the number of entries, then `topic partition offset`
//! lines (the changelog's offset and the input's). Written with
//! [`write_atomically`](super::write_atomically), so a crash leaves either the old file or the
//! new one.

use std::path::Path;

/// One line of a checkpoint: the next offset of a topic partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

pub fn write(path: &Path, entries: &[CheckpointEntry]) -> std::io::Result<()> {
    let mut text = format!("0\n{}\n", entries.len());
    for e in entries {
        text.push_str(&format!("{} {} {}\n", e.topic, e.partition, e.offset));
    }
    super::write_atomically(path, text.as_bytes())
}

/// Reads a checkpoint file; `Ok(None)` when there is none. A malformed file is an error
/// (`InvalidData`, saying what is wrong), not a guess.
pub fn read(path: &Path) -> std::io::Result<Option<Vec<CheckpointEntry>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    parse(&text).map(Some).map_err(|what| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {what}", path.display()),
        )
    })
}

/// A checkpoint file as a reporter sees it: when it was written, and what it says or why it
/// cannot be read. The agent reports the file's age; a file it cannot parse is still a file
/// that is there.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointFile {
    /// Its modification time (Unix ms): when the drain wrote it.
    pub written_at_ms: i64,
    pub entries: Result<Vec<CheckpointEntry>, String>,
}

impl CheckpointFile {
    /// The file at `path`, or `None` when there is none.
    pub fn read(path: &Path) -> Option<CheckpointFile> {
        let meta = std::fs::metadata(path).ok()?;
        let entries = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| parse(&t));
        Some(CheckpointFile {
            written_at_ms: super::modified_ms(&meta).unwrap_or_default(),
            entries,
        })
    }
}

/// The entries of a checkpoint's text, or what is wrong with it.
pub fn parse(text: &str) -> Result<Vec<CheckpointEntry>, String> {
    let mut lines = text.lines();
    if lines.next() != Some("0") {
        return Err("unknown checkpoint version".into());
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or("missing entry count")?;
    let entries = lines
        .map(|l| {
            let mut parts = l.split_whitespace();
            let (Some(topic), Some(p), Some(o), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(format!("malformed entry {l:?}"));
            };
            Ok(CheckpointEntry {
                topic: topic.into(),
                partition: p
                    .parse()
                    .map_err(|_| format!("malformed partition in {l:?}"))?,
                offset: o
                    .parse()
                    .map_err(|_| format!("malformed offset in {l:?}"))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if entries.len() != count {
        return Err(format!("says {count} entries, has {}", entries.len()));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_volume::{StateDir, remove_if_present};

    fn entry(topic: &str, partition: i32, offset: i64) -> CheckpointEntry {
        CheckpointEntry {
            topic: topic.into(),
            partition,
            offset,
        }
    }

    #[test]
    fn checkpoint_round_trips_in_kafka_streams_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = StateDir::new(dir.path(), None).checkpoint_file(3);
        let entries = vec![entry("app-dedup-changelog", 3, 42), entry("in", 3, 100)];
        write(&path, &entries).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "0\n2\napp-dedup-changelog 3 42\nin 3 100\n"
        );
        assert_eq!(read(&path).unwrap(), Some(entries));
        remove_if_present(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
    }

    #[test]
    fn malformed_checkpoint_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".checkpoint");
        std::fs::write(&path, "0\n2\nt 0 1\n").unwrap();
        let e = read(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("says 2 entries, has 1"), "{e}");
    }

    #[test]
    fn malformed_checkpoints_say_what_is_wrong() {
        assert_eq!(parse("1\n0\n"), Err("unknown checkpoint version".into()));
        assert_eq!(parse("0\n"), Err("missing entry count".into()));
        assert_eq!(parse("0\n2\nt 0 1\n"), Err("says 2 entries, has 1".into()));
        assert!(parse("0\n1\nt zero 1\n").unwrap_err().contains("partition"));
        assert!(parse("0\n1\nt 0 one\n").unwrap_err().contains("offset"));
        assert!(parse("0\n1\nt 0 1 extra\n").unwrap_err().contains("entry"));
        assert_eq!(parse("0\n0\n"), Ok(vec![]));
    }

    #[test]
    fn a_reporter_sees_when_the_checkpoint_was_written_and_why_it_does_not_parse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".checkpoint");
        assert_eq!(CheckpointFile::read(&path), None, "no checkpoint");
        write(&path, &[entry("app-changelog", 0, 42)]).unwrap();
        let file = CheckpointFile::read(&path).unwrap();
        assert!(file.written_at_ms > 0);
        assert_eq!(file.entries, Ok(vec![entry("app-changelog", 0, 42)]));
        std::fs::write(&path, "1\n0\n").unwrap();
        let file = CheckpointFile::read(&path).unwrap();
        assert_eq!(file.entries, Err("unknown checkpoint version".into()));
    }
}
