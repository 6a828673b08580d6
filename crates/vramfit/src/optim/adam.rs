use burn::prelude::*;

use super::flex_pass::flex_pass;

/// Adam hyper-parameters (learning rates are given per update).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub epsilon: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        }
    }
}

/// First and second moments of one parameter tensor.
#[derive(Debug, Clone)]
pub struct AdamMoments<B: Backend, const D: usize> {
    /// Running mean of gradients.
    pub m: Tensor<B, D>,
    /// Running mean of squared gradients.
    pub v: Tensor<B, D>,
}

impl<B: Backend, const D: usize> AdamMoments<B, D> {
    /// Zero moments shaped like `param`.
    pub fn zeros_like(param: &Tensor<B, D>) -> Self {
        Self {
            m: param.zeros_like(),
            v: param.zeros_like(),
        }
    }

    /// Appends `rows` zero rows along dimension 0: state for parameters
    /// added during training starts at zero.
    pub fn append_zero_rows(&mut self, rows: usize) {
        let mut dims = self.m.dims();
        dims[0] = rows;
        let zeros = Tensor::<B, D>::zeros(dims, &self.m.device());
        self.m = Tensor::cat(vec![self.m.clone(), zeros.clone()], 0);
        self.v = Tensor::cat(vec![self.v.clone(), zeros], 0);
    }
}

/// Adam with PyTorch's update rule and one step counter shared by every
/// tensor it updates (as a PyTorch Adam whose state rows were extended):
/// `p ← p − lr/(1−β1ᵗ) · m / (√v/√(1−β2ᵗ) + ε)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Adam {
    /// Hyper-parameters.
    pub config: AdamConfig,
    /// Optimiser steps taken.
    pub step: u64,
}

impl Adam {
    /// A fresh optimiser at step 0.
    pub fn new(config: AdamConfig) -> Self {
        Self { config, step: 0 }
    }

    /// Starts an optimiser step: call once, then [`Adam::update`] each tensor.
    pub fn begin_step(&mut self) {
        self.step += 1;
    }

    /// `[β1, 1−β1, β2, 1−β2, √(1−β2ᵗ), ε, lr/(1−β1ᵗ)]` of this step.
    fn scalars(&self, lr: f64) -> [f64; 7] {
        let AdamConfig { beta1, beta2, epsilon } = self.config;
        let t = self.step.max(1) as i32;
        let root_bias2 = (1.0 - beta2.powi(t)).sqrt();
        [
            beta1,
            1.0 - beta1,
            beta2,
            1.0 - beta2,
            root_bias2,
            epsilon,
            lr / (1.0 - beta1.powi(t)),
        ]
    }

    /// Updates one tensor with its gradient and learning rate. On the CPU
    /// backend (Flex) with f32 tensors it is one pass over the four, with
    /// the f32 operations of [`Adam::update_reference`] in the same order
    /// (its dozen Burn operations cost more in per-operation overhead than
    /// in work on a fit's small tensors): the same result, bit for bit.
    /// The moments are passed as clones and the fit keeps its parameters,
    /// so the pass writes copies (of a few small tensors), not in place.
    pub fn update<B: Backend, const D: usize>(
        &self,
        param: Tensor<B, D>,
        grad: Tensor<B, D>,
        moments: &mut AdamMoments<B, D>,
        lr: f64,
    ) -> Tensor<B, D> {
        let dims = param.dims();
        let n = dims.iter().product::<usize>();
        let flat = |t: Tensor<B, D>| t.reshape([n]);
        // Flex's scalar operations round their scalar to f32 first.
        let [b1, c1, b2, c2, root_bias2, eps, step] = self.scalars(lr).map(|x| x as f32);
        let vectors = (
            flat(param),
            flat(grad),
            flat(moments.m.clone()),
            flat(moments.v.clone()),
        );
        let one_pass = flex_pass(vectors, |p, g, m, v| {
            let m = m * b1 + g * c1;
            let v = v * b2 + (g * g) * c2;
            let denom = v.sqrt() / root_bias2 + eps;
            (p - (m / denom) * step, m, v)
        });
        match one_pass {
            Ok((p, m, v)) => {
                moments.m = m.reshape(dims);
                moments.v = v.reshape(dims);
                p.reshape(dims)
            }
            Err((p, g, _, _)) => self.update_reference(p.reshape(dims), g.reshape(dims), moments, lr),
        }
    }

    /// [`Adam::update`] as Burn operations, on any backend.
    pub fn update_reference<B: Backend, const D: usize>(
        &self,
        param: Tensor<B, D>,
        grad: Tensor<B, D>,
        moments: &mut AdamMoments<B, D>,
        lr: f64,
    ) -> Tensor<B, D> {
        let [
            beta1,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            root_bias2,
            epsilon,
            step_size,
        ] = self.scalars(lr);
        moments.m = moments
            .m
            .clone()
            .mul_scalar(beta1)
            .add(grad.clone().mul_scalar(one_minus_beta1));
        moments.v = moments
            .v
            .clone()
            .mul_scalar(beta2)
            .add(grad.clone().mul(grad).mul_scalar(one_minus_beta2));
        let denom = moments.v.clone().sqrt().div_scalar(root_bias2).add_scalar(epsilon);
        param.sub(moments.m.clone().div(denom).mul_scalar(step_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn matches_a_hand_computed_step() {
        let device = Default::default();
        let p = Tensor::<Flex, 1>::from_floats([1.0, -2.0], &device);
        let g = Tensor::<Flex, 1>::from_floats([0.5, -4.0], &device);
        let mut adam = Adam::new(AdamConfig::default());
        let mut m = AdamMoments::zeros_like(&p);
        adam.begin_step();
        let p1 = adam.update(p, g, &mut m, 0.1).into_data().to_vec::<f32>().unwrap();
        // First step: m̂ = g, v̂ = g², so the update is lr·g/(|g| + ε) ≈ lr·sign(g).
        assert!((p1[0] - 0.9).abs() < 1e-6 && (p1[1] + 1.9).abs() < 1e-6, "{p1:?}");
    }

    /// The one-pass CPU update is Burn's operations bit for bit, step after
    /// step, on a 2-D parameter whose buffer another tensor shares (not
    /// written through).
    #[test]
    fn cpu_update_equals_burns_operations_bit_for_bit() {
        use burn::tensor::Distribution;
        let device = Default::default();
        let bits = |t: &Tensor<Flex, 2>| {
            t.to_data()
                .to_vec::<f32>()
                .unwrap()
                .into_iter()
                .map(f32::to_bits)
                .collect::<Vec<_>>()
        };
        let p0 = Tensor::<Flex, 2>::random([4001, 3], Distribution::Normal(0.0, 1.0), &device);
        let mut adam = Adam::new(AdamConfig::default());
        let (mut fast, mut slow) = (p0.clone(), p0.clone());
        let (mut fast_m, mut slow_m) = (AdamMoments::zeros_like(&p0), AdamMoments::zeros_like(&p0));
        for _ in 0..4 {
            adam.begin_step();
            let g = Tensor::<Flex, 2>::random([4001, 3], Distribution::Normal(0.0, 0.5), &device);
            let kept = fast.clone();
            let before = bits(&kept);
            fast = adam.update(fast, g.clone(), &mut fast_m, 3e-3);
            slow = adam.update_reference(slow, g, &mut slow_m, 3e-3);
            assert_eq!(bits(&fast), bits(&slow), "parameters, step {}", adam.step);
            assert_eq!(bits(&fast_m.m), bits(&slow_m.m), "first moments, step {}", adam.step);
            assert_eq!(bits(&fast_m.v), bits(&slow_m.v), "second moments, step {}", adam.step);
            assert_ne!(before, bits(&fast), "the update changed the parameters");
            assert_eq!(before, bits(&kept), "a shared buffer is not written through");
        }
    }

    #[test]
    fn appended_rows_start_at_zero() {
        let device = Default::default();
        let p = Tensor::<Flex, 2>::ones([2, 3], &device);
        let mut m = AdamMoments::zeros_like(&p);
        m.m = m.m.add_scalar(1.0);
        m.append_zero_rows(2);
        assert_eq!(m.m.dims(), [4, 3]);
        assert_eq!(
            m.m.into_data().to_vec::<f32>().unwrap(),
            [vec![1.0; 6], vec![0.0; 6]].concat()
        );
    }
}
