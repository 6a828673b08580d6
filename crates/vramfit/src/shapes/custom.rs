//! vramfit's own kernels described to the shape backend: each one an
//! operation with the outputs (shapes and element types) its CubeCL kernel
//! allocates, in the order it allocates them.

use burn_backend::{DType, Shape};
use burn_ir::{CustomOpIr, OperationIr, TensorIr};
use burn_router::{RouterTensor, RunnerClient};

use super::client::ShapeClient;
use super::effects::CONTIGUOUS;

/// A tensor of the shape backend.
pub type ShapeTensor = RouterTensor<ShapeClient>;

/// Describes kernel `name` reading `inputs` (still held by the caller)
/// and making `outputs`, each a new buffer, in order.
pub fn kernel(name: &'static str, inputs: &[&ShapeTensor], outputs: &[(Shape, DType)]) -> Vec<ShapeTensor> {
    let client = inputs.first().map(|t| t.client.clone()).unwrap_or_else(super::client);
    // A clone's description says the caller holds another handle (read only).
    let inputs: Vec<TensorIr> = inputs.iter().map(|t| (*t).clone().into_ir()).collect();
    let outputs: Vec<TensorIr> = outputs
        .iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape.clone(), *dtype))
        .collect();
    client.register(OperationIr::Custom(CustomOpIr::new(name, &inputs, &outputs)))
}

/// `t` laid out row-major: itself where it is, else a copy (what CubeCL's
/// `into_contiguous` does before a kernel that reads rows).
pub fn contiguous(t: ShapeTensor) -> ShapeTensor {
    let client = t.client.clone();
    let input = t.into_ir();
    let out = TensorIr::uninit(client.create_empty_handle(), input.shape.clone(), input.dtype);
    let op = CustomOpIr::new(CONTIGUOUS, &[input], &[out]);
    client.register(OperationIr::Custom(op)).remove(0)
}
