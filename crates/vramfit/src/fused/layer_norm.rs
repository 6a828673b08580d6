//! Layer normalisation over the last axis as one autodiff operation.

#[allow(unused_imports)]
use super::*;

/// Layer normalisation over the last axis: `(x − mean) / √(var + eps) · γ + β`
/// (biased variance, as PyTorch's `layer_norm`).
pub fn layer_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    if gamma.dtype() == DType::F32 && beta.dtype() == DType::F32 {
        match on_cpu(x) {
            Ok(x) => {
                let (gamma, beta) = (
                    downcast(gamma).unwrap_or_else(|_| unreachable!("same backend as x")),
                    downcast(beta).unwrap_or_else(|_| unreachable!("same backend as x")),
                );
                return back(layer_norm_cpu(x, gamma, beta, eps as f32));
            }
            Err(x) => return layer_norm_reference(x, gamma, beta, eps),
        }
    }
    layer_norm_reference(x, gamma, beta, eps)
}

/// [`layer_norm`] from Burn's operations (every backend; the CPU kernels' oracle).
pub fn layer_norm_reference<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    let last = D - 1;
    let centred = x.clone() - x.mean_dim(last);
    let var = centred.clone().powi_scalar(2).mean_dim(last);
    let y = centred / var.add_scalar(eps).sqrt();
    let w = gamma.dims()[0];
    let mut shape = [1; D];
    shape[last] = w;
    y * gamma.reshape(shape) + beta.reshape(shape)
}

/// Forward state: the normalised input and each row's `1 / σ`.
#[derive(Debug, Clone)]
pub(super) struct Normed {
    pub(super) x_hat: Vec<f32>,
    pub(super) rstd: Vec<f32>,
}

pub(super) fn layer_norm_forward(x: &FlexTensor, gamma: &[f32], beta: &[f32], eps: f32) -> (FlexTensor, Normed) {
    let shape = x.layout().shape().clone();
    let w = gamma.len();
    let x = values(x);
    let rows = x.len() / w;
    let (mut y, mut x_hat, mut rstd) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()], vec![0.0f32; rows]);
    let task = ROWS_PER_TASK * w;
    y.par_chunks_mut(task)
        .zip(x_hat.par_chunks_mut(task))
        .zip(rstd.par_chunks_mut(ROWS_PER_TASK))
        .zip(x.par_chunks(task))
        .for_each(|(((yc, hc), rc), xc)| {
            for (((yr, hr), r), xr) in yc
                .chunks_exact_mut(w)
                .zip(hc.chunks_exact_mut(w))
                .zip(rc.iter_mut())
                .zip(xc.chunks_exact(w))
            {
                let mean = xr.iter().sum::<f32>() / w as f32;
                let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / w as f32;
                *r = 1.0 / (var + eps).sqrt();
                for ((((o, h), v), g), b) in yr.iter_mut().zip(hr.iter_mut()).zip(xr).zip(gamma).zip(beta) {
                    *h = (v - mean) * *r;
                    *o = *h * g + b;
                }
            }
        });
    (flex(y, shape), Normed { x_hat, rstd })
}

/// `(dx, dγ, dβ)`: with `g = dy ⊙ γ`, `dx = (g − mean(g) − x̂ · mean(g ⊙ x̂)) / σ`;
/// `dγ = Σ dy ⊙ x̂` and `dβ = Σ dy` over rows, added per task and then in
/// task order (the same sums whatever the thread count).
pub(super) fn layer_norm_backward(normed: &Normed, gamma: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let w = gamma.len();
    let mut dx = vec![0.0f32; dy.len()];
    let task = ROWS_PER_TASK * w;
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(task)
        .zip(normed.x_hat.par_chunks(task))
        .zip(normed.rstd.par_chunks(ROWS_PER_TASK))
        .zip(dy.par_chunks(task))
        .map(|(((dxc, hc), rc), dyc)| {
            let (mut d_gamma, mut d_beta) = (vec![0.0f32; w], vec![0.0f32; w]);
            for (((dxr, hr), r), dyr) in dxc
                .chunks_exact_mut(w)
                .zip(hc.chunks_exact(w))
                .zip(rc)
                .zip(dyc.chunks_exact(w))
            {
                let (mut mean_g, mut mean_gh) = (0.0f32, 0.0f32);
                for (((dg, db), (d, h)), g) in d_gamma
                    .iter_mut()
                    .zip(d_beta.iter_mut())
                    .zip(dyr.iter().zip(hr))
                    .zip(gamma)
                {
                    *dg += d * h;
                    *db += d;
                    mean_g += d * g;
                    mean_gh += d * g * h;
                }
                mean_g /= w as f32;
                mean_gh /= w as f32;
                for (((o, d), h), g) in dxr.iter_mut().zip(dyr).zip(hr).zip(gamma) {
                    *o = (d * g - mean_g - h * mean_gh) * r;
                }
            }
            (d_gamma, d_beta)
        })
        .collect();
    let (mut d_gamma, mut d_beta) = (vec![0.0f32; w], vec![0.0f32; w]);
    for (dg, db) in &partials {
        d_gamma.iter_mut().zip(dg).for_each(|(a, b)| *a += b);
        d_beta.iter_mut().zip(db).for_each(|(a, b)| *a += b);
    }
    (dx, d_gamma, d_beta)
}

pub(super) fn layer_norm_cpu<const D: usize>(
    x: Tensor<Cpu, D>,
    gamma: Tensor<Cpu, 1>,
    beta: Tensor<Cpu, 1>,
    eps: f32,
) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct LayerNorm;

    impl Backward<Flex, 3> for LayerNorm {
        type State = (Normed, FlexTensor, burn::tensor::Shape);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let dy = grads.consume::<Flex>(&ops.node);
            let (normed, gamma, shape) = ops.state;
            let (dx, d_gamma, d_beta) = layer_norm_backward(&normed, &values(&gamma), &values(&dy));
            let w = d_gamma.len();
            let [x, g, b] = ops.parents;
            if let Some(node) = x {
                grads.register::<Flex>(node.id, flex(dx, shape));
            }
            if let Some(node) = g {
                grads.register::<Flex>(node.id, flex(d_gamma, [w].into()));
            }
            if let Some(node) = b {
                grads.register::<Flex>(node.id, flex(d_beta, [w].into()));
            }
        }
    }

    let (x, gamma, beta) = (
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
    );
    let forward = || {
        let (g, b) = (values(&gamma.primitive), values(&beta.primitive));
        layer_norm_forward(&x.primitive, &g, &b, eps)
    };
    let out = match LayerNorm
        .prepare::<NoCheckpointing>([x.node.clone(), gamma.node.clone(), beta.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (y, normed) = forward();
            let shape = x.primitive.layout().shape().clone();
            prep.finish((normed, gamma.primitive.clone(), shape), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward().0),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
