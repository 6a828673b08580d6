//! Low-rank adapters (LoRA, Hu et al. 2021) on a projection whose base may
//! be frozen and stored small ([`crate::frozen`]): `y = x · W (+ b) +
//! (x · A) · B`, `A: [in, r]`, `B: [r, out]`, B zero at the start so the
//! adapted model begins as the base.
//!
//! [`Projection`] is the building block a model uses for every matrix that
//! may be frozen or adapted: trainable, it is an ordinary linear layer;
//! frozen, its weight is used through [`crate::frozen::linear`], which keeps
//! it as stored (16-bit or quantized) for the backward; adapted, the
//! adapter's sum is added in f32.

use burn::module::{Module, Param};
use burn::prelude::*;

use crate::frozen::{BaseStorage, Matrix, QuantError, Quantized};
use crate::precision::Autocast;

/// A low-rank adapter: `A: [in, r]`, `B: [r, out]`.
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// Down to the rank.
    pub a: Param<Tensor<B, 2>>,
    /// Up from it (zero at the start).
    pub b: Param<Tensor<B, 2>>,
}

impl<B: Backend> Lora<B> {
    /// An adapter from `a` (`[in, r]`, drawn by the caller) and a zero `B`.
    pub fn new(a: Param<Tensor<B, 2>>, outputs: usize) -> Self {
        let [_, rank] = a.val().dims();
        let device = a.val().device();
        Self {
            a,
            b: Param::from_tensor(Tensor::zeros([rank, outputs], &device)),
        }
    }
}

/// `x · W (+ b)`, `W: [in, out]`, with a low-rank adapter added where the
/// model has one. `W` is a float parameter (`weight`) or, for a quantized
/// frozen base, `quantized`; exactly one of the two is present.
#[derive(Module, Debug)]
pub struct Projection<B: Backend> {
    /// Weight, `[in, out]`, where it is stored as floats.
    pub weight: Option<Param<Tensor<B, 2>>>,
    /// Weight, where it is block-quantized (frozen).
    pub quantized: Option<Quantized<B>>,
    /// Bias, where the shape has one.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The adapter, where one was added.
    pub lora: Option<Lora<B>>,
}

impl<B: Backend> Projection<B> {
    /// A plain projection with a float weight.
    pub fn new(weight: Param<Tensor<B, 2>>, bias: Option<Param<Tensor<B, 1>>>) -> Self {
        Self {
            weight: Some(weight),
            quantized: None,
            bias,
            lora: None,
        }
    }

    /// `[in, out]`.
    pub fn dims(&self) -> [usize; 2] {
        match (&self.weight, &self.quantized) {
            (Some(w), _) => w.val().dims(),
            (None, Some(q)) => q.dims(),
            (None, None) => unreachable!("a projection holds a weight"),
        }
    }

    /// The weight as stored.
    pub fn matrix(&self) -> Matrix<B> {
        match (&self.weight, &self.quantized) {
            (Some(w), _) => Matrix::Float(w.val()),
            (None, Some(q)) => Matrix::of(q),
            (None, None) => unreachable!("a projection holds a weight"),
        }
    }

    /// Whether the weight trains.
    pub fn weight_trains(&self) -> bool {
        self.weight.as_ref().is_some_and(|w| w.val().is_require_grad())
    }

    /// `x: [.., in]` → `[.., out]`: the base in the compute type, or, with
    /// an adapter, base and adapter added in f32.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, ac: &Autocast) -> Tensor<B, D> {
        let bias = self.bias.as_ref().map(|b| b.val());
        let base = match &self.weight {
            Some(w) if w.val().is_require_grad() => ac.linear(x.clone(), w.val(), bias),
            _ => crate::frozen::linear(x.clone(), &self.matrix(), bias, ac),
        };
        match &self.lora {
            Some(l) => ac.full(base) + ac.full(ac.linear(ac.linear(x, l.a.val(), None), l.b.val(), None)),
            None => base,
        }
    }

    /// Adds `lora` (replacing any adapter there).
    pub fn adapt(self, lora: Lora<B>) -> Self {
        Self {
            lora: Some(lora),
            ..self
        }
    }

    /// The weight frozen and stored as `storage` says: cast to its float
    /// type, or quantized (refused when its values are not a whole number
    /// of blocks or not finite). The bias is frozen, in the float type or,
    /// beside a quantized weight, in f32 (every device has it).
    pub fn frozen_as(self, storage: BaseStorage) -> Result<Self, QuantError> {
        let Self {
            weight,
            quantized,
            bias,
            lora,
        } = self;
        let bias_dtype = match storage.format() {
            Some(_) => burn::tensor::FloatDType::F32,
            None => storage.float(),
        };
        let bias = bias.map(|b| frozen_float(b, bias_dtype));
        let (weight, quantized) = match (weight, storage.format()) {
            (Some(w), Some(format)) if crate::shapes::is_shapes::<B>() => {
                // No values to read back and quantize: the weight goes, as
                // a device's does when it is read, then the stored buffers.
                let (dims, device) = (w.val().dims(), w.val().device());
                drop(w);
                (None, Some(Quantized::unset(dims, format, &device)?))
            }
            (Some(w), Some(format)) => {
                let t = w.val();
                let (dims, device) = (t.dims(), t.device());
                let values = t.into_data().convert::<f32>();
                let values = values.as_slice::<f32>().expect("f32 values");
                (None, Some(Quantized::new(values, dims, format, &device)?))
            }
            (Some(w), None) => (Some(frozen_float(w, storage.float())), None),
            (None, _) => (None, quantized),
        };
        Ok(Self {
            weight,
            quantized,
            bias,
            lora,
        })
    }
}

/// `param` frozen and stored in `dtype` (rebuilt as a leaf in that type).
pub fn frozen_float<B: Backend, const D: usize>(
    param: Param<Tensor<B, D>>,
    dtype: burn::tensor::FloatDType,
) -> Param<Tensor<B, D>> {
    let (id, tensor, mapper) = param.consume();
    let tensor = if tensor.dtype() == dtype.into() {
        tensor
    } else if crate::shapes::is_shapes::<B>() {
        // No values to read back: the tensor goes as the read takes it,
        // then a buffer of the stored type.
        let (shape, device) = (tensor.shape(), tensor.device());
        drop(tensor);
        Tensor::empty(shape, (&device, dtype.into()))
    } else {
        let device = tensor.device();
        let data = tensor.into_data().convert_dtype(dtype.into());
        Tensor::from_data(data, (&device, dtype.into()))
    };
    Param::from_mapped_value(id, tensor, mapper).set_require_grad(false)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::Distribution;

    use super::*;
    use crate::frozen::code_bytes;
    use crate::precision::Precision;

    type B = Autodiff<Flex>;

    /// A frozen projection's parameters take no gradient; its bias and
    /// weight stay frozen through the cast; the quantized one holds 4.5 bits a
    /// weight.
    #[test]
    fn a_frozen_projection_holds_no_gradient_and_its_stored_bytes() {
        let _graph = crate::grads::graph_lock();
        let device = Default::default();
        let w = Projection::<B>::new(
            Param::from_tensor(Tensor::random([64, 32], Distribution::Normal(0.0, 0.02), &device)),
            Some(Param::from_tensor(Tensor::zeros([32], &device))),
        );
        let frozen = w.frozen_as(BaseStorage::Nf4).unwrap();
        assert!(frozen.weight.is_none());
        assert_eq!(
            frozen.quantized.as_ref().unwrap().bytes(),
            64 * 32 / 2 + 64 * 32 / 64 * 4
        );
        assert_eq!(code_bytes(&frozen), 64 * 32 / 2);
        let params = crate::params::describe(&frozen);
        assert!(params.iter().all(|p| !p.trainable), "{params:?}");
        let x = Tensor::<B, 2>::random([3, 64], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let grads = frozen
            .forward(x.clone(), &Autocast::new(Precision::F32))
            .sum()
            .backward();
        assert!(x.grad(&grads).is_some());
        assert!(frozen.bias.as_ref().unwrap().val().grad(&grads).is_none());
        // A weight that is not a whole number of blocks is refused by name.
        let odd = Projection::<B>::new(Param::from_tensor(Tensor::zeros([5, 7], &device)), None);
        let e = odd.frozen_as(BaseStorage::Nf4).unwrap_err();
        assert!(
            e.to_string()
                .contains("35 values are not a whole number of blocks of 64"),
            "{e}"
        );
    }
}
