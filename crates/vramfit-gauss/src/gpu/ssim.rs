//! The banded SSIM + L1 loss and its gradient on the device, twins of
//! [`crate::ssim`], shared by the image fit and the scene: the kernels and
//! [`band`], which runs them over one band of rows of a render against a
//! [`Target`] kept on the device.
//!
//! A band of output rows `[y0, y1)` needs the render `2R` rows past it and
//! the local statistics `R` rows past it (`R` the window's radius), so its
//! scratch scales with the band's height, not the image's.

// Kernel code is expanded by `#[cube]`, which supports comparisons but not
// `Range::contains`.
#![allow(clippy::manual_range_contains)]

use std::ops::Deref;

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::{UNITS, array, cubes_of, dim, grid};

/// Taps of the SSIM window ([`crate::ssim::TAPS`]).
pub const TAPS: u32 = crate::ssim::TAPS as u32;

/// Rows of halo on each side of a band: the window's radius.
pub const RADIUS: usize = (TAPS / 2) as usize;

/// SSIM's stabilising constants ([`crate::ssim`]).
const C1: f32 = crate::ssim::C1 as f32;
const C2: f32 = crate::ssim::C2 as f32;

/// Target value at flat index `i`: packed, a u8 image four to a u32
/// (`byte / 255`); else f32 values stored as their bits.
#[cube]
fn target_at(target: &Array<u32>, i: u32, #[comptime] packed: bool) -> f32 {
    if comptime!(packed) {
        let word = target[(i / 4) as usize];
        let byte = (word >> ((i % 4) * 8)) & 255u32;
        f32::cast_from(byte) / 255.0
    } else {
        f32::reinterpret(target[i as usize])
    }
}

/// Render value at band row `row`, optionally clamped to `[0, 1]`.
#[cube]
fn render_at(render: &Array<f32>, i: u32, #[comptime] clamp: bool) -> f32 {
    let v = render[i as usize];
    if comptime!(clamp) { f32::clamp(v, 0.0, 1.0) } else { v }
}

/// Horizontal window sums of `x, y, x², y², xy` (x the render, y the target)
/// for the render band rows `[ry0, ry0 + rows)`: five planes in `h5`. The
/// render buffer's first row is image row `render_row0`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn hblur_stats(
    render: &Array<f32>,
    target: &Array<u32>,
    window: &Array<f32>,
    h5: &mut Array<f32>,
    width: u32,
    rows: u32,
    ry0: u32,
    render_row0: u32,
    #[comptime] channels: usize,
    #[comptime] clamp: bool,
    #[comptime] packed: bool,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    if e < plane {
        let row = e / (width * c);
        let x = (e / c) % width;
        let ch = e % c;
        let img_row = (ry0 + row) * width * c;
        let mut s = Array::<f32>::new(5usize);
        #[unroll]
        for q in 0..5usize {
            s[q] = 0.0;
        }
        for j in 0..TAPS {
            let xs = x + j;
            // xs − 5 in [0, W), written without going negative.
            if xs >= TAPS / 2 && xs < width + TAPS / 2 {
                let col = xs - TAPS / 2;
                let kv = window[j as usize];
                let xv = render_at(render, ((ry0 - render_row0 + row) * width + col) * c + ch, clamp);
                let yv = target_at(target, img_row + col * c + ch, packed);
                s[0] += kv * xv;
                s[1] += kv * yv;
                s[2] += kv * (xv * xv);
                s[3] += kv * (yv * yv);
                s[4] += kv * (xv * yv);
            }
        }
        #[unroll]
        for q in 0..5usize {
            h5[(q as u32 * plane + e) as usize] = s[q];
        }
    }
}

/// Sums `v` over the cube in shared memory; unit 0 gets the total.
#[cube]
fn cube_sum(v: f32, shared: &mut SharedMemory<f32>) -> f32 {
    shared[UNIT_POS as usize] = v;
    sync_cube();
    let mut stride = (UNITS / 2).runtime();
    while stride > 0 {
        if UNIT_POS < stride {
            shared[UNIT_POS as usize] += shared[(UNIT_POS + stride) as usize];
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// Vertical window sums of `h5` → local statistics → SSIM per value, for
/// rows `[cy0, cy0 + rows)`. With `coeffs`, writes the three SSIM
/// derivative planes `∂S/∂μx, ∂S/∂E[x²], ∂S/∂E[xy]` times `scale` to
/// `coef3`. For rows in `[y0, y1)` adds SSIM, |x − y| and (x − y)² to
/// per-cube partial sums (`partials[3·cube ..]`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn ssim_terms(
    h5: &Array<f32>,
    render: &Array<f32>,
    target: &Array<u32>,
    window: &Array<f32>,
    coef3: &mut Array<f32>,
    partials: &mut Array<f32>,
    width: u32,
    height: u32,
    h_rows: u32,
    ry0: u32,
    render_row0: u32,
    cy0: u32,
    rows: u32,
    y0: u32,
    y1: u32,
    scale: f32,
    #[comptime] channels: usize,
    #[comptime] clamp: bool,
    #[comptime] coeffs: bool,
    #[comptime] packed: bool,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    let h_plane = h_rows * width * c;
    let mut ssim = 0.0f32;
    let mut l1 = 0.0f32;
    let mut se = 0.0f32;
    if e < plane {
        let row = e / (width * c);
        let rest = e % (width * c);
        let y = cy0 + row;
        let mut s = Array::<f32>::new(5usize);
        #[unroll]
        for q in 0..5usize {
            s[q] = 0.0;
        }
        for j in 0..TAPS {
            let ys = y + j;
            if ys >= TAPS / 2 && ys < height + TAPS / 2 {
                let src = ((ys - TAPS / 2 - ry0) * width * c + rest) as usize;
                let kv = window[j as usize];
                #[unroll]
                for q in 0..5usize {
                    s[q] += kv * h5[q * h_plane as usize + src];
                }
            }
        }
        let mx = s[0];
        let my = s[1];
        let a1 = 2.0 * mx * my + C1;
        let a2 = 2.0 * (s[4] - mx * my) + C2;
        let b1 = mx * mx + my * my + C1;
        let b2 = (s[2] - mx * mx) + (s[3] - my * my) + C2;
        let den = b1 * b2;
        let sv = a1 * a2 / den;
        if comptime!(coeffs) {
            let d_mx = 2.0 * my * a2 / den - 2.0 * my * a1 / den - 2.0 * mx * sv / b1 + 2.0 * mx * sv / b2;
            coef3[e as usize] = scale * d_mx;
            coef3[(plane + e) as usize] = scale * (-sv / b2);
            coef3[(2 * plane + e) as usize] = scale * (2.0 * a1 / den);
        }
        if y >= y0 && y < y1 {
            let xv = render_at(render, (y - render_row0) * width * c + rest, clamp);
            let yv = target_at(target, y * width * c + rest, packed);
            ssim = sv;
            l1 = f32::abs(xv - yv);
            se = (xv - yv) * (xv - yv);
        }
    }
    let mut shared = SharedMemory::<f32>::new(UNITS as usize);
    let t_ssim = cube_sum(ssim, &mut shared);
    let t_l1 = cube_sum(l1, &mut shared);
    let t_se = cube_sum(se, &mut shared);
    if UNIT_POS == 0 {
        let cube = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
        partials[3 * cube] = t_ssim;
        partials[3 * cube + 1] = t_l1;
        partials[3 * cube + 2] = t_se;
    }
}

/// Horizontal window sums of the three coefficient planes (`rows` rows).
#[cube(launch)]
pub fn hblur_coeffs(
    coef3: &Array<f32>,
    window: &Array<f32>,
    hc3: &mut Array<f32>,
    width: u32,
    rows: u32,
    #[comptime] channels: usize,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    if e < plane {
        let x = (e / c) % width;
        let row_start = e - (x * c + e % c);
        let ch = e % c;
        let mut s = Array::<f32>::new(3usize);
        #[unroll]
        for q in 0..3usize {
            s[q] = 0.0;
        }
        for j in 0..TAPS {
            let xs = x + j;
            if xs >= TAPS / 2 && xs < width + TAPS / 2 {
                let src = row_start + (xs - TAPS / 2) * c + ch;
                let kv = window[j as usize];
                #[unroll]
                for q in 0..3usize {
                    s[q] += kv * coef3[(q as u32 * plane + src) as usize];
                }
            }
        }
        #[unroll]
        for q in 0..3usize {
            hc3[(q as u32 * plane + e) as usize] = s[q];
        }
    }
}

/// Gradient of the loss with respect to the render for rows
/// `[y0, y0 + rows)`: the vertical window sums of `hc3` (rows from `cy0`)
/// give the SSIM part, `l1_scale · sign(x − y)` the L1 part. The render's
/// first row is image row `render_row0`, `d_render`'s `out_row0`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn render_grad(
    hc3: &Array<f32>,
    render: &Array<f32>,
    target: &Array<u32>,
    window: &Array<f32>,
    d_render: &mut Array<f32>,
    width: u32,
    height: u32,
    hc_rows: u32,
    cy0: u32,
    render_row0: u32,
    y0: u32,
    rows: u32,
    out_row0: u32,
    l1_scale: f32,
    #[comptime] channels: usize,
    #[comptime] packed: bool,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    let hc_plane = hc_rows * width * c;
    if e < plane {
        let row = e / (width * c);
        let rest = e % (width * c);
        let y = y0 + row;
        let mut g = Array::<f32>::new(3usize);
        #[unroll]
        for q in 0..3usize {
            g[q] = 0.0;
        }
        for j in 0..TAPS {
            let ys = y + j;
            if ys >= TAPS / 2 && ys < height + TAPS / 2 {
                let src = ((ys - TAPS / 2 - cy0) * width * c + rest) as usize;
                let kv = window[j as usize];
                #[unroll]
                for q in 0..3usize {
                    g[q] += kv * hc3[q * hc_plane as usize + src];
                }
            }
        }
        let xv = render[((y - render_row0) * width * c + rest) as usize];
        let yv = target_at(target, y * width * c + rest, packed);
        let diff = xv - yv;
        let mut sign = 0.0f32;
        if diff > 0.0 {
            sign = 1.0;
        }
        if diff < 0.0 {
            sign = -1.0;
        }
        d_render[((y - out_row0) * width * c + rest) as usize] = g[0] + 2.0 * xv * g[1] + yv * g[2] + l1_scale * sign;
    }
}

/// The SSIM window's taps on the device (one small buffer a workload).
pub fn window<R: Runtime>(client: &ComputeClient<R>) -> Handle {
    client.create_from_slice(f32::as_bytes(&crate::ssim::window_f32()))
}

/// A target image on the device, `[H, W, C]` row major: 8-bit values
/// packed four to a word, or f32 values.
#[derive(Clone)]
pub struct Target {
    handle: Handle,
    values: usize,
    packed: bool,
}

impl Target {
    /// 8-bit values, packed four to a word (a quarter of f32's bytes), in
    /// the buffer `make` makes of the bytes given.
    pub fn from_u8(values: &[u8], make: impl FnOnce(&[u8]) -> Handle) -> Self {
        let mut words = vec![0u32; values.len().div_ceil(4).max(1)];
        for (i, &b) in values.iter().enumerate() {
            words[i / 4] |= (b as u32) << ((i % 4) * 8);
        }
        Self {
            handle: make(u32::as_bytes(&words)),
            values: values.len(),
            packed: true,
        }
    }

    /// Values in `[0, 1]`: packed as bytes where every value is exactly
    /// `byte / 255` in f32 (an 8-bit image read as floats; the kernels
    /// divide by 255 again, to within the device's division), else kept
    /// as f32.
    pub fn from_f32(values: &[f32], make: impl FnOnce(&[u8]) -> Handle) -> Self {
        let bytes: Option<Vec<u8>> = values
            .iter()
            .map(|&v| {
                let b = (v * 255.0).round();
                ((0.0..=255.0).contains(&b) && b / 255.0 == v).then_some(b as u8)
            })
            .collect();
        match bytes {
            Some(bytes) => Self::from_u8(&bytes, make),
            None => Self {
                handle: make(f32::as_bytes(if values.is_empty() { &[0.0] } else { values })),
                values: values.len(),
                packed: false,
            },
        }
    }

    /// Device bytes the target takes.
    pub fn bytes(&self) -> u64 {
        4 * self.words() as u64
    }

    /// Whether it is held as bytes.
    pub fn is_packed(&self) -> bool {
        self.packed
    }

    fn words(&self) -> usize {
        if self.packed {
            self.values.div_ceil(4)
        } else {
            self.values
        }
        .max(1)
    }

    fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        array(&self.handle, self.words())
    }
}

/// The loss `l1 · L1 + ssim · (1 − SSIM)`, L1 and SSIM means over the
/// values: the weights the gradient is made with.
#[derive(Debug, Clone, Copy)]
pub struct Weights {
    /// Of the mean absolute difference.
    pub l1: f32,
    /// Of `1 − SSIM`.
    pub ssim: f32,
}

/// The rows of one band of an image `height` rows high: its output rows
/// `[y0, y1)`, the render rows it reads `[ry0, ry1)` (`2R` past it) and
/// the rows of local statistics `[cy0, cy1)` (`R` past it).
#[derive(Debug, Clone, Copy)]
pub struct Band {
    /// First output row.
    pub y0: usize,
    /// One past the last output row.
    pub y1: usize,
    /// First render row.
    pub ry0: usize,
    /// One past the last render row.
    pub ry1: usize,
    cy0: usize,
    cy1: usize,
}

impl Band {
    /// Rows `[y0, y1)` of an image `height` rows high.
    pub fn new(y0: usize, y1: usize, height: usize) -> Self {
        Self {
            y0,
            y1,
            ry0: y0.saturating_sub(2 * RADIUS),
            ry1: (y1 + 2 * RADIUS).min(height),
            cy0: y0.saturating_sub(RADIUS),
            cy1: (y1 + RADIUS).min(height),
        }
    }

    /// The image in bands of `rows` rows.
    pub fn all(height: usize, rows: usize) -> impl Iterator<Item = Band> {
        let rows = rows.max(1);
        (0..height)
            .step_by(rows)
            .map(move |y0| Band::new(y0, (y0 + rows).min(height), height))
    }
}

/// An image's shape: width, height, channels.
#[derive(Debug, Clone, Copy)]
pub struct Image {
    /// Pixels a row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Values a pixel.
    pub channels: usize,
}

/// What [`band`] made: the per-cube partial sums of SSIM, `|x − y|` and
/// `(x − y)²` over the band's rows (three floats a cube, `cubes` cubes),
/// and with weights the loss's gradient with respect to the band's output
/// rows of the render (`[y1 − y0, W, C]`), unless it went into the
/// caller's buffer.
pub struct BandLoss<S> {
    /// The partial sums.
    pub partials: S,
    /// Cubes in `partials`.
    pub cubes: usize,
    /// The render's gradient in a band buffer of its own.
    pub d_render: Option<S>,
}

/// Image rows of a render on the device: `handle` holds rows
/// `[first_row, first_row + rows)`.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// The values, `[rows, W, C]`.
    pub handle: &'a Handle,
    /// The image row of its first row.
    pub first_row: usize,
    /// Rows it holds.
    pub rows: usize,
}

/// The SSIM and L1 terms of band `b` of `render` (holding at least its
/// rows `[ry0, ry1)`) against `target`: with `weights`, of the raw render
/// and with the render's gradient; without, of the render clamped to
/// `[0, 1]` (metrics). The gradient is written into `into`'s rows `[y0,
/// y1)` where given (a buffer of the same rows as `render`), else into a
/// band buffer of its own. `scratch(len)` gives an f32 buffer of `len`
/// values (the caller's, so it can count them); the planes are released as
/// soon as the next kernel has them.
#[allow(clippy::too_many_arguments)]
pub fn band<R: Runtime, S: Deref<Target = Handle>>(
    client: &ComputeClient<R>,
    window: &Handle,
    render: Rows,
    target: &Target,
    image: Image,
    b: &Band,
    weights: Option<Weights>,
    into: Option<&Handle>,
    scratch: impl Fn(usize) -> S,
) -> BandLoss<S> {
    let Image {
        width: w,
        height: h,
        channels: c,
    } = image;
    assert!(
        render.first_row <= b.ry0 && b.ry1 <= render.first_row + render.rows,
        "the render holds rows {}..{}, the band reads {}..{}",
        render.first_row,
        render.first_row + render.rows,
        b.ry0,
        b.ry1
    );
    let render_len = render.rows * w * c;
    let values = (w * h * c) as f64;
    let grads = weights.is_some();
    let clamp = !grads;
    let r_len = (b.ry1 - b.ry0) * w * c;
    let h5 = scratch(5 * r_len);
    hblur_stats::launch::<R>(
        client,
        grid(r_len),
        dim(),
        array(render.handle, render_len),
        target.arg(),
        array(window, TAPS as usize),
        array(&h5, 5 * r_len),
        w as u32,
        (b.ry1 - b.ry0) as u32,
        b.ry0 as u32,
        render.first_row as u32,
        c,
        clamp,
        target.packed,
    );
    let c_len = (b.cy1 - b.cy0) * w * c;
    let coef_len = if grads { 3 * c_len } else { 1 };
    let coef3 = scratch(coef_len);
    let count = grid(c_len);
    let cubes = cubes_of(&count);
    let partials = scratch(3 * cubes);
    let scale = weights.map_or(0.0, |wt| -(wt.ssim as f64) / values) as f32;
    ssim_terms::launch::<R>(
        client,
        count,
        dim(),
        array(&h5, 5 * r_len),
        array(render.handle, render_len),
        target.arg(),
        array(window, TAPS as usize),
        array(&coef3, coef_len),
        array(&partials, 3 * cubes),
        w as u32,
        h as u32,
        (b.ry1 - b.ry0) as u32,
        b.ry0 as u32,
        render.first_row as u32,
        b.cy0 as u32,
        (b.cy1 - b.cy0) as u32,
        b.y0 as u32,
        b.y1 as u32,
        scale,
        c,
        clamp,
        grads,
        target.packed,
    );
    drop(h5);
    let Some(weights) = weights else {
        return BandLoss {
            partials,
            cubes,
            d_render: None,
        };
    };
    let hc3 = scratch(3 * c_len);
    hblur_coeffs::launch::<R>(
        client,
        grid(c_len),
        dim(),
        array(&coef3, 3 * c_len),
        array(window, TAPS as usize),
        array(&hc3, 3 * c_len),
        w as u32,
        (b.cy1 - b.cy0) as u32,
        c,
    );
    drop(coef3);
    let o_len = (b.y1 - b.y0) * w * c;
    let own = into.is_none().then(|| scratch(o_len));
    let (out, out_len, out_row0) = match (into, &own) {
        (Some(h), _) => (h, render_len, render.first_row),
        (None, Some(own)) => (&**own, o_len, b.y0),
        (None, None) => unreachable!("a band buffer is made when none is given"),
    };
    render_grad::launch::<R>(
        client,
        grid(o_len),
        dim(),
        array(&hc3, 3 * c_len),
        array(render.handle, render_len),
        target.arg(),
        array(window, TAPS as usize),
        array(out, out_len),
        w as u32,
        h as u32,
        (b.cy1 - b.cy0) as u32,
        b.cy0 as u32,
        render.first_row as u32,
        b.y0 as u32,
        (b.y1 - b.y0) as u32,
        out_row0 as u32,
        (weights.l1 as f64 / values) as f32,
        c,
        target.packed,
    );
    BandLoss {
        partials,
        cubes,
        d_render: own,
    }
}

/// A scratch buffer that is only its handle (for callers that count their
/// buffers elsewhere).
pub struct Buffer(pub Handle);

impl Deref for Buffer {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.0
    }
}

/// Adds partial sums read back from [`BandLoss::partials`] to `sums`
/// (SSIM, `|x − y|`, `(x − y)²`).
pub fn add_partials(read: &[f32], sums: &mut [f64; 3]) {
    for (q, v) in read.iter().enumerate() {
        sums[q % 3] += *v as f64;
    }
}
