//! A child's environment packed in one buffer.
//!
//! On the wire it is a sequence of [`EnvVar`] (a key and a value, each a
//! byte string), exactly as `Vec<EnvVar>` encodes. In memory every
//! variable is `KEY=VALUE\0` in one buffer, which is what `execve(2)`
//! takes: decoding copies each string once, into that buffer, instead of
//! allocating two vectors per variable, and the daemon points `envp`
//! into it instead of building a `CString` per variable. A request
//! carries the caller's whole environment, so this was most of the
//! daemon's allocations per spawn.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

/// One environment variable, as raw bytes: the wire form of each of
/// [`Env`]'s variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    /// Non-empty, without `=` or NUL.
    #[serde(with = "crate::bytes::one")]
    pub key: Vec<u8>,
    /// Without NUL.
    #[serde(with = "crate::bytes::one")]
    pub value: Vec<u8>,
}

/// Variables preallocated from a length prefix: a hostile prefix must not
/// reserve memory the frame cannot hold.
const MAX_PREALLOCATED_VARS: usize = 1024;

/// Bytes reserved per announced variable (a typical `KEY=VALUE\0`).
const BYTES_PER_VAR_GUESS: usize = 64;

/// A whole environment: variables in order, each stored as `KEY=VALUE\0`.
///
/// The key and value are kept as received: nothing here checks that
/// neither holds a NUL (the daemon refuses such requests). A key may be
/// empty or hold `=` (PROTOCOL.md §4.7): [`Env::iter`] gives it back
/// exactly, since the offset of each variable's separating `=` is kept.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// `KEY=VALUE\0` of every variable, one after the other.
    bytes: Vec<u8>,
    /// Per variable: the offset of its `=` and of its NUL in `bytes`.
    ends: Vec<(usize, usize)>,
}

impl Env {
    /// An empty environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty environment with room for `vars` variables taking `bytes`
    /// bytes of keys and values.
    pub fn with_capacity(vars: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes + 2 * vars),
            ends: Vec::with_capacity(vars),
        }
    }

    /// Appends a variable.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        self.bytes.reserve(key.len() + value.len() + 2);
        self.bytes.extend_from_slice(key);
        let eq = self.push_separator();
        self.bytes.extend_from_slice(value);
        self.end_variable(eq);
    }

    /// Ends a key with `=`; returns the `=`'s offset.
    fn push_separator(&mut self) -> usize {
        let eq = self.bytes.len();
        self.bytes.push(b'=');
        eq
    }

    /// Ends the value of the variable whose `=` is at `eq` with its NUL.
    fn end_variable(&mut self, eq: usize) {
        let nul = self.bytes.len();
        self.bytes.push(0);
        self.ends.push((eq, nul));
    }

    /// How many variables.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The variables as `(key, value)`, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8])> + '_ {
        self.spans()
            .map(|(start, eq, nul)| (&self.bytes[start..eq], &self.bytes[eq + 1..nul]))
    }

    /// The variable at `index`, as `(key, value)`.
    pub fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        self.iter().nth(index)
    }

    /// Every variable as `KEY=VALUE\0`, the NUL included: each slice is a
    /// C string, unless a key or value itself holds a NUL.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.spans().map(|(start, _, nul)| &self.bytes[start..=nul])
    }

    fn spans(&self) -> impl ExactSizeIterator<Item = (usize, usize, usize)> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&(eq, nul)| {
            let span = (start, eq, nul);
            start = nul + 1;
            span
        })
    }
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.iter().map(|(key, value)| {
                    (String::from_utf8_lossy(key), String::from_utf8_lossy(value))
                }),
            )
            .finish()
    }
}

impl From<Vec<EnvVar>> for Env {
    fn from(vars: Vec<EnvVar>) -> Self {
        vars.into_iter().collect()
    }
}

impl FromIterator<EnvVar> for Env {
    fn from_iter<I: IntoIterator<Item = EnvVar>>(vars: I) -> Self {
        let mut env = Self::new();
        for var in vars {
            env.push(&var.key, &var.value);
        }
        env
    }
}

impl Serialize for Env {
    /// As `Vec<EnvVar>` serializes.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for (key, value) in self.iter() {
            seq.serialize_element(&VarRef { key, value })?;
        }
        seq.end()
    }
}

/// One variable, serialized as [`EnvVar`] is.
struct VarRef<'a> {
    key: &'a [u8],
    value: &'a [u8],
}

impl Serialize for VarRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut var = serializer.serialize_struct("EnvVar", 2)?;
        var.serialize_field("key", &Bytes(self.key))?;
        var.serialize_field("value", &Bytes(self.value))?;
        var.end()
    }
}

struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

impl<'de> Deserialize<'de> for Env {
    /// As `Vec<EnvVar>` deserializes.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(EnvVisitor)
    }
}

struct EnvVisitor;

impl<'de> Visitor<'de> for EnvVisitor {
    type Value = Env;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of environment variables")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Env, A::Error> {
        let vars = seq.size_hint().unwrap_or(0).min(MAX_PREALLOCATED_VARS);
        let mut env = Env::with_capacity(vars, vars * BYTES_PER_VAR_GUESS);
        while seq.next_element_seed(VarSeed(&mut env))?.is_some() {}
        Ok(env)
    }
}

/// Appends one variable to the environment.
struct VarSeed<'a>(&'a mut Env);

impl<'de> DeserializeSeed<'de> for VarSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_struct("EnvVar", &["key", "value"], self)
    }
}

impl<'de> Visitor<'de> for VarSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an environment variable")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let env = self.0;
        // Undone on error: the environment keeps whole variables only.
        let start = env.bytes.len();
        let parsed = (|| {
            if seq.next_element_seed(Append(&mut env.bytes))?.is_none() {
                return Err(de::Error::invalid_length(0, &"a key and a value"));
            }
            let eq = env.push_separator();
            if seq.next_element_seed(Append(&mut env.bytes))?.is_none() {
                return Err(de::Error::invalid_length(1, &"a key and a value"));
            }
            Ok(eq)
        })();
        match parsed {
            Ok(eq) => {
                env.end_variable(eq);
                Ok(())
            }
            Err(error) => {
                env.bytes.truncate(start);
                Err(error)
            }
        }
    }

    /// Self-describing formats (JSON) give the struct as a map.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut key = None;
        let mut value = None;
        while let Some(field) = map.next_key::<String>()? {
            let mut bytes = Vec::new();
            map.next_value_seed(Append(&mut bytes))?;
            match field.as_str() {
                "key" => key = Some(bytes),
                "value" => value = Some(bytes),
                other => return Err(de::Error::unknown_field(other, &["key", "value"])),
            }
        }
        let key = key.ok_or_else(|| de::Error::missing_field("key"))?;
        let value = value.ok_or_else(|| de::Error::missing_field("value"))?;
        self.0.push(&key, &value);
        Ok(())
    }
}

/// Appends one byte string to a buffer.
struct Append<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_bytes(self)
    }
}

impl<'de> Visitor<'de> for Append<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E>(self, bytes: &[u8]) -> Result<(), E> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(byte) = seq.next_element::<u8>()? {
            self.0.push(byte);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(key: &[u8], value: &[u8]) -> EnvVar {
        EnvVar {
            key: key.to_vec(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn the_wire_format_is_that_of_a_vec_of_env_vars() {
        let vars = vec![
            var(b"PATH", b"/usr/bin"),
            var(b"", b""),
            // Kept exactly, even what the daemon refuses (the NUL).
            var(b"A=B", b"x\0y\xff"),
            var(b"=A", b"B"),
        ];
        let env = Env::from(vars.clone());
        let encoded = postcard::to_stdvec(&env).expect("encode");
        assert_eq!(encoded, postcard::to_stdvec(&vars).expect("encode"));
        let decoded: Env = postcard::from_bytes(&encoded).expect("decode");
        assert_eq!(decoded, env);
        let pairs: Vec<_> = decoded.iter().collect();
        assert_eq!(
            pairs,
            [
                (&b"PATH"[..], &b"/usr/bin"[..]),
                (b"", b""),
                (b"A=B", b"x\0y\xff"),
                (b"=A", b"B")
            ]
        );
        let entries: Vec<_> = decoded.entries().collect();
        assert_eq!(entries[0], b"PATH=/usr/bin\0");
        assert_eq!(entries[1], b"=\0");
        assert_eq!(entries[3], b"=A=B\0");
        let json = serde_json::to_value(&env).expect("JSON");
        assert_eq!(json, serde_json::to_value(&vars).expect("JSON"));
        assert_eq!(serde_json::from_value::<Env>(json).expect("JSON"), env);
    }

    #[test]
    fn a_truncated_or_hostile_sequence_fails() {
        let encoded = postcard::to_stdvec(&vec![var(b"K", b"v")]).expect("encode");
        for end in 0..encoded.len() {
            assert!(postcard::from_bytes::<Env>(&encoded[..end]).is_err());
        }
        // 2^35 variables announced.
        let hostile = [0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert!(postcard::from_bytes::<Env>(&hostile).is_err());
    }
}
