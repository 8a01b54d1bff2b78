//! The value at a JSON pointer (RFC 6901) of a document, found in one pass over its bytes
//! without building the document: the record's id when `dedupId.source` is `JsonPointer`.
//!
//! Only the values along the pointer's path are looked into; every other value is skipped by
//! serde_json's `IgnoredAny`, which still parses it, so a document that is not valid JSON (or
//! has trailing bytes) is refused exactly as parsing it whole would refuse it, with the same
//! error. The answer is the one `serde_json::Value::pointer` gives (of duplicate keys, the last
//! counts; array indexes without leading zeros), which the tests compare it with.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A scalar found at the pointer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scalar {
    String(String),
    /// A number, written as `serde_json::Number` writes it.
    Number(String),
    /// Anything else (`null`, a boolean, an object, an array).
    Other,
}

/// The value at `pointer` in `document`: `Ok(None)` when nothing is there, `Err` when the
/// document is not JSON. An empty pointer is the whole document; one that does not start with
/// `/` points at nothing.
pub fn find(document: &[u8], pointer: &str) -> Result<Option<Scalar>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(document);
    let walk = if pointer.is_empty() {
        Some(Walk { rest: None })
    } else {
        pointer
            .strip_prefix('/')
            .map(|rest| Walk { rest: Some(rest) })
    };
    let found = match walk {
        Some(walk) => walk.deserialize(&mut de)?,
        None => {
            IgnoredAny::deserialize(&mut de)?;
            None
        }
    };
    de.end()?;
    Ok(found)
}

/// Looks for what the rest of the pointer points at in the next value: `None` is that value
/// itself, `Some(rest)` the tokens still to follow (after a `/`).
#[derive(Clone, Copy)]
struct Walk<'p> {
    rest: Option<&'p str>,
}

impl<'p> Walk<'p> {
    fn at_target(&self) -> bool {
        self.rest.is_none()
    }

    /// The next token (unescaped: `~1` is `/`, `~0` is `~`) and the walk after it.
    fn next(&self) -> Option<(Cow<'p, str>, Walk<'p>)> {
        let rest = self.rest?;
        let (token, after) = match rest.split_once('/') {
            Some((token, after)) => (token, Some(after)),
            None => (rest, None),
        };
        let token = if token.contains('~') {
            Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
        } else {
            Cow::Borrowed(token)
        };
        Some((token, Walk { rest: after }))
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Option<Scalar>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Option<Scalar>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.at_target().then(|| Scalar::String(v.to_string())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self
            .at_target()
            .then(|| Scalar::Number(serde_json::Number::from(v).to_string())))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self
            .at_target()
            .then(|| Scalar::Number(serde_json::Number::from(v).to_string())))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(self.at_target().then(|| {
            serde_json::Number::from_f64(v).map_or(Scalar::Other, |n| Scalar::Number(n.to_string()))
        }))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(self.at_target().then_some(Scalar::Other))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(self.at_target().then_some(Scalar::Other))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let Some((token, rest)) = self.next() else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(Some(Scalar::Other));
        };
        let mut found = None;
        while let Some(matches) = map.next_key_seed(KeyIs(&token))? {
            if matches {
                // Of duplicate keys the last counts, as in a parsed document.
                found = map.next_value_seed(rest)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let Some((token, rest)) = self.next() else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Some(Scalar::Other));
        };
        // As serde_json reads an index: digits only, no leading zero.
        let index = (!token.starts_with('+') && (!token.starts_with('0') || token.len() == 1))
            .then(|| token.parse::<usize>().ok())
            .flatten();
        let mut found = None;
        let mut i = 0;
        loop {
            if Some(i) == index {
                match seq.next_element_seed(rest)? {
                    Some(value) => found = value,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }
}

/// Whether the next key is the token, without keeping the key.
struct KeyIs<'t>(&'t str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What parsing the whole document and asking it gives.
    fn parsed(document: &[u8], pointer: &str) -> Result<Option<Scalar>, String> {
        let value: serde_json::Value =
            serde_json::from_slice(document).map_err(|e| e.to_string())?;
        Ok(value.pointer(pointer).map(|v| match v {
            serde_json::Value::String(s) => Scalar::String(s.clone()),
            serde_json::Value::Number(n) => Scalar::Number(n.to_string()),
            _ => Scalar::Other,
        }))
    }

    #[test]
    fn finds_what_the_parsed_document_finds_and_refuses_what_it_refuses() {
        let documents: &[&[u8]] = &[
            br#"{"id":"a-1","seq":7,"payload":"xxxx"}"#,
            br#"{"cmd":{"id":"j1","n":[1,2,{"id":"deep"}]},"id":42}"#,
            br#"{"id":-3}"#,
            br#"{"id":1.5e3}"#,
            br#"{"id":18446744073709551616}"#,
            br#"{"id":"first","id":"last"}"#,
            br#"{"a/b":"slash","m~n":"tilde","":"empty"}"#,
            br#"{"id":null,"b":true,"o":{},"arr":[]}"#,
            br#"[10,"x",{"id":"in-array"}]"#,
            br#"{"esc":"a\"b\\c\u00e9","k\u0069d":"escaped key"}"#,
            br#"  {"id" : "spaced" }  "#,
            br#""just a string""#,
            br#"{not json"#,
            br#"{"id":"x"} trailing"#,
            br#"{"id":"x","rest":[1,2"#,
            br#"{"id":"x","rest":nul}"#,
            b"",
        ];
        let pointers = [
            "",
            "/id",
            "/cmd/id",
            "/cmd/n/2/id",
            "/cmd/n/0",
            "/cmd/n/01",
            "/cmd/n/+1",
            "/cmd/n/9",
            "/a~1b",
            "/m~0n",
            "/",
            "/esc",
            "/kid",
            "/0",
            "/2/id",
            "/id/x",
            "id",
            "/o",
            "/b",
        ];
        for document in documents {
            for pointer in pointers {
                let walked = find(document, pointer).map_err(|e| e.to_string());
                assert_eq!(
                    walked,
                    parsed(document, pointer),
                    "{} at {pointer:?}",
                    String::from_utf8_lossy(document)
                );
            }
        }
    }
}
