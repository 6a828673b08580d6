//! Adam(W) over a Burn module, with the moments' stored type as an option.
//!
//! Arithmetic is f32 whatever the stored types: the parameter, its gradient
//! and the moments are cast to f32, updated with PyTorch's Adam formula
//! (decoupled weight decay as in AdamW), and the parameter and moments are
//! rounded back to their stored types (round to nearest even). With
//! `moments = bf16` the moments lose mantissa bits at every store, so the
//! update is PyTorch's Adam with `m` and `v` rounded to bf16 after each
//! step; their range is f32's. State is keyed by parameter path so that a
//! checkpoint restores it into a freshly built model.

use std::collections::BTreeMap;

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, TensorData};

use super::AdamConfig;
use crate::params::PathTracker;
use crate::precision::cast_to;

/// One parameter's moments, flattened, in the moment type.
#[derive(Debug, Clone)]
struct Moments<B: Backend> {
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
}

/// Adam(W) whose state survives a rebuild of the module (keyed by path).
#[derive(Debug, Clone)]
pub struct ModuleAdam<B: AutodiffBackend> {
    config: AdamConfig,
    weight_decay: f64,
    moment_dtype: FloatDType,
    step: u64,
    state: BTreeMap<String, Moments<B::InnerBackend>>,
}

/// Saved optimiser state: step count and moments by path, as f32.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdamSnapshot {
    /// Optimiser steps taken.
    pub step: u64,
    /// `(m, v)` by parameter path.
    pub moments: BTreeMap<String, (Vec<f32>, Vec<f32>)>,
}

impl<B: AutodiffBackend> ModuleAdam<B> {
    /// A fresh optimiser; `moment_dtype` is f32 (PyTorch) or bf16/f16.
    pub fn new(config: AdamConfig, weight_decay: f64, moment_dtype: FloatDType) -> Self {
        Self {
            config,
            weight_decay,
            moment_dtype,
            step: 0,
            state: BTreeMap::new(),
        }
    }

    /// Optimiser steps taken (skipped steps do not count).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Bytes of moments held.
    pub fn state_bytes(&self) -> u64 {
        self.state
            .values()
            .map(|s| 2 * (s.m.shape().num_elements() * s.m.dtype().size()) as u64)
            .sum()
    }

    /// Applies one update with learning rate `lr` to every parameter that has a gradient.
    pub fn step<M: AutodiffModule<B>>(&mut self, lr: f64, module: M, mut grads: GradientsParams) -> M {
        self.step += 1;
        let t = self.step as i32;
        let c = self.config;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2 = 1.0 - c.beta2.powi(t);
        struct Update<'a, B: AutodiffBackend> {
            path: PathTracker,
            grads: &'a mut GradientsParams,
            state: &'a mut BTreeMap<String, Moments<B::InnerBackend>>,
            c: AdamConfig,
            lr: f64,
            weight_decay: f64,
            moment_dtype: FloatDType,
            bias1: f64,
            bias2: f64,
        }
        impl<B: AutodiffBackend> ModuleMapper<B> for Update<'_, B> {
            fn enter_module(&mut self, name: &str, _: &str) {
                self.path.enter(name)
            }
            fn exit_module(&mut self, _: &str, _: &str) {
                self.path.exit()
            }
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
                let (id, tensor, mapper) = param.consume();
                let Some(grad) = self.grads.remove::<B::InnerBackend, D>(id) else {
                    return Param::from_mapped_value(id, tensor, mapper);
                };
                let shape = tensor.shape();
                let stored = FloatDType::from(tensor.dtype());
                let trainable = tensor.is_require_grad();
                let p = cast_to(tensor.inner(), FloatDType::F32).reshape([-1]);
                let g = cast_to(grad, FloatDType::F32).reshape([-1]);
                let (m, v) = match self.state.remove(&self.path.path()) {
                    Some(s) => (cast_to(s.m, FloatDType::F32), cast_to(s.v, FloatDType::F32)),
                    None => (g.zeros_like(), g.zeros_like()),
                };
                let m = m.mul_scalar(self.c.beta1) + g.clone().mul_scalar(1.0 - self.c.beta1);
                let v = v.mul_scalar(self.c.beta2) + g.clone().mul(g).mul_scalar(1.0 - self.c.beta2);
                let denom = v.clone().div_scalar(self.bias2).sqrt().add_scalar(self.c.epsilon);
                let p = if self.weight_decay != 0.0 {
                    p.mul_scalar(1.0 - self.lr * self.weight_decay)
                } else {
                    p
                };
                let p = p - m.clone().div(denom).mul_scalar(self.lr / self.bias1);
                self.state.insert(
                    self.path.path(),
                    Moments {
                        m: cast_to(m, self.moment_dtype),
                        v: cast_to(v, self.moment_dtype),
                    },
                );
                let p = cast_to(p, stored).reshape(shape);
                Param::from_mapped_value(id, Tensor::from_inner(p).set_require_grad(trainable), mapper)
            }
        }
        module.map(&mut Update::<B> {
            path: PathTracker::default(),
            grads: &mut grads,
            state: &mut self.state,
            c,
            lr,
            weight_decay: self.weight_decay,
            moment_dtype: self.moment_dtype,
            bias1,
            bias2,
        })
    }

    /// Copies the state to the host.
    pub fn snapshot(&self) -> AdamSnapshot {
        let host = |t: &Tensor<B::InnerBackend, 1>| {
            cast_to(t.clone(), FloatDType::F32)
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .unwrap_or_default()
        };
        AdamSnapshot {
            step: self.step,
            moments: self
                .state
                .iter()
                .map(|(k, s)| (k.clone(), (host(&s.m), host(&s.v))))
                .collect(),
        }
    }

    /// Restores saved state onto `device`.
    pub fn restore(&mut self, snapshot: &AdamSnapshot, device: &B::Device) {
        self.step = snapshot.step;
        let dev = |v: &Vec<f32>| {
            let t = Tensor::<B::InnerBackend, 1>::from_data(TensorData::new(v.clone(), [v.len()]), device);
            cast_to(t, self.moment_dtype)
        };
        self.state = snapshot
            .moments
            .iter()
            .map(|(k, (m, v))| (k.clone(), Moments { m: dev(m), v: dev(v) }))
            .collect();
    }
}
