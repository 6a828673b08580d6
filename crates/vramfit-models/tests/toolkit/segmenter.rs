//! The segmenter (`train segmenter`), one body on every backend present:
//! the image encoder's and the mask decoder's gradients agree with finite
//! differences of the loss; checkpointed links (the chain starts from a
//! stack: the prompt beside the image tokens) give the plain gradients; a
//! small one learns the synthetic masks (the loss falls, the held-out Dice
//! rises); the named shape holds the parameters its settings count; bad
//! settings are refused by name.

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::activation_checkpointing::CheckpointPolicy;
use vramfit::batch::MicroBatching;
use vramfit::precision::{Autocast, Precision};
use vramfit::step::Trainable;
use vramfit_models::family::{Family, ModelSettings};
use vramfit_models::segmenter::{SegBatch, Segmenter, SegmenterConfig, SegmenterTask};

use crate::common::{by_path, relative_gap, stepper};

vramfit::test_backends!(
    encoder_and_decoder_gradients_agree_with_finite_differences,
    checkpointed_links_give_the_plain_gradients,
);

fn tiny() -> (SegmenterConfig, SegmenterTask) {
    (SegmenterConfig::default(), SegmenterTask::default())
}

fn batch<B: AutodiffBackend>(config: &SegmenterConfig, task: &SegmenterTask, step: u64, size: usize) -> SegBatch<B> {
    config.data(task).unwrap().batch(step, size, &Default::default())
}

fn gradients<B: AutodiffBackend>(model: &Segmenter<B>, batch: &SegBatch<B>, ac: &Autocast) -> GradientsParams {
    let _graph = vramfit::grads::graph_lock();
    GradientsParams::from_grads(model.loss(batch, ac).backward(), model)
}

/// Along a direction over the parameters `part` picks (by path), the
/// loss's central difference against the gradient's projection (f32, a
/// step of 2e-3, agreement to 2 %, as the llm's check).
fn finite_difference_gap<B: AutodiffBackend>(part: &dyn Fn(&str) -> bool) -> (f64, f64, usize) {
    let device = Default::default();
    let (config, task) = tiny();
    let model = config.load::<B>(5, &device).unwrap();
    let b = batch::<B>(&config, &task, 1, 2);
    let ac = Autocast::new(Precision::F32);
    let grads = by_path(&model, &gradients(&model, &b, &ac));
    let base = vramfit::params::snapshot(&model);
    let mut direction = std::collections::BTreeMap::new();
    let mut projected = 0.0f64;
    let mut picked = 0;
    for (path, (shape, dtype, v)) in &base {
        let on = part(path) && grads.contains_key(path);
        picked += on as usize;
        let d: Vec<f32> = (0..v.len())
            .map(|i| {
                if on {
                    ((i * 7919 + path.len()) % 13) as f32 / 13.0 - 0.5
                } else {
                    0.0
                }
            })
            .collect();
        if on {
            projected += grads[path].iter().zip(&d).map(|(g, d)| (*g * d) as f64).sum::<f64>();
        }
        direction.insert(path.clone(), (shape.clone(), *dtype, d));
    }
    let step = 2e-3f32;
    let shifted = |sign: f32| {
        let mut moved = base.clone();
        for (path, (_, _, v)) in moved.iter_mut() {
            for (x, d) in v.iter_mut().zip(&direction[path].2) {
                *x += sign * step * d;
            }
        }
        let m = vramfit::params::restore(config.load::<B>(5, &device).unwrap(), &moved).unwrap();
        m.loss(&b, &ac).into_scalar().elem::<f32>() as f64
    };
    let measured = (shifted(1.0) - shifted(-1.0)) / (2.0 * step as f64);
    (measured, projected, picked)
}

fn encoder_and_decoder_gradients_agree_with_finite_differences<B: AutodiffBackend>() {
    let paths: Vec<String> =
        vramfit::params::snapshot(&SegmenterConfig::default().load::<B>(5, &Default::default()).unwrap())
            .into_keys()
            .collect();
    // The encoder: the patch embedding and the layers before the bridge;
    // the decoder: the two-way layers and the head.
    let encoder = |p: &str| p.starts_with("patch.") || p.contains(".Vision.");
    let decoder = |p: &str| p.starts_with("head.") || p.contains(".TwoWay.");
    for (name, part) in [("encoder", &encoder as &dyn Fn(&str) -> bool), ("decoder", &decoder)] {
        let (measured, projected, picked) = finite_difference_gap::<B>(part);
        assert!(picked >= 8, "{name}: {picked} parameters picked of {paths:?}");
        assert!(
            projected.abs() > 1e-4,
            "{name}: the gradient's projection {projected} is not small"
        );
        assert!(
            (measured - projected).abs() <= 2e-2 * projected.abs(),
            "{name}: finite differences {measured} vs gradient {projected}"
        );
    }
}

fn checkpointed_links_give_the_plain_gradients<B: AutodiffBackend>() {
    let device = Default::default();
    let (config, task) = tiny();
    let model = config.load::<B>(3, &device).unwrap();
    let b = batch::<B>(&config, &task, 2, 4);
    let ac = Autocast::new(Precision::F32);
    let plain = by_path(&model, &gradients(&model, &b, &ac));
    let links = config.blocks();
    assert_eq!(model.blocks().len(), links, "the settings count the chain's links");
    for policy in ["all", "every:3"] {
        let s = stepper::<B>(
            Precision::F32,
            &CheckpointPolicy::parse(policy).unwrap(),
            MicroBatching::whole(4),
            links,
        );
        let (_, grads) = s.gradients(&model, &b, 1.0, &mut ());
        let gap = relative_gap(&plain, &by_path(&model, &grads));
        assert!(gap <= 1e-5, "{policy}: relative gap {gap}");
    }
}

/// A small segmenter learns the synthetic task on the CPU: the loss falls
/// and the held-out Dice rises.
#[test]
fn a_small_segmenter_learns_the_synthetic_masks() {
    type B = burn::backend::Autodiff<burn::backend::Flex>;
    let device = Default::default();
    let (config, task) = tiny();
    let data = config.data(&task).unwrap();
    let mut model = config.load::<B>(1, &device).unwrap();
    let ac = Autocast::new(Precision::F32);
    let before = vramfit_models::segmenter::held_out_dice(&data, &model, 16, 16, &ac, &device);
    let mut s = stepper::<B>(
        Precision::F32,
        &CheckpointPolicy::parse("none").unwrap(),
        MicroBatching::whole(8),
        config.blocks(),
    );
    let mut losses = Vec::new();
    for step in 1..=200 {
        let (m, out) = s
            .step(model, &data.batch(step, 8, &device), 1e-3, &device, &mut ())
            .unwrap();
        model = m;
        losses.push(out.loss);
    }
    let after = vramfit_models::segmenter::held_out_dice(&data, &model, 16, 16, &ac, &device);
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 10..]));
    eprintln!("segmenter 200 steps: loss {first:.4} → {last:.4}, held-out Dice {before:.3} → {after:.3}");
    // Measured: loss 1.27 → 0.39 and Dice 0.02 → 0.75 in 400 steps at
    // this learning rate (0.68 at 150; at 3e-3 it stalled at 0).
    assert!(last < 0.7 * first, "the loss falls: {first} → {last}");
    assert!(after > before + 0.3, "the held-out Dice rises: {before} → {after}");
}

/// The named shape builds (on shapes: no values) with the parameters its
/// settings count, and the tiny one as well.
#[test]
fn the_named_shape_holds_the_parameters_its_settings_count() {
    type S = burn::backend::Autodiff<vramfit::shapes::Shapes>;
    let device = vramfit::shapes::ShapeDevice;
    for config in [SegmenterConfig::default(), SegmenterConfig::named("prs-med").unwrap()] {
        let model = config.load::<S>(1, &device).unwrap();
        let adapters = config.llm.adapter_parameters();
        assert_eq!(model.num_params() as u64, config.parameters() + adapters, "{config:?}");
    }
    let prs = SegmenterConfig::named("prs-med").unwrap();
    let task = SegmenterTask {
        image: 1024,
        prompt: 64,
        ..Default::default()
    };
    prs.check(&task).unwrap();
    assert_eq!(prs.grid(1024), 64, "TinySAM's 64×64 embedding at 1024 px");
    let e = SegmenterConfig::named("sam-9000").unwrap_err().to_string();
    assert!(e.contains("sam-9000") && e.contains("prs-med"), "{e}");
}

/// Settings that cannot make a model are refused, naming the setting and
/// what to give instead.
#[test]
fn bad_settings_are_refused_by_name() {
    let (config, task) = tiny();
    let refused = |c: &SegmenterConfig, t: &SegmenterTask| c.check(t).unwrap_err().to_string();
    // The encoder's patch and merges make tokens 8 px wide: 36 px is not whole.
    let e = refused(
        &config,
        &SegmenterTask {
            image: 36,
            ..task.clone()
        },
    );
    assert!(e.contains("task.image") && e.contains("multiple of 8"), "{e}");
    let e = refused(
        &SegmenterConfig {
            llm_grid: 3,
            ..config.clone()
        },
        &task,
    );
    assert!(e.contains("model.llm_grid") && e.contains("divisor of 4"), "{e}");
    let mut c = config.clone();
    c.encoder.heads = vec![3, 2];
    let e = refused(&c, &task);
    assert!(e.contains("model.encoder.heads") && e.contains("stage 0"), "{e}");
    let mut c = config.clone();
    c.encoder.strides = vec![1];
    let e = refused(&c, &task);
    assert!(e.contains("model.encoder.strides") && e.contains("one a stage"), "{e}");
    let e = refused(
        &config,
        &SegmenterTask {
            objects: 5,
            ..task.clone()
        },
    );
    assert!(e.contains("task.objects"), "{e}");
    let mut c = config.clone();
    c.encoder.train = "lora:x".into();
    let e = refused(&c, &task);
    assert!(e.contains("model.encoder.train") && e.contains("lora:RANK"), "{e}");
}

/// A folder of images and masks is read exactly (pixels / 255, masks 0 or
/// 1), its last tenth held out; a pair that cannot be used is refused
/// naming the file and the fault: a mask of another size, a mask that is
/// not binary, an image without a mask, an image of another size.
#[test]
fn a_folder_of_images_and_masks_is_read_and_bad_pairs_are_refused() {
    use vramfit_models::segmenter::folder::Pairs;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("images")).unwrap();
    std::fs::create_dir_all(dir.join("masks")).unwrap();
    let side = 16u32;
    let write = |path: &std::path::Path, w: u32, h: u32, f: &dyn Fn(u32, u32) -> [u8; 3]| {
        image::RgbImage::from_fn(w, h, |x, y| image::Rgb(f(x, y)))
            .save(path)
            .unwrap();
    };
    for i in 0..10u32 {
        write(&dir.join(format!("images/{i:02}.png")), side, side, &|x, y| {
            [(x * 16) as u8, (y * 16) as u8, i as u8]
        });
        write(&dir.join(format!("masks/{i:02}.png")), side, side, &|x, _| {
            if x < 8 { [0; 3] } else { [255; 3] }
        });
    }
    let pairs = Pairs::open(dir, side as usize, 4).unwrap();
    assert_eq!((pairs.len(), pairs.held_out()), (10, 1));
    let b: SegBatch<burn::backend::Flex> = pairs.batch(1, 2, false, &Default::default());
    let images: Vec<f32> = b.images.into_data().to_vec().unwrap();
    // Pair 00's pixel (3, 2): red 48, green 32, blue 0.
    let at = |c: usize| images[c * 256 + 2 * 16 + 3];
    assert_eq!([at(0), at(1), at(2)], [48.0 / 255.0, 32.0 / 255.0, 0.0]);
    let masks: Vec<f32> = b.masks.into_data().to_vec().unwrap();
    assert_eq!((masks[7], masks[8]), (0.0, 1.0));
    // The held-out pair is the last.
    let h: SegBatch<burn::backend::Flex> = pairs.batch(1, 1, true, &Default::default());
    let blue: Vec<f32> = h.images.slice([0..1, 2..3, 0..1, 0..1]).into_data().to_vec().unwrap();
    assert_eq!(blue, [9.0 / 255.0]);

    let refused = |why: &str| {
        let e = Pairs::open(dir, side as usize, 4).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    };
    write(&dir.join("masks/03.png"), side, 8, &|_, _| [0; 3]);
    refused("03.png is 16×8 px and its image 16×16: a mask is its image's size");
    write(&dir.join("masks/03.png"), side, side, &|x, _| {
        if x == 5 { [128; 3] } else { [0; 3] }
    });
    refused("03.png is not a binary mask: pixel (5, 0) is (128, 128, 128)");
    std::fs::remove_file(dir.join("masks/03.png")).unwrap();
    refused("03.png: no mask for it");
    write(&dir.join("masks/03.png"), side, side, &|_, _| [0; 3]);
    write(&dir.join("images/04.png"), 20, side, &|_, _| [0; 3]);
    refused("04.png is 20×16 px: the segmenter reads square images of task.image = 16 px");
    let e = Pairs::open(&dir.join("images"), 16, 4).unwrap_err().to_string();
    assert!(e.contains("expected a folder `images`"), "{e}");
}

/// Frames as tokens: a sample of 6 frames read by a model capped at 3
/// gives the loss of the same sample with frames 0, 2 and 4 given (evenly
/// spaced); the frames' tokens go ahead of the text and change its loss.
#[test]
fn frames_above_the_cap_are_read_evenly_spaced() {
    type B = burn::backend::Autodiff<burn::backend::Flex>;
    use vramfit_models::data::{SyntheticTask, TaskConfig};
    use vramfit_models::llama::LlamaConfig;
    let device = Default::default();
    let config = LlamaConfig {
        vocab: 16,
        width: 32,
        depth: 2,
        heads: 4,
        kv_heads: 2,
        ffn: 40,
        context: 64,
        max_frames: 3,
        ..Default::default()
    };
    let task = TaskConfig {
        tokens: 8,
        frames: 6,
        frame_size: 16,
        ..Default::default()
    };
    config.check(&task).unwrap();
    let model = config.load::<B>(4, &device).unwrap();
    let batch = SyntheticTask::new(task, config.vocab, 0).batch::<B>(3, 2, &device);
    let ac = Autocast::new(Precision::F32);
    let loss = |b: &vramfit_models::data::TokenBatch<B>| model.loss(b, &ac).into_scalar().elem::<f32>();
    let video = batch.video.clone().unwrap();
    let keep = Tensor::<B, 1, Int>::from_ints([0, 2, 4], &device);
    let spaced = vramfit_models::data::TokenBatch {
        video: Some(video.clone().select(1, keep)),
        ..batch.clone()
    };
    assert_eq!(loss(&batch), loss(&spaced));
    let other = vramfit_models::data::TokenBatch {
        video: Some(video.slice([0..2, 1..4])),
        ..batch.clone()
    };
    assert_ne!(loss(&batch), loss(&other), "the frames read change the text's loss");
}

/// The segmenter's quality knob is its image's side, lowered in the steps
/// its encoder's tokens and the LLM's grid allow, every lower value a task
/// the settings accept.
#[test]
fn the_segmenters_quality_knob_is_the_image_side() {
    let (config, task) = tiny();
    let task = SegmenterTask { image: 64, ..task };
    let knob = config.quality_knob(&task).unwrap();
    // Tokens 8 px wide, the LLM's grid 2: steps of 16.
    assert_eq!(
        (knob.key.as_str(), knob.asked, knob.lower.clone()),
        ("task.image", 64, vec![16, 32, 48])
    );
    for &v in &knob.lower {
        let lowered = SegmenterConfig::with_quality(&task, v).unwrap();
        assert_eq!(lowered.image, v);
        config.check(&lowered).unwrap();
    }
}
