//! Byte strings as serde "bytes" rather than sequences of `u8`.
//!
//! Postcard writes both the same way (a varint length, then the bytes),
//! so the wire format is unchanged. But a `Vec<u8>` derived as a sequence
//! costs a serializer call per byte each way, which showed at the top of
//! the spawn path's profile on both sides (a request carries the caller's
//! whole environment). Used as `#[serde(with = "...")]` on the message
//! fields.

use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// Most elements preallocated from a length prefix: a hostile prefix must
/// not reserve memory the frame cannot hold (frames are at most 256 KiB).
const MAX_PREALLOCATED: usize = 4096;

/// One byte string.
pub mod one {
    use super::*;

    /// Serializes `value` as bytes.
    ///
    /// # Errors
    ///
    /// The serializer's.
    pub fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(value)
    }

    /// Deserializes bytes (or, from other formats, a sequence of `u8`).
    ///
    /// # Errors
    ///
    /// The deserializer's.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(ByteBufVisitor)
    }
}

/// An optional byte string.
pub mod optional {
    use super::*;

    /// Serializes `value` as an option of bytes.
    ///
    /// # Errors
    ///
    /// The serializer's.
    pub fn serialize<S: Serializer>(
        value: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => serializer.serialize_some(&AsBytes(bytes)),
            None => serializer.serialize_none(),
        }
    }

    /// Deserializes an option of bytes.
    ///
    /// # Errors
    ///
    /// The deserializer's.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<OwnedBytes>::deserialize(deserializer)?.map(|bytes| bytes.0))
    }
}

/// A list of byte strings.
pub mod list {
    use super::*;

    /// Serializes `value` as a sequence of bytes.
    ///
    /// # Errors
    ///
    /// The serializer's.
    pub fn serialize<S: Serializer>(value: &[Vec<u8>], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(value.len()))?;
        for bytes in value {
            seq.serialize_element(&AsBytes(bytes))?;
        }
        seq.end()
    }

    /// Deserializes a sequence of bytes.
    ///
    /// # Errors
    ///
    /// The deserializer's.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Vec<u8>>, D::Error> {
        deserializer.deserialize_seq(ListVisitor)
    }
}

struct AsBytes<'a>(&'a [u8]);

impl Serialize for AsBytes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

struct OwnedBytes(Vec<u8>);

impl<'de> Deserialize<'de> for OwnedBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        one::deserialize(deserializer).map(OwnedBytes)
    }
}

struct ByteBufVisitor;

impl<'de> Visitor<'de> for ByteBufVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
        Ok(bytes.to_vec())
    }

    fn visit_byte_buf<E>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(bytes)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOCATED));
        while let Some(byte) = seq.next_element()? {
            bytes.push(byte);
        }
        Ok(bytes)
    }
}

struct ListVisitor;

impl<'de> Visitor<'de> for ListVisitor {
    type Value = Vec<Vec<u8>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of byte strings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Vec<u8>>, A::Error> {
        let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOCATED));
        while let Some(OwnedBytes(bytes)) = seq.next_element()? {
            list.push(bytes);
        }
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    /// The same fields, derived the plain way (sequences of `u8`).
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Plain {
        one: Vec<u8>,
        optional: Option<Vec<u8>>,
        list: Vec<Vec<u8>>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct AsBytes {
        #[serde(with = "super::one")]
        one: Vec<u8>,
        #[serde(with = "super::optional")]
        optional: Option<Vec<u8>>,
        #[serde(with = "super::list")]
        list: Vec<Vec<u8>>,
    }

    #[test]
    fn the_wire_format_is_that_of_plain_sequences() {
        for (one, optional, list) in [
            (vec![], None, vec![]),
            (
                b"x=1".to_vec(),
                Some(vec![0xff; 300]),
                vec![vec![], b"a b".to_vec()],
            ),
        ] {
            let plain = Plain {
                one: one.clone(),
                optional: optional.clone(),
                list: list.clone(),
            };
            let bytes = AsBytes {
                one,
                optional,
                list,
            };
            let encoded = postcard::to_stdvec(&bytes).expect("encode");
            assert_eq!(encoded, postcard::to_stdvec(&plain).expect("encode"));
            assert_eq!(
                postcard::from_bytes::<AsBytes>(&encoded).expect("decode"),
                bytes
            );
            assert_eq!(
                postcard::from_bytes::<Plain>(&encoded).expect("decode"),
                plain
            );
        }
    }

    #[test]
    fn a_huge_length_prefix_fails_without_reserving_it() {
        // one = empty, optional = None, list claims 2^35 elements.
        let hostile = [0x00, 0x00, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert!(postcard::from_bytes::<AsBytes>(&hostile).is_err());
    }
}
