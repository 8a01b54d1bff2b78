//! What one changelog record says about a store, decoded once for the restore and the
//! standbys alike.

use std::sync::Arc;

use crate::store::Sighting;

/// What one changelog record says about the store.
#[derive(Debug, PartialEq, Eq)]
pub enum ChangelogRecord<'m> {
    /// The id (the key) was first seen as the value says ([`Sighting`]: its time and, from
    /// processors since store format 2, its source), as the processor writes it.
    Sighting { id: &'m [u8], sighting: Sighting },
    /// A key without a value: forget the id. The processor never writes one; an operator may,
    /// by hand, to make a store rebuilt from the changelog (a restore, a standby) forget an id.
    Tombstone { id: &'m [u8] },
    /// Not a record this processor wrote or understands: skipped and counted, never a reason
    /// to stop restoring (every pod restoring the partition would stop at it).
    Undecodable(&'static str),
}

impl<'m> ChangelogRecord<'m> {
    /// `known_topic`: a source topic to share instead of allocating it again.
    pub fn of(
        key: Option<&'m [u8]>,
        value: Option<&'m [u8]>,
        known_topic: Option<&Arc<str>>,
    ) -> Self {
        let Some(id) = key.filter(|k| !k.is_empty()) else {
            return ChangelogRecord::Undecodable("a record without a key");
        };
        match value {
            None => ChangelogRecord::Tombstone { id },
            Some(v) => match Sighting::decode(v, known_topic) {
                Some(sighting) => ChangelogRecord::Sighting { id, sighting },
                None => ChangelogRecord::Undecodable(
                    "a value that is not a sighting (an 8-byte time, with or without a source)",
                ),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sightings_tombstones_and_what_cannot_be_read() {
        let time = 1_750_000_000_123_i64.to_be_bytes();
        assert_eq!(
            ChangelogRecord::of(Some(b"x"), Some(&time), None),
            ChangelogRecord::Sighting {
                id: b"x",
                sighting: Sighting::at(1_750_000_000_123)
            },
            "a record of a processor before store format 2: no source"
        );
        let with_source = Sighting {
            time: 5,
            source: Some(crate::store::Source {
                topic: Arc::from("orders"),
                partition: 2,
                offset: 99,
            }),
        };
        assert_eq!(
            ChangelogRecord::of(Some(b"x"), Some(&with_source.to_vec()), None),
            ChangelogRecord::Sighting {
                id: b"x",
                sighting: with_source
            }
        );
        assert_eq!(
            ChangelogRecord::of(Some(b"x"), None, None),
            ChangelogRecord::Tombstone { id: b"x" }
        );
        for (key, value) in [
            (None, Some(time.as_slice())),
            (Some(b"".as_slice()), Some(time.as_slice())),
            (Some(b"x".as_slice()), Some(b"".as_slice())),
            (Some(b"x".as_slice()), Some(b"1750000000123".as_slice())),
        ] {
            assert!(
                matches!(
                    ChangelogRecord::of(key, value, None),
                    ChangelogRecord::Undecodable(_)
                ),
                "{key:?} {value:?}"
            );
        }
    }
}
