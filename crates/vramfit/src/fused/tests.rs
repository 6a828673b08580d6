//! The fused operations against Burn's own, in value and gradient.

use super::*;
use burn::tensor::Distribution;

fn close(a: Vec<f32>, b: Vec<f32>, tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0f32, f32::max);
    assert!(worst <= tol, "{what}: largest relative difference {worst:e} > {tol:e}");
    assert!(
        b.iter().any(|v| v.abs() > 1e-3),
        "{what}: all ~0, the case tests nothing"
    );
}

fn host<const D: usize>(t: Tensor<Cpu, D>) -> Vec<f32> {
    t.into_data().into_vec::<f32>().unwrap()
}

/// The fused softmax's value and gradient are Burn's decomposed ones, on
/// a non-contiguous input (a transposed view, as attention makes).
/// The gemm products' value and both gradients are Burn's matmul's, on
/// transposed (non-contiguous) operands: 2-D, with shapes large enough
/// for gemm's threads, and batched as attention's.
#[test]
fn matmul_matches_burns() {
    let d = Default::default();
    for (m, k, n) in [(37, 19, 23), (256, 200, 192)] {
        let a = Tensor::<Cpu, 2>::random([k, m], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let b = Tensor::<Cpu, 2>::random([k, n], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let up = Tensor::<Cpu, 2>::random([m, n], Distribution::Normal(0.0, 1.0), &d);
        let view = |t: Tensor<Cpu, 2>| t.transpose();
        check_matmul(&a, &b, up, view, |t| t, "2-D");
    }
    let a = Tensor::<Cpu, 4>::random([2, 3, 9, 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let b = Tensor::<Cpu, 4>::random([2, 3, 7, 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let up = Tensor::<Cpu, 4>::random([2, 3, 9, 7], Distribution::Normal(0.0, 1.0), &d);
    check_matmul(&a, &b, up, |t| t, |t| t.swap_dims(2, 3), "batched");
    // A transposed block of columns: the stored rows further apart than their width.
    let a = Tensor::<Cpu, 2>::random([37, 19], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let b = Tensor::<Cpu, 2>::random([23, 19 + 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let up = Tensor::<Cpu, 2>::random([37, 23], Distribution::Normal(0.0, 1.0), &d);
    let block = |t: Tensor<Cpu, 2>| t.narrow(1, 1, 19).transpose();
    check_matmul(&a, &b, up, |t| t, block, "transposed column block");
    // A batch read from an offset into its buffer (a narrow of the batch axis).
    let a = Tensor::<Cpu, 4>::random([4, 3, 9, 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let b = Tensor::<Cpu, 4>::random([2, 3, 5, 7], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let up = Tensor::<Cpu, 4>::random([2, 3, 9, 7], Distribution::Normal(0.0, 1.0), &d);
    check_matmul(&a, &b, up, |t| t.narrow(0, 1, 2), |t| t, "batch at an offset");
}

fn check_matmul<const D: usize>(
    a: &Tensor<Cpu, D>,
    b: &Tensor<Cpu, D>,
    up: Tensor<Cpu, D>,
    view_a: impl Fn(Tensor<Cpu, D>) -> Tensor<Cpu, D>,
    view_b: impl Fn(Tensor<Cpu, D>) -> Tensor<Cpu, D>,
    what: &str,
) {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let fused = matmul(view_a(a.clone()), view_b(b.clone()));
    let reference = view_a(a.clone()).matmul(view_b(b.clone()));
    close(host(fused.clone()), host(reference.clone()), 1e-5, what);
    let g_fused = (fused * up.clone()).sum().backward();
    let g_ref = (reference * up).sum().backward();
    for (t, side) in [(a, "d_a"), (b, "d_b")] {
        close(
            t.grad(&g_fused).unwrap().into_data().into_vec().unwrap(),
            t.grad(&g_ref).unwrap().into_data().into_vec().unwrap(),
            1e-5,
            &format!("{what} {side}"),
        );
    }
}

/// bf16 products (the frozen weights' and the adapters' under `--precision
/// bf16`): value and both gradients equal Burn's bf16 matmul (f32 sums
/// rounded once) to within a bf16 unit, for both layouts the kernels read
/// in place (row major, transposed) and a transposed left operand (copied
/// first; batches are `gemm_bf16`'s own test), with and without autodiff. The shapes cover
/// the tiles' and panels' remainders and an odd inner dimension.
#[test]
fn bf16_matmul_matches_burns() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let bf16 = burn::tensor::FloatDType::BF16;
    let normal = |shape: [usize; 2]| Tensor::<Cpu, 2>::random(shape, Distribution::Normal(0.0, 1.0), &d).cast(bf16);
    let wide = |t: Tensor<Cpu, 2>| host(t.cast(burn::tensor::FloatDType::F32));
    type View = fn(Tensor<Cpu, 2>) -> Tensor<Cpu, 2>;
    let views: [(&str, View, View); 3] = [
        ("x · W", |t| t, |t| t),
        ("g · Wᵀ", |t| t, |t| t.transpose()),
        ("xᵀ · g", |t| t.transpose(), |t| t),
    ];
    for (m, k, n) in [(7, 33, 70), (64, 129, 200)] {
        for (what, view_a, view_b) in views {
            let a = normal(if what == "xᵀ · g" { [k, m] } else { [m, k] }).require_grad();
            let b = normal(if what == "g · Wᵀ" { [n, k] } else { [k, n] }).require_grad();
            let up = normal([m, n]);
            let fused = matmul(view_a(a.clone()), view_b(b.clone()));
            assert_eq!(fused.dtype(), DType::BF16, "{what}: the product's type");
            let reference = view_a(a.clone()).matmul(view_b(b.clone()));
            let case = format!("{what} {m}×{k}×{n}");
            close(wide(fused.clone()), wide(reference.clone()), 1e-2, &case);
            let g_fused = (fused * up.clone()).sum().backward();
            let g_ref = (reference * up).sum().backward();
            for (t, side) in [(&a, "d_a"), (&b, "d_b")] {
                let grad = |g: &_| wide(Tensor::from_inner(t.grad(g).unwrap()));
                close(grad(&g_fused), grad(&g_ref), 1e-2, &format!("{case} {side}"));
            }
            // Without autodiff (a frozen weight's product inside its own
            // operation): the same values.
            let (pa, pb) = (view_a(a.clone()).inner(), view_b(b.clone()).inner());
            let (plain, plain_ref) = (matmul(pa.clone(), pb.clone()), pa.matmul(pb));
            let flat = |t: Tensor<Flex, 2>| host(Tensor::from_inner(t.cast(burn::tensor::FloatDType::F32)));
            close(flat(plain), flat(plain_ref), 1e-2, &format!("{case}, no autodiff"));
        }
    }
}

/// The rotary positions' value is Burn's operations' to the bit, and the
/// gradient theirs, on a view (as the heads arrive) and on a plain tensor.
#[test]
fn rotary_matches_burns_operations() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    // 40 positions: rows of two heads span several of the operation's tasks.
    let x = Tensor::<Cpu, 4>::random([2, 40, 3, 8], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let up = Tensor::<Cpu, 4>::random([2, 3, 40, 8], Distribution::Normal(0.0, 1.0), &d);
    for (what, view) in [("a view", true), ("plain", false)] {
        // `* 1.0` makes a row-major copy.
        let x_in = || {
            if view {
                x.clone().swap_dims(1, 2)
            } else {
                x.clone().swap_dims(1, 2) * 1.0
            }
        };
        let (ours, burns) = (rotary(x_in(), 10_000.0), rotary_reference(x_in(), 10_000.0));
        close(host(ours.clone()), host(burns.clone()), 0.0, &format!("{what}: value"));
        let g_ours = (ours * up.clone()).sum().backward();
        let g_burns = (burns * up.clone()).sum().backward();
        close(
            host(Tensor::from_inner(x.grad(&g_ours).unwrap())),
            host(Tensor::from_inner(x.grad(&g_burns).unwrap())),
            1e-6,
            &format!("{what}: gradient"),
        );
    }
}

/// The bias-seeded product and its three gradients are Burn's matmul
/// and broadcast add's: small, and large enough for gemm's threads and
/// its blocking over the inner dimension; x a transposed view, the
/// weight a block of columns of a wider one (rows further apart than
/// its width, read in place).
#[test]
fn linear_matches_burns_matmul_and_add() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    for (rows, inputs, outputs) in [(37, 19, 23), (300, 600, 257)] {
        let x = Tensor::<Cpu, 2>::random([inputs, rows], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let wide = Tensor::<Cpu, 2>::random([inputs, outputs + 9], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let w = || wide.clone().narrow(1, 4, outputs);
        let bias = Tensor::<Cpu, 1>::random([outputs], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let up = Tensor::<Cpu, 2>::random([rows, outputs], Distribution::Normal(0.0, 1.0), &d);
        // One graph at a time: a backward consumes the graph of every
        // node it reaches.
        let fused = linear(x.clone().transpose(), w(), bias.clone());
        let y_fused = host(fused.clone());
        let g_fused = (fused * up.clone()).sum().backward();
        let reference = x.clone().transpose().matmul(w()) + bias.clone().unsqueeze::<2>();
        let y_ref = host(reference.clone());
        let g_ref = (reference * up).sum().backward();
        let what = format!("{rows}×{inputs}×{outputs}");
        close(y_fused, y_ref, 1e-5, &what);
        let grad = |g: &Gradients, t: &Tensor<Cpu, 2>| t.grad(g).unwrap().into_data().into_vec().unwrap();
        close(grad(&g_fused, &x), grad(&g_ref, &x), 1e-5, &format!("{what} d_x"));
        close(grad(&g_fused, &wide), grad(&g_ref, &wide), 1e-5, &format!("{what} d_w"));
        close(
            bias.grad(&g_fused).unwrap().into_data().into_vec().unwrap(),
            bias.grad(&g_ref).unwrap().into_data().into_vec().unwrap(),
            1e-5,
            &format!("{what} d_bias"),
        );
    }
}

/// Row-major, transposed and column-block matrices are read where they
/// lie; a layout gemm cannot stride through is copied.
#[test]
fn matrices_are_read_in_place_where_they_lie() {
    let d = Default::default();
    let t = Tensor::<Flex, 4>::random([2, 3, 5, 7], Distribution::Default, &d);
    let w = Tensor::<Flex, 2>::random([6, 12], Distribution::Default, &d);
    let cases = [
        (t.clone().into_primitive().tensor(), true, false, "row major"),
        (t.clone().swap_dims(2, 3).into_primitive().tensor(), true, true, "kᵀ"),
        (
            w.clone().narrow(1, 4, 4).into_primitive().tensor(),
            true,
            false,
            "column block",
        ),
        (
            w.transpose().narrow(0, 4, 4).into_primitive().tensor(),
            true,
            true,
            "its transpose",
        ),
        (
            t.clone().narrow(0, 1, 1).into_primitive().tensor(),
            true,
            false,
            "a batch at an offset",
        ),
        (
            t.swap_dims(1, 2).into_primitive().tensor(),
            false,
            false,
            "heads swapped",
        ),
    ];
    for (tensor, in_place, transposed, what) in cases {
        let m = Matrices::of(&tensor);
        let borrowed = matches!(m.values, std::borrow::Cow::Borrowed(_));
        assert_eq!((borrowed, m.transposed), (in_place, transposed), "{what}");
    }
}

#[test]
fn causal_softmax_matches_burns_operations() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let x = Tensor::<Cpu, 4>::random([2, 3, 7, 7], Distribution::Normal(0.0, 2.0), &d).require_grad();
    let up = Tensor::<Cpu, 4>::random([2, 3, 7, 7], Distribution::Normal(0.0, 1.0), &d);
    let view = |x: Tensor<Cpu, 4>| x.swap_dims(2, 3);
    let fused = causal_softmax(view(x.clone()), 0.3);
    let reference = causal_softmax_reference(view(x.clone()), 0.3);
    close(host(fused.clone()), host(reference.clone()), 1e-6, "softmax");
    let g_fused = x.grad(&(fused * up.clone()).sum().backward()).unwrap();
    let g_ref = x.grad(&(reference * up).sum().backward()).unwrap();
    close(
        g_fused.into_data().into_vec().unwrap(),
        g_ref.into_data().into_vec().unwrap(),
        1e-5,
        "softmax gradient",
    );
}

/// The fused layer norm's value and its three gradients are Burn's
/// decomposed ones, on rows more than one task long.
#[test]
fn layer_norm_matches_burns_operations() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let x = Tensor::<Cpu, 3>::random([3, 40, 24], Distribution::Normal(0.5, 2.0), &d).require_grad();
    let gamma = Tensor::<Cpu, 1>::random([24], Distribution::Normal(1.0, 0.3), &d).require_grad();
    let beta = Tensor::<Cpu, 1>::random([24], Distribution::Normal(0.0, 0.3), &d).require_grad();
    let up = Tensor::<Cpu, 3>::random([3, 40, 24], Distribution::Normal(0.0, 1.0), &d);
    let fused = layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-5);
    let reference = layer_norm_reference(x.clone(), gamma.clone(), beta.clone(), 1e-5);
    close(host(fused.clone()), host(reference.clone()), 1e-5, "layer norm");
    let gf = (fused * up.clone()).sum().backward();
    let gr = (reference * up).sum().backward();
    let v = |t: Tensor<Flex, 3>| t.into_data().into_vec::<f32>().unwrap();
    let v1 = |t: Tensor<Flex, 1>| t.into_data().into_vec::<f32>().unwrap();
    close(v(x.grad(&gf).unwrap()), v(x.grad(&gr).unwrap()), 1e-4, "d_x");
    close(
        v1(gamma.grad(&gf).unwrap()),
        v1(gamma.grad(&gr).unwrap()),
        1e-4,
        "d_gamma",
    );
    close(v1(beta.grad(&gf).unwrap()), v1(beta.grad(&gr).unwrap()), 1e-4, "d_beta");
}

/// Other types take Burn's operations: f64 values are not truncated.
#[test]
fn other_types_keep_burns_operations() {
    let d = Default::default();
    let x = Tensor::<Cpu, 2>::from_floats([[0.1, 0.2], [0.3, 0.4]], &d).cast(burn::tensor::FloatDType::F64);
    assert_eq!(x.dtype(), DType::F64);
    let y = causal_softmax(x.clone(), 1.0);
    assert_eq!(y.dtype(), DType::F64);
    assert_eq!(
        y.into_data().into_vec::<f64>().unwrap(),
        host_f64(causal_softmax_reference(x, 1.0))
    );
}

/// Splitting a narrowed view (as q, k and v are cut from one
/// projection) and merging back give Burn's reshapes and permutations,
/// values and gradients.
#[test]
fn head_split_and_merge_match_burns_operations() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let qkv = Tensor::<Cpu, 3>::random([2, 5, 3 * 12], Distribution::Normal(0.0, 1.0), &d).require_grad();
    let up = Tensor::<Cpu, 3>::random([2, 5, 12], Distribution::Normal(0.0, 1.0), &d);
    let scale = Tensor::<Cpu, 4>::random([2, 3, 5, 4], Distribution::Normal(0.0, 1.0), &d);
    let run = |fused: bool| {
        let view = qkv.clone().narrow(2, 12, 12);
        let heads = if fused {
            split_heads(view, 3)
        } else {
            view.reshape([2, 5, 3, 4]).swap_dims(1, 2)
        };
        assert_eq!(heads.dims(), [2, 3, 5, 4]);
        let mixed = heads * scale.clone();
        let merged = if fused {
            merge_heads(mixed)
        } else {
            mixed.swap_dims(1, 2).reshape([2, 5, 12])
        };
        let grads = (merged.clone() * up.clone()).sum().backward();
        (
            host(merged),
            qkv.grad(&grads).unwrap().into_data().into_vec::<f32>().unwrap(),
        )
    };
    let ((fv, fg), (rv, rg)) = (run(true), run(false));
    assert_eq!(fv, rv, "values");
    assert_eq!(fg, rg, "gradients");
    assert!(
        rg.iter().any(|v| *v != 0.0) && rg.contains(&0.0),
        "only the narrowed third has gradients"
    );
}

/// The vectorisable erf and exp against libm's, over their whole range.
#[test]
fn erf_and_exp_approximations_are_close_to_libm() {
    let (mut erf_err, mut exp_rel) = (0.0f64, 0.0f64);
    for i in -600_000i32..=600_000 {
        let x = i as f64 * 1e-5;
        erf_err = erf_err.max((erf_fast(x as f32) as f64 - libm_erf(x)).abs());
        let y = -(i.abs() as f32) * 1.45e-4; // 0 … −87
        exp_rel = exp_rel.max(((exp_nonpositive(y) as f64) / (y as f64).exp() - 1.0).abs());
    }
    assert!(erf_err < 6e-7, "erf: largest error {erf_err:e}");
    assert!(exp_rel < 5e-7, "exp: largest relative error {exp_rel:e}");
}

/// erf in f64 from its series and continued fraction (the test's oracle).
fn libm_erf(x: f64) -> f64 {
    let a = x.abs();
    let v = if a < 2.5 {
        // Maclaurin series: converges fast here.
        let (mut term, mut sum, mut n) = (a, a, 0.0f64);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a * a / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc by its continued fraction, evaluated from the tail.
        let mut f = 0.0f64;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (a + f);
        }
        1.0 - (-a * a).exp() / (a + f) / std::f64::consts::PI.sqrt()
    };
    v.copysign(x)
}

/// The fused GELU's value and gradient are Burn's (libm erf) within
/// the approximation's error.
#[test]
fn gelu_matches_burns_operation() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let x = Tensor::<Cpu, 2>::random([64, 300], Distribution::Normal(0.0, 3.0), &d).require_grad();
    let up = Tensor::<Cpu, 2>::random([64, 300], Distribution::Normal(0.0, 1.0), &d);
    let fused = gelu(x.clone());
    let reference = burn::tensor::activation::gelu(x.clone());
    close(host(fused.clone()), host(reference.clone()), 2e-6, "gelu");
    let gf = x.grad(&(fused * up.clone()).sum().backward()).unwrap();
    let gr = x.grad(&(reference * up).sum().backward()).unwrap();
    close(
        gf.into_data().into_vec().unwrap(),
        gr.into_data().into_vec().unwrap(),
        2e-6,
        "gelu gradient",
    );
}

fn host_f64<const D: usize>(t: Tensor<Cpu, D>) -> Vec<f64> {
    t.into_data().into_vec::<f64>().unwrap()
}

/// The fused attention's output and its three gradients are the standard
/// attention's (Burn's operations, which keep the scores): causal and not,
/// head widths 16 to 128, lengths that are multiples of nothing, more keys
/// than queries, and a value width of its own.
#[test]
fn attention_matches_the_standard_attention() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let normal = |shape: [usize; 4]| Tensor::<Cpu, 4>::random(shape, Distribution::Normal(0.0, 1.0), &d);
    for (b, h, t, s, dh, dv, causal) in [
        (2, 3, 7, 7, 16, 16, true),
        (1, 2, 33, 33, 64, 64, true),
        (2, 1, 13, 29, 24, 40, false),
        (1, 1, 5, 5, 128, 128, false),
        (1, 2, 2, 2, 16, 16, true),
    ] {
        let what = format!("b{b} h{h} t{t} s{s} dh{dh} dv{dv} causal {causal}");
        let scale = 1.0 / (dh as f64).sqrt();
        let (q, k, v) = (
            normal([b, h, t, dh]).require_grad(),
            normal([b, h, s, dh]).require_grad(),
            normal([b, h, s, dv]).require_grad(),
        );
        let up = normal([b, h, t, dv]);
        let fused = attention(q.clone(), k.clone(), v.clone(), scale, causal);
        let reference = attention_reference(q.clone(), k.clone(), v.clone(), scale, causal);
        close(
            host(fused.clone()),
            host(reference.clone()),
            1e-5,
            &format!("{what}: output"),
        );
        // Without autodiff (a checkpointed block's first forward): the
        // same values from the fused forward alone.
        let inner = |x: &Tensor<Cpu, 4>| x.clone().inner();
        close(
            attention(inner(&q), inner(&k), inner(&v), scale, causal)
                .into_data()
                .into_vec()
                .unwrap(),
            host(fused.clone()),
            0.0,
            &format!("{what}: output without autodiff"),
        );
        let g_fused = (fused * up.clone()).sum().backward();
        let g_ref = (reference * up).sum().backward();
        for (name, x) in [("dq", &q), ("dk", &k), ("dv", &v)] {
            close(
                x.grad(&g_fused).unwrap().into_data().into_vec().unwrap(),
                x.grad(&g_ref).unwrap().into_data().into_vec().unwrap(),
                1e-4,
                &format!("{what}: {name}"),
            );
        }
    }
}

/// No query or no key is refused with the shapes (Burn's own operations
/// fail on them without saying which).
#[test]
#[should_panic(expected = "at least one query and one key")]
fn attention_over_nothing_is_refused() {
    let d = Default::default();
    let z = |t: usize| Tensor::<Cpu, 4>::zeros([1, 2, t, 16], &d);
    attention(z(0), z(3), z(3), 0.25, false);
}

/// The causal mask is exact: a key after the query has no effect on it,
/// at every position (changing key and value `j` changes no output row
/// before `j`).
#[test]
fn causal_attention_ignores_later_keys() {
    let d = Default::default();
    let normal = |shape: [usize; 4]| Tensor::<Cpu, 4>::random(shape, Distribution::Normal(0.0, 1.0), &d);
    let (t, dh) = (19, 16);
    let (q, k, v) = (normal([1, 2, t, dh]), normal([1, 2, t, dh]), normal([1, 2, t, dh]));
    let base = host(attention(q.clone(), k.clone(), v.clone(), 0.25, true));
    for j in [0, 7, t - 1] {
        let bump = |x: Tensor<Cpu, 4>| {
            let delta = Tensor::<Cpu, 4>::ones([1, 2, 1, dh], &d).mul_scalar(3.0);
            x.clone().slice_assign(
                [0..1, 0..2, j..j + 1, 0..dh],
                x.slice([0..1, 0..2, j..j + 1, 0..dh]) + delta,
            )
        };
        let moved = host(attention(q.clone(), bump(k.clone()), bump(v.clone()), 0.25, true));
        for head in 0..2 {
            for i in 0..t {
                let row = |o: &[f32]| o[(head * t + i) * dh..(head * t + i + 1) * dh].to_vec();
                if i < j {
                    assert_eq!(row(&moved), row(&base), "query {i} saw key {j}");
                } else if i == j {
                    assert_ne!(row(&moved), row(&base), "query {i} sees its own key");
                }
            }
        }
    }
}

/// The fused attention's gradients against central finite differences of
/// its own forward, in f64 arithmetic on the loss (a small case).
#[test]
fn attention_gradients_match_finite_differences() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let normal = |shape: [usize; 4]| Tensor::<Cpu, 4>::random(shape, Distribution::Normal(0.0, 1.0), &d);
    let (t, dh) = (6, 4);
    let (q, k, v) = (normal([1, 1, t, dh]), normal([1, 1, t, dh]), normal([1, 1, t, dh]));
    let up = host(normal([1, 1, t, dh]));
    let loss = |q: Vec<f32>, k: Vec<f32>, v: Vec<f32>| -> f64 {
        let make = |x: Vec<f32>| Tensor::<Cpu, 4>::from_data(TensorData::new(x, [1, 1, t, dh]), &d);
        let o = host(attention(make(q), make(k), make(v), 0.5, true));
        o.iter().zip(&up).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    let (qv, kv, vv) = (host(q.clone()), host(k.clone()), host(v.clone()));
    let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
    let upt = Tensor::<Cpu, 4>::from_data(TensorData::new(up.clone(), [1, 1, t, dh]), &d);
    let grads = (attention(q.clone(), k.clone(), v.clone(), 0.5, true) * upt)
        .sum()
        .backward();
    let analytic =
        [q.grad(&grads), k.grad(&grads), v.grad(&grads)].map(|g| g.unwrap().into_data().into_vec::<f32>().unwrap());
    let eps = 1e-2f32;
    for (which, grad) in analytic.iter().enumerate() {
        for e in 0..t * dh {
            let nudged = |delta: f32| {
                let mut xs = [qv.clone(), kv.clone(), vv.clone()];
                xs[which][e] += delta;
                let [a, b, c] = xs;
                loss(a, b, c)
            };
            let numeric = (nudged(eps) - nudged(-eps)) / (2.0 * eps as f64);
            let err = (grad[e] as f64 - numeric).abs();
            assert!(
                err < 2e-3 * (1.0 + numeric.abs()),
                "input {which} element {e}: {} vs {numeric}",
                grad[e]
            );
        }
    }
}

/// bf16 and f16 inputs are widened to f32 for the fused operation: the
/// output comes back in their type, equal to the fused attention of their
/// widened values, and the gradients reach them.
#[test]
fn attention_of_half_precision_inputs_is_the_widened_fused_attention() {
    let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
    let d = Default::default();
    let normal = |shape: [usize; 4]| Tensor::<Cpu, 4>::random(shape, Distribution::Normal(0.0, 1.0), &d);
    for low in [burn::tensor::FloatDType::BF16, burn::tensor::FloatDType::F16] {
        let [q, k, v] =
            [normal([1, 2, 9, 16]), normal([1, 2, 9, 16]), normal([1, 2, 9, 16])].map(|t| t.cast(low).require_grad());
        let out = attention(q.clone(), k.clone(), v.clone(), 0.25, true);
        assert_eq!(out.dtype(), DType::from(low), "{low:?}");
        let wide = |t: &Tensor<Cpu, 4>| t.clone().cast(burn::tensor::FloatDType::F32);
        let expected = attention(wide(&q), wide(&k), wide(&v), 0.25, true).cast(low);
        close(
            host(wide(&out)),
            host(wide(&expected)),
            0.0,
            &format!("{low:?}: output"),
        );
        let g = out.sum().backward();
        for x in [&q, &k, &v] {
            let grad = x.grad(&g).expect("the gradient reaches the input");
            assert!(
                grad.into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .unwrap()
                    .iter()
                    .any(|v| v.abs() > 1e-3)
            );
        }
    }
}
