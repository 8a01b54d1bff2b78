//! Kafka-Streams-style `.checkpoint` files: evidence of a clean shutdown, never the source of
//! truth (the store's own offsets are).
//!
//! Format: line 1 the version `0`, line 2 the number of entries, then `topic partition offset`
//! lines. Written to a temporary file, fsynced, renamed over the old one, and the directory
//! fsynced, so a crash leaves either the old file or the new one.

use std::io::Write;
use std::path::Path;

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
    write_atomically(path, text.as_bytes())
}

/// Reads a checkpoint file; `Ok(None)` when there is none. A malformed file is an error.
pub fn read(path: &Path) -> std::io::Result<Option<Vec<CheckpointEntry>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |what: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {what}", path.display()),
        )
    };
    let mut lines = text.lines();
    if lines.next() != Some("0") {
        return Err(bad("unknown checkpoint version"));
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| bad("missing entry count"))?;
    let entries = lines
        .map(|l| {
            let mut parts = l.split_whitespace();
            let (Some(topic), Some(p), Some(o), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("malformed entry"));
            };
            Ok(CheckpointEntry {
                topic: topic.into(),
                partition: p.parse().map_err(|_| bad("malformed partition"))?,
                offset: o.parse().map_err(|_| bad("malformed offset"))?,
            })
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    if entries.len() != count {
        return Err(bad("entry count does not match"));
    }
    Ok(Some(entries))
}

pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// tmp + fsync + rename + directory fsync.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trips_in_kafka_streams_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".checkpoint");
        let entries = vec![
            CheckpointEntry {
                topic: "app-dedup-changelog".into(),
                partition: 3,
                offset: 42,
            },
            CheckpointEntry {
                topic: "in".into(),
                partition: 3,
                offset: 100,
            },
        ];
        write(&path, &entries).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "0\n2\napp-dedup-changelog 3 42\nin 3 100\n"
        );
        assert_eq!(read(&path).unwrap(), Some(entries));
        remove(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
        remove(&path).unwrap();
    }

    #[test]
    fn malformed_checkpoint_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".checkpoint");
        std::fs::write(&path, "0\n2\nt 0 1\n").unwrap();
        assert!(read(&path).is_err());
    }
}
