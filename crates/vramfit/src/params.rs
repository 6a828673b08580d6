//! Parameters by path (`blocks.0.mlp_in`): the names the storage policy,
//! the optimiser state and checkpoints use. Paths come from the field names
//! Burn's module derive reports, so they are stable across runs, unlike
//! parameter ids.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::{DType, FloatDType, TensorData};

/// The stack of module names above the parameter being visited.
#[derive(Debug, Default, Clone)]
pub struct PathTracker(Vec<String>);

impl PathTracker {
    /// Enters a submodule.
    pub fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }
    /// Leaves it.
    pub fn exit(&mut self) {
        self.0.pop();
    }
    /// The dotted path of the current parameter.
    pub fn path(&self) -> String {
        self.0.join(".")
    }
}

/// One float parameter's description.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamInfo {
    /// Dotted path.
    pub path: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Stored type.
    pub dtype: DType,
    /// Whether it trains.
    pub trainable: bool,
}

impl ParamInfo {
    /// Stored bytes.
    pub fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.size()) as u64
    }
}

/// Every float parameter of `module`, in visiting order.
pub fn describe<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamInfo> {
    struct Walk(PathTracker, Vec<ParamInfo>);
    impl<B: Backend> ModuleVisitor<B> for Walk {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.enter(name)
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.exit()
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            self.1.push(ParamInfo {
                path: self.0.path(),
                shape: t.shape().dims::<D>().to_vec(),
                dtype: t.dtype(),
                trainable: t.is_require_grad(),
            });
        }
    }
    let mut w = Walk(PathTracker::default(), Vec::new());
    module.visit(&mut w);
    w.1
}

/// A module's parameters as the profiler's named tensors, largest first;
/// integer parameters (a quantized base's codes) are frozen parameters.
pub fn named_tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<crate::profile::NamedTensor> {
    struct Ints(PathTracker, Vec<crate::profile::NamedTensor>);
    impl<B: Backend> ModuleVisitor<B> for Ints {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.enter(name)
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.exit()
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            let t = param.val();
            let bytes = (t.shape().num_elements() * t.dtype().size()) as u64;
            self.1.push(crate::profile::NamedTensor::new(
                self.0.path(),
                bytes,
                crate::profile::Category::FrozenParameters,
            ));
        }
    }
    let mut ints = Ints(PathTracker::default(), Vec::new());
    module.visit(&mut ints);
    let mut t: Vec<_> = describe(module)
        .into_iter()
        .map(|p| {
            let category = if p.trainable {
                crate::profile::Category::Parameters
            } else {
                crate::profile::Category::FrozenParameters
            };
            crate::profile::NamedTensor::new(p.path.clone(), p.bytes(), category)
        })
        .chain(ints.1)
        .collect();
    t.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
    t
}

/// Parameter values as f32 (exact for f16/bf16), by path, with shape and stored type.
pub type Snapshot = BTreeMap<String, (Vec<usize>, DType, Vec<f32>)>;

/// Copies every float parameter to the host.
pub fn snapshot<B: Backend, M: Module<B>>(module: &M) -> Snapshot {
    snapshot_where(module, |_| true)
}

/// Copies the float parameters whose path `keep` picks to the host (the
/// others are never copied).
pub fn snapshot_where<B: Backend, M: Module<B>>(module: &M, keep: impl Fn(&str) -> bool) -> Snapshot {
    struct Walk<F>(PathTracker, Snapshot, F);
    impl<B: Backend, F: Fn(&str) -> bool> ModuleVisitor<B> for Walk<F> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.enter(name)
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.exit()
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !(self.2)(&self.0.path()) {
                return;
            }
            let t = param.val();
            let dtype = t.dtype();
            let shape = t.shape().dims::<D>().to_vec();
            let values = t
                .cast(FloatDType::F32)
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .unwrap_or_default();
            self.1.insert(self.0.path(), (shape, dtype, values));
        }
    }
    let mut w = Walk(PathTracker::default(), Snapshot::new(), keep);
    module.visit(&mut w);
    w.1
}

/// A snapshot that does not match the module it is loaded into.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// A parameter of the module has no value in the snapshot.
    #[error("parameter `{0}` is missing from the checkpoint")]
    Missing(String),
    /// Shapes differ.
    #[error("parameter `{path}` has shape {found:?} in the checkpoint but {expected:?} in the model")]
    Shape {
        /// Path.
        path: String,
        /// In the checkpoint.
        found: Vec<usize>,
        /// In the model.
        expected: Vec<usize>,
    },
}

/// Replaces every float parameter's value with the snapshot's, keeping the
/// parameter's id, stored type and whether it trains.
pub fn restore<B: Backend, M: Module<B>>(module: M, snapshot: &Snapshot) -> Result<M, RestoreError> {
    restore_where(module, snapshot, |_| false)
}

/// [`restore`], where a parameter whose path `kept` picks keeps its value
/// when the snapshot has none (it was rebuilt from the settings).
pub fn restore_where<B: Backend, M: Module<B>>(
    module: M,
    snapshot: &Snapshot,
    kept: impl Fn(&str) -> bool,
) -> Result<M, RestoreError> {
    struct Load<'a, F> {
        path: PathTracker,
        snapshot: &'a Snapshot,
        error: Option<RestoreError>,
        kept: F,
    }
    impl<B: Backend, F: Fn(&str) -> bool> ModuleMapper<B> for Load<'_, F> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name)
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit()
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let path = self.path.path();
            let expected = tensor.shape().dims::<D>().to_vec();
            let tensor = match self.snapshot.get(&path) {
                None if (self.kept)(&path) => tensor,
                None => {
                    self.error.get_or_insert(RestoreError::Missing(path));
                    tensor
                }
                Some((shape, _, _)) if *shape != expected => {
                    self.error.get_or_insert(RestoreError::Shape {
                        path,
                        found: shape.clone(),
                        expected,
                    });
                    tensor
                }
                Some((shape, _, values)) => {
                    let trainable = tensor.is_require_grad();
                    let dtype = tensor.dtype();
                    let data = TensorData::new(values.clone(), shape.clone());
                    // Created in its stored type: a fresh leaf, not a cast node.
                    Tensor::<B, D>::from_data(data, (&tensor.device(), dtype)).set_require_grad(trainable)
                }
            };
            Param::from_mapped_value(id, tensor, mapper)
        }
    }
    let mut l = Load {
        path: PathTracker::default(),
        snapshot,
        error: None,
        kept,
    };
    let module = module.map(&mut l);
    match l.error {
        Some(e) => Err(e),
        None => Ok(module),
    }
}
