//! The reads of Adam's host step, started ahead of the update that needs
//! them (`--moments host` on a Burn module).
//!
//! Waiting for each parameter's value and gradient in turn leaves the link
//! idle while the host updates, and the host idle while the link copies.
//! Here every parameter that has a gradient is queued in the order the
//! update visits them; taking one starts the reads of those behind it (a
//! window of [`WINDOW_BYTES`], always at least the next), so their copies
//! run while the host updates this one. On CubeCL (wgpu, CUDA) a read is
//! the client's `read_one_tensor_async`, which issues the copy when called
//! (into pinned memory on CUDA) and whose future only waits for it: Burn's
//! `into_data_async` cannot be used so, because on CUDA its first poll
//! already waits for the copy. Elsewhere (the CPU, fusion) the read is
//! Burn's future polled once, on the CPU the whole read.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use burn::module::ParamId;
use burn::prelude::*;
use burn::tensor::{FloatDType, TensorData};

use crate::precision::cast_to;

/// Bytes of reads (value and gradient as f32) in flight behind the one
/// being updated: their f32 copies on the device (for parameters stored in
/// f32, the parameter and gradient themselves) and host vectors. A few
/// milliseconds of a PCIe link, enough to cover a parameter's host update.
pub const WINDOW_BYTES: usize = 32 << 20;

type Read = Pin<Box<dyn Future<Output = TensorData>>>;

/// A read started (or done).
enum Pending {
    Waiting(Read),
    Done(TensorData),
}

impl Pending {
    /// Starts reading `t`.
    fn start<B: Backend>(t: Tensor<B, 1>) -> Self {
        #[cfg(feature = "wgpu")]
        let t = match on_cube::<B, cubecl::wgpu::WgpuRuntime>(t) {
            Ok(read) => return read,
            Err(t) => t,
        };
        #[cfg(feature = "cuda")]
        let t = match on_cube::<B, cubecl::cuda::CudaRuntime>(t) {
            Ok(read) => return read,
            Err(t) => t,
        };
        let mut read: Read = Box::pin(async move {
            t.into_data_async()
                .await
                .unwrap_or_else(|e| panic!("reading a parameter or its gradient for the host's Adam: {e}"))
        });
        match read.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(data) => Self::Done(data),
            Poll::Pending => Self::Waiting(read),
        }
    }

    /// The values, waiting for them.
    fn wait(self) -> Vec<f32> {
        let data = match self {
            Self::Done(data) => data,
            Self::Waiting(read) => block_on(read),
        };
        data.into_vec::<f32>().expect("f32 after the cast")
    }
}

/// A read of `t` issued now on CubeCL runtime `R`, where `B` is its backend.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn on_cube<B: Backend, R: burn_cubecl::CubeRuntime>(t: Tensor<B, 1>) -> Result<Pending, Tensor<B, 1>> {
    type Cube<R> = burn_cubecl::CubeBackend<R, f32, i32, u8>;
    let t = crate::fused::downcast::<_, Tensor<Cube<R>, 1>>(t)?;
    let tensor = t.into_primitive().tensor();
    let tensor = if tensor.is_contiguous() {
        tensor
    } else {
        burn_cubecl::kernel::into_contiguous(tensor)
    };
    let (shape, dtype) = (tensor.meta.shape().clone(), tensor.dtype);
    let copy = cubecl::server::CopyDescriptor::new(
        tensor.handle.clone().binding(),
        shape.clone(),
        tensor.meta.strides().clone(),
        tensor.elem_size(),
    );
    let read = lasting(&tensor.client, &tensor.device).read_one_tensor_async(copy);
    Ok(Pending::Waiting(Box::pin(async move {
        let bytes = read
            .await
            .unwrap_or_else(|e| panic!("reading a parameter or its gradient for the host's Adam: {e}"));
        // The buffer is held until the copy is done.
        drop(tensor);
        TensorData::from_bytes(bytes, shape, dtype)
    })))
}

/// `client` (of `device`) for the life of the process, so a read's future
/// (which borrows its client) can outlive the tensor it reads: one clone a
/// device, kept (CubeCL keeps its clients for the process anyway).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn lasting<R: burn_cubecl::CubeRuntime>(
    client: &cubecl::prelude::ComputeClient<R>,
    device: &R::Device,
) -> &'static cubecl::prelude::ComputeClient<R> {
    use std::any::Any;
    use std::sync::Mutex;
    type Kept<R> = (<R as cubecl::Runtime>::Device, cubecl::prelude::ComputeClient<R>);
    static CLIENTS: Mutex<Vec<&'static (dyn Any + Send + Sync)>> = Mutex::new(Vec::new());
    let mut clients = CLIENTS.lock().unwrap_or_else(|e| e.into_inner());
    let found = clients
        .iter()
        .filter_map(|c| c.downcast_ref::<Kept<R>>())
        .find(|(d, _)| d == device);
    let kept = match found {
        Some(kept) => kept,
        None => {
            let kept: &'static Kept<R> = Box::leak(Box::new((device.clone(), client.clone())));
            clients.push(kept);
            kept
        }
    };
    &kept.1
}

/// Polls `read` to its end, parking the thread between wake-ups.
fn block_on(mut read: Read) -> TensorData {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark()
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match read.as_mut().poll(&mut cx) {
            Poll::Ready(data) => return data,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// One parameter: its flat value and gradient, then their reads.
struct Entry<B: Backend> {
    id: ParamId,
    bytes: usize,
    tensors: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
    reads: Option<(Pending, Pending)>,
}

/// The parameters' values and gradients to read, in update order.
pub(super) struct ReadAhead<B: Backend> {
    queue: VecDeque<Entry<B>>,
}

impl<B: Backend> Default for ReadAhead<B> {
    fn default() -> Self {
        Self { queue: VecDeque::new() }
    }
}

impl<B: Backend> ReadAhead<B> {
    /// Queues parameter `id` (`value` and `grad` in any float type; cast
    /// to f32 only when their reads start, so the f32 copies of 16-bit
    /// parameters are on the device a window at a time).
    pub fn push<const D: usize>(&mut self, id: ParamId, value: Tensor<B, D>, grad: Tensor<B, D>) {
        let (p, g) = (value.reshape([-1]), grad.reshape([-1]));
        self.queue.push_back(Entry {
            id,
            bytes: p.shape().num_elements() * 8,
            tensors: Some((p, g)),
            reads: None,
        });
    }

    /// Whether parameter `id` is queued (it had a gradient).
    pub fn has(&self, id: ParamId) -> bool {
        self.queue.iter().any(|e| e.id == id)
    }

    /// Parameter `id`'s value and gradient as host vectors, after starting
    /// the reads of the window behind it (the queue's order is the
    /// window's; a parameter may be taken out of it). The f32 casts are
    /// device memory; the reads' host vectors are left out of a heap trace
    /// (`crate::heap::off_device`).
    pub fn take(&mut self, id: ParamId) -> Option<(Vec<f32>, Vec<f32>)> {
        let at = self.queue.iter().position(|e| e.id == id)?;
        let entry = self.queue.remove(at).expect("found above");
        let start = |(p, g): (Tensor<B, 1>, Tensor<B, 1>)| {
            let (p, g) = (cast_to(p, FloatDType::F32), cast_to(g, FloatDType::F32));
            crate::heap::off_device(|| (Pending::start(p), Pending::start(g)))
        };
        let reads = match (entry.reads, entry.tensors) {
            (Some(reads), _) => reads,
            (None, Some(tensors)) => start(tensors),
            (None, None) => unreachable!("an entry has its tensors until its reads start"),
        };
        // The window behind it, from the front of what is left.
        let mut ahead = 0;
        for (i, next) in self.queue.iter_mut().enumerate() {
            if i > 0 && ahead >= WINDOW_BYTES {
                break;
            }
            if let Some(tensors) = next.tensors.take() {
                next.reads = Some(start(tensors));
            }
            ahead += next.bytes;
        }
        let (p, g) = reads;
        Some(crate::heap::off_device(|| (p.wait(), g.wait())))
    }

    /// Drops parameter `id` unread (another rank updates it).
    pub fn skip(&mut self, id: ParamId) {
        self.queue.retain(|e| e.id != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ParamId;

    type B = burn::backend::Flex;

    fn tensor(values: Vec<f32>) -> Tensor<B, 2> {
        let n = values.len();
        Tensor::from_data(TensorData::new(values, [1, n]), &Default::default())
    }

    /// Which queued parameters have their reads started.
    fn started(a: &ReadAhead<B>) -> Vec<bool> {
        a.queue.iter().map(|e| e.reads.is_some()).collect()
    }

    #[test]
    fn each_parameter_comes_back_with_its_own_values_and_the_window_starts_ahead() {
        let ids: Vec<ParamId> = (0..5).map(|_| ParamId::new()).collect();
        let mut a = ReadAhead::<B>::default();
        // Parameter 1 alone fills the window (its f32 value and gradient
        // take 8 bytes a value): 2 is not started with it, 3 and 4 never
        // before their turn.
        let sizes = [3, WINDOW_BYTES / 8, 2, 4, 1];
        for (i, id) in ids.iter().enumerate() {
            let p = tensor((0..sizes[i]).map(|k| (i * 10 + k) as f32).collect());
            let g = tensor(vec![-(i as f32); sizes[i]]);
            a.push(*id, p, g.cast(FloatDType::F16));
        }
        assert!(a.has(ids[3]) && !a.has(ParamId::new()));
        let (p, g) = a.take(ids[0]).expect("queued");
        assert_eq!((p, g), (vec![0.0, 1.0, 2.0], vec![0.0; 3]));
        assert_eq!(
            started(&a),
            [true, false, false, false],
            "the next one, then the window is full"
        );
        // Out of order: 3 comes back with its own values, 1 and 2 stay.
        let (p, g) = a.take(ids[3]).expect("queued");
        assert_eq!((p, g), (vec![30.0, 31.0, 32.0, 33.0], vec![-3.0; 4]));
        assert_eq!(started(&a), [true, false, false]);
        a.skip(ids[1]);
        assert!(!a.has(ids[1]));
        let (p, g) = a.take(ids[2]).expect("queued");
        assert_eq!(
            (p, g),
            (vec![20.0, 21.0], vec![-2.0; 2]),
            "a 16-bit gradient read as f32"
        );
        assert_eq!(started(&a), [true]);
        assert!(a.take(ids[1]).is_none(), "skipped");
        assert_eq!(a.take(ids[4]).expect("queued").0, vec![40.0]);
        assert!(a.queue.is_empty());
    }
}
