//! Reduced-precision storage of chosen parameter groups.
//!
//! A group is a path prefix (`token_embedding`, `blocks.0`, or `*` for every
//! parameter). Its parameters are stored in f16 or bf16: half the bytes.
//! The forward casts them to the compute type when it uses them (see
//! [`crate::precision::Autocast`]); their gradients arrive in the stored
//! type; the optimiser ([`crate::optim::ModuleAdam`]) does its arithmetic in
//! f32 and rounds the result back to the stored type (round to nearest
//! even). Updates smaller than half a unit in the last place of the stored
//! value are lost, which is why the usual candidates are frozen groups and
//! large tables whose entries each get few updates.

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;
use burn::tensor::FloatDType;

use crate::params::PathTracker;

/// Which parameter groups are stored in which type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoragePolicy {
    groups: Vec<(String, FloatDType)>,
}

/// A storage setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// Not `PREFIX:TYPE`.
    #[error(
        "storage entry `{0}` is not PREFIX:TYPE with TYPE one of f32, bf16, f16 (for example *:bf16, or a group's path prefix such as blocks.0:bf16)"
    )]
    Syntax(String),
    /// A prefix that names no parameter.
    #[error("storage group `{prefix}` matches no parameter; parameters start with: {known}")]
    NoMatch {
        /// The prefix.
        prefix: String,
        /// Top-level names that exist.
        known: String,
    },
}

fn parse_dtype(text: &str) -> Option<FloatDType> {
    match text {
        "f32" => Some(FloatDType::F32),
        "bf16" => Some(FloatDType::BF16),
        "f16" => Some(FloatDType::F16),
        _ => None,
    }
}

fn matches(prefix: &str, path: &str) -> bool {
    prefix == "*" || path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.'))
}

impl StoragePolicy {
    /// Parses entries `PREFIX:TYPE` (later entries win where prefixes overlap).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, StorageError> {
        let mut groups = Vec::new();
        for e in entries {
            let e = e.as_ref();
            let (prefix, dtype) = e.rsplit_once(':').ok_or_else(|| StorageError::Syntax(e.to_string()))?;
            let dtype = parse_dtype(dtype).ok_or_else(|| StorageError::Syntax(e.to_string()))?;
            if prefix.is_empty() {
                return Err(StorageError::Syntax(e.to_string()));
            }
            groups.push((prefix.to_string(), dtype));
        }
        Ok(Self { groups })
    }

    /// The stored type of the parameter at `path`, if the policy names it.
    pub fn dtype_of(&self, path: &str) -> Option<FloatDType> {
        self.groups
            .iter()
            .rev()
            .find(|(p, _)| matches(p, path))
            .map(|(_, d)| *d)
    }

    /// Casts the named groups of `module` to their stored types, keeping
    /// ids and whether each parameter trains. Errors if a group matches
    /// nothing (a typo would otherwise silently store everything in f32).
    pub fn apply<B: Backend, M: Module<B>>(&self, module: M) -> Result<M, StorageError> {
        let paths: Vec<String> = crate::params::describe(&module).into_iter().map(|p| p.path).collect();
        for (prefix, _) in &self.groups {
            if !paths.iter().any(|p| matches(prefix, p)) {
                let mut known: Vec<&str> = paths.iter().map(|p| p.split('.').next().unwrap_or(p)).collect();
                known.dedup();
                return Err(StorageError::NoMatch {
                    prefix: prefix.clone(),
                    known: known.join(", "),
                });
            }
        }
        struct Cast<'a>(PathTracker, &'a StoragePolicy);
        impl<B: Backend> ModuleMapper<B> for Cast<'_> {
            fn enter_module(&mut self, name: &str, _: &str) {
                self.0.enter(name)
            }
            fn exit_module(&mut self, _: &str, _: &str) {
                self.0.exit()
            }
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
                let (id, tensor, mapper) = param.consume();
                let tensor = match self.1.dtype_of(&self.0.path()) {
                    Some(dtype) if tensor.dtype() != dtype.into() => {
                        let trainable = tensor.is_require_grad();
                        let device = tensor.device();
                        // Rebuilt in the stored type so it is a leaf, not a cast node of autodiff.
                        let data = tensor.into_data().convert_dtype(dtype.into());
                        Tensor::from_data(data, (&device, dtype.into())).set_require_grad(trainable)
                    }
                    _ => tensor,
                };
                Param::from_mapped_value(id, tensor, mapper)
            }
        }
        Ok(module.map(&mut Cast(PathTracker::default(), self)))
    }
}

/// Stored bytes of every parameter of `module` (a quantized base's codes
/// included).
pub fn parameter_bytes<B: Backend, M: Module<B>>(module: &M) -> u64 {
    crate::params::describe(module).iter().map(|p| p.bytes()).sum::<u64>() + crate::frozen::code_bytes(module)
}

/// Bytes of `module`'s trainable and of its frozen parameters, as stored
/// (a quantized base's codes are frozen).
pub fn trainable_and_frozen_bytes<B: Backend, M: Module<B>>(module: &M) -> (u64, u64) {
    let (t, f) = crate::params::describe(module).iter().fold((0, 0), |(t, f), p| {
        if p.trainable {
            (t + p.bytes(), f)
        } else {
            (t, f + p.bytes())
        }
    });
    (t, f + crate::frozen::code_bytes(module))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches_prefixes() {
        let p = StoragePolicy::parse(&["blocks:bf16", "blocks.1:f16"]).unwrap();
        assert_eq!(p.dtype_of("blocks.0.w"), Some(FloatDType::BF16));
        assert_eq!(p.dtype_of("blocks.1.w"), Some(FloatDType::F16));
        assert_eq!(p.dtype_of("blocks_extra.w"), None, "a prefix matches whole names only");
        assert_eq!(p.dtype_of("head"), None);
        assert_eq!(
            StoragePolicy::parse(&["*:bf16"]).unwrap().dtype_of("x.y"),
            Some(FloatDType::BF16)
        );
        for bad in ["blocks", "blocks:f8", ":bf16"] {
            assert!(StoragePolicy::parse(&[bad]).is_err(), "{bad}");
        }
    }
}
