//! The settings flags of the workloads, each defined once and resolved
//! once (defaults ← config file ← flags ← `--set`): a model family's
//! (`train`, `plan transformer|unet`, `bench plan`) and a fit's (`fit`,
//! `plan splat`, `bench plan-splat`). Commands read the resolved settings,
//! never the raw flags again.

use std::path::{Path, PathBuf};

use anyhow::Result;
use vramfit_gauss::picture::Picture;
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::ModelSettings;
use vramfit_scene::config::SceneConfig;
use vramfit_splat::config::{BUILTIN_SAMPLE, FitConfig};

/// A family's settings as flags (shared by `train` and `plan`).
#[derive(clap::Args)]
pub struct TrainSettings {
    /// TOML file of settings (keys as in a run's config.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Matrix-work precision: f32, bf16 or f16 (f16 uses dynamic loss scaling).
    #[arg(long)]
    precision: Option<String>,
    /// Block activation checkpointing: none, all, every:K, auto (√n), list:I,J.
    #[arg(long)]
    checkpoint: Option<String>,
    /// Samples per forward/backward.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<usize>)]
    micro_batch: Option<usize>,
    /// Micro-batches per optimiser step (micro_batch × accumulate = batch_size).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<usize>)]
    accumulate: Option<usize>,
    /// Samples per optimiser step.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<usize>)]
    batch_size: Option<usize>,
    /// Optimiser steps (e.g. 1000 or 1e3).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<u64>)]
    steps: Option<u64>,
    /// Store a parameter group in low precision, PREFIX:TYPE (repeatable), e.g. token_embedding:bf16, stages:bf16.
    #[arg(long, value_name = "PREFIX:TYPE")]
    storage: Vec<String>,
    /// Adam's moments: f32 or bf16 on the device, or host (f32 in host
    /// memory, updated by the CPU; --device wgpu|cuda).
    #[arg(long)]
    moments: Option<String>,
    /// Allocator cleanup: never, step, every:N.
    #[arg(long)]
    allocator_cleanup: Option<String>,
    /// The transformer's and the llm's attention: standard (the scores kept
    /// for the backward) or fused (recomputed there, never stored). The key
    /// `model.attention`.
    #[arg(long)]
    attention: Option<vramfit::fused::Attention>,
    /// The llm: a published model's shape (tinyllama-1.1b, qwen2-1.5b,
    /// mistral-7b), its settings each overridable with --set model.KEY=VALUE.
    #[arg(long, value_name = "NAME")]
    shape: Option<String>,
    /// The llm: what trains, all (default), lora:RANK (lora:RANK:mlp: the MLP
    /// too), qlora:RANK (lora with the base in NF4) or frozen:GROUP,...
    /// (embedding, head, final_norm, blocks, blocks.I-J). The key `model.train`.
    #[arg(long, value_name = "MODE")]
    train: Option<String>,
    /// The llm under LoRA: how the frozen base is stored, f32, bf16, f16,
    /// nf4 or int8 (quantized in blocks of 64), or search. Not given (or
    /// search), the planner (plan, train --budget) chooses among f32, 16
    /// bits and NF4, lowering it only where nothing fits; a run without a
    /// plan stores it in f32. The key `model.base`.
    #[arg(long, value_name = "TYPE")]
    base: Option<String>,
    /// The llm: start from a safetensors checkpoint in the Hugging Face
    /// layout (a directory with model.safetensors or its index and shards),
    /// checked against the shape. The key `model.weights`.
    #[arg(long, value_name = "DIR")]
    weights: Option<PathBuf>,
    /// The llm: train on this corpus instead of the synthetic task: token
    /// ids (.bin, u16 or u32 as nanoGPT and llm.c write them), plain text
    /// (.txt, documents separated by blank lines) or JSON lines (.jsonl, a
    /// `text` field each), text tokenized with the checkpoint's
    /// tokenizer.json; packed to task.tokens, task.validation of it held out
    /// for validation loss and perplexity. The segmenter: a folder of
    /// `images/` and `masks/` (PNG, same names; square, task.image px). The
    /// key `task.data`.
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// The llm under LoRA: continue from this adapter in PEFT's layout (a
    /// folder with adapter_config.json and adapter_model.safetensors, as
    /// PEFT writes it and as a vramfit LoRA run leaves in its run folder),
    /// of the run's rank and targets. The key `model.adapter`.
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Seed of the weights.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<u64>)]
    seed: Option<u64>,
    /// Data-parallel ranks: N processes share each step's micro-batches and
    /// sum their gradients (through mpirun; a build with --features mpi).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<usize>)]
    ranks: Option<usize>,
    /// With --ranks: shard Adam's moments and the accumulated gradients
    /// over the ranks (ZeRO stage 2; each keeps about 1/N of them; the same
    /// parameters, rounding apart). The key `shard_moments`.
    #[arg(long)]
    shard_moments: bool,
    /// Planning: never lower a setting that costs quality (a video model's
    /// frames, a segmenter's image size, an llm's tokens) to fit; where
    /// nothing fits, say what the asked quality needs. The key `keep_quality`.
    #[arg(long)]
    keep_quality: bool,
    /// Override one setting, KEY=VALUE (dotted keys reach tables: model.width=128) (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl TrainSettings {
    /// The technique flags given (the planner's to set with `--budget`).
    /// `--ranks`, where given.
    pub fn ranks(&self) -> Option<usize> {
        self.ranks
    }

    pub fn techniques_given(&self) -> Vec<&'static str> {
        [
            ("--precision", self.precision.is_some()),
            ("--checkpoint", self.checkpoint.is_some()),
            ("--micro-batch", self.micro_batch.is_some()),
            ("--accumulate", self.accumulate.is_some()),
            ("--storage", !self.storage.is_empty()),
            ("--moments", self.moments.is_some()),
            ("--allocator-cleanup", self.allocator_cleanup.is_some()),
            ("--attention", self.attention.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }
}

/// Resolves defaults ← config file ← flags ← `--set`.
pub fn resolve_train<M: ModelSettings>(a: &TrainSettings) -> Result<FamilyConfig<M>> {
    let mut c = match &a.config {
        Some(path) => FamilyConfig::<M>::load(path)?,
        None => FamilyConfig::<M>::default(),
    };
    let or = |flag: &Option<String>, value: &mut String| {
        if let Some(f) = flag {
            *value = f.clone();
        }
    };
    or(&a.precision, &mut c.precision);
    or(&a.checkpoint, &mut c.checkpoint);
    or(&a.moments, &mut c.moments);
    or(&a.allocator_cleanup, &mut c.allocator_cleanup);
    c.batch_size = a.batch_size.unwrap_or(c.batch_size);
    c.micro_batch = a.micro_batch.unwrap_or(c.micro_batch);
    c.accumulate = a.accumulate.unwrap_or(c.accumulate);
    c.steps = a.steps.unwrap_or(c.steps);
    c.seed = a.seed.unwrap_or(c.seed);
    c.ranks = a.ranks.unwrap_or(c.ranks);
    c.shard_moments |= a.shard_moments;
    c.keep_quality |= a.keep_quality;
    if !a.storage.is_empty() {
        c.storage = a.storage.clone();
    }
    if let Some(name) = &a.shape {
        // Before the user's own --set, which may still override any of it.
        c.model = M::named(name)?;
        c.task = M::named_task(name, c.task);
    }
    let mut sets = a.set.clone();
    // Where the family's LLM settings live (`model`, or the segmenter's `model.llm`).
    let llm = M::LLM_KEY;
    if let Some(train) = &a.train {
        let Some(llm) = llm else {
            anyhow::bail!(
                "--train {train}: `train {}` trains every parameter; LoRA and frozen groups are the llm's and the \
                 segmenter's",
                M::NAME
            );
        };
        // Before the user's own --set, which may still override it.
        sets.insert(0, format!("{llm}.train=\"{train}\""));
    }
    if let Some(base) = &a.base {
        let Some(llm) = llm else {
            anyhow::bail!(
                "--base {base}: `train {}` has no frozen base; a frozen base stored small is the llm's and the \
                 segmenter's",
                M::NAME
            );
        };
        sets.insert(0, format!("{llm}.base={}", serde_json::to_string(base)?));
    }
    if let Some(dir) = &a.weights {
        let Some(llm) = llm else {
            anyhow::bail!(
                "--weights: `train {}` draws its weights; a Hugging Face checkpoint is the llm's and the segmenter's",
                M::NAME
            );
        };
        sets.insert(0, path_set(&format!("{llm}.weights"), dir)?);
        // The checkpoint's own config.json gives the shape, before the
        // user's --set (a --set that then differs from it is refused).
        if dir.is_dir() {
            let given =
                vramfit_models::llama::hf_config::settings(dir).map_err(|why| anyhow::anyhow!("--weights: {why}"))?;
            for s in given.into_iter().rev() {
                // `model.width=…` names the llm's own key.
                let key = s
                    .strip_prefix("model.")
                    .map_or(s.clone(), |rest| format!("{llm}.{rest}"));
                sets.insert(0, key);
            }
        }
    }
    if let Some(data) = &a.data {
        if !matches!(M::NAME, "llm" | "segmenter") {
            anyhow::bail!(
                "--data: `train {}` trains on its synthetic task; a corpus is the llm's, a folder of images and \
                 masks the segmenter's",
                M::NAME
            );
        }
        sets.insert(0, path_set("task.data", data)?);
    }
    if let Some(adapter) = &a.adapter {
        let Some(llm) = llm else {
            anyhow::bail!(
                "--adapter: `train {}` has no adapters; LoRA is the llm's and the segmenter's",
                M::NAME
            );
        };
        sets.insert(0, path_set(&format!("{llm}.adapter"), adapter)?);
    }
    if let Some(attention) = a.attention {
        if M::default().attention().is_none() {
            anyhow::bail!(
                "--attention: `train {}` has no attention layers; it is a setting of the transformer and the llm",
                M::NAME
            );
        }
        // Before the user's own --set, which may still override it.
        sets.insert(0, format!("model.attention={attention}"));
    }
    Ok(vramfit::settings::apply_sets(&c.to_toml(), &sets)?.unwrap_or(c))
}

/// `KEY="PATH"` for `--set`, the path absolute: a resume or an export reads
/// it from wherever it is run. JSON's string escapes are TOML's basic
/// string's.
fn path_set(key: &str, path: &Path) -> Result<String> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(format!(
        "{key}={}",
        serde_json::to_string(&absolute.display().to_string())?
    ))
}

/// A fit's settings as flags (shared by `fit` and `plan splat`).
#[derive(clap::Args)]
pub struct FitSettings {
    /// PNG or JPEG to fit.
    image: Option<PathBuf>,
    /// Final number of Gaussians (e.g. 20000 or 2e4).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<usize>)]
    gaussians: Option<usize>,
    /// Most optimiser steps (e.g. 10000 or 1e4).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<u64>)]
    steps: Option<u64>,
    /// Seed of every random choice.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count::<u64>)]
    seed: Option<u64>,
    /// TOML file of settings (keys as in a run's config.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one setting, KEY=VALUE with a key of config.toml (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// Resolves defaults ← config file ← flags.
pub fn resolve_fit(args: &FitSettings) -> Result<FitConfig> {
    let mut c = match &args.config {
        Some(path) => FitConfig::load(path)?,
        None => FitConfig::default(),
    };
    if let Some(image) = &args.image {
        c.image = image.display().to_string();
    }
    c.gaussians = args.gaussians.unwrap_or(c.gaussians);
    c.steps = args.steps.unwrap_or(c.steps);
    c.seed = args.seed.unwrap_or(c.seed);
    let c = apply_sets(c, &args.set)?;
    // A relative image path from a config file is read from the working
    // directory (as a flag's is); when it is not there, say so.
    if let (Some(config), None) = (&args.config, &args.image) {
        let image = Path::new(&c.image);
        if c.image != BUILTIN_SAMPLE && image.is_relative() && !image.exists() {
            let cwd = std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            let beside = config.parent().map(|d| d.join(image)).filter(|p| p.exists());
            let hint = match beside {
                Some(p) => format!("; there is {} beside the config file: give that path", p.display()),
                None => String::new(),
            };
            anyhow::bail!(
                "image '{}' (from {}) does not exist: a relative path in a config file is read from the working \
                 directory ({cwd}), not from the file's folder{hint}",
                c.image,
                config.display()
            );
        }
    }
    if c.image != BUILTIN_SAMPLE
        && let Ok(true) = Picture::has_alpha(Path::new(&c.image))
    {
        eprintln!("note: {} has an alpha channel; it is ignored (fitted as RGB)", c.image);
    }
    Ok(c)
}

/// Applies `--set KEY=VALUE` overrides; an error names the argument.
pub fn apply_sets(c: FitConfig, sets: &[String]) -> Result<FitConfig> {
    Ok(vramfit::settings::apply_sets(&c.to_toml(), sets)?.unwrap_or(c))
}

/// A count of at most `MOST`, read as [`parse_count`] reads it.
pub fn parse_at_most<const MOST: usize>(s: &str) -> Result<usize, String> {
    let value = parse_count::<usize>(s)?;
    if value > MOST {
        return Err(format!("'{s}' is too large: at most {MOST}"));
    }
    Ok(value)
}

/// A whole number, also written like `2e4` or `1.5e6` (clap puts the flag
/// in front of the message; the settings' checks bound it further).
pub fn parse_count<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let t = s.trim().replace('_', "");
    // Settings files (TOML) hold signed 64-bit integers: a larger value
    // could not be written into the run's config.toml.
    const MOST: u64 = i64::MAX as u64;
    let too_large = || format!("'{s}' is too large: at most {MOST}");
    if t.starts_with('-') && t.len() > 1 {
        return Err(format!("'{s}' is negative: give a whole number, e.g. 20000 or 2e4"));
    }
    let value = match t.parse::<u64>() {
        Ok(v) => v,
        Err(_) => match t.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 && v.fract() == 0.0 => {
                if v >= u64::MAX as f64 {
                    return Err(too_large());
                }
                v as u64
            }
            _ => return Err(format!("'{s}' is not a whole number; write e.g. 20000 or 2e4")),
        },
    };
    if value > MOST {
        return Err(too_large());
    }
    T::try_from(value).map_err(|_| too_large())
}

/// A scene fit's settings, for `vramfit scene` and `vramfit plan scene`.
#[derive(clap::Args)]
pub struct SceneSettings {
    /// A COLMAP text dataset's folder (sparse/0/*.txt and images/), a
    /// NeRF-synthetic one, or a built-in scene: `builtin` (the default) or
    /// `builtin:glossy`.
    dataset: Option<PathBuf>,
    /// Optimiser steps, one view each (e.g. 3000 or 3e3).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<u64>)]
    steps: Option<u64>,
    /// Final SH degree, 0 to 3 (raised from 0 every sh_every steps).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    sh_degree: Option<usize>,
    /// Each view at 1/K of its size (for large photographs).
    #[arg(long, value_name = "K", allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    downscale: Option<usize>,
    /// The most Gaussians the fit may hold: densification never exceeds it
    /// (with a budget: the most the planner may set).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    max_gaussians: Option<usize>,
    /// Where Adam's moments live with --device wgpu|cuda: device, or host
    /// (host memory, updated by the CPU; the same parameters, less device
    /// memory). The config key `moments`.
    #[arg(long)]
    moments: Option<vramfit::optim::Moments>,
    /// How the GPU stores the SH coefficients: f32, or f16/bf16 (rounded
    /// copies of f32 masters kept with --moments host; 96 fewer device bytes
    /// a Gaussian at degree 3). The config key `sh_storage`.
    #[arg(long)]
    sh_storage: Option<vramfit_scene::sh_storage::ShStorage>,
    /// TOML file of settings (keys as in a run's config.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one setting, KEY=VALUE with a key of config.toml (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Planning: let the planner lower the SH degree where the quality it
    /// costs, the most measured on the two built-in scenes, is at most this
    /// (e.g. 0.3dB).
    #[arg(long, value_name = "DB", value_parser = parse_db)]
    allow_quality_loss: Option<f64>,
    /// Planning: the Gaussian counts each variant is probed at (default: a
    /// quarter, a half and all of --max-gaussians, within the device's
    /// largest buffer).
    #[arg(long, value_delimiter = ',')]
    probe_gaussians: Vec<usize>,
}

impl SceneSettings {
    /// The quality cost the planner may take (dB), if allowed.
    pub fn allow_quality_loss(&self) -> Option<f64> {
        self.allow_quality_loss
    }

    /// The counts to probe.
    pub fn probe_gaussians(&self) -> &[usize] {
        &self.probe_gaussians
    }
}

/// `0.3dB`, `0.3 dB` or `0.3`: decibels, 0 or more.
fn parse_db(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let number = t
        .strip_suffix("dB")
        .or_else(|| t.strip_suffix("db"))
        .unwrap_or(t)
        .trim();
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "`{text}` is not a quality loss: give decibels of held-out PSNR, 0 or more, such as 0.3dB"
        )),
    }
}

/// Defaults ← config file ← flags ← `--set`.
pub fn resolve_scene(args: &SceneSettings) -> Result<SceneConfig> {
    let mut c = match &args.config {
        Some(path) => {
            let text = vramfit::files::read::read_text(path, vramfit::files::read::Links::Follow)
                .map_err(|e| anyhow::anyhow!("{}: cannot read it: {e}", path.display()))?;
            SceneConfig::from_toml(&text, path)?
        }
        None => SceneConfig::default(),
    };
    if let Some(d) = &args.dataset {
        c.dataset = d.display().to_string();
    }
    c.steps = args.steps.unwrap_or(c.steps);
    c.sh_degree = args.sh_degree.unwrap_or(c.sh_degree);
    c.max_gaussians = args.max_gaussians.unwrap_or(c.max_gaussians);
    c.downscale = args.downscale.unwrap_or(c.downscale);
    c.moments = args.moments.unwrap_or(c.moments);
    c.sh_storage = args.sh_storage.unwrap_or(c.sh_storage);
    let c = vramfit::settings::apply_sets(&c.to_toml(), &args.set)?.unwrap_or(c);
    if let Some(given) = &args.dataset {
        let name = given.display().to_string();
        if c.dataset != name {
            anyhow::bail!(
                "two datasets: {name} and --set dataset={}: give one (nothing was run)",
                c.dataset
            );
        }
        if c.builtin().is_some() && given.exists() {
            anyhow::bail!(
                "'{name}' names a built-in scene and a folder here: give ./{name} for the folder, or '{name}' with \
                 no folder of that name beside it for the scene"
            );
        }
    }
    Ok(c)
}

/// `WIDTHxHEIGHT` (e.g. `1920x1080`), both positive.
pub(crate) fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("'{s}' is not WIDTHxHEIGHT (e.g. 1920x1080)"))?;
    let parse = |v: &str| v.trim().parse::<u32>().ok().filter(|v| *v > 0);
    match (parse(w), parse(h)) {
        (Some(w), Some(h)) => Ok((w, h)),
        _ => Err(format!("'{s}' is not WIDTHxHEIGHT with positive integers")),
    }
}

/// The files a command's settings read: an output that is one of them, or
/// lies inside one of their folders, is refused (`vramfit::files::outputs`).
pub trait Inputs {
    /// Each input with the flag or key that names it.
    fn inputs(&self) -> Vec<(String, PathBuf)>;
}

/// `model.weights=DIR` (or `weights=`) among `--set`'s.
fn set_paths(set: &[String], keys: &[&str]) -> Vec<(String, PathBuf)> {
    set.iter()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| keys.contains(&k.trim()))
        .map(|(k, v)| (format!("--set {}", k.trim()), PathBuf::from(v.trim().trim_matches('"'))))
        .collect()
}

/// The value of `table.key` in the TOML file `config` (a path it names),
/// where it reads and holds one.
fn config_path(config: &Path, table: &str, key: &str) -> Option<PathBuf> {
    let text = vramfit::files::read::read_text(config, vramfit::files::read::Links::Follow).ok()?;
    let value: toml::Value = toml::from_str(&text).ok()?;
    let v = if table.is_empty() {
        value.get(key)?
    } else {
        value.get(table)?.get(key)?
    };
    v.as_str().filter(|s| !s.is_empty()).map(PathBuf::from)
}

impl Inputs for TrainSettings {
    fn inputs(&self) -> Vec<(String, PathBuf)> {
        let mut out = set_paths(
            &self.set,
            &["model.weights", "model.adapter", "task.data", "task.tokenizer"],
        );
        for (table, key) in [
            ("model", "weights"),
            ("model", "adapter"),
            ("task", "data"),
            ("task", "tokenizer"),
        ] {
            if let Some(p) = self.config.as_deref().and_then(|c| config_path(c, table, key)) {
                out.push((format!("--config's {table}.{key}"), p));
            }
        }
        out.extend(self.data.clone().map(|p| ("--data".into(), p)));
        out.extend(self.adapter.clone().map(|p| ("--adapter".into(), p)));
        out.extend(self.config.clone().map(|p| ("--config".into(), p)));
        out.extend(self.weights.clone().map(|p| ("--weights".into(), p)));
        out
    }
}

impl Inputs for FitSettings {
    fn inputs(&self) -> Vec<(String, PathBuf)> {
        let mut out = set_paths(&self.set, &["image"]);
        out.extend(self.config.clone().map(|p| ("--config".into(), p)));
        out.extend(self.image.clone().map(|p| ("the image".into(), p)));
        out
    }
}

impl Inputs for SceneSettings {
    fn inputs(&self) -> Vec<(String, PathBuf)> {
        let mut out = set_paths(&self.set, &["dataset"]);
        out.extend(self.config.clone().map(|p| ("--config".into(), p)));
        out.extend(self.dataset.clone().map(|p| ("the dataset".into(), p)));
        out
    }
}

/// Refuses writing `output` over or into one of `inputs`, or over a file
/// its owner made read-only: before the work, not after it.
pub fn check_output(output: &Path, inputs: &[(String, PathBuf)]) -> Result<()> {
    let named: Vec<vramfit::files::outputs::Input> = inputs.iter().map(|(f, p)| (f.as_str(), p.as_path())).collect();
    if let Some(why) = vramfit::files::outputs::onto_input(output, &named) {
        anyhow::bail!("{why} (nothing was written)");
    }
    vramfit::files::outputs::read_only(output)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Scene {
        #[command(flatten)]
        settings: SceneSettings,
    }

    fn resolve(args: &[&str]) -> Result<SceneConfig> {
        let parsed = <Scene as clap::Parser>::try_parse_from(std::iter::once("scene").chain(args.iter().copied()))?;
        resolve_scene(&parsed.settings)
    }

    #[test]
    fn a_built_in_scene_is_named_like_a_dataset_and_never_twice() {
        assert_eq!(resolve(&[]).unwrap().dataset, "builtin");
        assert_eq!(resolve(&["builtin:glossy"]).unwrap().dataset, "builtin:glossy");
        assert_eq!(
            resolve(&["--set", "dataset=builtin:glossy"]).unwrap().dataset,
            "builtin:glossy"
        );
        let twice = resolve(&["some/folder", "--set", "dataset=builtin:glossy"]).unwrap_err();
        assert!(twice.to_string().contains("two datasets"), "{twice}");
    }
}
