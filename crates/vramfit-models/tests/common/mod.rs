//! Helpers shared by the model tests: gradients by parameter path, their
//! relative gap, a composed step with chosen techniques, and whether the
//! device has a precision.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType};
use vramfit::activation_checkpointing::CheckpointPolicy;
use vramfit::allocator::{Cleanup, CleanupPolicy};
use vramfit::batch::MicroBatching;
use vramfit::optim::{AdamConfig, ModuleAdam};
use vramfit::params::PathTracker;
use vramfit::precision::{Autocast, LossScaler, Precision, ScalerConfig};
use vramfit::step::Stepper;

/// Whether the device computes in `precision` (wgpu has no bf16).
pub fn supports<B: AutodiffBackend>(precision: Precision) -> bool {
    let supported = B::supports_dtype(&Default::default(), DType::from(precision.dtype()));
    if !supported {
        eprintln!("skipped on this device: {precision:?} is not supported");
    }
    supported
}

/// Gradients by parameter path, as f32 host vectors.
pub fn by_path<B: AutodiffBackend, M: Module<B>>(model: &M, grads: &GradientsParams) -> BTreeMap<String, Vec<f32>> {
    struct Walk<'a>(PathTracker, &'a GradientsParams, BTreeMap<String, Vec<f32>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Walk<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.enter(name)
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.exit()
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.1.get::<B::InnerBackend, D>(param.id) {
                let v = g.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap();
                self.2.insert(self.0.path(), v);
            }
        }
    }
    let mut w = Walk(PathTracker::default(), grads, BTreeMap::new());
    model.visit(&mut w);
    w.2
}

/// Largest |a − b| over all entries, relative to the largest |a|.
pub fn relative_gap(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> f32 {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "same parameters have gradients"
    );
    let scale = a.values().flatten().fold(0f32, |m, x| m.max(x.abs()));
    let gap = a
        .iter()
        .flat_map(|(k, va)| va.iter().zip(&b[k]).map(|(x, y)| (x - y).abs()))
        .fold(0f32, f32::max);
    gap / scale
}

pub fn stepper<B: AutodiffBackend>(
    precision: Precision,
    checkpoint: &CheckpointPolicy,
    batching: MicroBatching,
    depth: usize,
) -> Stepper<B> {
    Stepper {
        autocast: Autocast::new(precision),
        checkpointed: checkpoint.plan(depth).unwrap(),
        batching,
        scaler: precision
            .needs_loss_scaling()
            .then(|| LossScaler::new(ScalerConfig::default())),
        optimizer: ModuleAdam::new(AdamConfig::default(), 0.0, FloatDType::F32),
        cleanup: Cleanup::new(CleanupPolicy::Never),
        attempts: 0,
        ranks: None,
    }
}

/// One run's parameters after training, its optimizer's device bytes and
/// its host bytes.
pub type Trained = (vramfit::params::Snapshot, u64, u64);

/// Asserts that training with Adam's moments on the device and on the host
/// gave the same parameters (bit for bit on the CPU, where both run the
/// same f32 pass; to 1e-5 of each tensor's largest elsewhere, where the
/// device's update is Burn's operations), that they trained away from
/// `start`, and that the host run held no optimizer state on the device.
pub fn assert_host_moments_agree<B: AutodiffBackend>(
    (device_params, device_state, _): Trained,
    (host_params, host_state, host_bytes): Trained,
    start: &vramfit::params::Snapshot,
) {
    let mut worst = 0.0f32;
    let mut moved = false;
    for (path, (_, _, a)) in &device_params {
        let b = &host_params[path].2;
        moved |= a != &start[path].2;
        let scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-12);
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    assert!(moved, "the parameters trained");
    let on_cpu = std::any::TypeId::of::<B>() == std::any::TypeId::of::<vramfit::backends::Flex>();
    eprintln!("host vs device moments: largest relative difference {worst:e} (cpu: {on_cpu})");
    if on_cpu {
        assert_eq!(worst, 0.0, "bit for bit on the CPU");
    } else {
        assert!(worst < 1e-5, "to the last bits: {worst:e}");
    }
    assert!(device_state > 0);
    assert_eq!(host_state, 0, "no optimizer state on the device");
    assert_eq!(host_bytes, device_state, "the same moments, in host memory");
}
