//! bf16 matrix products on the CPU, read where the operands lie: the x86
//! `vdpbf16ps` instruction (AVX512_BF16) where the CPU has it, f32
//! products of widened copies where it does not.
//!
//! Flex multiplies two bf16 matrices by widening both whole to f32
//! vectors (a transposed weight first copied to row major), an f32 gemm,
//! and a pass back to bf16: for a frozen projection in a LoRA step that is
//! 6 bytes written and read again for each stored weight, twice a step,
//! and f32 arithmetic where the CPU has units for pairs of bf16 values.
//! `vdpbf16ps` adds the products of 16 pairs of bf16 values onto 16 f32
//! sums in one instruction (products exact in f32, sums rounded as f32
//! additions are), as oneDNN's bf16 kernels do behind PyTorch's bf16 step.
//! Each result is its f32 sum rounded once to bf16 (to nearest, ties to
//! even), as Flex's path rounds, except below bf16's smallest normal
//! (about 1.2e-38): `vdpbf16ps` and `vcvtneps2bf16` flush subnormal
//! inputs and results to zero, as oneDNN's kernels do.
//!
//! Two layouts run without copying the weight: `x · W` with `W` row major
//! (its rows paired and interleaved into a 64-column panel at a time, in
//! registers), and `g · Wᵀ` (both operands read along `k`, a dot product
//! per result). Any other layout, and CPUs without the instruction, take
//! the widening path.

use burn::tensor::bf16;

use super::products::{Operand, gemm_products};

/// `a · b` for each of `batch` pairs (`a: [m, k]`, `b: [k, n]` as the
/// operands read them; matrix `i` starts `i·size` in), into a row-major
/// `[batch, m, n]` vector.
pub(super) fn products_bf16(batch: usize, a: Operand<bf16>, b: Operand<bf16>) -> Vec<bf16> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "operand shapes");
    if m * n == 0 || batch == 0 {
        return Vec::new();
    }
    if k == 0 {
        return vec![bf16::ZERO; batch * m * n];
    }
    let fits = |o: &Operand<bf16>| o.rs >= 0 && o.cs >= 0 && o.values.len() >= (batch - 1) * o.size + o.extent();
    assert!(fits(&a) && fits(&b), "operand values");
    let mut out = Vec::with_capacity(batch * m * n);
    for i in 0..batch {
        let (a, b) = (a.matrix(i), b.matrix(i));
        out.extend(product_bf16(a, b));
    }
    out
}

/// One product, by the fastest path the CPU and the layout allow.
fn product_bf16(a: Operand<bf16>, b: Operand<bf16>) -> Vec<bf16> {
    #[cfg(target_arch = "x86_64")]
    if x86::has_bf16_units() && a.cs != 1 && (b.cs == 1 || b.rs == 1) {
        // A transposed left operand (a weight's gradient, `xᵀ · g`):
        // copied row major (`m·k` values, small beside the product's
        // `m·k·n` work), then the paths below.
        let rows = row_major(&a);
        return product_bf16(Operand::plain(&rows, a.rows, a.cols), b);
    }
    #[cfg(target_arch = "x86_64")]
    if x86::has_bf16_units() && a.cs == 1 {
        if b.cs == 1 {
            // SAFETY: the CPU has the instructions; every value read lies in
            // the slices (asserted by the caller).
            return unsafe { x86::rows_paired(a, b) };
        }
        if b.rs == 1 {
            // SAFETY: as above.
            return unsafe { x86::dot_products(a, b) };
        }
    }
    product_widened(a, b)
}

/// One product through f32: both operands widened to row-major f32
/// copies, gemm, each result rounded to bf16.
pub(super) fn product_widened(a: Operand<bf16>, b: Operand<bf16>) -> Vec<bf16> {
    let (a32, b32) = (widened(&a), widened(&b));
    let products = gemm_products(
        1,
        Operand::plain(&a32, a.rows, a.cols),
        Operand::plain(&b32, b.rows, b.cols),
    );
    products.into_iter().map(bf16::from_f32).collect()
}

/// The operand's matrix as row-major f32 values.
fn widened(o: &Operand<bf16>) -> Vec<f32> {
    row_major(o).into_iter().map(bf16::to_f32).collect()
}

/// The operand's matrix as row-major values, read in the order they are
/// stored (a transposed matrix is read along its stored rows).
fn row_major(o: &Operand<bf16>) -> Vec<bf16> {
    let (rows, cols, rs, cs) = (o.rows, o.cols, o.rs as usize, o.cs as usize);
    let mut v = vec![bf16::ZERO; rows * cols];
    if rs < cs {
        for j in 0..cols {
            for i in 0..rows {
                v[i * cols + j] = o.values[i * rs + j * cs];
            }
        }
    } else {
        for i in 0..rows {
            for j in 0..cols {
                v[i * cols + j] = o.values[i * rs + j * cs];
            }
        }
    }
    v
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use burn::tensor::bf16;
    use rayon::prelude::*;

    use super::Operand;

    /// Whether this CPU multiplies bf16 pairs (and has the AVX-512 loads,
    /// stores and shuffles the kernels use with them).
    pub(super) fn has_bf16_units() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bf16")
        })
    }

    /// Rows of `a` in a tile of [`rows_paired`]; its columns are `NV`
    /// vectors of 16. 6 × 4 sums, 4 panel loads and one broadcast live at
    /// a time: 29 of the 32 vector registers.
    const MR: usize = 6;
    const NV: usize = 4;
    /// Columns of a packed panel.
    const NR: usize = 16 * NV;

    /// Rows of `a` and of `bᵀ` in a tile of [`dot_products`]: 24 sums and
    /// 10 loads a step of 32 values along `k`.
    const TR: usize = 4;
    const TS: usize = 6;

    /// The result's first value, shared by tasks that write disjoint columns.
    #[derive(Clone, Copy)]
    struct Out(*mut bf16);
    // SAFETY: every task writes only its own columns of the result.
    unsafe impl Send for Out {}
    unsafe impl Sync for Out {}

    /// Tasks for `units` independent column blocks of an `m·n·k` product:
    /// one below about 64³ multiply-adds (a task costs more than it
    /// saves), else a few per thread for balance.
    fn tasks(m: usize, n: usize, k: usize, units: usize) -> usize {
        if m * n * k < 64 * 64 * 64 {
            1
        } else {
            (rayon::current_num_threads() * 4).min(units).max(1)
        }
    }

    /// Runs `block(first, last)` over `units` column blocks split into tasks.
    fn over_blocks(m: usize, n: usize, k: usize, units: usize, block: impl Fn(usize, usize) + Sync) {
        let tasks = tasks(m, n, k, units);
        let per = units.div_ceil(tasks);
        if tasks == 1 {
            block(0, units);
        } else {
            (0..tasks)
                .into_par_iter()
                .for_each(|t| block(t * per, ((t + 1) * per).min(units)));
        }
    }

    /// `a · b` with `a`'s and `b`'s rows contiguous (`cs == 1`): `b`'s
    /// rows `2p` and `2p + 1` interleaved into a panel of [`NR`] columns,
    /// each 32-bit pair of `a`'s row broadcast against it.
    ///
    /// # Safety
    /// The CPU has [`has_bf16_units`]; the operands' values cover their
    /// extents.
    pub(super) unsafe fn rows_paired(a: Operand<bf16>, b: Operand<bf16>) -> Vec<bf16> {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut c = Vec::<bf16>::with_capacity(m * n);
        let out = Out(c.as_mut_ptr());
        let pairs = k.div_ceil(2);
        over_blocks(m, n, k, n.div_ceil(NR), |first, last| {
            let mut packed = vec![0u32; pairs * NR];
            for p in first..last {
                let j0 = p * NR;
                let cols = NR.min(n - j0);
                // SAFETY: the caller's promise; `packed` holds `pairs` rows of NR.
                unsafe {
                    pack_pairs(&b, j0, cols, &mut packed);
                    for i0 in (0..m).step_by(MR) {
                        tile_paired(&a, i0, &packed, out, n, j0, cols);
                    }
                }
            }
        });
        // SAFETY: the tiles wrote every row of every column block.
        unsafe { c.set_len(m * n) };
        c
    }

    /// `b`'s columns `j0..j0 + cols`, rows paired: `packed[p·NR + j]` holds
    /// `b[2p, j0 + j]` in its low half and `b[2p + 1, j0 + j]` (or 0 past
    /// the last row) in its high half; columns past `cols` are 0.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pack_pairs(b: &Operand<bf16>, j0: usize, cols: usize, packed: &mut [u32]) {
        const LOW: [u16; 32] = interleave(0);
        const HIGH: [u16; 32] = interleave(16);
        let (k, rs) = (b.rows, b.rs as usize);
        // SAFETY (whole function): rows `0..k` of columns `j0..j0 + cols`
        // lie in `b.values` (the caller's promise); `packed` has
        // `k.div_ceil(2) · NR` values.
        unsafe {
            let (low, high) = (
                _mm512_loadu_si512(LOW.as_ptr().cast()),
                _mm512_loadu_si512(HIGH.as_ptr().cast()),
            );
            let base = b.values.as_ptr().add(j0).cast::<u16>();
            for p in 0..k.div_ceil(2) {
                let dst = packed.as_mut_ptr().add(p * NR).cast::<u16>();
                let r0 = base.add(2 * p * rs);
                if cols == NR && 2 * p + 1 < k {
                    let r1 = base.add((2 * p + 1) * rs);
                    for h in 0..2 {
                        let x = _mm512_loadu_si512(r0.add(32 * h).cast());
                        let y = _mm512_loadu_si512(r1.add(32 * h).cast());
                        _mm512_storeu_si512(dst.add(64 * h).cast(), _mm512_permutex2var_epi16(x, low, y));
                        _mm512_storeu_si512(dst.add(64 * h + 32).cast(), _mm512_permutex2var_epi16(x, high, y));
                    }
                } else {
                    for j in 0..NR {
                        let inside = j < cols;
                        *dst.add(2 * j) = if inside { *r0.add(j) } else { 0 };
                        *dst.add(2 * j + 1) = if inside && 2 * p + 1 < k {
                            *base.add((2 * p + 1) * rs + j)
                        } else {
                            0
                        };
                    }
                }
            }
        }
    }

    /// Indices for `_mm512_permutex2var_epi16` interleaving 16 values of
    /// two vectors from `first` on: `x[first], y[first], x[first + 1], …`.
    const fn interleave(first: u16) -> [u16; 32] {
        let mut idx = [0u16; 32];
        let mut i = 0;
        while i < 16 {
            idx[2 * i] = first + i as u16;
            idx[2 * i + 1] = 32 + first + i as u16;
            i += 1;
        }
        idx
    }

    /// Rows `i0..i0 + MR` (the last row repeated past `m`, not stored) of
    /// `a · panel` into the result's columns `j0..j0 + cols`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn tile_paired(a: &Operand<bf16>, i0: usize, packed: &[u32], out: Out, n: usize, j0: usize, cols: usize) {
        let (m, k, rs) = (a.rows, a.cols, a.rs as usize);
        // SAFETY (whole function): rows below `m` and values below `k` of
        // `a` lie in its slice; `packed` holds `k.div_ceil(2)` rows of NR;
        // the stores go to rows below `m` and columns below `j0 + cols ≤ n`.
        unsafe {
            let rows: [*const u16; MR] =
                std::array::from_fn(|r| a.values.as_ptr().add((i0 + r).min(m - 1) * rs).cast::<u16>());
            let mut acc = [[_mm512_setzero_ps(); NV]; MR];
            let bp = packed.as_ptr();
            let panel = |p: usize| -> [__m512bh; NV] {
                std::array::from_fn(|v| std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR + 16 * v).cast())))
            };
            for p in 0..k / 2 {
                let bv = panel(p);
                for r in 0..MR {
                    let pair = rows[r].add(2 * p).cast::<i32>().read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    for v in 0..NV {
                        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
                    }
                }
            }
            if k % 2 == 1 {
                let bv = panel(k / 2);
                for r in 0..MR {
                    // The last value alone: the pair's other half is 0.
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*rows[r].add(k - 1) as i32));
                    for v in 0..NV {
                        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
                    }
                }
            }
            for (r, sums) in acc.iter().enumerate().take(MR.min(m - i0)) {
                let dst = out.0.add((i0 + r) * n + j0).cast::<u16>();
                for (v, &sum) in sums.iter().enumerate() {
                    let c0 = 16 * v;
                    if c0 >= cols {
                        break;
                    }
                    let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(sum));
                    if c0 + 16 <= cols {
                        _mm256_storeu_si256(dst.add(c0).cast(), h);
                    } else {
                        _mm256_mask_storeu_epi16(dst.add(c0).cast(), ((1u32 << (cols - c0)) - 1) as u16, h);
                    }
                }
            }
        }
    }

    /// `a · b` with `a`'s rows and `b`'s columns contiguous (`a.cs == 1`,
    /// `b.rs == 1`, as `g · Wᵀ` reads a row-major `W`): a dot product of
    /// two contiguous runs per result, [`TR`] × [`TS`] at a time.
    ///
    /// # Safety
    /// As [`rows_paired`].
    pub(super) unsafe fn dot_products(a: Operand<bf16>, b: Operand<bf16>) -> Vec<bf16> {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut c = Vec::<bf16>::with_capacity(m * n);
        let out = Out(c.as_mut_ptr());
        over_blocks(m, n, k, n.div_ceil(TS), |first, last| {
            for s in first..last {
                for i0 in (0..m).step_by(TR) {
                    // SAFETY: the caller's promise.
                    unsafe { tile_dots(&a, &b, i0, s * TS, out, n) };
                }
            }
        });
        // SAFETY: the tiles wrote every value.
        unsafe { c.set_len(m * n) };
        c
    }

    /// Results `[i0..i0 + TR, j0..j0 + TS]` (rows and columns past the
    /// matrix repeat its last, not stored).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn tile_dots(a: &Operand<bf16>, b: &Operand<bf16>, i0: usize, j0: usize, out: Out, n: usize) {
        let (m, k) = (a.rows, a.cols);
        // SAFETY (whole function): rows of `a` below `m` and columns of `b`
        // below `n` are `k` contiguous values inside their slices; masked
        // loads read none past `k`; stores go to rows below `m`, columns
        // below `n`.
        unsafe {
            let arow: [*const u16; TR] =
                std::array::from_fn(|r| a.values.as_ptr().add((i0 + r).min(m - 1) * a.rs as usize).cast::<u16>());
            let bcol: [*const u16; TS] =
                std::array::from_fn(|s| b.values.as_ptr().add((j0 + s).min(n - 1) * b.cs as usize).cast::<u16>());
            let mut acc = [[_mm512_setzero_ps(); TS]; TR];
            // Steps of 32 values along `k`, the last masked to what is left
            // (a full mask elsewhere: a masked load costs a plain one).
            for q in 0..k.div_ceil(32) {
                let (off, left) = (32 * q, k - 32 * q);
                let mask = if left >= 32 {
                    u32::MAX
                } else {
                    ((1u64 << left) - 1) as u32
                };
                let av: [__m512bh; TR] = std::array::from_fn(|r| {
                    std::mem::transmute(_mm512_maskz_loadu_epi16(mask, arow[r].add(off).cast()))
                });
                for s in 0..TS {
                    let bv: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(mask, bcol[s].add(off).cast()));
                    for r in 0..TR {
                        acc[r][s] = _mm512_dpbf16_ps(acc[r][s], av[r], bv);
                    }
                }
            }
            for (r, sums) in acc.iter().enumerate().take(TR.min(m - i0)) {
                for (s, &sum) in sums.iter().enumerate().take(TS.min(n - j0)) {
                    *out.0.add((i0 + r) * n + j0 + s) = bf16::from_f32(_mm512_reduce_add_ps(sum));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in about ±2, exact in bf16.
    fn values(count: usize, seed: u64) -> Vec<bf16> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..count)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bf16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0)
            })
            .collect()
    }

    /// The exact product in f64, each value's bf16 rounding allowed plus
    /// f32 summation's error on `k` terms.
    fn check(got: &[bf16], a: &Operand<bf16>, b: &Operand<bf16>, what: &str) {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        assert_eq!(got.len(), m * n, "{what}: result size");
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut magnitude) = (0f64, 0f64);
                for l in 0..k {
                    let x = a.values[i * a.rs as usize + l * a.cs as usize].to_f64();
                    let y = b.values[l * b.rs as usize + j * b.cs as usize].to_f64();
                    exact += x * y;
                    magnitude += (x * y).abs();
                }
                let got = got[i * n + j].to_f64();
                // Half a bf16 unit of the result, and f32 sums' rounding.
                let bound = exact.abs() * 2f64.powi(-8) + magnitude * k as f64 * 2f64.powi(-23) + 1e-30;
                assert!(
                    (got - exact).abs() <= bound,
                    "{what}: [{i}, {j}] of {m}×{k}×{n}: {got} against {exact} (bound {bound})"
                );
            }
        }
    }

    /// Every layout path (rows paired, dot products, widened) at shapes
    /// with every remainder: rows not a multiple of the tiles', columns
    /// not of the panel's, odd `k`, `k` not a multiple of 32, and a row
    /// stride wider than the matrix (a `narrow`ed weight).
    #[test]
    fn every_path_gives_the_rounded_product() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 33, 65),
            (13, 64, 130),
            (6, 95, 64),
            (64, 256, 200),
            (3, 2, 17),
        ] {
            let av = values(m * (k + 3), 1 + m as u64);
            let a = Operand {
                values: &av,
                size: m * (k + 3),
                rows: m,
                cols: k,
                rs: (k + 3) as isize,
                cs: 1,
            };
            // `b` row major with a wider row stride (rows paired).
            let bv = values(k * (n + 5), 7 + k as u64);
            let rows = Operand {
                values: &bv,
                size: k * (n + 5),
                rows: k,
                cols: n,
                rs: (n + 5) as isize,
                cs: 1,
            };
            check(&products_bf16(1, a, rows), &a, &rows, "rows paired");
            // `b` as a transposed row-major `[n, k]` (dot products).
            let wv = values(n * k, 11 + n as u64);
            let w = Operand::plain(&wv, n, k).t();
            check(&products_bf16(1, a, w), &a, &w, "dot products");
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx512bf16") {
                // The kernels themselves, not a fallback that would pass too.
                assert!(x86::has_bf16_units(), "the CPU has AVX512_BF16");
                // SAFETY: the CPU has the instructions; the operands cover their extents.
                let (paired, dots) = unsafe { (x86::rows_paired(a, rows), x86::dot_products(a, w)) };
                check(&paired, &a, &rows, "rows paired, the kernel");
                check(&dots, &a, &w, "dot products, the kernel");
            }
            // Both through f32, and a transposed `a` (no fast layout).
            check(&product_widened(a, rows), &a, &rows, "widened");
            let at_v = values(k * m, 3);
            let at = Operand::plain(&at_v, k, m).t();
            check(&products_bf16(1, at, w), &at, &w, "a transposed");
        }
    }

    /// Batched products read matrix `i` at `i · size`.
    #[test]
    fn a_batch_is_its_products_in_order() {
        let (batch, m, k, n) = (3, 5, 40, 70);
        let (av, bv) = (values(batch * m * k, 5), values(batch * k * n, 6));
        let (a, b) = (Operand::plain(&av, m, k), Operand::plain(&bv, k, n));
        let all = products_bf16(batch, a, b);
        for i in 0..batch {
            let (a, b) = (a.matrix(i), b.matrix(i));
            assert_eq!(
                &all[i * m * n..(i + 1) * m * n],
                &products_bf16(1, a, b)[..],
                "product {i}"
            );
            check(&all[i * m * n..(i + 1) * m * n], &a, &b, "batched");
        }
    }
}
