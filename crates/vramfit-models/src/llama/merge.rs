//! A finished llm run written out as a Hugging Face checkpoint (`vramfit
//! export RUN_DIR --out DIR`): every tensor under transformers' name and
//! layout, a LoRA's adapters merged into their projections (`W + (A·B)ᵀ`,
//! what PEFT's `merge_and_unload` gives), the trained parameters of a full
//! or partly frozen fine-tune in place of the base's, sharded with
//! `model.safetensors.index.json` above a size (Hugging Face's layout), and
//! the base's config.json and tokenizer files beside them.
//!
//! One tensor at a time: each is read from the base checkpoint, merged and
//! written before the next, so a 7B is never whole in memory (the run's
//! `weights.bin` is read whole: a LoRA's is the adapters).

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::TensorData;
use vramfit::run::ArrayFile;

use super::hf_config::{HfConfigError, HfConfigProblem};
use crate::safetensors::{Dtype, HfWeights};

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    /// The weight files, in order (one, or the shards).
    pub shards: Vec<PathBuf>,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub bytes: u64,
    /// Projections an adapter was merged into.
    pub merged: usize,
}

/// Why a run cannot be exported; nothing is left of the new folder.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Not the folder of an llm run.
    #[error("{}: {why}: give the folder of a `vramfit train llm` run", run.display())]
    NotARun {
        /// The folder given.
        run: PathBuf,
        /// What is missing or wrong.
        why: String,
    },
    /// Its `weights.bin` is not there (yet) or cannot be read.
    #[error(
        "{}: {why}: the run has not finished (its weights.bin is written at the end; resume it first)",
        run.display()
    )]
    NotFinished {
        /// The run.
        run: PathBuf,
        /// The reader's error.
        why: String,
    },
    /// The base was drawn from the seed: there is no checkpoint to write into.
    #[error(
        "the run's base was drawn from its seed, not read from a checkpoint: there is no Hugging Face model to \
         write it into (export runs started with --weights DIR)"
    )]
    DrawnBase,
    /// The base's file is not the one the run trained on.
    #[error(
        "the run was trained on a base whose fingerprint was {then}, and {} now gives {now}: the checkpoint was \
         replaced; give back the one the run started from",
        base.display()
    )]
    BaseReplaced {
        /// The base's path.
        base: PathBuf,
        /// The fingerprint the run kept.
        then: String,
        /// The file's now.
        now: String,
    },
    /// The base's files cannot be read, or disagree with the run's shape.
    #[error("the run's base: {0}")]
    Base(String),
    /// The base's safetensors cannot be read.
    #[error("the run's base: {0}")]
    BaseFile(#[from] crate::safetensors::HfWeightsError),
    /// The base's config.json disagrees with the run's shape.
    #[error("the run's base: {0}")]
    BaseConfig(#[from] HfConfigError),
    /// An array of `weights.bin` of another shape than the run's.
    #[error("weights.bin's `{name}` is {got:?} where the run's shape makes it {want:?}: a damaged or altered file")]
    Damaged {
        /// The array.
        name: String,
        /// Its shape.
        got: Vec<usize>,
        /// The run's.
        want: Vec<usize>,
    },
    /// The output is an input, inside one, or already there.
    #[error("{0}")]
    Output(String),
    /// A file could not be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
}

/// The base's files copied beside the weights, where it has them.
const BESIDE: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
];

/// vramfit's parameter path for transformers' tensor `name`, and whether
/// vramfit keeps it transposed (`[in, out]` against `[out, in]`).
fn ours(name: &str) -> Option<(String, bool)> {
    match name {
        "model.embed_tokens.weight" => return Some(("embedding".into(), false)),
        "model.norm.weight" => return Some(("final_norm.weight".into(), false)),
        "lm_head.weight" => return Some(("head".into(), true)),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (i, what) = rest.split_once('.')?;
    let (path, transposed) = match what {
        "input_layernorm.weight" => ("attn_norm.weight".to_string(), false),
        "post_attention_layernorm.weight" => ("mlp_norm.weight".to_string(), false),
        w => {
            let (module, kind) = w.rsplit_once('.')?;
            let short = module.rsplit('.').next()?.strip_suffix("_proj")?;
            (format!("{short}.{kind}"), kind == "weight")
        }
    };
    Some((format!("blocks.{i}.{path}"), transposed))
}

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// Exports the run in `run` (its `config.toml` and `weights.bin`) into the
/// new folder `out` in `dtype` (`None`: the base's own), with shards of at
/// most `shard_bytes` each.
pub fn export(run: &Path, out: &Path, dtype: Option<Dtype>, shard_bytes: u64) -> Result<Exported, ExportError> {
    let not_a_run = |why: String| ExportError::NotARun { run: run.into(), why };
    if !run.join("config.toml").is_file() {
        return Err(not_a_run("not a run folder (it has no config.toml)".into()));
    }
    let text = vramfit::files::read::read_text(&run.join("config.toml"), vramfit::files::read::Links::Refuse)
        .map_err(|e| not_a_run(e.to_string()))?;
    let config = super::LlmConfig::from_toml(&text, &run.join("config.toml"))
        .map_err(|e| not_a_run(format!("{e}: not an llm run's settings")))?
        .model;
    let trained = ArrayFile::read(&run.join("weights.bin")).map_err(|e| ExportError::NotFinished {
        run: run.into(),
        why: e.to_string(),
    })?;
    if config.weights.is_empty() {
        return Err(ExportError::DrawnBase);
    }
    let base = HfWeights::open(Path::new(&config.weights))?;
    // The base the run trained on, not another under its path.
    if let Some(then) = trained.meta.get("rebuilt_fingerprint").and_then(|v| v.as_str()) {
        let now = base.fingerprint()?;
        if now != then {
            return Err(ExportError::BaseReplaced {
                base: config.weights.clone().into(),
                then: then.into(),
                now,
            });
        }
    }
    let folder = Path::new(&config.weights);
    let folder = if folder.is_dir() {
        folder
    } else {
        folder.parent().unwrap_or(folder)
    };
    if let Some(why) = vramfit::files::outputs::onto_input(out, &[("the run", run), ("the run's base", folder)]) {
        return Err(ExportError::Output(why));
    }
    // The files copied beside the weights must still be the base's: its
    // config.json of the run's shape, a tokenizer within its vocabulary.
    if folder.join("config.json").is_file() {
        super::hf_config::check(&config, folder)?;
    }
    if folder.join("tokenizer.json").is_file() {
        crate::corpus::text::tokenizer(&folder.join("tokenizer.json"), config.vocab)
            .map_err(|e| ExportError::Base(e.to_string()))?;
    }
    let dtype = dtype
        .or_else(|| base.dtype("model.embed_tokens.weight"))
        .unwrap_or(Dtype::F32);
    let names = config.hf_tensors();
    // Shards: whole tensors in order, each shard at most `shard_bytes`
    // (a larger tensor alone).
    let mut shards: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new()];
    let mut filled = 0u64;
    let mut total = 0u64;
    for (name, shape) in names {
        let bytes = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
        if filled > 0 && filled + bytes > shard_bytes {
            shards.push(Vec::new());
            filled = 0;
        }
        filled += bytes;
        total += bytes;
        shards.last_mut().expect("one shard at least").push((name, shape));
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| ExportError::Write {
            path: parent.into(),
            source,
        })?;
    }
    std::fs::create_dir(out).map_err(|e| ExportError::Output(format!("{}: {e} (give a new folder)", out.display())))?;
    // The folder is new: what a failure leaves in it goes with it.
    write(out, &config, &base, &trained, &shards, dtype, total).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(out);
    })
}

fn write(
    out: &Path,
    config: &super::LlamaConfig,
    base: &HfWeights,
    trained: &ArrayFile,
    shards: &[Vec<(String, Vec<usize>)>],
    dtype: Dtype,
    total: u64,
) -> Result<Exported, ExportError> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ExportError::Write { path, source }
    };
    let n = shards.len();
    let file_name = |i: usize| {
        if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        }
    };
    let mut done = Exported {
        shards: Vec::new(),
        tensors: 0,
        bytes: total,
        merged: 0,
    };
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let path = out.join(file_name(i));
        let mut header = serde_json::Map::new();
        let mut at = 0usize;
        for (name, shape) in shard {
            let bytes = shape.iter().product::<usize>() * dtype.size();
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [at, at + bytes]}),
            );
            at += bytes;
            weight_map.insert(name.clone(), file_name(i).into());
        }
        let mut head = serde_json::to_vec(&header).map_err(|e| write_err(&path)(std::io::Error::other(e)))?;
        while !head.len().is_multiple_of(8) {
            head.push(b' ');
        }
        let mut failure = None;
        vramfit::run::atomic_write_with(&path, |w| {
            w.write_all(&(head.len() as u64).to_le_bytes())?;
            w.write_all(&head)?;
            for (name, shape) in shard {
                let values = match tensor(name, shape, base, trained) {
                    Ok((v, merged)) => {
                        done.merged += merged as usize;
                        v
                    }
                    Err(e) => {
                        failure = Some(e);
                        return Err(std::io::Error::other("stopped"));
                    }
                };
                let mut bytes = Vec::with_capacity(values.len() * dtype.size());
                for x in values {
                    match dtype {
                        Dtype::F32 => bytes.extend_from_slice(&x.to_le_bytes()),
                        Dtype::F16 => bytes.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                        Dtype::Bf16 => bytes.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
                    }
                }
                w.write_all(&bytes)?;
                done.tensors += 1;
            }
            Ok(())
        })
        .map_err(|e| failure.take().unwrap_or_else(|| write_err(&path)(e)))?;
        done.shards.push(path);
    }
    if n > 1 {
        let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let at = out.join("model.safetensors.index.json");
        let bytes = serde_json::to_vec_pretty(&index).map_err(|e| write_err(&at)(std::io::Error::other(e)))?;
        vramfit::run::atomic_write(&at, &bytes).map_err(write_err(&at))?;
    }
    let folder = Path::new(&config.weights);
    let folder = if folder.is_dir() {
        folder
    } else {
        folder.parent().unwrap_or(folder)
    };
    for name in BESIDE {
        let from = folder.join(name);
        if from.is_file() {
            let mut bytes = vramfit::files::read::read_at_most(&from, vramfit::files::read::Links::Follow, 64 << 20)
                .map_err(|e| ExportError::Base(format!("{}: {e}", from.display())))?;
            if name == "config.json" {
                bytes = with_dtype(&bytes, dtype).map_err(|problem| HfConfigError {
                    file: from.clone(),
                    problem,
                })?;
            }
            vramfit::run::atomic_write(&out.join(name), &bytes).map_err(write_err(&out.join(name)))?;
        }
    }
    Ok(done)
}

/// `config.json` with the weights' type (transformers 5 writes `dtype`,
/// 4.x `torch_dtype`: whichever it has, or `dtype`).
fn with_dtype(bytes: &[u8], dtype: Dtype) -> Result<Vec<u8>, HfConfigProblem> {
    let mut json: serde_json::Value = serde_json::from_slice(bytes).map_err(HfConfigProblem::NotJson)?;
    let name = match dtype {
        Dtype::F32 => "float32",
        Dtype::F16 => "float16",
        Dtype::Bf16 => "bfloat16",
    };
    let object = json.as_object_mut().ok_or(HfConfigProblem::NotObject)?;
    let mut written = false;
    for key in ["dtype", "torch_dtype"] {
        if let Some(v) = object.get_mut(key) {
            *v = name.into();
            written = true;
        }
    }
    if !written {
        object.insert("dtype".into(), name.into());
    }
    let mut out = serde_json::to_vec_pretty(&json).map_err(HfConfigProblem::NotJson)?;
    out.push(b'\n');
    Ok(out)
}

/// Tensor `name` (`shape`, transformers' layout) as the run ends: the
/// trained value where the run wrote one, else the base's, plus the
/// adapter's product where the projection has one. Whether one was merged.
fn tensor(name: &str, shape: &[usize], base: &HfWeights, trained: &ArrayFile) -> Result<(Vec<f32>, bool), ExportError> {
    let (path, transposed) =
        ours(name).ok_or_else(|| ExportError::Base(format!("`{name}`: no parameter of vramfit's Llama")))?;
    let param = |p: &str| trained.arrays.get(&format!("param/{p}"));
    let damaged = |p: &str, got: &[usize], want: &[usize]| ExportError::Damaged {
        name: p.into(),
        got: got.to_vec(),
        want: want.to_vec(),
    };
    let mut values = match param(&path) {
        Some((s, v)) if transposed => {
            let want = [shape[1], shape[0]];
            if s[..] != want {
                return Err(damaged(&path, s, &want));
            }
            transpose(v, want[0], want[1])
        }
        Some((s, v)) if s[..] == *shape => v.clone(),
        Some((s, _)) => return Err(damaged(&path, s, shape)),
        None => base.read_f32(name)?,
    };
    if values.len() != shape.iter().product::<usize>() {
        return Err(ExportError::Base(format!(
            "`{name}` holds {} values, its shape {shape:?} another count",
            values.len()
        )));
    }
    let Some(stem) = path.strip_suffix(".weight") else {
        return Ok((values, false));
    };
    let (Some((sa, a)), Some((sb, b))) = (param(&format!("{stem}.lora.a")), param(&format!("{stem}.lora.b"))) else {
        return Ok((values, false));
    };
    // A: [in, r], B: [r, out], against the projection's [out, in].
    let rank = sa.get(1).copied().unwrap_or(0);
    if sa[..] != [shape[1], rank] {
        return Err(damaged(&format!("{stem}.lora.a"), sa, &[shape[1], rank]));
    }
    if sb[..] != [rank, shape[0]] {
        return Err(damaged(&format!("{stem}.lora.b"), sb, &[rank, shape[0]]));
    }
    // (A·B)ᵀ = Bᵀ·Aᵀ, `[out, in]`, added in f32.
    let device = Default::default();
    let a = Tensor::<Flex, 2>::from_data(TensorData::new(a.clone(), [sa[0], sa[1]]), &device);
    let b = Tensor::<Flex, 2>::from_data(TensorData::new(b.clone(), [sb[0], sb[1]]), &device);
    let product: Vec<f32> = b
        .transpose()
        .matmul(a.transpose())
        .into_data()
        .to_vec()
        .map_err(|e| ExportError::Base(format!("`{name}`'s merged values: {e:?}")))?;
    for (w, d) in values.iter_mut().zip(product) {
        *w += d;
    }
    Ok((values, true))
}
