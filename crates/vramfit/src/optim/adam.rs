use burn::prelude::*;

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

    /// Updates one tensor with its gradient and learning rate.
    pub fn update<B: Backend, const D: usize>(
        &self,
        param: Tensor<B, D>,
        grad: Tensor<B, D>,
        moments: &mut AdamMoments<B, D>,
        lr: f64,
    ) -> Tensor<B, D> {
        let AdamConfig { beta1, beta2, epsilon } = self.config;
        let t = self.step.max(1) as i32;
        moments.m = moments
            .m
            .clone()
            .mul_scalar(beta1)
            .add(grad.clone().mul_scalar(1.0 - beta1));
        moments.v = moments
            .v
            .clone()
            .mul_scalar(beta2)
            .add(grad.clone().mul(grad).mul_scalar(1.0 - beta2));
        let step_size = lr / (1.0 - beta1.powi(t));
        let denom = moments
            .v
            .clone()
            .sqrt()
            .div_scalar((1.0 - beta2.powi(t)).sqrt())
            .add_scalar(epsilon);
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
