//! LoRA adapters in PEFT's layout, out and back in: what `vramfit train
//! llm --train lora:R` leaves in its run folder (`adapter_model.safetensors`
//! and `adapter_config.json`, which `PeftModel.from_pretrained(base,
//! RUN_DIR)` loads), and what `--adapter DIR` starts from.
//!
//! PEFT computes `y = x·Wᵀ + s·(x·A_pᵀ)·B_pᵀ` with `lora_A.weight` `[r, in]`,
//! `lora_B.weight` `[out, r]` and `s = lora_alpha / r` (`/ √r` under
//! rsLoRA); vramfit `y = x·W + (x·A)·B` with `A: [in, r]`, `B: [r, out]`.
//! So `A = A_pᵀ` and `B = s·B_pᵀ`; written out, `lora_alpha = r` (s = 1)
//! and the factors transposed: the same function exactly.

use std::path::Path;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::TensorData;

use super::{Llama, LlamaBlock, LlamaConfig, Lora, Proj, Training};
use crate::config::{ConfigError, invalid};

/// The adapter's weights, as PEFT names the file.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The adapter's settings, as PEFT names the file.
pub const CONFIG_FILE: &str = "adapter_config.json";

/// The adapted projections: Hugging Face's module name and the block's field.
type Slot<B> = (&'static str, fn(&mut LlamaBlock<B>) -> &mut Proj<B>);

fn slots<B: Backend>(mlp: bool) -> Vec<Slot<B>> {
    let mut out: Vec<Slot<B>> = vec![
        ("self_attn.q_proj", |b| &mut b.q),
        ("self_attn.k_proj", |b| &mut b.k),
        ("self_attn.v_proj", |b| &mut b.v),
        ("self_attn.o_proj", |b| &mut b.o),
    ];
    if mlp {
        out.extend([
            (
                "mlp.gate_proj",
                (|b| &mut b.gate) as fn(&mut LlamaBlock<B>) -> &mut Proj<B>,
            ),
            ("mlp.up_proj", |b| &mut b.up),
            ("mlp.down_proj", |b| &mut b.down),
        ]);
    }
    out
}

/// The adapted modules' last names, as PEFT's `target_modules` gives them.
fn target_names<B: Backend>(mlp: bool) -> Vec<&'static str> {
    slots::<B>(mlp)
        .iter()
        .map(|(m, _)| m.rsplit('.').next().unwrap_or(m))
        .collect()
}

/// PEFT's name of block `i`'s module `module`'s factor (`lora_A` or `lora_B`).
fn name(i: usize, module: &str, factor: &str) -> String {
    format!("base_model.model.model.layers.{i}.{module}.{factor}.weight")
}

/// The adapter's rank and whether the MLP is adapted, where the run trains one.
fn lora_of(config: &LlamaConfig) -> Option<(usize, bool)> {
    match config.training() {
        Ok(Training::Lora { rank, mlp }) => Some((rank, mlp)),
        _ => None,
    }
}

fn values<B: Backend>(t: Tensor<B, 2>) -> Result<Vec<f32>, std::io::Error> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| std::io::Error::other(format!("{e:?}")))
}

/// The two files of `model`'s adapters (none where the run trains no
/// adapter): the safetensors in f32, and the settings PEFT reads.
pub fn export<B: Backend>(model: &Llama<B>, config: &LlamaConfig) -> Result<Vec<(String, Vec<u8>)>, std::io::Error> {
    let Some((rank, mlp)) = lora_of(config) else {
        return Ok(Vec::new());
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut model_blocks: Vec<LlamaBlock<B>> = model.blocks.clone();
    for (i, block) in model_blocks.iter_mut().enumerate() {
        for (module, field) in slots::<B>(mlp) {
            let p = field(block);
            let Some(lora) = p.lora.as_ref() else {
                continue;
            };
            let a = lora.a.val().transpose(); // [r, in]
            let b = lora.b.val().transpose(); // [out, r]
            let (sa, sb) = (a.dims().to_vec(), b.dims().to_vec());
            tensors.push((name(i, module, "lora_A"), sa, values(a)?));
            tensors.push((name(i, module, "lora_B"), sb, values(b)?));
        }
    }
    let borrowed: Vec<(&str, Vec<usize>, &[f32])> = tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.as_slice()))
        .collect();
    let weights = crate::safetensors::encode(&borrowed, crate::safetensors::Dtype::F32)?;
    let modules = target_names::<B>(mlp);
    // The folder (transformers' and PEFT's from_pretrained take folders).
    let base = std::path::absolute(&config.weights)
        .ok()
        .filter(|_| !config.weights.is_empty())
        .map(|p| {
            if p.is_dir() {
                p
            } else {
                p.parent().map(Path::to_path_buf).unwrap_or(p)
            }
        })
        .map(|p| p.display().to_string());
    let settings = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        // vramfit's B carries the scale: alpha = r makes PEFT's 1.
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "base_model_name_or_path": base,
        "revision": null,
    });
    let mut settings = serde_json::to_vec_pretty(&settings).map_err(std::io::Error::other)?;
    settings.push(b'\n');
    Ok(vec![(WEIGHTS_FILE.into(), weights), (CONFIG_FILE.into(), settings)])
}

/// Reads the PEFT adapter in `dir` onto `model`'s projections, replacing
/// the drawn ones; refused, naming the difference, where it is not an
/// adapter of this run's rank, targets and shapes.
pub fn apply<B: Backend>(
    mut model: Llama<B>,
    dir: &Path,
    config: &LlamaConfig,
    device: &B::Device,
) -> Result<Llama<B>, ConfigError> {
    let bad = |why: String| invalid("model.adapter", format!("{}: {why}", dir.display()));
    let Some((rank, mlp)) = lora_of(config) else {
        return Err(bad(
            "an adapter continues a LoRA run: give --train lora:RANK with it".into()
        ));
    };
    let text = vramfit::files::read::read_at_most(&dir.join(CONFIG_FILE), vramfit::files::read::Links::Follow, 1 << 20)
        .map_err(|e| bad(format!("{CONFIG_FILE}: {e} (a PEFT adapter's folder holds it)")))?;
    let settings: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(format!("{CONFIG_FILE} is not JSON: {e}")))?;
    let field = |key: &str| settings.get(key).cloned().unwrap_or(serde_json::Value::Null);
    if field("peft_type").as_str() != Some("LORA") {
        return Err(bad(format!(
            "{CONFIG_FILE}: peft_type is {}, not LORA",
            field("peft_type")
        )));
    }
    let r = match field("r") {
        serde_json::Value::Null => return Err(bad(format!("{CONFIG_FILE}: no rank `r`"))),
        v => v
            .as_u64()
            .filter(|&r| r > 0)
            .ok_or_else(|| bad(format!("{CONFIG_FILE}: r is {v}, not a rank (a whole number from 1)")))?
            as usize,
    };
    if r != rank {
        return Err(bad(format!(
            "the adapter has rank {r} and this run trains rank {rank}: give --train lora:{r}{}",
            if mlp { ":mlp" } else { "" }
        )));
    }
    for (key, refused) in [
        ("use_dora", "DoRA"),
        ("fan_in_fan_out", "fan-in-fan-out weights (GPT-2's Conv1D)"),
    ] {
        if field(key).as_bool() == Some(true) {
            return Err(bad(format!("{refused} adapters are not vramfit's LoRA")));
        }
    }
    if field("use_qalora").as_bool() == Some(true) {
        return Err(bad("QA-LoRA adapters (use_qalora) are not vramfit's LoRA".into()));
    }
    // The modules it adapts, by their last name (PEFT matches on it).
    let ours: std::collections::BTreeSet<&str> = target_names::<B>(mlp).into_iter().collect();
    let theirs: Option<std::collections::BTreeSet<&str>> = match &settings["target_modules"] {
        serde_json::Value::Array(a) => Some(a.iter().filter_map(|v| v.as_str()).collect()),
        serde_json::Value::String(s) if ours.contains(s.as_str()) => Some([s.as_str()].into()),
        // A regular expression or "all-linear": the tensors below say.
        _ => None,
    };
    if let Some(theirs) = theirs.filter(|t| *t != ours) {
        return Err(bad(format!(
            "target_modules is {theirs:?} and this run adapts {ours:?}{}",
            if !mlp && theirs.contains("gate_proj") {
                " (the MLP's too: --train lora:R:mlp)"
            } else {
                ""
            }
        )));
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if field(key).as_object().is_some_and(|m| !m.is_empty()) {
            return Err(bad(format!(
                "{key}: per-module ranks or alphas are not read; one rank, one alpha"
            )));
        }
    }
    if !matches!(field("modules_to_save"), serde_json::Value::Null)
        && field("modules_to_save").as_array().is_none_or(|a| !a.is_empty())
    {
        return Err(bad(
            "modules_to_save: trained copies of whole modules are not read".into()
        ));
    }
    if !matches!(field("layers_to_transform"), serde_json::Value::Null) {
        return Err(bad("layers_to_transform: vramfit adapts every block".into()));
    }
    let alpha = match field("lora_alpha") {
        // PEFT's default where it is not written.
        serde_json::Value::Null => 8.0,
        v => v
            .as_f64()
            .filter(|a| a.is_finite() && *a > 0.0)
            .ok_or_else(|| bad(format!("{CONFIG_FILE}: lora_alpha is {v}, not a positive number")))?,
    };
    let scale = if field("use_rslora").as_bool() == Some(true) {
        alpha / (r as f64).sqrt()
    } else {
        alpha / r as f64
    };
    let file = crate::safetensors::HfWeights::open(&dir.join(WEIGHTS_FILE)).map_err(|e| bad(e.to_string()))?;
    let mut expected = std::collections::BTreeSet::new();
    let blocks = std::mem::take(&mut model.blocks);
    let mut adapted = Vec::with_capacity(blocks.len());
    for (i, mut block) in blocks.into_iter().enumerate() {
        for (module, field) in slots::<B>(mlp) {
            let p = field(&mut block);
            let [inputs, outputs] = p.dims();
            let mut read = |factor: &str, shape: [usize; 2]| -> Result<Vec<f32>, ConfigError> {
                let n = name(i, module, factor);
                expected.insert(n.clone());
                match file.shape(&n) {
                    Some(s) if s == shape => file.read_f32(&n).map_err(|e| bad(e.to_string())),
                    Some(s) => Err(bad(format!(
                        "`{n}` is {s:?} and this model's is {shape:?}: an adapter of another base shape"
                    ))),
                    None => Err(bad(format!(
                        "it has no `{n}`: an adapter of other target modules (this run adapts {}) or of a model \
                         with fewer blocks",
                        slots::<B>(mlp).iter().map(|(m, _)| *m).collect::<Vec<_>>().join(", ")
                    ))),
                }
            };
            let a = read("lora_A", [r, inputs])?; // [r, in]
            let b = read("lora_B", [outputs, r])?; // [out, r]
            let a = Tensor::<B, 2>::from_data(TensorData::new(a, [r, inputs]), device).transpose();
            let b = Tensor::<B, 2>::from_data(TensorData::new(b, [outputs, r]), device).transpose() * scale;
            p.lora = Some(Lora {
                a: Param::from_tensor(a),
                b: Param::from_tensor(b),
            });
        }
        adapted.push(block);
    }
    model.blocks = adapted;
    if let Some(extra) = file.names().find(|n| !expected.contains(*n)) {
        return Err(bad(format!(
            "it holds `{extra}`, which this run does not adapt: an adapter of other target modules{}",
            if !mlp && extra.contains(".mlp.") {
                " (the MLP's: give --train lora:R:mlp)"
            } else {
                ""
            }
        )));
    }
    Ok(model)
}
