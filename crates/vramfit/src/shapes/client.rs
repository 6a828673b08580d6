//! The device, the channel and the client burn-router talks to: every
//! operation arrives here as burn-ir describes it and is placed in
//! [`Buffers`]; nothing is computed.

use std::sync::{Arc, Mutex, MutexGuard};

use burn_backend::backend::{DeviceId, DeviceOps, ExecutionError};
use burn_backend::{DTypeUsage, DTypeUsageSet, Shape, TensorData};
use burn_ir::{OperationIr, TensorId, TensorIr, TensorStatus};
use burn_router::{MultiBackendBridge, RouterTensor, RunnerChannel, RunnerClient};
use burn_std::DType;
use burn_std::future::DynFut;

use super::buffers::Buffers;
use super::effects::{Untraceable, apply};
use super::work::{self, OpWork};

/// The one device of the shape backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShapeDevice;

/// Its type in Burn's device ids (any number no other backend here uses).
const DEVICE_TYPE: u16 = 0x5a7e;

impl burn_std::device::Device for ShapeDevice {
    fn from_id(_: DeviceId) -> Self {
        ShapeDevice
    }

    fn to_id(&self) -> DeviceId {
        DeviceId::new(DEVICE_TYPE, 0)
    }
}

impl DeviceOps for ShapeDevice {}

/// What the client has seen.
#[derive(Debug)]
pub(super) struct State {
    pub(super) buffers: Buffers,
    next_id: u64,
    pub(super) operations: u64,
    pub(super) reads: u64,
    pub(super) refused: Option<Untraceable>,
    pub(super) alignment: u64,
    /// Each kernel's work since the recording's last mark.
    pub(super) work: Vec<OpWork>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            buffers: Buffers::default(),
            next_id: 0,
            operations: 0,
            reads: 0,
            refused: None,
            alignment: 512,
            work: Vec::new(),
        }
    }
}

/// The client: one per process (burn-router keeps it), its state shared
/// by every clone.
#[derive(Debug, Clone, Default)]
pub struct ShapeClient {
    state: Arc<Mutex<State>>,
}

impl ShapeClient {
    /// The state, even after a panic elsewhere while it was held.
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Zeros of `tensor`'s shape and type: what a read of a value gives.
fn placeholder(tensor: &TensorIr) -> TensorData {
    let shape = tensor.shape.clone();
    match tensor.dtype {
        DType::Bool(_) => TensorData::new(vec![false; shape.num_elements()], shape),
        dtype => TensorData::zeros::<f32, _>(shape).convert_dtype(dtype),
    }
}

impl RunnerClient for ShapeClient {
    type Device = ShapeDevice;

    fn register_op(&self, op: OperationIr) {
        let mut state = self.state();
        state.operations += 1;
        let alignment = state.alignment;
        match apply(&mut state.buffers, &op, alignment) {
            Ok(true) => state.work.push(work::of(&op)),
            Ok(false) => {}
            Err(e) => {
                state.refused.get_or_insert(e);
            }
        }
    }

    fn read_tensor_async(&self, tensor: TensorIr) -> DynFut<Result<TensorData, ExecutionError>> {
        let mut state = self.state();
        state.reads += 1;
        if matches!(tensor.dtype, DType::Bool(_)) && tensor.shape.num_elements() > 1 {
            // Burn reads a mask's values only to build a tensor whose shape
            // they decide (argwhere, nonzero): zeros would give a wrong one.
            state.refused.get_or_insert(Untraceable {
                op: format!("a read of a {:?} mask (argwhere or nonzero)", tensor.shape.to_vec()),
                why: "the values decide the shape of what follows; a trace on shapes has no values",
            });
        }
        if tensor.status == TensorStatus::ReadWrite {
            state.buffers.release(tensor.id);
        }
        let moved = (tensor.shape.num_elements() * tensor.dtype.size()) as f64;
        state.work.push(OpWork {
            host_bytes: moved,
            ..Default::default()
        });
        let data = placeholder(&tensor);
        Box::pin(async move { Ok(data) })
    }

    fn sync(&self) -> Result<(), ExecutionError> {
        Ok(())
    }

    fn create_empty_handle(&self) -> TensorId {
        let mut state = self.state();
        state.next_id += 1;
        TensorId::new(state.next_id)
    }

    fn register_tensor_data(&self, data: TensorData) -> RouterTensor<Self> {
        let id = self.create_empty_handle();
        let ir = TensorIr::uninit(id, data.shape.clone(), data.dtype);
        let mut state = self.state();
        state.buffers.reserve(&ir);
        state.work.push(OpWork {
            host_bytes: data.bytes.len() as f64,
            ..Default::default()
        });
        drop(state);
        RouterTensor::new(id, data.shape, data.dtype, self.clone())
    }

    fn device(&self) -> Self::Device {
        ShapeDevice
    }

    fn seed(&self, _seed: u64) {}

    fn dtype_usage(&self, dtype: DType) -> DTypeUsageSet {
        match dtype {
            DType::QFloat(_) => DTypeUsageSet::new(),
            _ => DTypeUsage::Storage | DTypeUsage::Arithmetic,
        }
    }
}

/// The one backend behind the router: no bridge to another.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShapeChannel;

/// No tensor moves to another backend.
#[derive(Debug)]
pub struct NoBridge;

impl MultiBackendBridge for NoBridge {
    type TensorHandle = ();
    type Device = ShapeDevice;

    fn change_backend_float(_: (), _: Shape, _: &ShapeDevice) {}
    fn change_backend_int(_: (), _: Shape, _: &ShapeDevice) {}
    fn change_backend_bool(_: (), _: Shape, _: &ShapeDevice) {}
}

impl RunnerChannel for ShapeChannel {
    type Device = ShapeDevice;
    type Bridge = NoBridge;
    type Client = ShapeClient;
    type FloatElem = f32;
    type IntElem = i32;
    type BoolElem = u8;

    fn name(_: &ShapeDevice) -> String {
        "shapes".into()
    }

    fn init_client(_: &ShapeDevice) -> ShapeClient {
        ShapeClient::default()
    }

    fn get_tensor_handle(_: &TensorIr, _: &ShapeClient) {}

    fn register_tensor(client: &ShapeClient, _: (), shape: Shape, dtype: DType) -> RouterTensor<ShapeClient> {
        let id = client.create_empty_handle();
        client
            .state()
            .buffers
            .reserve(&TensorIr::uninit(id, shape.clone(), dtype));
        RouterTensor::new(id, shape, dtype, client.clone())
    }
}
