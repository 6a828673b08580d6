//! Matrices as gemm reads them (each `[rows, cols]` matrix at its strides,
//! read where it lies) and the f32 products through gemm: shared by the
//! matrix product, the linear layer, the attention and the bf16 products'
//! widening path.

#[allow(unused_imports)]
use super::*;

/// Batched matrices as gemm reads them: each `[rows, cols]` matrix (as
/// used) `size` values after the previous one, its elements `rs` apart
/// down a column and `cs` apart along a row.
#[derive(Clone, Copy)]
pub(super) struct Operand<'a, E = f32> {
    pub(super) values: &'a [E],
    pub(super) size: usize,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) rs: isize,
    pub(super) cs: isize,
}

impl<'a, E> Operand<'a, E> {
    /// Row-major matrices of `rows × cols`.
    pub(super) fn plain(values: &'a [E], rows: usize, cols: usize) -> Self {
        Self {
            values,
            size: rows * cols,
            rows,
            cols,
            rs: cols as isize,
            cs: 1,
        }
    }

    /// The same matrices used transposed.
    pub(super) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Matrix `i` of the batch alone.
    pub(super) fn matrix(self, i: usize) -> Self {
        Self {
            values: &self.values[i * self.size..],
            ..self
        }
    }

    /// Values from the first element of a matrix to its last, inclusive.
    pub(super) fn extent(&self) -> usize {
        (self.rows - 1) * self.rs.unsigned_abs() + (self.cols - 1) * self.cs.unsigned_abs() + 1
    }
}

/// `lhs · rhs` for each of `batch` pairs, into a new row-major
/// `[batch, lhs.rows, rhs.cols]` vector.
pub(super) fn gemm_products(batch: usize, lhs: Operand, rhs: Operand) -> Vec<f32> {
    gemm_products_onto(batch, lhs, rhs, None)
}

/// [`gemm_products`], each result row added onto `bias` (`rhs.cols`
/// values) when given: gemm starts from the bias rows instead of a separate
/// pass that adds them afterwards.
pub(super) fn gemm_products_onto(batch: usize, lhs: Operand, rhs: Operand, bias: Option<&[f32]>) -> Vec<f32> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(rhs.rows == k && bias.is_none_or(|b| b.len() == n), "operand shapes");
    if k == 0 || m * n == 0 {
        return match bias {
            Some(b) => b.repeat(batch * m),
            None => vec![0.0; batch * m * n],
        };
    }
    // Strides are never negative here (`Matrices::of` and `plain` make
    // none), so every value gemm reads lies in `values` when this holds.
    let fits =
        |o: &Operand| o.rs >= 0 && o.cs >= 0 && (batch == 0 || o.values.len() >= (batch - 1) * o.size + o.extent());
    assert!(fits(&lhs) && fits(&rhs), "operand values");
    // Flex's thresholds: threads inside one product from about 192³
    // multiply-adds; else one product per task when there are several.
    let large = m * n * k >= 192 * 192 * 192;
    let one = |i: usize, dst: &mut [std::mem::MaybeUninit<f32>], parallelism| {
        if let Some(bias) = bias {
            for row in dst.chunks_mut(n) {
                for (d, &b) in row.iter_mut().zip(bias) {
                    d.write(b);
                }
            }
        }
        // SAFETY: `dst` has room for the m·n values of product `i`, written
        // in row-major order (row stride n, column stride 1), read only
        // when the bias rows were written into it just above (`read_dst`);
        // product `i`'s operands lie inside the slices at the given strides
        // (matrix `i` starts `i·size` in, lengths asserted above).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr().cast::<f32>(),
                1,
                n as isize,
                bias.is_some(),
                lhs.values.as_ptr().add(i * lhs.size),
                lhs.cs,
                lhs.rs,
                rhs.values.as_ptr().add(i * rhs.size),
                rhs.cs,
                rhs.rs,
                if bias.is_some() { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    };
    let mut out = Vec::<f32>::with_capacity(batch * m * n);
    let spare = &mut out.spare_capacity_mut()[..batch * m * n];
    if large || batch == 1 {
        let parallelism = if large {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        };
        for (i, dst) in spare.chunks_mut(m * n).enumerate() {
            one(i, dst, parallelism);
        }
    } else {
        spare
            .par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(i, dst)| one(i, dst, gemm::Parallelism::None));
    }
    // SAFETY: every product wrote all of its m·n values above.
    unsafe { out.set_len(batch * m * n) };
    out
}
