//! The serde form of [`HelloAck`], whose layout follows its version.
//!
//! postcard writes a struct as its fields in order; the version-1 form
//! stops after `limits`, the version-2 form adds `features`. Deserializing
//! reads the version first and only then decides how many fields follow,
//! so one type reads both. In JSON (the test vectors) the version-1 form
//! has no `features` key.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use crate::message::{HelloAck, Limits};
use crate::version::FEATURES_SINCE;

const FIELDS: &[&str] = &["protocol_version", "server_version", "limits", "features"];

impl Serialize for HelloAck {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let with_features = self.protocol_version >= FEATURES_SINCE;
        let mut state = serializer.serialize_struct("HelloAck", 3 + usize::from(with_features))?;
        state.serialize_field("protocol_version", &self.protocol_version)?;
        state.serialize_field("server_version", &self.server_version)?;
        state.serialize_field("limits", &self.limits)?;
        if with_features {
            state.serialize_field("features", &self.features)?;
        }
        state.end()
    }
}

impl<'de> Deserialize<'de> for HelloAck {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("HelloAck", FIELDS, AckVisitor)
    }
}

struct AckVisitor;

impl<'de> Visitor<'de> for AckVisitor {
    type Value = HelloAck;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a HelloAck")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<HelloAck, A::Error> {
        let missing = |index| de::Error::invalid_length(index, &self);
        let protocol_version: u32 = seq.next_element()?.ok_or_else(|| missing(0))?;
        let server_version = seq.next_element()?.ok_or_else(|| missing(1))?;
        let limits: Limits = seq.next_element()?.ok_or_else(|| missing(2))?;
        let features = if protocol_version >= FEATURES_SINCE {
            seq.next_element()?.ok_or_else(|| missing(3))?
        } else {
            Vec::new()
        };
        Ok(HelloAck {
            protocol_version,
            server_version,
            limits,
            features,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HelloAck, A::Error> {
        let mut protocol_version = None;
        let mut server_version = None;
        let mut limits = None;
        let mut features = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "protocol_version" => protocol_version = Some(map.next_value()?),
                "server_version" => server_version = Some(map.next_value()?),
                "limits" => limits = Some(map.next_value()?),
                "features" => features = Some(map.next_value()?),
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        let protocol_version: u32 =
            protocol_version.ok_or_else(|| de::Error::missing_field("protocol_version"))?;
        let features = match features {
            Some(_) if protocol_version < FEATURES_SINCE => {
                return Err(de::Error::custom("a version-1 HelloAck has no features"));
            }
            Some(features) => features,
            None if protocol_version >= FEATURES_SINCE => {
                return Err(de::Error::missing_field("features"));
            }
            None => Vec::new(),
        };
        Ok(HelloAck {
            protocol_version,
            server_version: server_version
                .ok_or_else(|| de::Error::missing_field("server_version"))?,
            limits: limits.ok_or_else(|| de::Error::missing_field("limits"))?,
            features,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{HelloAck, LIMITS, decode, encode};

    fn ack(protocol_version: u32, features: &[&str]) -> HelloAck {
        HelloAck {
            protocol_version,
            server_version: "0.1.0".to_owned(),
            limits: LIMITS,
            features: features.iter().map(|name| (*name).to_owned()).collect(),
        }
    }

    #[test]
    fn version_1_layout_ends_after_limits() {
        let bytes = encode(&ack(1, &[])).expect("encodes");
        assert_eq!(
            bytes,
            [1, 5, b'0', b'.', b'1', b'.', b'0', 0x80, 0x80, 0x10, 0x40]
        );
        assert_eq!(decode::<HelloAck>(&bytes).expect("decodes"), ack(1, &[]));
    }

    #[test]
    fn version_2_layout_adds_features() {
        let bytes = encode(&ack(2, &["pty"])).expect("encodes");
        assert_eq!(&bytes[..1], [2]);
        assert_eq!(&bytes[11..], [1, 3, b'p', b't', b'y']);
        assert_eq!(
            decode::<HelloAck>(&bytes).expect("decodes"),
            ack(2, &["pty"])
        );
        // A version-2 ack cut after its limits lacks its features.
        assert!(decode::<HelloAck>(&bytes[..11]).is_err());
    }
}
