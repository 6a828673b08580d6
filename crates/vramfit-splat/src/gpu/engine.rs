//! The lean fit on a CubeCL runtime: the target lives on the device as u8,
//! and render, loss and backward run band by band (tile rows plus a halo for
//! the SSIM window), so that scratch memory scales with the band, not the
//! image. Nothing image-sized in f32 is ever allocated.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cubecl::prelude::*;
use cubecl::server::Handle;

use vramfit_gauss::gpu::ssim::{self, Band, Image, Target, Weights};
use vramfit_gauss::gpu::{DeviceError, TILE, array, binning, dim, grid};

use super::kernels::{self, GEOMETRY_GRADS};
use crate::cpu::project::Frame;
use crate::op::LossParts;
use crate::params::{Param, Params};

/// Rows of SSIM halo on each side of a band: the window's radius.
const R: usize = ssim::RADIUS;
/// Scratch planes per band row (render, five statistics, three
/// coefficients, their three blurs, the render gradient).
const PLANES: usize = 13;
/// Most scratch planes a band may take when its height is automatic.
pub const DEFAULT_BAND_BYTES: usize = 192 << 20;
/// Automatic bands stop growing here: each band renders 4·R halo rows
/// beyond its own, so at this height the halo adds 1/8 of the work, and a
/// taller band only holds more scratch. (Measured on lavapipe at 2048²:
/// docs/results/splat-gpu.md, "Memory of the GPU path (wgpu on software Vulkan)".)
const EFFICIENT_ROWS: usize = 8 * 4 * R;

/// Parameter buffers on the device, f32, row major, `[N, width]` each
/// (widths from [`crate::params::Param::width`]).
#[derive(Debug, Clone)]
pub struct ParamBuffers {
    /// One buffer per parameter tensor.
    pub handles: Params<Handle>,
    /// Gaussians N.
    pub n: usize,
}

/// Live scratch bytes and their high-water mark: the workspace the engine
/// declares to the profiler.
#[derive(Debug, Default)]
struct Meter {
    live: AtomicU64,
    largest: AtomicU64,
}

/// A scratch buffer, counted in the engine's workspace while the engine
/// holds it. (The allocator may keep the memory a little longer, until the
/// kernels queued on it have run: the count is a lower bound of what the
/// allocator holds for scratch.)
struct Scratch {
    handle: Handle,
    bytes: u64,
    meter: Arc<Meter>,
}

impl std::ops::Deref for Scratch {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.meter.live.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// The fitted image on the device and the band layout.
#[derive(Clone)]
pub struct Lean<R: Runtime> {
    client: ComputeClient<R>,
    width: usize,
    height: usize,
    channels: usize,
    top_k: usize,
    band_rows: usize,
    target: Target,
    window: Handle,
    meter: Arc<Meter>,
}

/// Band height in rows: the given one rounded up to whole tiles, or
/// [`EFFICIENT_ROWS`], lowered where needed to keep the scratch planes
/// within [`DEFAULT_BAND_BYTES`].
pub fn band_rows(width: usize, height: usize, channels: usize, requested: usize) -> usize {
    let tile = TILE as usize;
    let rows = if requested > 0 {
        requested
    } else {
        let per_row = PLANES * width * channels * 4;
        (DEFAULT_BAND_BYTES / per_row.max(1))
            .saturating_sub(4 * R)
            .min(EFFICIENT_ROWS)
    };
    rows.div_ceil(tile).max(1).min(height.div_ceil(tile).max(1)) * tile
}

/// The largest single buffer a band may take in the planner's band
/// heights: wgpu's default limit on a buffer binding (256 MiB), the
/// strictest runtime vramfit builds for.
const MOST_BUFFER_BYTES: usize = 256 << 20;

/// Band heights for the planner: 16, 32, 64, … rows, up to the image's
/// height or the tallest band whose largest buffer (five statistics planes
/// over the band and its halo) stays within [`MOST_BUFFER_BYTES`].
pub fn band_rungs(width: usize, height: usize, channels: usize) -> Vec<usize> {
    let tile = TILE as usize;
    let per_row = 5 * width * channels * 4;
    let by_buffer = (MOST_BUFFER_BYTES / per_row.max(1)).saturating_sub(4 * R) / tile * tile;
    let most = (height.div_ceil(tile) * tile).min(by_buffer.max(tile));
    vramfit::plan::ladder::doubling(tile, most, tile)
}

/// The tile lists of one band: `offsets` (per tile, plus the total) and `ids`.
struct Binning {
    offsets: Scratch,
    ids: Scratch,
    tiles: usize,
    pairs: usize,
    row0: usize,
}

impl<R: Runtime> Lean<R> {
    /// Uploads the target (`[H, W, C]` bytes) and sets the band height
    /// (`band_rows` 0: automatic).
    pub fn new(
        client: ComputeClient<R>,
        target: &[u8],
        width: usize,
        height: usize,
        channels: usize,
        top_k: usize,
        band_rows_requested: usize,
    ) -> Self {
        assert_eq!(target.len(), width * height * channels, "target must be [H, W, C]");
        let target = Target::from_u8(target, |bytes| client.create_from_slice(bytes));
        let window = ssim::window(&client);
        Self {
            client,
            width,
            height,
            channels,
            top_k,
            band_rows: band_rows(width, height, channels, band_rows_requested),
            target,
            window,
            meter: Arc::default(),
        }
    }

    /// Rows per band.
    pub fn band_rows(&self) -> usize {
        self.band_rows
    }

    /// Device bytes the target takes.
    pub fn target_bytes(&self) -> u64 {
        self.target.bytes()
    }

    /// The most scratch the engine has held at once (bytes): projected
    /// Gaussians, tile lists, band planes and the gradient accumulator.
    pub fn workspace_bytes(&self) -> u64 {
        self.meter.largest.load(Ordering::Relaxed)
    }

    fn scratch(&self, bytes: usize) -> Scratch {
        let bytes = bytes.max(4);
        let live = self.meter.live.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.meter.largest.fetch_max(live, Ordering::Relaxed);
        Scratch {
            handle: self.client.empty(bytes),
            bytes: bytes as u64,
            meter: self.meter.clone(),
        }
    }

    fn f32_buffer(&self, len: usize) -> Scratch {
        self.scratch(len.max(1) * 4)
    }

    /// Parameter `q`'s buffer of `p` as a kernel argument.
    fn param(&self, p: &ParamBuffers, q: Param) -> ArrayArg<R> {
        array(&p.handles[q], p.n * q.width(self.channels))
    }

    fn fill_u32(&self, h: &Handle, len: usize, value: u32) {
        binning::fill_u32::launch::<R>(&self.client, grid(len), dim(), array(h, len), value, len as u32);
    }

    fn fill_f32(&self, h: &Handle, len: usize, value: f32) {
        binning::fill_f32::launch::<R>(&self.client, grid(len), dim(), array(h, len), value, len as u32);
    }

    /// Projects every Gaussian to `frame`: `(conic [N·5], rect [N·4])`.
    fn project(&self, p: &ParamBuffers, frame: &Frame) -> (Scratch, Scratch) {
        let n = p.n;
        let conic = self.f32_buffer(5 * n);
        let rect = self.scratch((4 * n).max(1) * 4);
        kernels::project::project::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            self.param(p, Param::Xy),
            self.param(p, Param::InvScale),
            self.param(p, Param::Theta),
            array(&conic, 5 * n),
            array(&rect, 4 * n),
            n as u32,
            frame.width as f32,
            frame.height as f32,
            frame.zoom_x as f32,
            frame.zoom_y as f32,
            frame.tiles_x() as u32,
            frame.tiles_y() as u32,
        );
        (conic, rect)
    }

    /// Bins the (Gaussian, tile) pairs of tile rows `[row0, row1)`.
    fn bin(&self, rect: &Handle, n: usize, tiles_x: usize, row0: usize, row1: usize) -> Result<Binning, DeviceError> {
        let tiles = (row1 - row0) * tiles_x;
        let counts = self.scratch(tiles.max(1) * 4);
        self.fill_u32(&counts, tiles, 0);
        binning::count_pairs::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            array(rect, 4 * n),
            array(&counts, tiles),
            n as u32,
            tiles_x as u32,
            row0 as u32,
            row1 as u32,
        );
        let offsets = self.scratch((tiles + 1) * 4);
        binning::exclusive_scan::launch::<R>(
            &self.client,
            CubeCount::Static(1, 1, 1),
            dim(),
            array(&counts, tiles),
            array(&offsets, tiles + 1),
            tiles as u32,
        );
        let read = self
            .client
            .read_one(offsets.handle.clone())
            .map_err(DeviceError::runtime)?;
        let pairs = u32::from_bytes(&read)[tiles] as usize;
        let ids = self.scratch(pairs.max(1) * 4);
        self.fill_u32(&counts, tiles, 0);
        binning::scatter_pairs::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            array(rect, 4 * n),
            array(&offsets, tiles + 1),
            array(&counts, tiles),
            array(&ids, pairs),
            n as u32,
            tiles_x as u32,
            row0 as u32,
            row1 as u32,
        );
        Ok(Binning {
            offsets,
            ids,
            tiles,
            pairs,
            row0,
        })
    }

    /// Renders rows `[ry0, ry1)` of `frame` into a new `[ry1 − ry0, W, C]` buffer.
    #[allow(clippy::too_many_arguments)]
    fn render_rows(
        &self,
        p: &ParamBuffers,
        conic: &Handle,
        bins: &Binning,
        frame: &Frame,
        ry0: usize,
        ry1: usize,
    ) -> Scratch {
        let (w, c) = (frame.width, self.channels);
        let len = (ry1 - ry0) * w * c;
        let out = self.f32_buffer(len);
        let tile = TILE as usize;
        let (t0, t1) = (ry0 / tile, ry1.div_ceil(tile));
        kernels::render::render_tiles::launch::<R>(
            &self.client,
            CubeCount::Static(frame.tiles_x() as u32, (t1 - t0) as u32, 1),
            dim(),
            array(&bins.offsets, bins.tiles + 1),
            array(&bins.ids, bins.pairs),
            array(conic, 5 * p.n),
            self.param(p, Param::Color),
            array(&out, len),
            w as u32,
            frame.tiles_x() as u32,
            bins.row0 as u32,
            t0 as u32,
            ry0 as u32,
            ry1 as u32,
            self.top_k,
            c,
        );
        out
    }

    /// Renders `frame` to the host, band by band (`[H, W, C]`, unclamped).
    pub fn render_host(&self, p: &ParamBuffers, frame: &Frame) -> Result<Vec<f32>, DeviceError> {
        let (w, h, c) = (frame.width, frame.height, self.channels);
        let mut out = vec![0.0f32; w * h * c];
        if p.n == 0 || out.is_empty() {
            return Ok(out);
        }
        // The fit's band height where it is lower (a planned band bounds every pass).
        let rows = band_rows(w, h, c, 0).min(self.band_rows);
        let (conic, rect) = self.project(p, frame);
        let tile = TILE as usize;
        for y0 in (0..h).step_by(rows) {
            let y1 = (y0 + rows).min(h);
            let bins = self.bin(&rect, p.n, frame.tiles_x(), y0 / tile, y1.div_ceil(tile))?;
            let band = self.render_rows(p, &conic, &bins, frame, y0, y1);
            let bytes = self
                .client
                .read_one(band.handle.clone())
                .map_err(DeviceError::runtime)?;
            out[y0 * w * c..y1 * w * c].copy_from_slice(f32::from_bytes(&bytes));
        }
        Ok(out)
    }

    /// Metrics of the clamped render against the target (forward only).
    pub fn metrics(&self, p: &ParamBuffers) -> Result<LossParts, DeviceError> {
        self.pass(p, None).map(|(parts, _)| parts)
    }

    /// The loss `L1 + ssim_weight·(1 − SSIM)` of the unclamped render, its
    /// parts, and the gradients with respect to the four parameter buffers.
    pub fn loss_and_grads(&self, p: &ParamBuffers, ssim_weight: f32) -> Result<(LossParts, ParamBuffers), DeviceError> {
        self.pass(p, Some(ssim_weight))
            .map(|(parts, grads)| (parts, grads.expect("gradients were asked for")))
    }

    /// One banded pass. `ssim_weight` given: loss and gradients of the raw
    /// render; `None`: metrics of the clamped render.
    fn pass(
        &self,
        p: &ParamBuffers,
        ssim_weight: Option<f32>,
    ) -> Result<(LossParts, Option<ParamBuffers>), DeviceError> {
        let (w, h, c, n) = (self.width, self.height, self.channels, p.n);
        let frame = Frame::new(w, h);
        let tile = TILE as usize;
        let values = (w * h * c) as f64;
        let (conic, rect) = self.project(p, &frame);
        let stride = GEOMETRY_GRADS as usize + c;
        let acc = self.f32_buffer(n * stride);
        self.fill_f32(&acc, n * stride, 0.0);
        let grads = ssim_weight.is_some();
        let mut sums = [0.0f64; 3];
        let image = Image {
            width: w,
            height: h,
            channels: c,
        };
        let weights = ssim_weight.map(|sw| Weights { l1: 1.0, ssim: sw });
        for band in Band::all(h, self.band_rows) {
            let (y0, y1) = (band.y0, band.y1);
            // Render rows reach 2R past the band: statistics R past it need them.
            let bins = self.bin(&rect, n, frame.tiles_x(), band.ry0 / tile, band.ry1.div_ceil(tile))?;
            let render = self.render_rows(p, &conic, &bins, &frame, band.ry0, band.ry1);
            let loss = ssim::band(
                &self.client,
                &self.window,
                ssim::Rows {
                    handle: &render,
                    first_row: band.ry0,
                    rows: band.ry1 - band.ry0,
                },
                &self.target,
                image,
                &band,
                weights,
                None,
                |len| self.f32_buffer(len),
            );
            let part = self
                .client
                .read_one(loss.partials.handle.clone())
                .map_err(DeviceError::runtime)?;
            ssim::add_partials(f32::from_bytes(&part), &mut sums);
            let Some(d_render) = loss.d_render else {
                continue;
            };
            let o_len = (y1 - y0) * w * c;
            kernels::render::render_backward_tiles::launch::<R>(
                &self.client,
                CubeCount::Static(frame.tiles_x() as u32, (y1.div_ceil(tile) - y0 / tile) as u32, 1),
                dim(),
                array(&bins.offsets, bins.tiles + 1),
                array(&bins.ids, bins.pairs),
                array(&conic, 5 * n),
                self.param(p, Param::Color),
                array(&d_render, o_len),
                array(&acc, n * stride),
                w as u32,
                frame.tiles_x() as u32,
                bins.row0 as u32,
                (y0 / tile) as u32,
                y0 as u32,
                y1 as u32,
                self.top_k,
                c,
            );
        }
        let parts = LossParts {
            ssim: sums[0] / values,
            l1: sums[1] / values,
            mse: sums[2] / values,
        };
        if !grads {
            return Ok((parts, None));
        }
        // The gradients leave the engine: not scratch.
        let out = ParamBuffers {
            handles: Params::from_fn(|q| self.client.empty((n * q.width(c)).max(1) * 4)),
            n,
        };
        kernels::project::project_backward::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            self.param(p, Param::InvScale),
            self.param(p, Param::Theta),
            array(&acc, n * stride),
            self.param(&out, Param::Xy),
            self.param(&out, Param::InvScale),
            self.param(&out, Param::Theta),
            self.param(&out, Param::Color),
            n as u32,
            w as f32,
            h as f32,
            1.0,
            1.0,
            c,
        );
        Ok((parts, Some(out)))
    }

    /// Uploads host parameters (tests and the kernel check use this).
    pub fn upload(&self, params: &Params<Vec<f32>>) -> ParamBuffers {
        ParamBuffers {
            handles: params.as_ref().map(|v| self.client.create_from_slice(f32::as_bytes(v))),
            n: params.count(),
        }
    }

    /// Reads a buffer of f32 back to the host.
    pub fn download(&self, h: &Handle) -> Result<Vec<f32>, DeviceError> {
        let bytes = self.client.read_one(h.clone()).map_err(DeviceError::runtime)?;
        Ok(f32::from_bytes(&bytes).to_vec())
    }
}
