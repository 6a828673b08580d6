//! A small versioned container of named f32 arrays plus JSON metadata; the
//! on-disk form of checkpoints and of fitted Gaussians.
//!
//! Layout (all integers little endian):
//! `b"VRAMFIT\0"`, `u32` format version (1), `u32` header length `L`,
//! `L` bytes of UTF-8 JSON `{"kind", "meta", "arrays": [{"name", "shape"}]}`,
//! each array's f32 values in header order, then a `u64` FNV-1a checksum of
//! every byte before it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::files::fingerprint::Fnv1a;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"VRAMFIT\0";
const VERSION: u32 = 1;

/// Errors reading an array file.
#[derive(Debug, thiserror::Error)]
pub enum ArrayFileError {
    /// The file could not be read.
    #[error("cannot read '{path}': {cause}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The bytes are not a valid file of this format.
    #[error("'{path}' is not a valid vramfit file: {why}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

#[derive(Serialize, Deserialize)]
struct Header {
    kind: String,
    meta: serde_json::Value,
    arrays: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    name: String,
    shape: Vec<usize>,
}

/// Named arrays with a kind tag and free-form metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayFile {
    /// What the file holds, e.g. `"gaussians"` or `"checkpoint"`.
    pub kind: String,
    /// Metadata (sizes, step, settings).
    pub meta: serde_json::Value,
    /// `name → (shape, values)`, kept in insertion order by name.
    pub arrays: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::default();
    h.add(bytes);
    h.0
}

impl ArrayFile {
    /// An empty file of the given kind.
    pub fn new(kind: &str, meta: serde_json::Value) -> Self {
        Self {
            kind: kind.into(),
            meta,
            arrays: BTreeMap::new(),
        }
    }

    /// Adds an array; panics if `values` does not fill `shape` (a caller bug).
    pub fn insert(&mut self, name: &str, shape: Vec<usize>, values: Vec<f32>) {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "array '{name}' does not match its shape"
        );
        self.arrays.insert(name.into(), (shape, values));
    }

    /// The values of an array, if present.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.arrays.get(name).map(|(_, v)| v.as_slice())
    }

    /// Serialises to bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len_bytes());
        self.write_to(&mut out).expect("writing to memory does not fail");
        out
    }

    /// The file's size in bytes.
    fn len_bytes(&self) -> usize {
        32 + 64 * self.arrays.len() + self.arrays.values().map(|(_, v)| v.len() * 4).sum::<usize>()
    }

    /// Writes the file's bytes (those of [`ArrayFile::to_bytes`]) to `w` as
    /// they are made, a slice of values at a time: the file is never whole
    /// in memory beside its arrays (a model's weights and moments at the
    /// end of a run would otherwise be held twice).
    pub fn write_to(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        let header = Header {
            kind: self.kind.clone(),
            meta: self.meta.clone(),
            arrays: self
                .arrays
                .iter()
                .map(|(n, (s, _))| Entry {
                    name: n.clone(),
                    shape: s.clone(),
                })
                .collect(),
        };
        let json = serde_json::to_vec(&header).expect("header is plain data");
        let mut sum = Fnv1a::default();
        let mut put = |w: &mut dyn std::io::Write, bytes: &[u8]| {
            sum.add(bytes);
            w.write_all(bytes)
        };
        put(w, MAGIC)?;
        put(w, &VERSION.to_le_bytes())?;
        put(w, &(json.len() as u32).to_le_bytes())?;
        put(w, &json)?;
        const SLICE: usize = 1 << 14;
        let longest = self.arrays.values().map(|(_, v)| v.len()).max().unwrap_or(0);
        let mut buf = Vec::with_capacity(4 * SLICE.min(longest));
        for (_, values) in self.arrays.values() {
            for part in values.chunks(SLICE) {
                buf.clear();
                buf.extend(part.iter().flat_map(|v| v.to_le_bytes()));
                put(w, &buf)?;
            }
        }
        w.write_all(&sum.0.to_le_bytes())
    }

    /// Parses bytes; `path` only names the source in errors.
    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Self, ArrayFileError> {
        let bad = |why: &str| ArrayFileError::Invalid {
            path: path.into(),
            why: why.into(),
        };
        if bytes.len() < 24 || &bytes[..8] != MAGIC {
            return Err(bad("wrong magic bytes (not written by vramfit)"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if fnv1a(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
            return Err(bad("checksum mismatch (truncated or corrupted)"));
        }
        let version = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(bad(&format!(
                "format version {version}; this build reads version {VERSION}"
            )));
        }
        let len = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes")) as usize;
        let json = body.get(16..16 + len).ok_or_else(|| bad("header runs past the end"))?;
        let header: Header = serde_json::from_slice(json).map_err(|e| bad(&format!("header: {e}")))?;
        let mut at = 16 + len;
        let mut arrays = BTreeMap::new();
        for e in header.arrays {
            // A damaged header can claim any shape: its byte count is checked
            // against the file before anything is allocated.
            let bytes = e
                .shape
                .iter()
                .try_fold(4usize, |n, &d| n.checked_mul(d))
                .and_then(|n| at.checked_add(n).map(|end| (n, end)));
            let Some((_, end)) = bytes else {
                return Err(bad(&format!(
                    "array '{}' has an impossible shape {:?}",
                    e.name, e.shape
                )));
            };
            let raw = body
                .get(at..end)
                .ok_or_else(|| bad(&format!("array '{}' runs past the end", e.name)))?;
            let values = raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            at = end;
            arrays.insert(e.name, (e.shape, values));
        }
        if at != body.len() {
            return Err(bad("trailing bytes after the last array"));
        }
        Ok(Self {
            kind: header.kind,
            meta: header.meta,
            arrays,
        })
    }

    /// Reads a file.
    pub fn read(path: &Path) -> Result<Self, ArrayFileError> {
        let shown = path.display().to_string();
        let bytes =
            crate::files::read::read(path, crate::files::read::Links::Follow).map_err(|cause| ArrayFileError::Io {
                path: shown.clone(),
                cause,
            })?;
        Self::from_bytes(&bytes, &shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ArrayFile {
        let mut f = ArrayFile::new("test", serde_json::json!({ "step": 3 }));
        f.insert("a", vec![2, 2], vec![1.0, -2.0, f32::MAX, 0.5]);
        f.insert("b", vec![0], vec![]);
        f
    }

    #[test]
    fn round_trips() {
        let f = sample();
        assert_eq!(ArrayFile::from_bytes(&f.to_bytes(), "mem").unwrap(), f);
    }

    #[test]
    fn truncation_and_corruption_are_detected() {
        let bytes = sample().to_bytes();
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                ArrayFile::from_bytes(&bytes[..cut], "mem").is_err(),
                "cut at {cut} accepted"
            );
        }
        let mut flipped = bytes.clone();
        flipped[30] ^= 1;
        let err = ArrayFile::from_bytes(&flipped, "mem").unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
    }
}
