//! Rotary positions ("rotate half", as Llama's reference) as one autodiff
//! operation on the CPU.
//!
//! Burn's form narrows the input into its two halves (strided views),
//! multiplies each by the cosine and sine tables, subtracts, adds and
//! concatenates: each a pass that walks a strided view element by
//! element, and twice as many again backward (3.7 % of TinyLlama's bf16
//! LoRA step on its one main thread, perf, 2026-11-29). Here the forward is
//! one pass over rows of `dh` values, the backward the inverse rotation of
//! the output's gradient; the values are the same f32 expressions, so the
//! forward is Burn's to the bit.

#[allow(unused_imports)]
use super::*;

/// `x: [b, h, t, dh]` turned pair by pair: values `i` and `i + dh/2` of
/// position `p` by the angle `p · θ^(−2i/dh)`. On the CPU backend with
/// f32 one operation; elsewhere [`rotary_reference`].
pub fn rotary<B: Backend>(x: Tensor<B, 4>, theta: f64) -> Tensor<B, 4> {
    match on_cpu(x) {
        Ok(x) => back(rotary_cpu(x, theta)),
        Err(x) => rotary_reference(x, theta),
    }
}

/// The cosine and sine tables, `[t, dh/2]` each, row major: computed once
/// a process for each length, width and base (a step asks for them twice
/// a block: a 7B's 2,048 tokens are 262,144 sines and cosines each time).
fn tables(t: usize, dh: usize, theta: f64) -> std::sync::Arc<(Vec<f32>, Vec<f32>)> {
    type Tables = std::collections::HashMap<(usize, usize, u64), std::sync::Arc<(Vec<f32>, Vec<f32>)>>;
    static MADE: std::sync::Mutex<Option<Tables>> = std::sync::Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    made.get_or_insert_with(Default::default)
        .entry((t, dh, theta.to_bits()))
        .or_insert_with(|| std::sync::Arc::new(compute_tables(t, dh, theta)))
        .clone()
}

fn compute_tables(t: usize, dh: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = dh / 2;
    let (mut cos, mut sin) = (Vec::with_capacity(t * half), Vec::with_capacity(t * half));
    for p in 0..t {
        for i in 0..half {
            let angle = p as f64 * theta.powf(-2.0 * i as f64 / dh as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// Rotary positions in Burn's own operations (every backend and type).
pub fn rotary_reference<B: Backend>(x: Tensor<B, 4>, theta: f64) -> Tensor<B, 4> {
    let [_, _, t, dh] = x.dims();
    let half = dh / 2;
    let made = tables(t, dh, theta);
    let device = x.device();
    let table =
        |v: &Vec<f32>| Tensor::<B, 2>::from_data(TensorData::new(v.clone(), [t, half]), &device).unsqueeze::<4>();
    let (cos, sin) = (table(&made.0), table(&made.1));
    let (a, b) = (x.clone().narrow(3, 0, half), x.narrow(3, half, half));
    Tensor::cat(
        vec![a.clone() * cos.clone() - b.clone() * sin.clone(), b * cos + a * sin],
        3,
    )
}

/// Each `dh`-row of `x` (rows in `[.., t, dh]` order) turned by its
/// position's angles: by `+angle` forward, by `−angle` for the gradient
/// (the rotation's transpose).
fn turned(x: &[f32], t: usize, dh: usize, cos: &[f32], sin: &[f32], inverse: bool) -> Vec<f32> {
    let half = dh / 2;
    let mut y = vec![0f32; x.len()];
    y.par_chunks_mut(dh * ROWS_PER_TASK)
        .zip(x.par_chunks(dh * ROWS_PER_TASK))
        .enumerate()
        .for_each(|(task, (yc, xc))| {
            for (r, (yr, xr)) in yc.chunks_mut(dh).zip(xc.chunks(dh)).enumerate() {
                let p = (task * ROWS_PER_TASK + r) % t;
                let (c, s) = (&cos[p * half..(p + 1) * half], &sin[p * half..(p + 1) * half]);
                let (a, b) = xr.split_at(half);
                let (ya, yb) = yr.split_at_mut(half);
                for i in 0..half {
                    if inverse {
                        ya[i] = a[i] * c[i] + b[i] * s[i];
                        yb[i] = b[i] * c[i] - a[i] * s[i];
                    } else {
                        ya[i] = a[i] * c[i] - b[i] * s[i];
                        yb[i] = b[i] * c[i] + a[i] * s[i];
                    }
                }
            }
        });
    y
}

fn rotary_cpu(x: Tensor<Cpu, 4>, theta: f64) -> Tensor<Cpu, 4> {
    #[derive(Debug)]
    struct Rotary;

    impl Backward<Flex, 1> for Rotary {
        /// `t`, `dh` and the tables.
        type State = (usize, usize, Vec<f32>, Vec<f32>);

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let g = grads.consume::<Flex>(&ops.node);
            if let Some(node) = &ops.parents[0] {
                let (t, dh, cos, sin) = &ops.state;
                let shape = g.layout().shape().clone();
                let dx = turned(&values(&g), *t, *dh, cos, sin, true);
                grads.register::<Flex>(node.id, flex(dx, shape));
            }
        }
    }

    let [_, _, t, dh] = x.dims();
    assert!(dh % 2 == 0, "rotary positions turn pairs: a head width of {dh} is odd");
    let made = tables(t, dh, theta);
    let (cos, sin) = (made.0.clone(), made.1.clone());
    let x = x.into_primitive().tensor();
    let shape = x.primitive.layout().shape().clone();
    let y = flex(turned(&values(&x.primitive), t, dh, &cos, &sin, false), shape);
    let out = match Rotary
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((t, dh, cos, sin), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
