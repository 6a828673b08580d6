//! The (batched) matrix product written straight into its result, operands read where they lie.

#[allow(unused_imports)]
use super::*;
use burn::tensor::{FloatDType, bf16};

/// `a · b` for `a: [.., m, k]`, `b: [.., k, n]` with the same leading
/// (batch) dimensions. On the CPU backend the products are written
/// straight into the result's own `Vec<f32>`: Flex's matmul makes every
/// result with `FlexTensor::empty`, a zeroed byte vector that
/// `Bytes::from_bytes_vec` then copies into a 16-byte aligned allocation
/// (a `Vec<u8>` reports alignment 1), a memset and a memcpy per product
/// that were 8 % of the transformer's step. Broadcast batch dimensions
/// and other backends and types use Burn's matmul.
pub fn matmul<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    let same_batch = a.dims()[..D - 2] == b.dims()[..D - 2];
    let (a, b) = match (on_cpu(a), on_cpu(b)) {
        (Ok(a), Ok(b)) if same_batch => return back(matmul_cpu::<f32, D>(a, b)),
        (a, b) => (a.map_or_else(|t| t, back), b.map_or_else(|t| t, back)),
    };
    let (a, b) = match (bf16_on::<Cpu, B, D>(a), bf16_on::<Cpu, B, D>(b)) {
        (Ok(a), Ok(b)) if same_batch => return back(matmul_cpu::<bf16, D>(a, b)),
        (a, b) => (a.map_or_else(|t| t, back), b.map_or_else(|t| t, back)),
    };
    // Flex without autodiff (a checkpointed block's first forward, the
    // products inside other autodiff operations): the same gemm, operands
    // read where they lie (a transposed weight is not copied).
    let (a, b) = match (f32_on::<Flex, B, D>(a), f32_on::<Flex, B, D>(b)) {
        (Ok(a), Ok(b)) if same_batch => return back(matmul_flex(a, b)),
        (a, b) => (a.map_or_else(|t| t, back), b.map_or_else(|t| t, back)),
    };
    // bf16 on Flex without autodiff (a frozen weight's products, forward
    // and backward): read in place, multiplied in bf16 pairs where the CPU
    // can (`gemm_bf16`).
    match (bf16_on::<Flex, B, D>(a), bf16_on::<Flex, B, D>(b)) {
        (Ok(a), Ok(b)) if same_batch => back(matmul_flex_bf16(a, b)),
        (a, b) => a.map_or_else(|t| t, back).matmul(b.map_or_else(|t| t, back)),
    }
}

fn matmul_flex_bf16<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> Tensor<Flex, D> {
    let (a, b) = (a.into_primitive().tensor(), b.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(product::<bf16>(&a, &b)))
}

/// `a · b` of two Flex tensors of `E`, operands read where they lie.
fn product<E: Gemm>(a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
    let (ma, mb) = (Matrices::<E>::read(a), Matrices::<E>::read(b));
    assert_eq!(ma.cols, mb.rows, "matmul: inner dimensions {} and {}", ma.cols, mb.rows);
    let mut shape = a.layout().shape().clone();
    let d = shape.num_dims();
    shape[d - 1] = mb.cols;
    flex(E::products(ma.batch, ma.operand(), mb.operand()), shape)
}

/// The element types the CPU multiplies in their own type: f32 through
/// gemm, bf16 through [`super::gemm_bf16`].
pub(super) trait Gemm: Stored + burn::tensor::Element {
    /// `a · b` for each of `batch` pairs, row major.
    fn products(batch: usize, a: Operand<Self>, b: Operand<Self>) -> Vec<Self>;
}

impl Gemm for f32 {
    fn products(batch: usize, a: Operand<Self>, b: Operand<Self>) -> Vec<Self> {
        gemm_products(batch, a, b)
    }
}

impl Gemm for bf16 {
    fn products(batch: usize, a: Operand<Self>, b: Operand<Self>) -> Vec<Self> {
        super::gemm_bf16::products_bf16(batch, a, b)
    }
}

fn matmul_flex<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> Tensor<Flex, D> {
    let (a, b) = (a.into_primitive().tensor(), b.into_primitive().tensor());
    let (ma, mb) = (Matrices::of(&a), Matrices::of(&b));
    assert_eq!(ma.cols, mb.rows, "matmul: inner dimensions {} and {}", ma.cols, mb.rows);
    let mut shape = a.layout().shape().clone();
    shape[D - 1] = mb.cols;
    Tensor::from_primitive(TensorPrimitive::Float(flex(
        gemm_products(ma.batch, ma.operand(), mb.operand()),
        shape,
    )))
}

/// A Flex tensor's `[batch.., rows, cols]` matrices, read where they lie
/// when each is stored row major or transposed (a `swap_dims` of the last
/// two axes, as attention's `kᵀ`) and the batch is packed, or, for a
/// single matrix, when its rows are further apart than its width (a
/// `narrow` of the columns, as one of q, k, v's blocks of the joint
/// weight); copied to row major otherwise.
pub(super) struct Matrices<'a, E: Clone = f32> {
    pub(super) values: std::borrow::Cow<'a, [E]>,
    pub(super) batch: usize,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Stored as row-major `[cols, rows]` matrices.
    pub(super) transposed: bool,
    /// Values between consecutive stored rows.
    pub(super) stored_row_stride: usize,
}

impl<'a> Matrices<'a> {
    pub(super) fn of(t: &'a FlexTensor) -> Self {
        Self::read(t)
    }
}

/// The element types whose matrices [`Matrices::read`] reads in place.
pub(super) trait Stored: Clone + 'static {
    /// The tensor's whole buffer.
    fn storage(t: &FlexTensor) -> &[Self];
    /// Its values row major (copied only when it is a view).
    fn row_major(t: &FlexTensor) -> std::borrow::Cow<'_, [Self]>;
}

impl Stored for f32 {
    fn storage(t: &FlexTensor) -> &[Self] {
        t.storage::<f32>()
    }
    fn row_major(t: &FlexTensor) -> std::borrow::Cow<'_, [Self]> {
        values(t)
    }
}

impl Stored for bf16 {
    fn storage(t: &FlexTensor) -> &[Self] {
        t.storage::<bf16>()
    }
    fn row_major(t: &FlexTensor) -> std::borrow::Cow<'_, [Self]> {
        match t.as_slice::<bf16>() {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(t.to_contiguous().as_slice::<bf16>().expect("contiguous").to_vec()),
        }
    }
}

impl<'a, E: Stored> Matrices<'a, E> {
    pub(super) fn read(t: &'a FlexTensor) -> Self {
        let (batch, rows, cols) = matrices(t);
        let copied = |t: &'a FlexTensor| Self {
            values: E::row_major(t),
            batch,
            rows,
            cols,
            transposed: false,
            stored_row_stride: cols,
        };
        if batch * rows * cols == 0 {
            return copied(t);
        }
        let layout = t.layout();
        let (dims, strides) = (layout.shape().to_vec(), layout.strides());
        let d = dims.len();
        let stride_is = |axis: usize, expected: usize| dims[axis] == 1 || strides[axis] == expected as isize;
        // Row stride of the stored rows: the matrix's width, or more for
        // a single matrix.
        let (transposed, stored_row_stride) = if stride_is(d - 1, 1) && stride_is(d - 2, cols) {
            (false, cols)
        } else if stride_is(d - 2, 1) && stride_is(d - 1, rows) {
            (true, rows)
        } else if batch == 1 && strides[d - 1] == 1 && strides[d - 2] >= cols as isize {
            (false, strides[d - 2] as usize)
        } else if batch == 1 && strides[d - 2] == 1 && strides[d - 1] >= rows as isize {
            (true, strides[d - 1] as usize)
        } else {
            return copied(t);
        };
        let mut expected = rows * cols;
        let mut packed = true;
        for axis in (0..d - 2).rev() {
            packed &= stride_is(axis, expected);
            expected *= dims[axis];
        }
        let (stored_rows, stored_cols) = if transposed { (cols, rows) } else { (rows, cols) };
        let extent = (batch - 1) * rows * cols + (stored_rows - 1) * stored_row_stride + stored_cols;
        let start = layout.start_offset();
        match E::storage(t).get(start..start + extent) {
            Some(values) if packed => Self {
                values: std::borrow::Cow::Borrowed(values),
                batch,
                rows,
                cols,
                transposed,
                stored_row_stride,
            },
            _ => copied(t),
        }
    }

    pub(super) fn operand(&self) -> Operand<'_, E> {
        let stored = Operand {
            values: &self.values,
            size: self.rows * self.cols,
            rows: self.rows,
            cols: self.cols,
            rs: self.stored_row_stride as isize,
            cs: 1,
        };
        if self.transposed {
            Operand {
                rows: self.cols,
                cols: self.rows,
                ..stored
            }
            .t()
        } else {
            stored
        }
    }
}

/// (batch, rows, columns) of a Flex tensor of matrices.
pub(super) fn matrices(t: &FlexTensor) -> (usize, usize, usize) {
    let dims = t.layout().shape().to_vec();
    let d = dims.len();
    (dims[..d - 2].iter().product(), dims[d - 2], dims[d - 1])
}

/// `p · q` for each of `like`'s `batch` matrices, as a tensor of `like`'s
/// shape whose matrices lie as `like`'s do: a gradient shaped like a
/// transposed view is computed as `qᵀ · pᵀ` and viewed transposed, so the
/// `swap_dims` backward that follows gets a row-major tensor, not a copy
/// to make.
pub(super) fn product_like<E: Gemm>(
    p: Operand<E>,
    q: Operand<E>,
    like: &Matrices<E>,
    shape: burn::tensor::Shape,
) -> FlexTensor {
    if like.transposed {
        let d = shape.num_dims();
        let mut stored = shape.clone();
        (stored[d - 2], stored[d - 1]) = (shape[d - 1], shape[d - 2]);
        flex(E::products(like.batch, q.t(), p.t()), stored).transpose(d - 2, d - 1)
    } else {
        flex(E::products(like.batch, p, q), shape)
    }
}

/// The gradients of `a · b` from the output's row-major `g`, for the
/// parents that want them: `da = g · bᵀ`, `db = aᵀ · g`.
pub(super) fn product_backward<E: Gemm>(
    a: &FlexTensor,
    b: &FlexTensor,
    g: &[E],
    [pa, pb]: [Option<NodeId>; 2],
    grads: &mut Gradients,
) {
    let (ma, mb) = (Matrices::<E>::read(a), Matrices::<E>::read(b));
    let g = Operand::plain(g, ma.rows, mb.cols);
    if let Some(id) = pa {
        let da = product_like(g, mb.operand().t(), &ma, a.layout().shape().clone());
        grads.register::<Flex>(id, da);
    }
    if let Some(id) = pb {
        let db = product_like(ma.operand().t(), g, &mb, b.layout().shape().clone());
        grads.register::<Flex>(id, db);
    }
}

/// `a · b` on the CPU backend with autodiff as one operation that keeps
/// both operands (handles, no copies) for its backward, in `E` (f32 or
/// bf16) throughout.
pub(super) fn matmul_cpu<E: Gemm, const D: usize>(a: Tensor<Cpu, D>, b: Tensor<Cpu, D>) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct Matmul<E>(std::marker::PhantomData<E>);

    impl<E: Gemm> Backward<Flex, 2> for Matmul<E> {
        type State = (FlexTensor, FlexTensor);

        fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
            let g = grads.consume::<Flex>(&ops.node);
            // The gradient of an `E` product is an `E` tensor; one summed
            // from other types is brought to it.
            let g = match g.dtype() {
                t if t == E::dtype() => g,
                _ => {
                    use burn::tensor::ops::FloatTensorOps;
                    let to = if E::dtype() == DType::BF16 {
                        FloatDType::BF16
                    } else {
                        FloatDType::F32
                    };
                    Flex::float_cast(g, to)
                }
            };
            let (a, b) = ops.state;
            let [pa, pb] = ops.parents.map(|p| p.map(|node| node.id));
            product_backward::<E>(&a, &b, &E::row_major(&g), [pa, pb], grads);
        }
    }

    let (a, b) = (a.into_primitive().tensor(), b.into_primitive().tensor());
    let out = match Matmul::<E>(std::marker::PhantomData)
        .prepare::<NoCheckpointing>([a.node.clone(), b.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = product::<E>(&a.primitive, &b.primitive);
            prep.finish((a.primitive, b.primitive), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(product::<E>(&a.primitive, &b.primitive)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
