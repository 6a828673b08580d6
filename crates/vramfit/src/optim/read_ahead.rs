//! The reads of Adam's host step, started ahead of the update that needs
//! them (`--moments host` on a Burn module).
//!
//! Waiting for each parameter's value and gradient in turn leaves the link
//! idle while the host updates, and the host idle while the link copies.
//! Here every parameter that has a gradient is queued in the order the
//! update visits them; taking one starts the reads of those behind it (a
//! window of [`WINDOW_BYTES`], always at least the next), so their copies
//! run while the host updates this one. A read is started by polling its
//! future once: Burn's CubeCL backend issues the copy there (into pinned
//! memory on CUDA) and the future then only waits for it. On the CPU the
//! first poll is the whole read.

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
    /// the reads of the window behind it. Parameters are taken in the
    /// order they were pushed; one skipped (another rank's) is dropped.
    pub fn take(&mut self, id: ParamId) -> Option<(Vec<f32>, Vec<f32>)> {
        if !self.has(id) {
            return None;
        }
        while self.queue.front().is_some_and(|e| e.id != id) {
            self.queue.pop_front();
        }
        let mut ahead = 0;
        for (i, entry) in self.queue.iter_mut().enumerate() {
            if i > 1 && ahead >= WINDOW_BYTES {
                break;
            }
            if let Some((p, g)) = entry.tensors.take() {
                let f32 = |t| Pending::start(cast_to(t, FloatDType::F32));
                entry.reads = Some((f32(p), f32(g)));
            }
            if i > 0 {
                ahead += entry.bytes;
            }
        }
        let entry = self.queue.pop_front()?;
        let (p, g) = entry.reads.expect("started above");
        Some((p.wait(), g.wait()))
    }
}
