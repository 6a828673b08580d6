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
//!
//! With the moments on the host ([`ModuleAdam::on_host`], `--moments
//! host`) they are f32 vectors in host memory: each parameter's gradient
//! and value come down, the same f32 update runs on the host's cores (the
//! CPU pass's arithmetic, `adam_update.rs`), and the parameter goes back. The
//! device then holds no optimizer state; the step moves the parameters
//! twice and the gradients once across the link, each parameter's reads
//! started ahead of its update ([`super::read_ahead`]) so the copies run
//! while the host updates.

use std::collections::{BTreeMap, HashMap, HashSet};

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, TensorData};

use std::sync::Arc;

use super::AdamConfig;
use super::adam_update::{Coefficients, adam_f32, update};
use super::read_ahead::ReadAhead;
use super::shards::Shards;
use crate::params::PathTracker;
use crate::precision::cast_to;
use crate::ranks::Collective;

/// One parameter's moments, flattened, in the moment type.
#[derive(Debug, Clone)]
struct Moments<B: Backend> {
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
}

/// Moments `(m, v)` in host memory, by parameter path.
type HostMoments = BTreeMap<String, (Vec<f32>, Vec<f32>)>;

/// Adam(W) whose state survives a rebuild of the module (keyed by path).
#[derive(Debug, Clone)]
pub struct ModuleAdam<B: AutodiffBackend> {
    config: AdamConfig,
    weight_decay: f64,
    moment_dtype: FloatDType,
    step: u64,
    state: BTreeMap<String, Moments<B::InnerBackend>>,
    /// The moments in host memory, when they live there.
    host: Option<HostMoments>,
    /// The ranks the moments are sharded over, when they are.
    shards: Option<Shards>,
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
            host: None,
            shards: None,
        }
    }

    /// The same optimiser with its moments sharded over `ranks`: each rank
    /// keeps the moments of about 1/N of the values, updates those
    /// parameters and broadcasts them; the others take the broadcast
    /// values. Given the same summed gradient, the update is the unsharded
    /// one, bit for bit. The step must
    /// run on every rank, visiting the same parameters (the summed
    /// gradients do: [`crate::ranks::sum_gradients`] checks it). With the
    /// gradients summed onto their owners ([`ModuleAdam::owners`]) the
    /// other ranks need not hold them (ZeRO stage 2).
    pub fn sharded(mut self, ranks: Arc<dyn Collective>) -> Self {
        self.shards = Some(Shards::new(ranks));
        self
    }

    /// True when the moments are sharded over ranks.
    pub fn is_sharded(&self) -> bool {
        self.shards.is_some()
    }

    /// The same optimiser with its moments in host memory (f32), updated
    /// on the host with the CPU pass's arithmetic.
    pub fn on_host(mut self) -> Self {
        self.moment_dtype = FloatDType::F32;
        self.host = Some(BTreeMap::new());
        self
    }

    /// True when the moments live in host memory.
    pub fn moments_on_host(&self) -> bool {
        self.host.is_some()
    }

    /// Bytes of moments held in host memory.
    pub fn host_bytes(&self) -> u64 {
        self.host
            .iter()
            .flat_map(|h| h.values())
            .map(|(m, v)| 4 * (m.len() + v.len()) as u64)
            .sum()
    }

    /// Optimiser steps taken (skipped steps do not count).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Bytes of moments held on the device (none when they are on the host).
    pub fn state_bytes(&self) -> u64 {
        self.state
            .values()
            .map(|s| 2 * (s.m.shape().num_elements() * s.m.dtype().size()) as u64)
            .sum()
    }

    /// Each trainable parameter's rank when the moments are sharded (`None`
    /// when not): the rank that updates it, onto which its gradient is
    /// summed.
    pub fn owners<M: AutodiffModule<B>>(&mut self, module: &M) -> Option<HashMap<ParamId, usize>> {
        struct Owners<'a> {
            path: PathTracker,
            shards: &'a mut Shards,
            owners: HashMap<ParamId, usize>,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Owners<'_> {
            fn enter_module(&mut self, name: &str, _: &str) {
                self.path.enter(name)
            }
            fn exit_module(&mut self, _: &str, _: &str) {
                self.path.exit()
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if param.is_require_grad() {
                    let owner = self.shards.owner(&self.path.path(), param.shape().num_elements());
                    self.owners.insert(param.id, owner);
                }
            }
        }
        let shards = self.shards.as_mut()?;
        let mut visitor = Owners {
            path: PathTracker::default(),
            shards,
            owners: HashMap::new(),
        };
        module.visit(&mut visitor);
        Some(visitor.owners)
    }

    /// Applies one update with learning rate `lr` to every parameter that has a gradient.
    pub fn step<M: AutodiffModule<B>>(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        self.step_sharded(lr, module, grads, &HashSet::new())
    }

    /// As [`ModuleAdam::step`], where the parameters in `elsewhere` have
    /// no gradient on this rank because it was summed onto their owner
    /// ([`crate::ranks::sum_gradients`]): they take the owner's values.
    pub fn step_sharded<M: AutodiffModule<B>>(
        &mut self,
        lr: f64,
        module: M,
        mut grads: GradientsParams,
        elsewhere: &HashSet<ParamId>,
    ) -> M {
        self.step += 1;
        let t = self.step as i32;
        let c = self.config;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2 = 1.0 - c.beta2.powi(t);
        // Host moments: every gradient queued, in the order the update
        // visits them, so each parameter's reads start ahead of its update.
        let mut ahead = self
            .host
            .is_some()
            .then(|| read_ahead::<B, M>(&module, &mut grads, elsewhere, self.shards.as_mut()));
        struct Update<'a, B: AutodiffBackend> {
            path: PathTracker,
            grads: &'a mut GradientsParams,
            ahead: Option<&'a mut ReadAhead<B::InnerBackend>>,
            elsewhere: &'a HashSet<ParamId>,
            state: &'a mut BTreeMap<String, Moments<B::InnerBackend>>,
            host: Option<&'a mut HostMoments>,
            shards: Option<&'a mut Shards>,
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
                let grad = self.grads.remove::<B::InnerBackend, D>(id);
                let queued = self.ahead.as_deref().is_some_and(|a| a.has(id));
                if grad.is_none() && !queued && !self.elsewhere.contains(&id) {
                    return Param::from_mapped_value(id, tensor, mapper);
                }
                let shape = tensor.shape();
                let stored = FloatDType::from(tensor.dtype());
                let trainable = tensor.is_require_grad();
                let device = tensor.device();
                let path = self.path.path();
                // Sharded: a parameter another rank owns comes from it.
                let owner = self
                    .shards
                    .as_deref_mut()
                    .map(|s| (s.owner(&path, shape.num_elements()), s));
                if let Some((owner, shards)) = owner
                    && owner != shards.ranks.rank()
                {
                    // Moments restored from a checkpoint gathered from every
                    // rank (a resume on another rank count) are the owner's.
                    self.state.remove(&path);
                    if let Some(ahead) = self.ahead.as_deref_mut() {
                        ahead.skip(id);
                    }
                    if let Some(host) = self.host.as_deref_mut() {
                        host.remove(&path);
                    }
                    let mut values = vec![0.0f32; shape.num_elements()];
                    shards.ranks.broadcast_f32(&mut values, owner);
                    let n = values.len();
                    let p = Tensor::<B::InnerBackend, 1>::from_data(TensorData::new(values, [n]), &device);
                    let p = cast_to(p, stored).reshape(shape);
                    return Param::from_mapped_value(id, Tensor::from_inner(p).set_require_grad(trainable), mapper);
                }
                let k = Coefficients {
                    beta1: self.c.beta1,
                    beta2: self.c.beta2,
                    epsilon: self.c.epsilon,
                    bias2: self.bias2,
                    decay: (self.weight_decay != 0.0).then_some(1.0 - self.lr * self.weight_decay),
                    step_size: self.lr / self.bias1,
                };
                let p = if let (Some(host), Some(ahead)) = (self.host.as_deref_mut(), self.ahead.as_deref_mut()) {
                    // The queue's handle is then the value's last: its
                    // buffer is freed once read, before the new one goes up
                    // (as when the read consumed the value itself).
                    drop(tensor);
                    // Host memory on a device: left out of a heap trace
                    // (`crate::pools::trace_on_cpu`), and the upload is a
                    // new device buffer there even where the CPU takes the
                    // vector as it is.
                    let (mut pv, gv) = ahead
                        .take(id)
                        .expect("a parameter this rank owns has its summed gradient here");
                    let (m, v) = crate::heap::off_device(|| {
                        host.entry(path)
                            .or_insert_with(|| (vec![0.0; gv.len()], vec![0.0; gv.len()]))
                    });
                    adam_f32(&mut pv, &gv, m, v, &k);
                    drop(gv);
                    let n = pv.len();
                    crate::heap::to_device(pv.as_ptr().cast(), n * 4);
                    Tensor::<B::InnerBackend, 1>::from_data(TensorData::new(pv, [n]), &device)
                } else {
                    let grad = grad.expect("a parameter this rank owns has its summed gradient here");
                    let p = cast_to(tensor.inner(), FloatDType::F32).reshape([-1]);
                    let g = cast_to(grad, FloatDType::F32).reshape([-1]);
                    let (m, v) = match self.state.remove(&path) {
                        Some(s) => (cast_to(s.m, FloatDType::F32), cast_to(s.v, FloatDType::F32)),
                        None => (g.zeros_like(), g.zeros_like()),
                    };
                    let (p, m, v) = update(p, g, m, v, &k);
                    self.state.insert(
                        path,
                        Moments {
                            m: cast_to(m, self.moment_dtype),
                            v: cast_to(v, self.moment_dtype),
                        },
                    );
                    p
                };
                let p = cast_to(p, stored);
                // Sharded: this rank owns it; the others take its values
                // as stored (exact in f32 whatever the stored type).
                if let Some(shards) = self.shards.as_deref() {
                    let mut values = cast_to(p.clone(), FloatDType::F32)
                        .into_data()
                        .to_vec::<f32>()
                        .expect("f32 after the cast");
                    shards.ranks.broadcast_f32(&mut values, shards.ranks.rank());
                }
                let p = p.reshape(shape);
                Param::from_mapped_value(id, Tensor::from_inner(p).set_require_grad(trainable), mapper)
            }
        }
        module.map(&mut Update::<B> {
            path: PathTracker::default(),
            grads: &mut grads,
            ahead: ahead.as_mut(),
            elsewhere,
            state: &mut self.state,
            host: self.host.as_mut(),
            shards: self.shards.as_mut(),
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
        if let Some(h) = &self.host {
            return AdamSnapshot {
                step: self.step,
                moments: h.clone(),
            };
        }
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
        if let Some(h) = &mut self.host {
            h.clone_from(&snapshot.moments);
            return;
        }
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

/// Every parameter of `module` this rank updates (it has a gradient in
/// `grads` and, sharded, this rank owns it), its gradient moved from
/// `grads` into a queue in the order the update visits them. Sharded, the
/// owners are assigned here as the update would (the same parameters in
/// the same order: those with a gradient or in `elsewhere`).
fn read_ahead<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    elsewhere: &HashSet<ParamId>,
    shards: Option<&mut Shards>,
) -> ReadAhead<B::InnerBackend> {
    struct Queue<'a, B: AutodiffBackend> {
        path: PathTracker,
        grads: &'a mut GradientsParams,
        elsewhere: &'a HashSet<ParamId>,
        shards: Option<&'a mut Shards>,
        ahead: ReadAhead<B::InnerBackend>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Queue<'_, B> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name)
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit()
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let has_grad = self.grads.get::<B::InnerBackend, D>(param.id).is_some();
            if !has_grad && !self.elsewhere.contains(&param.id) {
                return;
            }
            if let Some(shards) = self.shards.as_deref_mut() {
                let values = param.shape().num_elements();
                if shards.owner(&self.path.path(), values) != shards.ranks.rank() {
                    return;
                }
            }
            if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.ahead.push(param.id, param.val().inner(), grad);
            }
        }
    }
    let mut queue = Queue::<B> {
        path: PathTracker::default(),
        grads,
        elsewhere,
        shards,
        ahead: ReadAhead::default(),
    };
    module.visit(&mut queue);
    queue.ahead
}
