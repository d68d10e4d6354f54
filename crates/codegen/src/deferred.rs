//! A part of the registry kept as JSON text until it is first read.

use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// A value deserialized on first use. Read back from JSON it keeps only the text (scanned,
/// never built into values); the first deref parses it. A server's start needs neither the
/// profiles nor the operation inventory, two fifths of the registry's bytes.
pub struct Deferred<T> {
    text: Option<Box<RawValue>>,
    value: OnceLock<T>,
}

impl<T> Deferred<T> {
    /// A value known already (what the build makes).
    pub fn new(value: T) -> Self {
        Self {
            text: None,
            value: OnceLock::from(value),
        }
    }
}

impl<T: DeserializeOwned + Default> Deref for Deferred<T> {
    type Target = T;

    /// Parses the text the first time. The text was written from this very type by the build,
    /// so it parses; were it corrupt, the part reads as empty (the tests read every part).
    fn deref(&self) -> &T {
        self.value.get_or_init(|| {
            self.text
                .as_ref()
                .and_then(|text| serde_json::from_str(text.get()).ok())
                .unwrap_or_default()
        })
    }
}

impl<T: Default> Default for Deferred<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: DeserializeOwned + Default + Clone> Clone for Deferred<T> {
    fn clone(&self) -> Self {
        Self::new((**self).clone())
    }
}

impl<T: DeserializeOwned + Default + fmt::Debug> fmt::Debug for Deferred<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: DeserializeOwned + Default + PartialEq> PartialEq for Deferred<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: DeserializeOwned + Default + Serialize> Serialize for Deferred<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match (self.value.get(), &self.text) {
            (None, Some(text)) => text.serialize(serializer),
            _ => (**self).serialize(serializer),
        }
    }
}

impl<'de, T> Deserialize<'de> for Deferred<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self {
            text: Some(Box::<RawValue>::deserialize(deserializer)?),
            value: OnceLock::new(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Doc {
        head: u32,
        tail: Deferred<BTreeMap<String, Vec<u32>>>,
    }

    #[test]
    fn a_deferred_part_round_trips_and_parses_on_first_read() {
        let doc = Doc {
            head: 1,
            tail: Deferred::new(BTreeMap::from([("a".into(), vec![1, 2])])),
        };
        let text = serde_json::to_string(&doc).unwrap();
        let back: Doc = serde_json::from_str(&text).unwrap();
        assert!(back.tail.value.get().is_none(), "parsed before it was read");
        // Written back unread, it is the same text.
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        assert_eq!(back.tail["a"], vec![1, 2]);
        assert_eq!(back.head, 1);
    }

    #[test]
    fn a_corrupt_part_reads_as_empty_and_its_document_still_parses() {
        let back: Doc = serde_json::from_str(r#"{"head":2,"tail":{"a":"not a list"}}"#).unwrap();
        assert!(back.tail.is_empty());
        assert!(serde_json::from_str::<Doc>(r#"{"head":2,"tail":{"a":"#).is_err());
    }
}
