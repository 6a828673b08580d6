//! LoRA adapters in PEFT's layout, one body on every backend present: an
//! adapter PEFT saved (`tests/golden/*/adapter`, written by
//! `scripts/reference_llama.py`: rank 4, alpha 8, B drawn) read onto its
//! golden checkpoint gives PEFT's logits, loss and every factor's
//! gradient; adapters vramfit writes read back to the same model; adapters
//! that do not fit the run are refused, naming why.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::precision::{Autocast, Precision};
use vramfit_models::data::TokenBatch;
use vramfit_models::llama::{LlamaConfig, hf_config, peft};

use crate::common::by_path;

vramfit::test_backends!(
    a_peft_adapter_gives_the_references_logits_and_gradients,
    adapters_written_in_peft_layout_read_back_to_the_same_model,
);

fn golden(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(arch)
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The golden checkpoint `arch` with PEFT's adapter, under `lora:4`.
fn adapted(arch: &str) -> LlamaConfig {
    let mut config = hf_config::config(&golden(arch)).unwrap();
    config.train = "lora:4".into();
    config.adapter = golden(arch).join("adapter").display().to_string();
    config
}

/// The reference's tokens and targets (`reference.json` beside the checkpoint).
fn reference_batch<B: Backend>(arch: &str, device: &B::Device) -> TokenBatch<B> {
    let reference = json(&golden(arch).join("reference.json"));
    let ints = |key: &str| {
        let rows = reference[key].as_array().unwrap();
        let flat: Vec<i64> = rows
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()))
            .collect();
        let shape = [rows.len(), flat.len() / rows.len()];
        Tensor::<B, 2, Int>::from_data(TensorData::new(flat, shape), device)
    };
    TokenBatch {
        tokens: ints("tokens"),
        targets: ints("targets"),
        frames: None,
        video: None,
    }
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    fn walk(v: &serde_json::Value, out: &mut Vec<f32>) {
        match v {
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            x => out.push(x.as_f64().unwrap() as f32),
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

/// `[rows, cols]` row-major, transposed.
fn transposed(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| v[r * cols + c]))
        .collect()
}

/// Largest |a − b| relative to the largest |b|.
fn gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

/// PEFT's adapter on each golden checkpoint (q, k, v and o; GQA; biases and
/// a tied head): logits within 1e-4 (relative to 1 + |value|), the loss
/// within 1e-5, and the gradient of every factor within 1e-4 of its
/// largest value, after vramfit's layout (`A = A_pᵀ`, `B = 2·B_pᵀ`: alpha 8
/// over rank 4) is undone.
fn a_peft_adapter_gives_the_references_logits_and_gradients<B: AutodiffBackend>() {
    let device = Default::default();
    let ac = Autocast::new(Precision::F32);
    for arch in ["llama", "mistral", "qwen2"] {
        let reference = json(&golden(arch).join("adapter/reference.json"));
        let model = adapted(arch).load::<B>(0, &device).unwrap();
        let batch = reference_batch::<B>(arch, &device);
        let logits: Vec<f32> = model
            .logits(batch.tokens.clone(), &ac)
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap();
        let expected = floats(&reference["logits"]);
        assert_eq!(logits.len(), expected.len(), "{arch}: every logit");
        let worst = logits
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "{arch}: logits differ by {worst:e}");
        let grads = {
            let _graph = vramfit::grads::graph_lock();
            let loss = model.loss(&batch, &ac);
            let value: f32 = loss.clone().into_scalar().elem();
            let expected = reference["loss"].as_f64().unwrap() as f32;
            assert!(
                (value - expected).abs() <= 1e-5 * (1.0 + expected),
                "{arch}: loss {value} against {expected}"
            );
            GradientsParams::from_grads(loss.backward(), &model)
        };
        let ours = by_path(&model, &grads);
        let factors = reference["gradients"].as_object().unwrap();
        assert_eq!(factors.len(), 16, "two factors of four projections in two blocks");
        let mut worst_grad = 0f32;
        for (name, g) in factors {
            // base_model.model.model.layers.I.self_attn.M_proj.lora_F.weight
            let parts: Vec<&str> = name.split('.').collect();
            let (block, module, factor) = (parts[4], parts[6].trim_end_matches("_proj"), parts[7]);
            let shape: Vec<usize> = g["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let peft_grad = floats(&g["values"]);
            let (path, theirs) = match factor {
                // Ours is [in, r] = A_pᵀ: its gradient is theirs transposed.
                "lora_A" => (
                    format!("blocks.{block}.{module}.lora.a"),
                    transposed(&peft_grad, shape[0], shape[1]),
                ),
                // Ours is [r, out] = 2·B_pᵀ: dL/dB_p = 2·(dL/dB)ᵀ.
                _ => (
                    format!("blocks.{block}.{module}.lora.b"),
                    transposed(&peft_grad, shape[0], shape[1])
                        .iter()
                        .map(|x| x / 2.0)
                        .collect(),
                ),
            };
            let mine = ours
                .get(&path)
                .unwrap_or_else(|| panic!("{arch}: no gradient at {path}"));
            let g = gap(mine, &theirs);
            assert!(
                g <= 1e-4,
                "{arch}: {path}'s gradient differs by {g:e} of its largest value"
            );
            worst_grad = worst_grad.max(g);
        }
        eprintln!("{arch}: PEFT's adapter: logits within {worst:e}, gradients within {worst_grad:e}");
    }
}

/// What `peft::export` writes (as a run leaves it) read back with
/// `model.adapter` gives the same model: the same logits to the bit.
fn adapters_written_in_peft_layout_read_back_to_the_same_model<B: AutodiffBackend>() {
    let device = Default::default();
    let ac = Autocast::new(Precision::F32);
    let tmp = tempfile::tempdir().unwrap();
    for arch in ["mistral", "qwen2"] {
        let config = adapted(arch);
        let model = config.load::<B>(0, &device).unwrap();
        let out = tmp.path().join(arch);
        std::fs::create_dir(&out).unwrap();
        for (name, bytes) in peft::export(&model, &config).unwrap() {
            std::fs::write(out.join(name), bytes).unwrap();
        }
        let settings = json(&out.join(peft::CONFIG_FILE));
        assert_eq!(settings["r"], 4);
        assert_eq!(settings["lora_alpha"], 4, "alpha = r: the scale is in B");
        let again = LlamaConfig {
            adapter: out.display().to_string(),
            ..config.clone()
        }
        .load::<B>(0, &device)
        .unwrap();
        let batch = reference_batch::<B>(arch, &device);
        let a: Vec<f32> = model.logits(batch.tokens.clone(), &ac).into_data().to_vec().unwrap();
        let b: Vec<f32> = again.logits(batch.tokens, &ac).into_data().to_vec().unwrap();
        assert!(a == b, "{arch}: the adapter read back gives the same logits");
    }
}

/// An adapter of another rank, other targets or another base shape, a
/// folder without one, DoRA, target modules other than the run's, a rank
/// or alpha that is no number of its kind, and an adapter on a run that
/// trains no adapter: each refused with the reason.
#[test]
fn adapters_that_do_not_fit_the_run_are_refused() {
    let device = Default::default();
    let refused = |config: LlamaConfig| config.load::<Flex>(0, &device).unwrap_err().to_string();
    let e = refused(LlamaConfig {
        train: "lora:8".into(),
        ..adapted("llama")
    });
    assert!(e.contains("rank 4") && e.contains("--train lora:4"), "{e}");
    let e = refused(LlamaConfig {
        train: "lora:4:mlp".into(),
        ..adapted("llama")
    });
    assert!(e.contains("target_modules") && e.contains("gate_proj"), "{e}");
    // Mistral's k and v have 2 heads of 8, Llama's 4.
    let e = refused(LlamaConfig {
        adapter: golden("mistral").join("adapter").display().to_string(),
        ..adapted("llama")
    });
    assert!(e.contains("another base shape"), "{e}");
    let e = refused(LlamaConfig {
        adapter: golden("llama").display().to_string(),
        ..adapted("llama")
    });
    assert!(e.contains("adapter_config.json"), "{e}");
    let tmp = tempfile::tempdir().unwrap();
    let dora = tmp.path();
    let mut settings = json(&golden("llama").join("adapter/adapter_config.json"));
    settings["use_dora"] = true.into();
    std::fs::write(dora.join(peft::CONFIG_FILE), settings.to_string()).unwrap();
    std::fs::copy(
        golden("llama").join("adapter").join(peft::WEIGHTS_FILE),
        dora.join(peft::WEIGHTS_FILE),
    )
    .unwrap();
    let e = refused(LlamaConfig {
        adapter: dora.display().to_string(),
        ..adapted("llama")
    });
    assert!(e.contains("DoRA"), "{e}");
    // Other target modules, and a rank that is not a whole number.
    for (key, value, says) in [
        (
            "target_modules",
            serde_json::json!(["q_proj", "v_proj"]),
            "target_modules is",
        ),
        ("r", serde_json::json!(4.5), "not a rank"),
        ("lora_alpha", serde_json::json!("eight"), "not a positive number"),
    ] {
        let mut settings = json(&golden("llama").join("adapter/adapter_config.json"));
        settings["use_dora"] = false.into();
        settings[key] = value;
        std::fs::write(dora.join(peft::CONFIG_FILE), settings.to_string()).unwrap();
        let e = refused(LlamaConfig {
            adapter: dora.display().to_string(),
            ..adapted("llama")
        });
        assert!(e.contains(says), "{key}: {e}");
    }
    let e = refused(LlamaConfig {
        train: "all".into(),
        ..adapted("llama")
    });
    assert!(e.contains("continues a LoRA run"), "{e}");
}

/// The round trip outside vramfit, run by `scripts/peft-round-trip.sh`
/// (not CI: it needs PyTorch, transformers and PEFT): a vramfit run's
/// adapters, loaded by PEFT onto the same transformers checkpoint, gave
/// the logits in `$VRAMFIT_ROUND_TRIP/peft.json`; vramfit's own logits for
/// the same tokens must agree within 1e-4 (relative to 1 + |value|), and
/// `vramfit export`'s merged checkpoint the logits of PEFT's own merge
/// within 1e-4. The figures go to `$VRAMFIT_ROUND_TRIP/vramfit.json`.
#[test]
#[ignore = "run by scripts/peft-round-trip.sh"]
fn peft_reproduces_vramfits_logits() {
    let Ok(dir) = std::env::var("VRAMFIT_ROUND_TRIP") else {
        panic!("set VRAMFIT_ROUND_TRIP to the folder scripts/peft-round-trip.sh made");
    };
    let dir = Path::new(&dir);
    let peft_out = json(&dir.join("peft.json"));
    let run: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("run/config.toml")).unwrap()).unwrap();
    let mut config = hf_config::config(&dir.join("base")).unwrap();
    config.train = run["model"]["train"].as_str().unwrap().into();
    config.adapter = dir.join("run").display().to_string();
    let device = Default::default();
    let model = config.load::<Flex>(0, &device).unwrap();
    let rows = peft_out["tokens"].as_array().unwrap();
    let flat: Vec<i64> = rows
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()))
        .collect();
    let shape = [rows.len(), flat.len() / rows.len()];
    let tokens = Tensor::<Flex, 2, Int>::from_data(TensorData::new(flat, shape), &device);
    let ours: Vec<f32> = model
        .logits(tokens, &Autocast::new(Precision::F32))
        .into_data()
        .to_vec()
        .unwrap();
    let theirs = floats(&peft_out["logits"]);
    let base = floats(&peft_out["base_logits"]);
    assert_eq!((ours.len(), base.len()), (theirs.len(), theirs.len()), "every logit");
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0f32, f32::max);
    // How far the adapters moved the logits: what the agreement is measured against.
    let moved = base
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let figures = serde_json::json!({
        "logits": ours.len(),
        "largest_relative_difference": worst,
        "largest_change_by_the_adapters": moved,
        "merged_export_against_merge_and_unload": peft_out["export_against_merge_and_unload"],
    });
    std::fs::write(dir.join("vramfit.json"), figures.to_string()).unwrap();
    eprintln!("{figures}");
    assert!(
        moved > 1e-2,
        "the trained adapters change the logits ({moved}): else the check proves little"
    );
    assert!(worst <= 1e-4, "PEFT's logits differ from vramfit's by {worst:e}");
    // `vramfit export`'s merged checkpoint against PEFT's merge_and_unload,
    // both loaded by transformers (the script measured it).
    let export_gap = peft_out["export_against_merge_and_unload"].as_f64().unwrap();
    assert!(
        export_gap <= 1e-4,
        "the merged export's logits differ from PEFT's merge by {export_gap:e}"
    );
}
