//! The Llama-family decoder (`train llm`), one body on every backend
//! present: rotary positions keep each pair's length and make q·k depend
//! on the offset only; grouped-query attention is multi-head attention
//! with each key/value head shared by its group; the gradients agree with
//! finite differences of the loss; checkpointed blocks give the plain
//! gradients; the named shapes hold their published parameter counts.

use burn::module::Param;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::backend::AutodiffBackend;
use vramfit::batch::MicroBatching;
use vramfit::checkpoint::CheckpointPolicy;
use vramfit::precision::{Autocast, Precision};
use vramfit_models::data::{SyntheticTask, TaskConfig, TokenBatch};
use vramfit_models::family::ModelSettings;
use vramfit_models::llama::{Llama, LlamaConfig, Training, rotary};

use crate::common::{by_path, relative_gap, stepper};

vramfit::test_backends!(
    rotary_positions_keep_lengths_and_depend_on_offsets_only,
    grouped_query_attention_is_multi_head_attention_with_shared_heads,
    llm_gradients_agree_with_finite_differences,
    llm_checkpointed_gradients_equal_plain_gradients,
    lora_and_frozen_groups_give_gradients_only_to_what_trains,
);

fn tiny(kv_heads: usize) -> LlamaConfig {
    LlamaConfig {
        vocab: 16,
        width: 32,
        depth: 3,
        heads: 4,
        kv_heads,
        ffn: 40,
        context: 16,
        qkv_bias: true,
        ..Default::default()
    }
}

fn batch<B: AutodiffBackend>(config: &LlamaConfig, size: usize) -> TokenBatch<B> {
    let task = SyntheticTask::new(
        TaskConfig {
            tokens: 12,
            ..Default::default()
        },
        config.vocab,
        0,
    );
    task.batch(0, size, &Default::default())
}

fn gradients<B: AutodiffBackend>(model: &Llama<B>, batch: &TokenBatch<B>, ac: &Autocast) -> GradientsParams {
    // As the step does: no other test's backward may sweep this graph mid-build.
    let _graph = vramfit::grads::graph_lock();
    GradientsParams::from_grads(model.loss(batch, ac).backward(), model)
}

fn values<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    x.into_data().convert::<f32>().into_vec().unwrap()
}

/// Each pair keeps its length, and ⟨R(p)q, R(s)k⟩ is the same for (p, s)
/// and (p + 5, s + 5): attention sees the offset, not the position.
fn rotary_positions_keep_lengths_and_depend_on_offsets_only<B: AutodiffBackend>() {
    let device = Default::default();
    let (t, dh) = (12, 8);
    let x = Tensor::<B::InnerBackend, 4>::random([1, 2, t, dh], Distribution::Normal(0.0, 1.0), &device);
    let turned = rotary(x.clone(), 10_000.0);
    let norms = |x: Tensor<B::InnerBackend, 4>| values(x.powi_scalar(2).sum_dim(3));
    for (a, b) in norms(x.clone()).iter().zip(norms(turned.clone())) {
        assert!((a - b).abs() <= 1e-4 * a.max(1.0), "length {a} → {b}");
    }
    assert_eq!(
        values(x.clone().narrow(2, 0, 1)),
        values(turned.clone().narrow(2, 0, 1)),
        "position 0 is not turned"
    );
    // One q and one k, repeated at every position, then turned.
    let q = x.clone().narrow(2, 0, 1).repeat_dim(2, t);
    let k = x.narrow(2, 1, 1).repeat_dim(2, t);
    let (q, k) = (values(rotary(q, 10_000.0)), values(rotary(k, 10_000.0)));
    let dot = |p: usize, s: usize| (0..dh).map(|i| q[p * dh + i] * k[s * dh + i]).sum::<f32>();
    for (p, s) in [(0, 3), (2, 2), (6, 1)] {
        let (near, far) = (dot(p, s), dot(p + 5, s + 5));
        assert!(
            (near - far).abs() <= 1e-4 * near.abs().max(1.0),
            "({p}, {s}): {near} vs {far}"
        );
    }
}

/// A model with 2 key/value heads for 4 query heads gives the loss and
/// the query gradients of a 4-head model whose key and value weights hold
/// each shared head once per query head it serves.
fn grouped_query_attention_is_multi_head_attention_with_shared_heads<B: AutodiffBackend>() {
    let device = Default::default();
    let (grouped_config, full_config) = (tiny(2), tiny(4));
    let grouped = grouped_config.init::<B>(5, &device);
    let mut full = full_config.init::<B>(6, &device);
    let dh = grouped_config.head_width();
    // Head block g along `dim` (kv·dh wide), repeated for its 2 query heads.
    fn repeat<B: Backend, const D: usize>(x: Tensor<B, D>, dim: usize, dh: usize) -> Param<Tensor<B, D>> {
        let blocks: Vec<Tensor<B, D>> = (0..2)
            .flat_map(|g| {
                let block = x.clone().narrow(dim, g * dh, dh);
                [block.clone(), block]
            })
            .collect();
        Param::from_tensor(Tensor::cat(blocks, dim).detach())
    }
    full.embedding = grouped.embedding.clone();
    full.final_norm = grouped.final_norm.clone();
    full.head = grouped.head.clone();
    for (f, g) in full.blocks.iter_mut().zip(&grouped.blocks) {
        f.attn_norm = g.attn_norm.clone();
        f.mlp_norm = g.mlp_norm.clone();
        (f.q, f.o, f.gate, f.up, f.down) = (g.q.clone(), g.o.clone(), g.gate.clone(), g.up.clone(), g.down.clone());
        f.k.weight = repeat(g.k.weight.val(), 1, dh);
        f.v.weight = repeat(g.v.weight.val(), 1, dh);
        f.k.bias = g.k.bias.as_ref().map(|b| repeat(b.val(), 0, dh));
        f.v.bias = g.v.bias.as_ref().map(|b| repeat(b.val(), 0, dh));
    }
    let b = batch::<B>(&grouped_config, 3);
    let ac = Autocast::new(Precision::F32);
    let (lg, lf): (f32, f32) = (
        grouped.loss(&b, &ac).into_scalar().elem(),
        full.loss(&b, &ac).into_scalar().elem(),
    );
    assert!((lg - lf).abs() <= 1e-5 * lg.abs(), "loss {lg} vs {lf}");
    let (gg, gf) = (gradients(&grouped, &b, &ac), gradients(&full, &b, &ac));
    for (a, c) in grouped.blocks.iter().zip(&full.blocks) {
        let (x, y) = (
            values(gg.get::<B::InnerBackend, 2>(a.q.weight.id).unwrap()),
            values(gf.get::<B::InnerBackend, 2>(c.q.weight.id).unwrap()),
        );
        let gap = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
        let scale = x.iter().map(|v| v.abs()).fold(0.0, f32::max);
        assert!(gap <= 1e-4 * scale, "query gradient gap {gap} of {scale}");
    }
}

/// The loss's change along a random direction of every parameter,
/// measured by central differences, against the gradient's projection on
/// it (f32: a step of 1e-2 of the parameters' scale, agreement to 2 %).
fn llm_gradients_agree_with_finite_differences<B: AutodiffBackend>() {
    let device = Default::default();
    let config = tiny(2);
    let model = config.init::<B>(9, &device);
    let b = batch::<B>(&config, 2);
    let ac = Autocast::new(Precision::F32);
    let grads = by_path(&model, &gradients(&model, &b, &ac));
    // A direction: every parameter's value pattern, scaled to the step.
    let flat = |m: &Llama<B>| vramfit::params::snapshot(m);
    let base = flat(&model);
    let mut direction = std::collections::BTreeMap::new();
    let mut projected = 0.0f64;
    for (path, (shape, dtype, v)) in &base {
        let d: Vec<f32> = (0..v.len())
            .map(|i| ((i * 7919 + path.len()) % 13) as f32 / 13.0 - 0.5)
            .collect();
        projected += grads[path].iter().zip(&d).map(|(g, d)| (*g * d) as f64).sum::<f64>();
        direction.insert(path.clone(), (shape.clone(), *dtype, d));
    }
    let step = 1e-2f32;
    let shifted = |sign: f32| {
        let mut moved = base.clone();
        for (path, (_, _, v)) in moved.iter_mut() {
            for (x, d) in v.iter_mut().zip(&direction[path].2) {
                *x += sign * step * d;
            }
        }
        let m = vramfit::params::restore(config.init::<B>(9, &device), &moved).unwrap();
        m.loss(&b, &ac).into_scalar().elem::<f32>() as f64
    };
    let measured = (shifted(1.0) - shifted(-1.0)) / (2.0 * step as f64);
    assert!(
        (measured - projected).abs() <= 2e-2 * projected.abs().max(1e-3),
        "finite differences {measured} vs gradient {projected}"
    );
}

/// Checkpointed blocks recompute exactly what they computed: the plain
/// gradients, for every policy.
fn llm_checkpointed_gradients_equal_plain_gradients<B: AutodiffBackend>() {
    let device = Default::default();
    let config = tiny(2);
    let model = config.init::<B>(3, &device);
    let b = batch::<B>(&config, 4);
    let ac = Autocast::new(Precision::F32);
    let plain = by_path(&model, &gradients(&model, &b, &ac));
    for policy in ["all", "list:1"] {
        let marks = CheckpointPolicy::parse(policy).unwrap().plan(config.depth).unwrap();
        let mut s = stepper::<B>(
            Precision::F32,
            &CheckpointPolicy::parse(policy).unwrap(),
            MicroBatching::whole(4),
            config.depth,
        );
        s.checkpointed = marks;
        let (_, grads) = s.gradients(&model, &b, 1.0, &mut ());
        let gap = relative_gap(&plain, &by_path(&model, &grads));
        assert!(gap <= 1e-6, "{policy}: relative gap {gap}");
    }
}

/// The named shapes hold the parameter counts their models publish, and
/// an unknown name lists the known ones.
#[test]
fn named_shapes_hold_their_published_parameter_counts() {
    for (name, parameters) in [
        ("tinyllama-1.1b", 1_100_048_384u64),
        ("qwen2-1.5b", 1_543_714_304),
        ("mistral-7b", 7_241_732_096),
    ] {
        let config = LlamaConfig::named(name).unwrap();
        assert_eq!(config.parameters(), parameters, "{name}");
        assert!(config.check(&TaskConfig::default()).is_ok(), "{name}");
    }
    let e = LlamaConfig::named("llama-9000").unwrap_err().to_string();
    assert!(
        e.contains("llama-9000") && e.contains("tinyllama-1.1b") && e.contains("mistral-7b"),
        "{e}"
    );
    // The tiny model's count is what it holds.
    let config = tiny(2);
    let model = config.init::<burn::backend::Autodiff<burn::backend::Flex>>(1, &Default::default());
    let held: usize = vramfit::params::snapshot(&model)
        .values()
        .map(|(_, _, v)| v.len())
        .sum();
    assert_eq!(held as u64, config.parameters());
}

/// `lora:4`: the adapted model starts as its base (B is zero) and only the
/// adapters take gradients (q, k, v, o in each block, A and B); `frozen:`
/// groups take none, the rest do.
fn lora_and_frozen_groups_give_gradients_only_to_what_trains<B: AutodiffBackend>() {
    let device = Default::default();
    let base_config = tiny(2);
    let lora_config = LlamaConfig {
        train: "lora:4".into(),
        ..tiny(2)
    };
    let (base, lora) = (base_config.init::<B>(5, &device), lora_config.init::<B>(5, &device));
    let b = batch::<B>(&base_config, 2);
    let ac = Autocast::new(Precision::F32);
    let (lb, ll): (f32, f32) = (
        base.loss(&b, &ac).into_scalar().elem(),
        lora.loss(&b, &ac).into_scalar().elem(),
    );
    assert!(
        (lb - ll).abs() <= 1e-6 * lb.abs(),
        "the adapted model starts as its base: {lb} vs {ll}"
    );
    let grads = by_path(&lora, &gradients(&lora, &b, &ac));
    assert_eq!(grads.len(), 4 * 2 * base_config.depth, "{:?}", grads.keys());
    assert!(grads.keys().all(|k| k.contains(".lora.")), "{:?}", grads.keys());
    let with_mlp = LlamaConfig {
        train: "lora:4:mlp".into(),
        ..tiny(2)
    };
    let m = with_mlp.init::<B>(5, &device);
    assert_eq!(by_path(&m, &gradients(&m, &b, &ac)).len(), 7 * 2 * base_config.depth);

    let frozen_config = LlamaConfig {
        train: "frozen:embedding,blocks.0-1".into(),
        ..tiny(2)
    };
    let frozen = frozen_config.init::<B>(5, &device);
    let grads = by_path(&frozen, &gradients(&frozen, &b, &ac));
    assert!(grads.keys().any(|k| k.starts_with("blocks.2.")), "{:?}", grads.keys());
    assert!(grads.contains_key("head"), "{:?}", grads.keys());
    for k in grads.keys() {
        assert!(
            !(k.starts_with("embedding") || k.starts_with("blocks.0.") || k.starts_with("blocks.1.")),
            "{k} is frozen"
        );
    }
}

/// A training mode that cannot be is refused naming what is wrong.
#[test]
fn training_modes_refuse_what_cannot_be() {
    assert_eq!(
        Training::parse("lora:8", 4, 64).unwrap(),
        Training::Lora { rank: 8, mlp: false }
    );
    assert_eq!(
        Training::parse("frozen:blocks.1-2,head", 4, 64).unwrap(),
        Training::Frozen(vec!["blocks.1".into(), "blocks.2".into(), "head".into()])
    );
    for (mode, says) in [
        ("lora:0", "adapts nothing"),
        ("lora:65", "above the width"),
        ("lora:x", "not a rank"),
        ("lora:4:attn", "only `mlp`"),
        ("frozen:blocks.4", "not a group"),
        ("frozen:decoder", "not a group"),
        ("some", "give all, lora:RANK"),
    ] {
        let e = Training::parse(mode, 4, 64).unwrap_err().to_string();
        assert!(e.contains("model.train") && e.contains(says), "{mode}: {e}");
    }
    let tied = LlamaConfig {
        tie_head: true,
        train: "frozen:head".into(),
        ..Default::default()
    };
    let e = tied.check(&TaskConfig::default()).unwrap_err().to_string();
    assert!(e.contains("freeze `embedding`"), "{e}");
}
