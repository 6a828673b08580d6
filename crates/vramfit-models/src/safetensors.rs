//! A checkpoint in the safetensors format, as Hugging Face publishes one
//! (`model.safetensors`, or shards listed by `model.safetensors.index.json`),
//! read one tensor at a time.
//!
//! The format: an 8-byte little-endian header length, a JSON header naming
//! each tensor's dtype, shape and byte range (after the header), the bytes.
//! Opening reads only the headers and checks every range against the file's
//! length, so a truncated or inconsistent file is refused before anything
//! is built; a tensor is then read with one seek, never the whole file (a
//! 7B checkpoint is 14 GB).
//!
//! Why not Burn's `burn-store`: the Hugging Face layout needs every name
//! mapped and every projection transposed into this crate's `[in, out]`
//! modules, and its adapters transpose only Burn's own `Linear`; streaming
//! a tensor at a time also keeps the host's peak at one tensor, which the
//! profiler counts on the CPU.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A safetensors checkpoint's tensors, by name.
#[derive(Debug)]
pub struct Checkpoint {
    tensors: BTreeMap<String, Entry>,
}

/// Where one tensor lies.
#[derive(Debug, Clone)]
struct Entry {
    file: PathBuf,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte offset of its first value.
    start: u64,
}

/// The element types read (what Llama-family checkpoints are published in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16 (exact as f32).
    Bf16,
}

impl Dtype {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "F32" => Some(Self::F32),
            "F16" => Some(Self::F16),
            "BF16" => Some(Self::Bf16),
            _ => None,
        }
    }

    /// Bytes a value.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

/// Headers past this are not a model's (the largest published ones are a
/// few hundred KiB); refused before they are read into memory.
const MOST_HEADER: u64 = 100 << 20;

impl Checkpoint {
    /// The checkpoint in `dir` (a directory holding `model.safetensors`,
    /// or `model.safetensors.index.json` and its shards, or other
    /// `*.safetensors` files), or one `.safetensors` file: its headers read
    /// and checked against each file's length.
    pub fn open(path: &Path) -> Result<Self, String> {
        let files = files_of(path)?;
        let mut tensors = BTreeMap::new();
        for file in files {
            for (name, entry) in header(&file)? {
                if let Some(before) = tensors.insert(name.clone(), entry) {
                    return Err(format!(
                        "{}: tensor `{name}` is also in {}: one checkpoint, each tensor once",
                        file.display(),
                        before.file.display()
                    ));
                }
            }
        }
        Ok(Self { tensors })
    }

    /// The names it holds.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The shape of `name`, if held.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.shape.as_slice())
    }

    /// The element type of `name`, if held.
    pub fn dtype(&self, name: &str) -> Option<Dtype> {
        self.tensors.get(name).map(|e| e.dtype)
    }

    /// The values of `name` as f32 (bf16 and f16 exactly), row-major.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, String> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| format!("the checkpoint has no tensor `{name}`"))?;
        let count: usize = e.shape.iter().product();
        let mut bytes = vec![0u8; count * e.dtype.size()];
        let mut read = || -> std::io::Result<()> {
            let mut f = File::open(&e.file)?;
            f.seek(SeekFrom::Start(e.start))?;
            f.read_exact(&mut bytes)
        };
        read().map_err(|err| format!("{}: reading `{name}`: {err}", e.file.display()))?;
        Ok(match e.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }
}

/// The files of the checkpoint at `path`.
fn files_of(path: &Path) -> Result<Vec<PathBuf>, String> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        return Err(format!(
            "{}: no such directory or file: give the directory of a safetensors checkpoint (model.safetensors)",
            path.display()
        ));
    }
    let index = path.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| format!("{}: {e}", index.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", index.display()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| format!("{}: no `weight_map` object", index.display()))?;
        let mut shards: Vec<PathBuf> = map.values().filter_map(|v| v.as_str()).map(|f| path.join(f)).collect();
        shards.sort();
        shards.dedup();
        if let Some(missing) = shards.iter().find(|f| !f.is_file()) {
            return Err(format!(
                "{} lists {}, which is not there: the checkpoint is incomplete",
                index.display(),
                missing.display()
            ));
        }
        return Ok(shards);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!(
            "{}: no *.safetensors file here (a Hugging Face checkpoint has model.safetensors or \
             model.safetensors.index.json)",
            path.display()
        ));
    }
    Ok(files)
}

/// The tensors `file`'s header lists, each range checked against its length.
fn header(file: &Path) -> Result<Vec<(String, Entry)>, String> {
    let at = |why: String| format!("{}: {why}", file.display());
    let mut f = File::open(file).map_err(|e| at(e.to_string()))?;
    let length = f.metadata().map_err(|e| at(e.to_string()))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| at(format!("{length} bytes: too short for a safetensors file (truncated?)")))?;
    let n = u64::from_le_bytes(n);
    if n > MOST_HEADER || 8 + n > length {
        return Err(at(format!(
            "its header says {n} bytes, but the file has {length}: truncated, or not a safetensors file"
        )));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text).map_err(|e| at(e.to_string()))?;
    let json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&text).map_err(|e| at(format!("its header is not a safetensors header: {e}")))?;
    let data = 8 + n;
    let mut out = Vec::new();
    for (name, v) in json {
        if name == "__metadata__" {
            continue;
        }
        let bad = |why: &str| at(format!("tensor `{name}`: {why}"));
        let dtype = v.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
        let dtype = Dtype::parse(dtype).ok_or_else(|| {
            bad(&format!(
                "dtype `{dtype}`: only F32, F16 and BF16 are read (a model's weights)"
            ))
        })?;
        let numbers = |key: &str| -> Option<Vec<u64>> { v.get(key)?.as_array()?.iter().map(|x| x.as_u64()).collect() };
        let shape = numbers("shape").ok_or_else(|| bad("no shape"))?;
        let range = numbers("data_offsets")
            .filter(|r| r.len() == 2)
            .ok_or_else(|| bad("no data_offsets"))?;
        let count = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let bytes = count.and_then(|c| c.checked_mul(dtype.size() as u64));
        if bytes != range[1].checked_sub(range[0]) {
            return Err(bad(&format!(
                "shape {shape:?} of {dtype:?} does not match its byte range {}..{}",
                range[0], range[1]
            )));
        }
        if data + range[1] > length {
            return Err(at(format!(
                "{length} bytes, but tensor `{name}` ends at byte {}: the file is truncated",
                data + range[1]
            )));
        }
        out.push((
            name,
            Entry {
                file: file.to_path_buf(),
                dtype,
                shape: shape.iter().map(|&d| d as usize).collect(),
                start: data + range[0],
            },
        ));
    }
    Ok(out)
}

/// Writes `tensors` (name, shape, f32 values) to `path` as one safetensors
/// file in `dtype` (rounded to nearest even): for tests and for a user's
/// own small checkpoints.
pub fn write(path: &Path, tensors: &[(&str, Vec<usize>, &[f32])], dtype: Dtype) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        for &x in *values {
            match dtype {
                Dtype::F32 => data.extend_from_slice(&x.to_le_bytes()),
                Dtype::F16 => data.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                Dtype::Bf16 => data.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            }
        }
        let name_of = match dtype {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
        };
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": name_of, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut text = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    // Padded to 8 bytes with spaces, as the reference writer does.
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&data);
    vramfit::run::atomic_write(path, &out)
}
