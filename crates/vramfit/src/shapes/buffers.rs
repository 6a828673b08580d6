//! The buffers behind the tensors: which tensor is a view of which buffer,
//! and what the device's pools were asked for as they came and went.

use std::collections::HashMap;

use burn_ir::{TensorId, TensorIr, TensorStatus};

/// One thing the device's allocator was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// A buffer of `bytes` (element count × element size).
    Reserve {
        /// Bytes asked for.
        bytes: u64,
    },
    /// The last view of the `reserve`-th buffer (0-based) went.
    Free {
        /// Which reservation.
        reserve: usize,
    },
    /// The pools were told to give back what they hold but do not use.
    Cleanup,
}

/// How one tensor lies in its buffer.
#[derive(Debug, Clone)]
pub(super) struct View {
    buffer: u64,
    pub(super) shape: Vec<usize>,
    pub(super) strides: Vec<usize>,
}

impl View {
    /// No two elements at one place (a broadcast dimension reads one place
    /// many times): CubeCL writes in place only into such a tensor.
    fn is_nonoverlapping(&self) -> bool {
        self.shape.iter().zip(&self.strides).all(|(&d, &s)| d <= 1 || s > 0)
    }
}

/// One device buffer and the live tensors that read it.
#[derive(Debug)]
struct Buffer {
    /// Its reservation in the trace; `None` for one made before the
    /// recording started (never reserved nor freed in the trace).
    reserve: Option<usize>,
    views: u32,
}

/// Row-major strides of `shape`.
pub(super) fn contiguous(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Every tensor's buffer and the pools' events.
#[derive(Debug, Default)]
pub(super) struct Buffers {
    views: HashMap<TensorId, View>,
    buffers: HashMap<u64, Buffer>,
    next_buffer: u64,
    events: Vec<Allocation>,
    reserves: usize,
}

impl Buffers {
    /// Starts a new recording: buffers alive now were made before it.
    pub(super) fn restart(&mut self) {
        self.events.clear();
        self.reserves = 0;
        for b in self.buffers.values_mut() {
            b.reserve = None;
        }
    }

    /// The events since the start, leaving the buffers as they are.
    pub(super) fn take_events(&mut self) -> Vec<Allocation> {
        std::mem::take(&mut self.events)
    }

    /// The pools were told to give back what they do not use.
    pub(super) fn cleanup(&mut self) {
        self.events.push(Allocation::Cleanup);
    }

    /// `tensor`'s view; one made before the trace (or by another thread's
    /// backend) is taken as a contiguous buffer of its own, not in the trace.
    pub(super) fn view(&mut self, tensor: &TensorIr) -> &View {
        if !self.views.contains_key(&tensor.id) {
            let buffer = self.new_buffer(None);
            let shape = tensor.shape.to_vec();
            let strides = contiguous(&shape);
            self.views.insert(tensor.id, View { buffer, shape, strides });
        }
        &self.views[&tensor.id]
    }

    fn new_buffer(&mut self, reserve: Option<usize>) -> u64 {
        let id = self.next_buffer;
        self.next_buffer += 1;
        self.buffers.insert(id, Buffer { reserve, views: 0 });
        id
    }

    /// A new contiguous buffer for `tensor`, reserved in the trace.
    pub(super) fn reserve(&mut self, tensor: &TensorIr) {
        let bytes = (tensor.shape.num_elements() * tensor.dtype.size()) as u64;
        self.events.push(Allocation::Reserve { bytes });
        let buffer = self.new_buffer(Some(self.reserves));
        self.reserves += 1;
        self.add_view(tensor.id, buffer, tensor.shape.to_vec(), contiguous(&tensor.shape));
    }

    /// `out` as a view of `of`'s buffer with `strides`.
    pub(super) fn alias(&mut self, out: &TensorIr, of: &TensorIr, strides: Vec<usize>) {
        let buffer = self.view(of).buffer;
        self.add_view(out.id, buffer, out.shape.to_vec(), strides);
    }

    fn add_view(&mut self, id: TensorId, buffer: u64, shape: Vec<usize>, strides: Vec<usize>) {
        if let Some(b) = self.buffers.get_mut(&buffer) {
            b.views += 1;
        }
        if let Some(old) = self.views.insert(id, View { buffer, shape, strides }) {
            // An id reused for a new tensor: the old one is gone.
            self.unview(old.buffer);
        }
    }

    /// `tensor`'s last handle went.
    pub(super) fn release(&mut self, tensor: TensorId) {
        if let Some(view) = self.views.remove(&tensor) {
            self.unview(view.buffer);
        }
    }

    fn unview(&mut self, buffer: u64) {
        let Some(b) = self.buffers.get_mut(&buffer) else {
            return;
        };
        b.views = b.views.saturating_sub(1);
        if b.views == 0 {
            let reserve = b.reserve;
            self.buffers.remove(&buffer);
            if let Some(reserve) = reserve {
                self.events.push(Allocation::Free { reserve });
            }
        }
    }

    /// Whether CubeCL may write the op's output into `tensor`'s buffer:
    /// the op holds its last handle (`ReadWrite`), no other live tensor is
    /// a view of that buffer, and no element is read twice.
    pub(super) fn can_mut(&mut self, tensor: &TensorIr) -> bool {
        if tensor.status != TensorStatus::ReadWrite {
            return false;
        }
        let view = self.view(tensor).clone();
        view.is_nonoverlapping() && self.buffers.get(&view.buffer).is_some_and(|b| b.views == 1)
    }
}
