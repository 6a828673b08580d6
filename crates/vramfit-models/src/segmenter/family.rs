//! The segmenter as a model family: its settings' checks, the planner's
//! hooks (the LLM's frozen base and attention, rough sizes), its data, its
//! held-out Dice and its summary.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use vramfit::frozen::BaseStorage;
use vramfit::fused::Attention;
use vramfit::plan::quality::QualityKnob;

use super::{SegBatch, SegData, Segmenter, SegmenterConfig, SegmenterTask, Synthetic, shapes};
use crate::config::{ConfigError, RoughFloats, invalid};
use crate::family::ModelSettings;

impl ModelSettings for SegmenterConfig {
    type Task = SegmenterTask;
    const NAME: &'static str = "segmenter";
    const CHECKPOINT_KIND: &'static str = "vramfit.segmenter.checkpoint";
    const WEIGHTS_KIND: &'static str = "vramfit.segmenter.weights";
    const LLM_KEY: Option<&'static str> = Some("model.llm");

    fn check(&self, task: &SegmenterTask) -> Result<(), ConfigError> {
        self.check_task(task)
    }

    fn blocks(&self) -> usize {
        self.chain_blocks()
    }

    fn named(name: &str) -> Result<Self, ConfigError> {
        let all = shapes();
        all.iter()
            .find(|(n, ..)| *n == name)
            .map(|(.., c)| c.clone())
            .ok_or_else(|| {
                let known: Vec<String> = all.iter().map(|(n, s, _)| format!("{n} ({s})")).collect();
                invalid(
                    "shape",
                    format!(
                        "`{name}` is not a known segmenter; the known ones: {}",
                        known.join(", ")
                    ),
                )
            })
    }

    /// PRS-Med's images are 1024 px; its prompts some 64 tokens (a
    /// question about the image in LLaVA-Med's template).
    fn named_task(name: &str, task: SegmenterTask) -> SegmenterTask {
        match name {
            "prs-med" => SegmenterTask {
                image: 1024,
                prompt: 64,
                ..task
            },
            _ => task,
        }
    }

    /// The image's side, in the steps the encoder's tokens and the LLM's
    /// grid allow.
    fn quality_knob(&self, task: &SegmenterTask) -> Option<QualityKnob> {
        let step = self.encoder.reduction() * self.llm_grid;
        Some(QualityKnob {
            name: "image px".into(),
            key: "task.image".into(),
            asked: task.image,
            lower: QualityKnob::multiples_below(task.image, step)
                .into_iter()
                .filter(|&v| v >= 8)
                .collect(),
        })
    }

    fn with_quality(task: &SegmenterTask, value: usize) -> Option<SegmenterTask> {
        Some(SegmenterTask {
            image: value,
            ..task.clone()
        })
    }

    fn attention(&self) -> Option<Attention> {
        Some(self.llm.attention)
    }

    fn with_attention(self, attention: Attention) -> Self {
        Self {
            llm: self.llm.with_attention(attention),
            ..self
        }
    }

    fn unsupported_storage(&self, supported: &dyn Fn(burn::tensor::FloatDType) -> bool) -> Option<String> {
        self.llm.unsupported_storage(supported)
    }

    fn bases_to_search(&self) -> Vec<BaseStorage> {
        self.llm.bases_to_search()
    }

    fn with_base(self, base: BaseStorage) -> Self {
        Self {
            llm: self.llm.with_base(base),
            ..self
        }
    }

    /// The LLM's frozen base under LoRA (its blocks, embedding and final
    /// norm) and a frozen or adapted encoder are rebuilt from the seed (or
    /// the LLM's checkpoint): a run's files hold what trains.
    fn rebuilt_from_settings(&self, path: &str) -> bool {
        if path.contains(".lora.") {
            return false;
        }
        let llm = (path.contains(".Llm.") || path == "embedding" || path.contains(".Prompt.final_norm."))
            && self
                .llm
                .rebuilt_from_settings(path.rsplit(".Llm.").next().unwrap_or(path));
        let encoder = (path.starts_with("patch.") || path.contains(".Vision."))
            && matches!(
                self.encoder.training(),
                Ok(crate::vision::VisionTraining::Frozen | crate::vision::VisionTraining::Lora(_))
            );
        llm || encoder
    }

    fn rebuilt_fingerprint(&self) -> Result<Option<String>, ConfigError> {
        self.llm.rebuilt_fingerprint()
    }

    fn rough_floats(&self, task: &SegmenterTask) -> RoughFloats {
        let llm = self.llm.rough_floats(&crate::data::TaskConfig {
            tokens: self.llm_grid * self.llm_grid + task.prompt,
            ..Default::default()
        });
        let pixels = (task.image * task.image) as f64;
        let tokens0 = pixels / (self.encoder.patch * self.encoder.patch) as f64;
        let encoder: f64 = self
            .encoder
            .widths
            .iter()
            .zip(&self.encoder.depths)
            .map(|(&w, &d)| (d * w) as f64 * 14.0 * tokens0)
            .sum();
        let d = self.encoder.neck as f64;
        let grid = self.grid(task.image) as f64;
        // The upscaled features (16 g² × d/4 and d/8, a few copies) and the
        // full-resolution logits, sigmoid and loss terms.
        let decoder = 16.0 * grid * grid * d + 8.0 * pixels;
        RoughFloats {
            parameters: self.own_parameters() as f64 + llm.parameters,
            frozen: llm.frozen,
            frozen_bytes_each: llm.frozen_bytes_each,
            activations_per_sample: encoder + llm.activations_per_sample + decoder,
            largest_per_sample: crate::config::largest(&[
                (
                    tokens0 * self.encoder.widths[0] as f64 * self.encoder.mlp_ratio as f64,
                    "the encoder's MLP",
                ),
                (4.0 * grid * grid * d, "the upscaled image embedding"),
                (pixels, "the mask's logits"),
            ]),
            task: 0.0,
        }
    }
}

impl crate::family::Family<3> for SegmenterConfig {
    type Net<B: AutodiffBackend> = Segmenter<B>;
    type Data = SegData;

    fn init<B: AutodiffBackend>(&self, seed: u64, device: &B::Device) -> Result<Segmenter<B>, ConfigError> {
        self.load(seed, device)
    }

    fn data(&self, task: &SegmenterTask) -> Result<SegData, ConfigError> {
        if !task.data.is_empty() {
            return super::folder::Pairs::open(std::path::Path::new(&task.data), task.image, task.prompt)
                .map(SegData::Folder)
                .map_err(|e| invalid("task.data", e.to_string()));
        }
        Ok(SegData::Synthetic(Synthetic {
            image: task.image,
            channels: self.encoder.channels,
            prompt: task.prompt,
            classes: task.classes,
            objects: task.objects,
            seed: task.seed,
        }))
    }

    fn data_fingerprint(data: &SegData) -> Option<String> {
        match data {
            SegData::Folder(f) => Some(f.fingerprint().to_string()),
            SegData::Synthetic(_) => None,
        }
    }

    fn batch<B: AutodiffBackend>(data: &SegData, step: u64, size: usize, device: &B::Device) -> SegBatch<B> {
        data.batch::<B>(step, size, device)
    }

    fn evaluate_every(task: &SegmenterTask) -> u64 {
        task.eval_every
    }

    /// The mean Dice of the thresholded masks on held-out images.
    fn evaluate<B: AutodiffBackend>(
        data: &SegData,
        net: &Segmenter<B>,
        micro_batch: usize,
        autocast: &vramfit::precision::Autocast,
        device: &B::Device,
    ) -> Vec<(String, f64)> {
        vec![(
            "val_dice".into(),
            held_out_dice(data, net, 16, micro_batch, autocast, device),
        )]
    }

    fn block_input_bytes(&self, task: &SegmenterTask) -> u64 {
        let tokens0 = (task.image / self.encoder.patch).pow(2);
        ((tokens0 * self.encoder.widths[0] + task.prompt * self.llm.width) * 4) as u64
    }

    fn summary<B: AutodiffBackend>(
        &self,
        data: &SegData,
        net: &Segmenter<B>,
        batch_size: usize,
        micro_batch: usize,
        median_step_ms: f64,
        device: &B::Device,
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        out.insert("parameters".into(), self.parameters().into());
        out.insert(
            "images_per_second".into(),
            (batch_size as f64 / (median_step_ms / 1e3)).into(),
        );
        let ac = vramfit::precision::Autocast::new(vramfit::precision::Precision::F32);
        out.insert(
            "val_dice".into(),
            held_out_dice(data, net, 16, micro_batch, &ac, device).into(),
        );
        out.insert("base".into(), self.llm.base_storage().name().into());
        out
    }
}

/// The mean Dice over `images` held-out images (a folder's held-out pairs
/// at most), `micro_batch` at a time, without autodiff.
pub fn held_out_dice<B: AutodiffBackend>(
    data: &SegData,
    net: &Segmenter<B>,
    images: usize,
    micro_batch: usize,
    autocast: &vramfit::precision::Autocast,
    device: &B::Device,
) -> f64 {
    if vramfit::shapes::is_shapes::<B>() {
        return 0.0;
    }
    let net = net.valid();
    let images = match data {
        SegData::Folder(f) => images.min(f.held_out()),
        SegData::Synthetic(_) => images,
    };
    let (mut sum, mut n) = (0.0, 0usize);
    let size = micro_batch.clamp(1, images);
    let mut step = 0;
    while n < images {
        let batch = data.held_out::<B::InnerBackend>(step, size.min(images - n), device);
        let logits = net.predict(&batch, autocast);
        for d in super::mask_decoder::dice(logits, batch.masks) {
            sum += d;
            n += 1;
        }
        step += 1;
    }
    sum / n as f64
}
