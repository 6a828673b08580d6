//! The renderer on a CubeCL runtime: the scene's parameter groups live in
//! device buffers; a render projects every Gaussian, bins the tiles (the
//! kernels both workloads share, `vramfit_gauss::gpu::binning`), orders each tile by depth and composites; the
//! backward walks the same lists back to front into a per-Gaussian
//! accumulator and chains it to the parameters.
//!
//! What a render keeps for its backward, and its size (`N` Gaussians, `P`
//! pixels, `I` tile intersections, `T` tiles): the projected Gaussians
//! (11 floats and a 4-int tile rectangle each: 60 N bytes), the tiles'
//! offsets (4 (T + 1)), the sorted ids (4 I), and per pixel the final
//! transmittance and the entries walked (8 P); the image itself is 12 P.
//! The backward adds its accumulator (9 floats a Gaussian: 36 N) and the
//! parameters' gradients. Nothing is kept per (pixel, Gaussian) pair.

use cubecl::bytes::Bytes;
use cubecl::prelude::*;
use cubecl::server::{Handle, ServerError};
use std::sync::{Arc, Mutex};
use vramfit::pools::Recorder;
use vramfit_gauss::gpu::binning::{count_pairs, exclusive_scan, scatter_pairs};
use vramfit_gauss::gpu::{DeviceError, TILE, UNITS, array, dim, grid};

use super::kernels::{self, PROJECTED, SCREEN_GRADS, camera_array};
use crate::cpu::camera::Camera;
use crate::cpu::render::{Scene, SceneGrads};
use crate::sh_storage::{SH_GROUPS, ShStorage, group_bytes};

/// The scene's parameter groups on the device, in [`Scene`]'s order.
pub struct SceneBuffers {
    /// means, log_scales, rotations, opacity_logits, sh_dc, sh_rest.
    pub groups: [Handle; 6],
    /// Gaussians.
    pub n: usize,
    /// SH degree.
    pub degree: usize,
    /// How the two SH groups are stored (the others are f32).
    pub sh: ShStorage,
}

impl SceneBuffers {
    /// Floats a Gaussian holds in each group.
    pub fn widths(&self) -> [usize; 6] {
        crate::cpu::render::group_widths(self.degree)
    }

    /// 32-bit words of group `g`'s buffer for `count` Gaussians.
    pub fn words(&self, g: usize, count: usize) -> usize {
        let values = count * self.widths()[g];
        if SH_GROUPS.contains(&g) {
            self.sh.words(values)
        } else {
            values
        }
    }

    /// Device bytes of the parameters.
    pub fn bytes(&self) -> u64 {
        (0..6).map(|g| 4 * self.words(g, self.n) as u64).sum()
    }
}

/// One rendered view on the device and what its backward needs.
pub struct Drawn {
    camera: Handle,
    pub(crate) projected: Handle,
    pub(crate) rect: Handle,
    offsets: Handle,
    ids: Handle,
    /// The image, `[H, W, 3]`.
    pub image: Handle,
    final_t: Handle,
    walked: Handle,
    /// Tile intersections (entries of all the tiles' lists).
    pub intersections: usize,
    pub(crate) gaussians: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
    background: [f32; 3],
}

/// A read queued on the device ([`Renderer::read_later`]).
pub struct PendingRead<'a> {
    read: std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<Bytes>, ServerError>> + Send + 'a>>,
    lens: Vec<usize>,
}

impl PendingRead<'_> {
    /// Waits for the read and appends each buffer's floats to the matching
    /// output.
    pub fn append_to(self, outs: &mut [Vec<f32>]) -> Result<(), DeviceError> {
        assert_eq!(self.lens.len(), outs.len(), "one output a buffer");
        let bytes = cubecl::future::block_on(self.read).map_err(DeviceError::runtime)?;
        assert_eq!(bytes.len(), self.lens.len(), "one read a buffer");
        for ((b, len), out) in bytes.iter().zip(&self.lens).zip(outs) {
            let floats = f32::from_bytes(b);
            assert!(
                floats.len() >= *len,
                "a buffer of {} floats read for {len}",
                floats.len()
            );
            out.extend_from_slice(&floats[..*len]);
        }
        Ok(())
    }
}

/// Gaussians a backward chunk starts at a multiple of: buffers are bound
/// at byte offsets, which devices want aligned to 256 bytes (64 floats, or
/// 128 16-bit coefficients).
pub const CHUNK_ALIGN: usize = 128;

/// Renders scenes and their backward on one device.
pub struct Renderer<R: Runtime> {
    pub(crate) client: ComputeClient<R>,
    /// Where the renderer's allocations are recorded, when they are
    /// ([`vramfit::pools`]): every device buffer the scene makes is made
    /// here, so the recording is the whole of its use of the allocator.
    recorder: Option<Arc<Mutex<Recorder>>>,
}

impl Drawn {
    /// Device bytes of the render's buffers for `n` Gaussians: projected
    /// Gaussians and rectangles, tile offsets and counters, the sorted ids,
    /// the image and what each pixel keeps.
    pub fn bytes(&self, n: usize) -> u64 {
        let pixels = self.width * self.height;
        let tiles = self.width.div_ceil(TILE as usize) * self.height.div_ceil(TILE as usize);
        4 * ((PROJECTED as usize + 4) * n + 3 * tiles + 1 + self.intersections + 5 * pixels + kernels::CAMERA) as u64
    }
}

impl<R: Runtime> Renderer<R> {
    /// A renderer on `device`.
    pub fn new(device: &R::Device) -> Self {
        Self {
            client: R::client(device),
            recorder: None,
        }
    }

    /// Records every allocation and release into `recorder` from now on.
    pub fn record_into(&mut self, recorder: Arc<Mutex<Recorder>>) {
        self.recorder = Some(recorder);
    }

    fn recorded(&self, bytes: usize, make: impl FnOnce() -> Handle) -> Handle {
        match &self.recorder {
            Some(r) => r.lock().expect("the recorder is not poisoned").made(bytes as u64, make),
            None => make(),
        }
    }

    /// A buffer holding `bytes`.
    fn create_from_slice(&self, bytes: &[u8]) -> Handle {
        self.recorded(bytes.len(), || self.client.create_from_slice(bytes))
    }

    /// Runs `allocate` with the device's allocations made at their exact
    /// size in CubeCL's persistent pool, outside the paged pools: for
    /// buffers that live long (a scene's state). A later allocation of the
    /// same size also lands there.
    pub(crate) fn persistent(&self, allocate: impl FnOnce() + Send) {
        let mode = |on| {
            if let Some(r) = &self.recorder {
                r.lock().expect("the recorder is not poisoned").set_persistent(on);
            }
        };
        mode(true);
        self.client
            .memory_persistent_allocation((), |()| allocate())
            .expect("the device's allocation mode is set by a message to its server");
        mode(false);
    }

    /// Waits for the queued work.
    pub(crate) fn sync(&self) -> Result<(), DeviceError> {
        cubecl::future::block_on(self.client.sync()).map_err(DeviceError::runtime)
    }

    /// Returns every unused allocation (pages and exact-size ones) to the
    /// device.
    pub(crate) fn release_unused(&self) {
        if let Some(r) = &self.recorder {
            r.lock().expect("the recorder is not poisoned").cleanup();
        }
        self.client.memory_cleanup();
    }

    pub(crate) fn empty(&self, elems: usize) -> Handle {
        let bytes = elems.max(1) * 4;
        self.recorded(bytes, || self.client.empty(bytes))
    }

    pub(crate) fn zeros_f32(&self, elems: usize) -> Handle {
        let h = self.empty(elems);
        vramfit_gauss::gpu::binning::fill_f32::launch::<R>(
            &self.client,
            grid(elems),
            dim(),
            array(&h, elems),
            0.0,
            elems as u32,
        );
        h
    }

    fn zeros_u32(&self, elems: usize) -> Handle {
        let h = self.empty(elems);
        vramfit_gauss::gpu::binning::fill_u32::launch::<R>(
            &self.client,
            grid(elems),
            dim(),
            array(&h, elems),
            0,
            elems as u32,
        );
        h
    }

    /// The largest buffer the device's allocator can hand out (on wgpu the
    /// storage-binding limit, 128 MiB by default; far more on CUDA).
    pub fn largest_buffer(&self) -> u64 {
        self.client.properties().memory.max_page_size
    }

    /// An error naming `what` when one buffer of `bytes` is more than the
    /// device can allocate (the allocator would abort the process).
    pub fn check_buffer(&self, what: &str, bytes: u64) -> Result<(), DeviceError> {
        let limit = self.largest_buffer();
        if bytes > limit {
            return Err(DeviceError::BufferTooLarge {
                what: what.into(),
                bytes,
                largest: limit,
            });
        }
        Ok(())
    }

    /// Checks that every per-Gaussian and per-pixel buffer of a scene of
    /// `n` Gaussians of `widths` floats a group (the SH groups stored as
    /// `sh` says), rendered at `pixels`, fits one device buffer.
    pub fn check_scene(&self, n: usize, widths: [usize; 6], sh: ShStorage, pixels: usize) -> Result<(), DeviceError> {
        let widest = widest_bytes(widths, sh);
        self.check_buffer(&format!("a scene of {n} Gaussians"), (n * widest) as u64)?;
        self.check_buffer(&format!("an image of {pixels} pixels"), 12 * pixels as u64)
    }

    /// Uploads a host scene in f32.
    pub fn upload(&self, scene: &Scene<f32>) -> SceneBuffers {
        self.upload_as(scene, ShStorage::F32)
    }

    /// Uploads a host scene with its SH groups stored as `sh` says.
    pub fn upload_as(&self, scene: &Scene<f32>, sh: ShStorage) -> SceneBuffers {
        let up = |v: &[f32]| self.upload_f32(v);
        let sh_up = |v: &[f32]| self.upload_words(&sh.encode(v));
        SceneBuffers {
            groups: [
                up(scene.means),
                up(scene.log_scales),
                up(scene.rotations),
                up(scene.opacity_logits),
                sh_up(scene.sh_dc),
                sh_up(scene.sh_rest),
            ],
            n: scene.len(),
            degree: scene.degree,
            sh,
        }
    }

    fn group(&self, s: &SceneBuffers, g: usize) -> ArrayArg<R> {
        array(&s.groups[g], s.words(g, s.n))
    }

    /// Renders `s` through `camera` over `background`.
    pub fn render(&self, s: &SceneBuffers, camera: &Camera, background: [f32; 3]) -> Result<Drawn, DeviceError> {
        let n = s.n;
        self.check_scene(n, s.widths(), s.sh, camera.width * camera.height)?;
        let (tiles_x, tiles_y) = camera.tiles();
        let tiles = tiles_x * tiles_y;
        let pixels = camera.width * camera.height;
        let cam = self.create_from_slice(f32::as_bytes(&camera_array(camera)));
        let projected = self.empty(PROJECTED as usize * n);
        let rect = self.empty(4 * n);
        kernels::project::project::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            self.group(s, 0),
            self.group(s, 1),
            self.group(s, 2),
            self.group(s, 3),
            self.group(s, 4),
            self.group(s, 5),
            array(&cam, kernels::CAMERA),
            array(&projected, PROJECTED as usize * n),
            array(&rect, 4 * n),
            n as u32,
            tiles_x as u32,
            tiles_y as u32,
            s.degree as u32,
            s.sh.code(),
        );
        // Binning: count, scan, scatter (the shared kernels, all tile rows).
        let counts = self.zeros_u32(tiles);
        count_pairs::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            array(&rect, 4 * n),
            array(&counts, tiles),
            n as u32,
            tiles_x as u32,
            0,
            tiles_y as u32,
        );
        let offsets = self.empty(tiles + 1);
        exclusive_scan::launch::<R>(
            &self.client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(UNITS),
            array(&counts, tiles),
            array(&offsets, tiles + 1),
            tiles as u32,
        );
        let read = self.client.read_one(offsets.clone()).map_err(DeviceError::runtime)?;
        let intersections = u32::from_bytes(&read)[tiles] as usize;
        self.check_buffer(&format!("{intersections} tile intersections"), 4 * intersections as u64)?;
        let ids = self.empty(intersections);
        let fill = self.zeros_u32(tiles);
        scatter_pairs::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            array(&rect, 4 * n),
            array(&offsets, tiles + 1),
            array(&fill, tiles),
            array(&ids, intersections),
            n as u32,
            tiles_x as u32,
            0,
            tiles_y as u32,
        );
        let per_tile = CubeCount::Static(tiles_x as u32, tiles_y as u32, 1);
        kernels::raster::sort_tiles::launch::<R>(
            &self.client,
            per_tile.clone(),
            CubeDim::new_1d(UNITS),
            array(&offsets, tiles + 1),
            array(&ids, intersections),
            array(&projected, PROJECTED as usize * n),
            tiles_x as u32,
        );
        let image = self.empty(3 * pixels);
        let final_t = self.empty(pixels);
        let walked = self.empty(pixels);
        kernels::raster::composite::launch::<R>(
            &self.client,
            per_tile,
            CubeDim::new_1d(UNITS),
            array(&offsets, tiles + 1),
            array(&ids, intersections),
            array(&projected, PROJECTED as usize * n),
            array(&image, 3 * pixels),
            array(&final_t, pixels),
            array(&walked, pixels),
            background[0],
            background[1],
            background[2],
            camera.width as u32,
            camera.height as u32,
            tiles_x as u32,
        );
        Ok(Drawn {
            camera: cam,
            projected,
            rect,
            offsets,
            ids,
            image,
            final_t,
            walked,
            intersections,
            gaussians: n,
            width: camera.width,
            height: camera.height,
            background,
        })
    }

    /// The backward of `drawn` (a render of `s`) for `d_image` (`[H, W, 3]`
    /// on the device): the gradients of the six groups, in [`Scene`]'s
    /// order, and of the screen means (2 a Gaussian).
    pub fn backward(&self, s: &SceneBuffers, drawn: &Drawn, d_image: &Handle) -> ([Handle; 6], Handle) {
        let acc = self.backward_screen(drawn, d_image);
        let screen = self.empty(2 * s.n);
        let grads = self.backward_params(s, drawn, &acc, &screen, 0, s.n);
        (grads, screen)
    }

    /// The first half of the backward: each Gaussian's gradient with
    /// respect to its screen-space quantities ([`SCREEN_GRADS`] floats a
    /// Gaussian), accumulated over the pixels it covers.
    pub fn backward_screen(&self, drawn: &Drawn, d_image: &Handle) -> Handle {
        let n = drawn.gaussians;
        let pixels = drawn.width * drawn.height;
        let tiles_x = drawn.width.div_ceil(TILE as usize);
        let tiles_y = drawn.height.div_ceil(TILE as usize);
        let tiles = tiles_x * tiles_y;
        let acc = self.zeros_f32(SCREEN_GRADS as usize * n);
        kernels::raster::composite_backward::launch::<R>(
            &self.client,
            CubeCount::Static(tiles_x as u32, tiles_y as u32, 1),
            CubeDim::new_1d(UNITS),
            array(&drawn.offsets, tiles + 1),
            array(&drawn.ids, drawn.intersections),
            array(&drawn.projected, PROJECTED as usize * n),
            array(&drawn.final_t, pixels),
            array(&drawn.walked, pixels),
            array(d_image, 3 * pixels),
            array(&acc, SCREEN_GRADS as usize * n),
            drawn.background[0],
            drawn.background[1],
            drawn.background[2],
            drawn.width as u32,
            drawn.height as u32,
            tiles_x as u32,
        );
        acc
    }

    /// The second half for Gaussians `first .. first + count`: the six
    /// groups' gradients of those Gaussians only (new buffers of `count`
    /// Gaussians, so a fit can take them chunk by chunk), and their screen
    /// means' gradients written into `screen` (2 floats a Gaussian, all
    /// `n`). Each Gaussian's gradient reads only its own parameters and
    /// accumulator, so chunks are independent. `first` must be a multiple
    /// of [`CHUNK_ALIGN`] (buffers are bound at byte offsets).
    pub fn backward_params(
        &self,
        s: &SceneBuffers,
        drawn: &Drawn,
        acc: &Handle,
        screen: &Handle,
        first: usize,
        count: usize,
    ) -> [Handle; 6] {
        assert!(
            first.is_multiple_of(CHUNK_ALIGN) && first + count <= s.n,
            "backward chunk {first}+{count} of {}",
            s.n
        );
        let widths = s.widths();
        let grads: [Handle; 6] = std::array::from_fn(|g| self.empty(count * widths[g]));
        let at = |h: &Handle, width: usize| {
            let h = h.clone().offset_start((4 * first * width) as u64);
            array::<R>(&h, count * width)
        };
        let group = |g: usize| {
            let h = s.groups[g].clone().offset_start(4 * s.words(g, first) as u64);
            array::<R>(&h, s.words(g, count))
        };
        let out = |g: usize| array::<R>(&grads[g], count * widths[g]);
        kernels::project::project_backward::launch::<R>(
            &self.client,
            grid(count),
            dim(),
            group(0),
            group(1),
            group(2),
            group(3),
            group(4),
            group(5),
            array(&drawn.camera, kernels::CAMERA),
            at(&drawn.rect, 4),
            at(acc, SCREEN_GRADS as usize),
            out(0),
            out(1),
            out(2),
            out(3),
            out(4),
            out(5),
            at(screen, 2),
            count as u32,
            s.degree as u32,
            s.sh.code(),
        );
        grads
    }

    /// Writes host 32-bit words (f32 bits or packed halves, as bytes) into
    /// `dst` from word `first` on, through a staging buffer of their size
    /// (the destination is not reallocated). `first` must be a multiple of
    /// 64 (bindings start at 256-byte boundaries).
    pub fn write_at(&self, dst: &Handle, first: usize, bytes: &[u8]) {
        assert!(
            first.is_multiple_of(64) && bytes.len().is_multiple_of(4),
            "write {} bytes at word {first}",
            bytes.len()
        );
        let words = bytes.len() / 4;
        if words == 0 {
            return;
        }
        self.copy_staged_at(dst, first, self.create_from_slice(bytes), words);
    }

    /// [`Self::write_at`] for words the caller hands over: cubecl 0.10
    /// copies a slice twice on the host before the transfer
    /// (`create_from_slice`) and owned bytes once (`create`).
    pub fn write_words_at(&self, dst: &Handle, first: usize, words: Vec<u32>) {
        assert!(first.is_multiple_of(64), "write {} words at word {first}", words.len());
        let count = words.len();
        if count == 0 {
            return;
        }
        let staged = self.recorded(4 * count, || self.client.create(Bytes::from_elems(words)));
        self.copy_staged_at(dst, first, staged, count);
    }

    fn copy_staged_at(&self, dst: &Handle, first: usize, staged: Handle, words: usize) {
        let dst = dst.clone().offset_start(4 * first as u64);
        kernels::train::copy::launch::<R>(
            &self.client,
            grid(words),
            dim(),
            array(&dst, words),
            array(&staged, words),
            words as u32,
        );
    }

    /// Uploads host floats.
    pub fn upload_f32(&self, v: &[f32]) -> Handle {
        if v.is_empty() {
            self.empty(1)
        } else {
            self.create_from_slice(f32::as_bytes(v))
        }
    }

    /// Uploads host bytes.
    pub(crate) fn upload_bytes(&self, v: &[u8]) -> Handle {
        if v.is_empty() {
            self.empty(1)
        } else {
            self.create_from_slice(v)
        }
    }

    /// Uploads host 32-bit words.
    pub fn upload_words(&self, v: &[u32]) -> Handle {
        if v.is_empty() {
            self.empty(1)
        } else {
            self.create_from_slice(u32::as_bytes(v))
        }
    }

    /// The device's reading of a group stored as `sh` says: `n` values
    /// widened to f32 by the kernels' decoder.
    pub fn widen(&self, group: &Handle, n: usize, sh: ShStorage) -> Result<Vec<f32>, DeviceError> {
        let out = self.empty(n);
        kernels::sh::widen::launch::<R>(
            &self.client,
            grid(n),
            dim(),
            array(group, sh.words(n)),
            array(&out, n),
            n as u32,
            sh.code(),
        );
        self.download(&out, n)
    }

    /// Reads the buffers `parts` (each with the floats to keep) in one
    /// transfer, one wait for them all, and appends each to its `outs`:
    /// one host copy from the transfer's buffer, where [`Self::download`]
    /// then `extend` made two.
    pub fn append_downloads(&self, parts: &[(Handle, usize)], outs: &mut [Vec<f32>]) -> Result<(), DeviceError> {
        self.read_later(parts).append_to(outs)
    }

    /// Starts reading each buffer's first `len` floats: the copies are
    /// queued now, behind the device's queued work; [`PendingRead::append_to`]
    /// waits for them. Until then the buffers stay held (the read keeps
    /// them), so the allocator does not hand them out again.
    pub fn read_later(&self, parts: &[(Handle, usize)]) -> PendingRead<'_> {
        PendingRead {
            read: Box::pin(self.client.read_async(parts.iter().map(|(h, _)| h.clone()).collect())),
            lens: parts.iter().map(|(_, len)| *len).collect(),
        }
    }

    /// Reads `len` floats of a buffer back to the host.
    pub fn download(&self, h: &Handle, len: usize) -> Result<Vec<f32>, DeviceError> {
        let bytes = self.client.read_one(h.clone()).map_err(DeviceError::runtime)?;
        let mut v = f32::from_bytes(&bytes).to_vec();
        v.truncate(len);
        Ok(v)
    }

    /// Renders a host scene, runs the backward for the host `d_image`, and
    /// reads the image and every gradient back.
    pub fn render_and_backward_host(
        &self,
        scene: &Scene<f32>,
        camera: &Camera,
        background: [f32; 3],
        d_image: &[f32],
    ) -> Result<(Vec<f32>, SceneGrads<f32>), DeviceError> {
        self.render_and_backward_as(scene, ShStorage::F32, camera, background, d_image)
    }

    /// The same with the SH groups stored as `sh` says on the device.
    pub fn render_and_backward_as(
        &self,
        scene: &Scene<f32>,
        sh: ShStorage,
        camera: &Camera,
        background: [f32; 3],
        d_image: &[f32],
    ) -> Result<(Vec<f32>, SceneGrads<f32>), DeviceError> {
        self.check_scene(scene.len(), scene.widths(), sh, camera.width * camera.height)?;
        let s = self.upload_as(scene, sh);
        let drawn = self.render(&s, camera, background)?;
        let d = self.upload_f32(d_image);
        let (g, screen) = self.backward(&s, &drawn, &d);
        let widths = s.widths();
        let get = |i: usize| self.download(&g[i], s.n * widths[i]);
        Ok((
            self.download(&drawn.image, 3 * camera.width * camera.height)?,
            SceneGrads {
                means: get(0)?,
                log_scales: get(1)?,
                rotations: get(2)?,
                opacity_logits: get(3)?,
                sh_dc: get(4)?,
                sh_rest: get(5)?,
                screen_means: self.download(&screen, 2 * s.n)?,
            },
        ))
    }
}

/// Bytes a Gaussian takes in the widest of its buffers: a parameter group
/// (the SH groups at `sh`'s size) or the render's and backward's per-
/// Gaussian floats.
pub fn widest_bytes(widths: [usize; 6], sh: ShStorage) -> usize {
    let groups = group_bytes(widths, sh).into_iter().max().unwrap_or(0);
    groups.max(4 * SCREEN_GRADS.max(PROJECTED) as usize)
}
