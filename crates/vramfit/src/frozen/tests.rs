use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Distribution};

use super::*;
use crate::precision::Precision;

type B = Autodiff<Flex>;

/// The frozen product gives Burn's product with the weight made in the
/// compute type, forward and backward, for every storage and compute
/// type: the only difference is what the backward keeps.
#[test]
fn frozen_linear_equals_the_plain_product_of_the_stored_weight() {
    let _graph = crate::grads::graph_lock();
    let device = Default::default();
    let w = Tensor::<Flex, 2>::random([128, 48], Distribution::Normal(0.0, 0.05), &device);
    let w_values = w.to_data().convert::<f32>();
    let w_values = w_values.as_slice::<f32>().unwrap();
    let x0 = Tensor::<B, 3>::random([2, 5, 128], Distribution::Normal(0.0, 1.0), &device);
    let bias = Tensor::<B, 1>::random([48], Distribution::Normal(0.0, 1.0), &device).require_grad();
    for storage in BaseStorage::ALL {
        let stored: Matrix<B> = match storage.format() {
            Some(f) => Matrix::of(&Quantized::new(w_values, [128, 48], f, &device).unwrap()),
            None => Matrix::Float(Tensor::<B, 2>::from_inner(w.clone()).cast(storage.float())),
        };
        for precision in [Precision::F32, Precision::Bf16] {
            let ac = Autocast::new(precision);
            let x = x0.clone().require_grad();
            let y = linear(x.clone(), &stored, Some(bias.clone()), &ac);
            assert_eq!(
                y.dtype(),
                DType::from(precision.dtype()),
                "{storage:?} {precision:?}: y in the compute type"
            );
            let grads = ac.full(y.clone()).powi_scalar(2).sum().backward();
            let (dx, db) = (x.grad(&grads).unwrap(), bias.grad(&grads).unwrap());
            // The reference: the stored weight materialised and used by Burn's product.
            let xr = x0.clone().require_grad();
            let wr = stored.materialize(precision.dtype());
            let yr = ac.low(xr.clone()).matmul(wr.unsqueeze::<3>()) + ac.low(bias.clone()).unsqueeze::<3>();
            let gr = ac.full(yr.clone()).powi_scalar(2).sum().backward();
            let dxr = xr.grad(&gr).unwrap();
            let gap = |a: Tensor<Flex, 3>, b: Tensor<Flex, 3>| -> f32 {
                let scale: f32 = b.clone().cast(FloatDType::F32).abs().max().into_scalar();
                let d: f32 = (a.cast(FloatDType::F32) - b.cast(FloatDType::F32))
                    .abs()
                    .max()
                    .into_scalar();
                d / scale
            };
            // f32: the same products in another order (gemm's blocking), 1e-6
            // of the range; bf16: the outputs rounded to 8 bits, one unit in
            // the last place (2⁻⁸) of the range.
            let bound = if precision == Precision::F32 { 1e-5 } else { 8e-3 };
            let (gy, gx) = (gap(y.inner(), yr.inner()), gap(dx, dxr));
            assert!(
                gy <= bound && gx <= bound,
                "{storage:?} {precision:?}: y {gy:e}, dx {gx:e}"
            );
            let _ = db;
        }
    }
}

/// The quantized matrix's values are the host round trip's, on the
/// device's path (Burn's integer operations) as on the CPU's loop.
#[test]
fn device_dequantization_equals_the_host_loop() {
    let device = Default::default();
    let w = Tensor::<Flex, 2>::random([64, 24], Distribution::Normal(0.0, 0.05), &device);
    let values = w.to_data().convert::<f32>();
    let values = values.as_slice::<f32>().unwrap();
    for format in [Format::Nf4, Format::Int8] {
        let q = Quantized::<Flex>::new(values, [64, 24], format, &device).unwrap();
        let (codes, scales) = quant::quantize(values, format).unwrap();
        let host = quant::dequantize(&codes, &scales, format);
        // The generic path, run here on Flex.
        let ops = {
            use burn::tensor::ElementConversion;
            let (per_word, bits) = (format.per_word(), format.bits());
            let parts: Vec<Tensor<Flex, 1, Int>> = (0..per_word)
                .map(|j| {
                    q.codes
                        .val()
                        .bitwise_right_shift_scalar(((bits * j) as i32).elem())
                        .bitwise_and_scalar(((1i32 << bits) - 1).elem())
                })
                .collect();
            let c = Tensor::stack::<2>(parts, 1).reshape([64 * 24]);
            let levels = match format {
                Format::Nf4 => Tensor::<Flex, 1>::from_data(TensorData::new(quant::NF4_LEVELS.to_vec(), [16]), &device)
                    .select(0, c),
                Format::Int8 => (c.float() - 128.0) / 127.0,
            };
            (levels.reshape([24, 64]) * q.scales.val().reshape([24, 1])).reshape([64 * 24])
        };
        let on_cpu = Matrix::of(&q).materialize(FloatDType::F32).reshape([64 * 24]);
        let host = Tensor::<Flex, 1>::from_data(TensorData::new(host, [64 * 24]), &device);
        for (name, t) in [("loop", on_cpu), ("operations", ops)] {
            let gap: f32 = (t - host.clone()).abs().max().into_scalar();
            assert!(gap <= 1e-7, "{format:?} {name}: {gap}");
        }
    }
}
