//! A checkpoint in the safetensors format, as Hugging Face publishes one
//! (`model.safetensors`, or shards listed by `model.safetensors.index.json`),
//! read one tensor at a time.
//!
//! The format: an 8-byte little-endian header length, a JSON header naming
//! each tensor's dtype, shape and byte range (after the header), the bytes.
//! Every file is untrusted, so opening checks what the format promises
//! before anything is built: each name once, each range as long as its
//! shape's values, the ranges sorted, touching and covering the data
//! exactly (no overlap, no gap, nothing after), every shard an index names
//! inside the checkpoint's folder and a regular file, and the index and its
//! shards agreeing tensor for tensor. A tensor is then read with one seek,
//! never the whole file (a 7B checkpoint is 14 GB), and refused if a value
//! is not finite: the file's fault, named as such.
//!
//! Where a folder holds both `model.safetensors` and an index, the single
//! file is read, as transformers' `from_pretrained` does.
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

use vramfit::files::confine;

/// Why a checkpoint is refused, or a tensor cannot be read: the file (or
/// folder) and the problem.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct HfWeightsError {
    /// The file or folder at fault.
    pub path: PathBuf,
    /// What is wrong.
    pub problem: HfWeightsProblem,
}

/// What is wrong with a checkpoint: the kinds a caller may act on (a path
/// to correct, a file to fetch again, a read to retry) apart; the format's
/// own inconsistencies in words.
#[derive(Debug, thiserror::Error)]
pub enum HfWeightsProblem {
    /// Nothing at the path.
    #[error("no such directory or file: give the directory of a safetensors checkpoint (model.safetensors)")]
    Missing,
    /// A folder with no safetensors file.
    #[error(
        "no *.safetensors file here (a Hugging Face checkpoint has model.safetensors or model.safetensors.index.json)"
    )]
    NoFiles,
    /// A name that leads out of the checkpoint's folder.
    #[error("`{}` {}", .0.name, .0.why)]
    Outside(confine::Outside),
    /// A file the checkpoint needs is a folder, a pipe or a device.
    #[error("it is {0}: a checkpoint's files are regular files")]
    NotRegular(&'static str),
    /// A shard the index lists is missing or not a regular file.
    #[error("the index lists {}, which is {what}: the checkpoint is incomplete or damaged", shard.display())]
    ShardNotRegular {
        /// The shard.
        shard: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// The operating system refused a read.
    #[error("{0}")]
    Io(std::io::Error),
    /// A tensor's bytes could not be read.
    #[error("reading `{name}`: {cause}")]
    Reading {
        /// The tensor.
        name: String,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A tensor the caller asked for is not there.
    #[error("the checkpoint has no tensor `{0}`")]
    NoTensor(String),
    /// A tensor holds NaN or infinities: the file's fault.
    #[error(
        "tensor `{name}` holds {count} value(s) that are not finite (NaN or infinite; the first at index {first}, \
         {value}): the checkpoint file is damaged, not the training; export or download it again"
    )]
    NotFinite {
        /// The tensor.
        name: String,
        /// How many values.
        count: usize,
        /// The first one's index.
        first: usize,
        /// Its value.
        value: f32,
    },
    /// The header, the index or their agreement break the format (a
    /// damaged, truncated or altered file), in words.
    #[error("{0}")]
    Format(String),
}

impl HfWeightsError {
    fn new(path: &Path, problem: HfWeightsProblem) -> Self {
        Self {
            path: path.to_path_buf(),
            problem,
        }
    }

    fn format(path: &Path, why: String) -> Self {
        Self::new(path, HfWeightsProblem::Format(why))
    }
}

/// A safetensors checkpoint's tensors, by name.
#[derive(Debug)]
pub struct HfWeights {
    /// The folder or file it was opened from.
    root: PathBuf,
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

    /// The format's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
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

/// The single-file name, preferred where a folder also has an index.
const SINGLE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
const INDEX: &str = "model.safetensors.index.json";

impl HfWeights {
    /// The checkpoint in `dir` (a directory holding `model.safetensors`,
    /// or `model.safetensors.index.json` and its shards, or other
    /// `*.safetensors` files), or one `.safetensors` file: its headers read
    /// and checked (see the module's text).
    pub fn open(path: &Path) -> Result<Self, HfWeightsError> {
        let (files, index) = files_of(path)?;
        let mut tensors = BTreeMap::new();
        for file in &files {
            for (name, entry) in header(file)? {
                if let Some(before) = tensors.insert(name.clone(), entry) {
                    return Err(HfWeightsError::format(
                        file,
                        format!(
                            "tensor `{name}` is also in {}: one checkpoint, each tensor once",
                            before.file.display()
                        ),
                    ));
                }
            }
        }
        if let Some((index, map)) = index {
            agree(&index, &map, &tensors)?;
        }
        Ok(Self {
            root: path.to_path_buf(),
            tensors,
        })
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

    /// The values of `name` as f32 (bf16 and f16 exactly), row-major; a
    /// value that is not finite is refused as the file's fault.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, HfWeightsError> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| HfWeightsError::new(&self.root, HfWeightsProblem::NoTensor(name.into())))?;
        let count: usize = e.shape.iter().product();
        let mut bytes = vec![0u8; count * e.dtype.size()];
        let mut read = || -> std::io::Result<()> {
            if let Some(what) = confine::not_regular(&e.file) {
                return Err(std::io::Error::other(format!("it is now {what}")));
            }
            let mut f = File::open(&e.file)?;
            f.seek(SeekFrom::Start(e.start))?;
            f.read_exact(&mut bytes)
        };
        let reading = |cause| {
            HfWeightsError::new(
                &e.file,
                HfWeightsProblem::Reading {
                    name: name.into(),
                    cause,
                },
            )
        };
        read().map_err(reading)?;
        let values: Vec<f32> = match e.dtype {
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
        };
        if let Some(first) = values.iter().position(|x| !x.is_finite()) {
            return Err(HfWeightsError::new(
                &e.file,
                HfWeightsProblem::NotFinite {
                    name: name.into(),
                    count: values.iter().filter(|x| !x.is_finite()).count(),
                    first,
                    value: values[first],
                },
            ));
        }
        Ok(values)
    }
}

impl HfWeights {
    /// A fingerprint of the checkpoint: every tensor's name, dtype and
    /// shape, and of its bytes [`SAMPLED`] at its start, middle and end
    /// (FNV-1a, as hex). Cheap for a 7B (some 900 small reads), and a
    /// checkpoint fine-tuned, merged or exported again differs in them: a
    /// resumed run that rebuilds its base from the file checks it is the
    /// one it was trained on. Not a hash of every byte.
    pub fn fingerprint(&self) -> Result<String, HfWeightsError> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |bytes: &[u8]| {
            for &b in bytes {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for (name, e) in &self.tensors {
            mix(name.as_bytes());
            mix(e.dtype.name().as_bytes());
            for d in &e.shape {
                mix(&(*d as u64).to_le_bytes());
            }
            let length = e.shape.iter().product::<usize>() as u64 * e.dtype.size() as u64;
            let take = SAMPLED.min(length);
            let reading = |cause| {
                HfWeightsError::new(
                    &e.file,
                    HfWeightsProblem::Reading {
                        name: name.clone(),
                        cause,
                    },
                )
            };
            let mut f = File::open(&e.file).map_err(reading)?;
            let mut buf = vec![0u8; take as usize];
            for at in [0, (length - take) / 2, length - take] {
                f.seek(SeekFrom::Start(e.start + at))
                    .and_then(|_| f.read_exact(&mut buf))
                    .map_err(reading)?;
                mix(&buf);
            }
        }
        Ok(format!("{h:016x}"))
    }
}

/// Bytes [`HfWeights::fingerprint`] reads at each of three places in a tensor.
pub const SAMPLED: u64 = 256;

/// What a sharded checkpoint's index maps: tensor name to shard path.
type WeightMap = BTreeMap<String, PathBuf>;

/// The folder a checkpoint in `dir` may resolve its files into: `dir`
/// itself, or, for a snapshot in Hugging Face's cache
/// (`models--ORG--NAME/snapshots/REV`, whose files are links to
/// `../../blobs/SHA`), the model's cache folder `models--ORG--NAME`: links
/// into its `blobs/` are the cache's own, a link anywhere else is refused.
pub fn confined_to(dir: &Path) -> PathBuf {
    let snapshot = dir.parent().filter(|p| p.file_name().is_some_and(|n| n == "snapshots"));
    match snapshot.and_then(Path::parent) {
        Some(repo)
            if repo
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("models--")) =>
        {
            repo.to_path_buf()
        }
        _ => dir.to_path_buf(),
    }
}

/// A sharded checkpoint's index file and what it maps.
type Index = (PathBuf, WeightMap);

/// The files of the checkpoint at `path`, and the index with its map
/// where the checkpoint is sharded.
fn files_of(path: &Path) -> Result<(Vec<PathBuf>, Option<Index>), HfWeightsError> {
    let outside = |o| HfWeightsError::new(path, HfWeightsProblem::Outside(o));
    if !path.is_dir() {
        if !path.exists() {
            return Err(HfWeightsError::new(path, HfWeightsProblem::Missing));
        }
        return Ok((vec![regular(path)?], None));
    }
    let single = path.join(SINGLE);
    if single.exists() || single.is_symlink() {
        let file = confine::inside(&confined_to(path), path, SINGLE, "the checkpoint's folder").map_err(outside)?;
        return Ok((vec![regular(&file)?], None));
    }
    let index = path.join(INDEX);
    if index.exists() || index.is_symlink() {
        let index = confine::inside(&confined_to(path), path, INDEX, "the checkpoint's folder").map_err(outside)?;
        let map = weight_map(path, &regular(&index)?)?;
        let mut shards: Vec<PathBuf> = map.values().cloned().collect();
        shards.sort();
        shards.dedup();
        for shard in &shards {
            if let Some(what) = confine::not_regular(shard) {
                return Err(HfWeightsError::new(
                    &index,
                    HfWeightsProblem::ShardNotRegular {
                        shard: shard.clone(),
                        what,
                    },
                ));
            }
        }
        return Ok((shards, Some((index, map))));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| HfWeightsError::new(path, HfWeightsProblem::Io(e)))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".safetensors"))
        .map(|n| {
            let file = confine::inside(&confined_to(path), path, &n, "the checkpoint's folder").map_err(outside)?;
            regular(&file)
        })
        .collect::<Result<_, _>>()?;
    files.sort();
    if files.is_empty() {
        return Err(HfWeightsError::new(path, HfWeightsProblem::NoFiles));
    }
    Ok((files, None))
}

/// `path` if it is a regular file (a FIFO would block the read, a device
/// never end), else why not.
fn regular(path: &Path) -> Result<PathBuf, HfWeightsError> {
    match confine::not_regular(path) {
        None => Ok(path.to_path_buf()),
        Some(what) => Err(HfWeightsError::new(path, HfWeightsProblem::NotRegular(what))),
    }
}

/// The index's `weight_map`: every name a string, every shard inside the
/// checkpoint's folder `dir`.
fn weight_map(dir: &Path, index: &Path) -> Result<WeightMap, HfWeightsError> {
    let at = |why: String| HfWeightsError::format(index, why);
    let io = |e| HfWeightsError::new(index, HfWeightsProblem::Io(e));
    let length = std::fs::metadata(index).map_err(io)?.len();
    if length > MOST_HEADER {
        return Err(at(format!(
            "{length} bytes: more than an index takes ({MOST_HEADER} at most); not a checkpoint index"
        )));
    }
    let text = std::fs::read(index).map_err(io)?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| at(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| at("no `weight_map` object (tensor name → shard file)".into()))?;
    let mut out = WeightMap::new();
    for (name, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| at(format!("`weight_map`'s entry for `{name}` is {shard}, not a file name")))?;
        let file = confine::inside(&confined_to(dir), dir, shard, "the checkpoint's folder").map_err(|o| {
            at(format!(
                "tensor `{name}`'s shard `{}` {}: an index may name only files inside its own folder ({})",
                o.name,
                o.why,
                dir.display()
            ))
        })?;
        out.insert(name.clone(), file);
    }
    if out.is_empty() {
        return Err(at("its `weight_map` is empty: no tensor to read".into()));
    }
    Ok(out)
}

/// The index and the shards' headers agree tensor for tensor: each name
/// the index lists is in the shard it names, and each tensor a shard holds
/// is listed, with that shard.
fn agree(index: &Path, map: &WeightMap, tensors: &BTreeMap<String, Entry>) -> Result<(), HfWeightsError> {
    for (name, shard) in map {
        match tensors.get(name) {
            None => {
                return Err(HfWeightsError::format(
                    index,
                    format!(
                        "the index lists tensor `{name}` in {}, which does not hold it: the index and its shards disagree (an \
                         incomplete or mixed checkpoint)",
                        shard.display()
                    ),
                ));
            }
            Some(e) if &e.file != shard => {
                return Err(HfWeightsError::format(
                    index,
                    format!(
                        "the index lists tensor `{name}` in {}, but {} holds it: the index and its shards disagree",
                        shard.display(),
                        e.file.display()
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    if let Some((name, e)) = tensors.iter().find(|(n, _)| !map.contains_key(*n)) {
        return Err(HfWeightsError::format(
            &e.file,
            format!(
                "this shard holds tensor `{name}`, which {} does not list: the index and its shards disagree",
                index.display()
            ),
        ));
    }
    Ok(())
}

/// A JSON object's entries in file order, duplicates kept (a map would
/// keep only the last of a repeated name, which the format forbids).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, serde_json::Value>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The tensors `file`'s header lists, checked as the module's text says.
fn header(file: &Path) -> Result<Vec<(String, Entry)>, HfWeightsError> {
    let at = |why: String| HfWeightsError::format(file, why);
    let io = |e| HfWeightsError::new(file, HfWeightsProblem::Io(e));
    let mut f = File::open(file).map_err(io)?;
    let length = f.metadata().map_err(io)?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| at(format!("{length} bytes: too short for a safetensors file (truncated?)")))?;
    let n = u64::from_le_bytes(n);
    if n > MOST_HEADER {
        return Err(at(format!(
            "its header says it is {n} bytes long, more than a model's header takes ({MOST_HEADER} at most): not \
             a safetensors file, or a damaged one"
        )));
    }
    if 8 + n > length {
        return Err(at(format!(
            "its header says it is {n} bytes long, but the file has {length} in all: the file is truncated"
        )));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text).map_err(io)?;
    let Entries(json) =
        serde_json::from_slice(&text).map_err(|e| at(format!("its header is not a safetensors header: {e}")))?;
    let data = length - 8 - n;
    let mut out: Vec<(String, Entry, u64)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, v) in json {
        if !seen.insert(name.clone()) {
            return Err(at(format!(
                "tensor `{name}` is named twice in its header: each name once (the format forbids repeats)"
            )));
        }
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
        let numbers = |key: &str| -> Result<Vec<u64>, HfWeightsError> {
            let given = v.get(key).ok_or_else(|| bad(&format!("no `{key}`")))?;
            given
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>())
                .ok_or_else(|| bad(&format!("`{key}` is {given}: not a list of whole numbers ≥ 0")))
        };
        let shape = numbers("shape")?;
        let range = numbers("data_offsets")?;
        let [begin, end] = range[..] else {
            return Err(bad(&format!(
                "`data_offsets` is {range:?}: two numbers, [begin, end], are the format's"
            )));
        };
        if end < begin {
            return Err(bad(&format!("its byte range {begin}..{end} ends before it begins")));
        }
        let count = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let bytes = count.and_then(|c| c.checked_mul(dtype.size() as u64));
        if bytes != Some(end - begin) {
            return Err(bad(&format!(
                "shape {shape:?} of {} is {} bytes, but its byte range {begin}..{end} is {}",
                dtype.name(),
                bytes.map_or("more than 2^64".into(), |b| b.to_string()),
                end - begin
            )));
        }
        if end > data {
            return Err(at(format!(
                "tensor `{name}` ends at byte {end} of the data, which has {data}: the file is truncated"
            )));
        }
        let shape = shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| bad("a dimension too large for this machine"))?;
        let entry = Entry {
            file: file.to_path_buf(),
            dtype,
            shape,
            start: 8 + n + begin,
        };
        out.push((name, entry, end));
    }
    // The ranges in order must touch and cover the data exactly: an overlap
    // reads one tensor's bytes as another's, a gap or a tail is bytes no
    // tensor claims (a damaged or altered file).
    out.sort_by_key(|(_, e, end)| (e.start, *end));
    let mut covered = 0u64;
    let mut last: Option<&str> = None;
    for (name, e, end) in &out {
        let begin = e.start - 8 - n;
        if begin < covered {
            return Err(at(format!(
                "tensor `{name}`'s bytes {begin}..{end} overlap `{}`'s, which end at {covered}: each byte belongs \
                 to one tensor",
                last.unwrap_or("?")
            )));
        }
        if begin > covered {
            return Err(at(format!(
                "bytes {covered}..{begin} of the data, before tensor `{name}`, belong to no tensor: the ranges \
                 must touch (a damaged or altered file)"
            )));
        }
        covered = *end;
        last = Some(name);
    }
    if covered != data {
        return Err(at(format!(
            "{} bytes after the last tensor belong to no tensor (its tensors cover {covered} of the data's {data}): \
             a damaged or altered file",
            data - covered
        )));
    }
    Ok(out.into_iter().map(|(name, e, _)| (name, e)).collect())
}

/// Writes `tensors` (name, shape, f32 values) to `path` as one safetensors
/// file in `dtype` (rounded to nearest even): for tests and for a user's
/// own small checkpoints.
pub fn write(path: &Path, tensors: &[(&str, Vec<usize>, &[f32])], dtype: Dtype) -> std::io::Result<()> {
    vramfit::run::atomic_write(path, &encode(tensors, dtype)?)
}

/// The bytes of one safetensors file of `tensors` in `dtype`.
pub fn encode(tensors: &[(&str, Vec<usize>, &[f32])], dtype: Dtype) -> std::io::Result<Vec<u8>> {
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
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [start, data.len()]}),
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
    Ok(out)
}

#[cfg(test)]
mod tests;
