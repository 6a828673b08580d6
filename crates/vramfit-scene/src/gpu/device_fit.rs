//! A scene fit's state on a CubeCL device ([`crate::fit::SceneDevice`]):
//! the parameter groups, their gradients and Adam's moments live in device
//! buffers; each step renders, differentiates and updates there. The loss
//! (L1 + SSIM) runs there too ([`super::loss`]): a step sends its view's
//! image up (a byte a value for an 8-bit image) and the render never comes
//! down.
//!
//! With [`Moments::Host`] Adam's moments stay in host memory: the backward
//! runs chunk by chunk ([`CHUNK`] Gaussians), each chunk's gradients come
//! down (read while the next chunk is made), and Adam runs on the host
//! ([`vramfit::optim::HostAdam`], the same arithmetic as the device
//! kernel), which writes the parameters back in parts. The device then
//! holds the parameters, two chunks' gradients, the render and
//! densification's statistics: 484 of a degree-3 Gaussian's 968 bytes of
//! state (parameters, gradients, moments) leave it, and so do all but two
//! chunks of the gradients.
//!
//! With the SH groups stored in 16 bits ([`ShStorage`], moments on the
//! host) the device holds each SH coefficient as the rounded copy of the
//! host's f32 master, rewritten after each update: 96 more of a degree-3
//! Gaussian's bytes leave it.

use cubecl::prelude::*;
use cubecl::server::Handle;
use vramfit::optim::Moments;
use vramfit::profile::MemorySource;
use vramfit_gauss::gpu::{dim, grid};

use vramfit_gauss::gpu::array;

use super::engine::{Renderer, SceneBuffers};
use super::kernels::{PROJECTED, train};
pub use crate::allocation::StateAllocation;
use crate::cpu::camera::Camera;
use crate::fit::{ADAM, SceneDevice, State, mask_inactive_bands};
use crate::sh_storage::{SH_GROUPS, ShStorage};
use vramfit_gauss::DeviceError;

/// Gaussians per chunk of the backward when the moments are on the host
/// (a multiple of [`super::engine::CHUNK_ALIGN`]): 15 MiB of gradients at
/// SH degree 3.
pub const CHUNK: usize = 1 << 16;

/// How many chunks a step's backward makes its gradients in for `n`
/// Gaussians: one with the moments on the device, one per [`CHUNK`] with
/// them on the host. Steps whose chunk counts differ are not the same
/// steps (a recorded trace grows only between counts of one chunk count).
pub fn backward_chunks(n: usize, moments: Moments) -> usize {
    match moments {
        Moments::Device => 1,
        Moments::Host => n.div_ceil(CHUNK).max(1),
    }
}

/// The moments and the parameters' mirror when Adam runs on the host.
struct HostSide {
    /// The parameters, as on the device (only Adam changes them).
    params: Vec<Vec<f32>>,
    moments: Vec<(Vec<f32>, Vec<f32>)>,
    /// The last backward's gradients.
    grads: Option<Vec<Vec<f32>>>,
}

/// The fit's state on one device.
pub struct DeviceFit<R: Runtime> {
    renderer: Renderer<R>,
    label: &'static str,
    scene: Option<SceneBuffers>,
    /// Adam's moments on the device (empty when they are on the host).
    moments: Vec<[Handle; 2]>,
    host: Option<HostSide>,
    /// How the device stores the SH groups.
    sh: ShStorage,
    stats: Vec<Handle>,
    grads: Option<[Handle; 6]>,
    workspace: u64,
    /// Bytes copied between host and device by the last step.
    moved: u64,
    /// The last step's time in those copies and in the host's Adam
    /// ([`SceneDevice::host_times`]).
    times: [std::time::Duration; 2],
    state: StateAllocation,
    /// Gaussians a backward chunk (and an upload chunk) holds with the
    /// moments on the host: [`CHUNK`], or a probe's smaller one.
    chunk: usize,
}

impl<R: Runtime> DeviceFit<R> {
    /// An empty state on `device`, named `label` in reports, with Adam's
    /// moments on the device; a fit's [`crate::fit::Fit::on_device`]
    /// loads it.
    pub fn new(device: &R::Device, label: &'static str) -> Self {
        Self::with_moments(device, label, Moments::Device)
    }

    /// The same with Adam's moments where `moments` says.
    pub fn with_moments(device: &R::Device, label: &'static str, moments: Moments) -> Self {
        Self::with_storage(device, label, moments, ShStorage::F32)
    }

    /// The same with the SH groups stored as `sh` says (16 bits need the
    /// moments on the host, where the f32 masters are: [`SceneDevice::load`]
    /// refuses otherwise).
    pub fn with_storage(device: &R::Device, label: &'static str, moments: Moments, sh: ShStorage) -> Self {
        Self {
            sh,
            renderer: Renderer::new(device),
            label,
            scene: None,
            moments: Vec::new(),
            host: (moments == Moments::Host).then(|| HostSide {
                params: Vec::new(),
                moments: Vec::new(),
                grads: None,
            }),
            stats: Vec::new(),
            grads: None,
            workspace: 0,
            moved: 0,
            times: Default::default(),
            state: StateAllocation::default(),
            chunk: CHUNK,
        }
    }

    /// The same with the long-lived state allocated as `state` says.
    pub fn with_state_allocation(mut self, state: StateAllocation) -> Self {
        self.state = state;
        self
    }

    /// The same with the moments' chunks `chunk` Gaussians long instead of
    /// [`CHUNK`] (a multiple of [`super::engine::CHUNK_ALIGN`]): a probe of
    /// a smaller scene with a larger one's chunk count, so that its trace
    /// is the larger step's sequence at a smaller size
    /// ([`vramfit::pools::TraceLaw`]).
    pub fn with_backward_chunk(mut self, chunk: usize) -> Self {
        assert!(
            chunk > 0 && chunk.is_multiple_of(super::engine::CHUNK_ALIGN),
            "a chunk of {chunk} Gaussians is not a positive multiple of {}",
            super::engine::CHUNK_ALIGN
        );
        self.chunk = chunk;
        self
    }

    /// The same with every allocation and release recorded into
    /// `recorder` ([`vramfit::pools`]).
    pub fn recorded_into(mut self, recorder: std::sync::Arc<std::sync::Mutex<vramfit::pools::Recorder>>) -> Self {
        self.renderer.record_into(recorder);
        self
    }

    /// Bytes copied between host and device by the last step (the view's
    /// image up and the loss's partial sums down; with the moments on the
    /// host also every gradient down and every parameter up).
    pub fn moved_bytes(&self) -> u64 {
        self.moved
    }

    fn loaded(&self) -> Result<&SceneBuffers, DeviceError> {
        self.scene
            .as_ref()
            .ok_or(DeviceError::OutOfOrder("the scene is not on the device"))
    }
}

impl<R: Runtime> SceneDevice for DeviceFit<R> {
    fn name(&self) -> String {
        let mut at = String::new();
        if self.host.is_some() {
            at.push_str(", Adam's moments on the host");
        }
        if self.sh != ShStorage::F32 {
            at.push_str(&format!(", SH stored in {}", self.sh));
        }
        format!("{} (the scene renderer's CubeCL kernels{at})", self.label)
    }

    fn load(&mut self, state: &State) -> Result<(), DeviceError> {
        let r = &self.renderer;
        if self.sh != ShStorage::F32 && self.host.is_none() {
            return Err(DeviceError::Unsupported(format!(
                "SH stored in {} needs Adam's moments on the host (moments = \"host\"), where the f32 masters the \
                 updates land in are kept: an update rounded into 16 bits on the device would be lost",
                self.sh
            )));
        }
        r.check_scene(state.params.len(), state.params.widths(), self.sh, 0)?;
        // The old state goes first: the device never holds two (allocated
        // at exact sizes, its allocations are returned to the device, since
        // no later state has their sizes).
        self.scene = None;
        self.moments.clear();
        self.stats.clear();
        self.grads = None;
        let sh = self.sh;
        let (scene, host, moments, stats) = (&mut self.scene, &mut self.host, &mut self.moments, &mut self.stats);
        let mut allocate = || {
            *scene = Some(r.upload_as(&state.params.scene(), sh));
            if let Some(host) = host {
                host.params = state.params.groups().iter().map(|g| g.to_vec()).collect();
                host.moments = state.moments.clone();
                host.grads = None;
            } else {
                *moments = state
                    .moments
                    .iter()
                    .map(|(m, v)| [r.upload_f32(m), r.upload_f32(v)])
                    .collect();
            }
            let s = &state.stats;
            *stats = [&s.grad, &s.seen, &s.max_radius]
                .iter()
                .map(|v| r.upload_f32(v))
                .collect();
        };
        match self.state {
            // On CUDA a pool page is a fixed fraction of the card (an H200's
            // 1.03 GiB SH group took an 8.8 GiB page), so in the pools the
            // reserved figure would follow the page sizes, not the scene.
            StateAllocation::Exact => {
                r.release_unused();
                r.persistent(allocate);
            }
            StateAllocation::Pooled => allocate(),
        }
        Ok(())
    }

    fn store(&self, state: &mut State) -> Result<(), DeviceError> {
        let s = self.loaded()?;
        let widths = s.widths();
        let r = &self.renderer;
        if let Some(host) = &self.host {
            for (group, values) in state.params.groups_mut().into_iter().zip(&host.params) {
                group.clone_from(values);
            }
            state.moments.clone_from(&host.moments);
        } else {
            for (g, (group, h)) in state.params.groups_mut().into_iter().zip(&s.groups).enumerate() {
                *group = r.download(h, s.n * widths[g])?;
            }
            for (g, ((m, v), [hm, hv])) in state.moments.iter_mut().zip(&self.moments).enumerate() {
                *m = r.download(hm, s.n * widths[g])?;
                *v = r.download(hv, s.n * widths[g])?;
            }
        }
        let st = &mut state.stats;
        for (values, h) in [&mut st.grad, &mut st.seen, &mut st.max_radius]
            .into_iter()
            .zip(&self.stats)
        {
            *values = r.download(h, s.n)?;
        }
        Ok(())
    }

    fn render(&self, camera: &Camera, background: [f32; 3]) -> Result<Vec<f32>, DeviceError> {
        let drawn = self.renderer.render(self.loaded()?, camera, background)?;
        self.renderer.download(&drawn.image, 3 * camera.width * camera.height)
    }

    fn forward_backward(
        &mut self,
        camera: &Camera,
        background: [f32; 3],
        target: &[f32],
        stats: bool,
    ) -> Result<f32, DeviceError> {
        let s = self
            .scene
            .as_ref()
            .ok_or(DeviceError::OutOfOrder("the scene is not on the device"))?;
        let r = &self.renderer;
        let n = s.n;
        let chunk = self.chunk;
        let drawn = r.render(s, camera, background)?;
        let loss = r.loss(&drawn, target)?;
        let d_image = loss.d_image;
        let mut moved = loss.moved;
        let loss = loss.loss;
        let mut chunk_bytes = 0;
        let (grads, screen) = match &mut self.host {
            None => {
                let (grads, screen) = r.backward(s, &drawn, &d_image);
                (Some(grads), screen)
            }
            Some(host) => {
                // Chunk by chunk, each chunk's gradients coming down.
                let widths = s.widths();
                let acc = r.backward_screen(&drawn, &d_image);
                let screen = r.empty(2 * n);
                let mut down: Vec<Vec<f32>> = widths.iter().map(|w| Vec::with_capacity(n * w)).collect();
                // Pipelined: a chunk's read is queued behind its kernels and
                // the next chunk's kernels behind the read, before the host
                // waits for it, so the device does not idle while the host
                // waits and appends. Two chunks' gradients are on the device
                // at once (the one being read, the one being made). What is
                // timed is the host's wait for the reads and its appending,
                // the part of the backward the copies add to the kernels'.
                let mut copying = std::time::Duration::ZERO;
                let mut pending = None;
                for first in (0..n).step_by(chunk) {
                    let count = chunk.min(n - first);
                    let part = r.backward_params(s, &drawn, &acc, &screen, first, count);
                    let parts: Vec<_> = part.into_iter().zip(widths).map(|(h, w)| (h, count * w)).collect();
                    let read = r.read_later(&parts);
                    drop(parts);
                    if let Some(previous) = pending.replace(read) {
                        let t = std::time::Instant::now();
                        previous.append_to(&mut down)?;
                        copying += t.elapsed();
                    }
                }
                if let Some(last) = pending {
                    let t = std::time::Instant::now();
                    last.append_to(&mut down)?;
                    copying += t.elapsed();
                }
                self.times = [copying, std::time::Duration::ZERO];
                let values: usize = widths.iter().map(|w| w * n).sum();
                moved += 4 * values as u64;
                let chunks_held = if n > chunk { 2 } else { 1 };
                chunk_bytes = chunks_held * 4 * chunk.min(n) as u64 * widths.iter().sum::<usize>() as u64;
                host.grads = Some(down);
                (None, screen)
            }
        };
        if stats {
            train::accumulate_stats::launch::<R>(
                &r.client,
                grid(n),
                dim(),
                array(&drawn.rect, 4 * n),
                array(&drawn.projected, PROJECTED as usize * n),
                array(&screen, 2 * n),
                array(&self.stats[0], n),
                array(&self.stats[1], n),
                array(&self.stats[2], n),
                n as u32,
                camera.width as f32 / 2.0,
                camera.height as f32 / 2.0,
            );
        }
        // The render's buffers, the loss's (the target, the image gradient,
        // one band's SSIM planes, every band's partial sums), the backward's accumulator (9 floats a
        // Gaussian), the screen gradients, and with the moments on the host
        // two chunks' gradients (one being read, one being made).
        let step_bytes =
            drawn.bytes(n) + super::loss::scratch_bytes(camera.width, camera.height) + 44 * n as u64 + chunk_bytes;
        self.workspace = self.workspace.max(step_bytes);
        self.grads = grads;
        self.moved = moved;
        Ok(loss)
    }

    fn optimize(&mut self, rates: [f32; 6], c1: f32, c2: f32, active_rest: usize) -> Result<(), DeviceError> {
        let s = self
            .scene
            .as_ref()
            .ok_or(DeviceError::OutOfOrder("the scene is not on the device"))?;
        let widths = s.widths();
        if let Some(host) = &mut self.host {
            let mut grads = host
                .grads
                .take()
                .ok_or(DeviceError::OutOfOrder("optimize before forward_backward"))?;
            mask_inactive_bands(&mut grads[5], active_rest, widths[5]);
            // The whole update timed once (the uploads queue while the next
            // group's Adam runs); the host's Adam is the part of it timed
            // on its own, the copies the rest.
            self.renderer.sync()?;
            let whole = std::time::Instant::now();
            let mut adam = std::time::Duration::ZERO;
            for g in 0..6 {
                let (m, v) = &mut host.moments[g];
                let t = std::time::Instant::now();
                ADAM.step(&mut host.params[g], &grads[g], m, v, rates[g], c1, c2);
                adam += t.elapsed();
                // Back in parts (the device never holds a second copy of a
                // group), the SH groups rounded to their storage.
                let storage = if SH_GROUPS.contains(&g) {
                    self.sh
                } else {
                    ShStorage::F32
                };
                // Transfers as large as the widest group's chunk (the
                // staging buffer is never larger than that): the narrow
                // groups go up in a fifteenth of the calls at degree 3.
                let span = self.chunk * widths.iter().copied().max().unwrap_or(1).max(1);
                for (k, part) in host.params[g].chunks(span.max(1)).enumerate() {
                    // f32 goes up as it is; 16-bit storage packed first
                    // (and handed over, which saves cubecl a host copy).
                    let at = storage.words(k * span);
                    if storage == ShStorage::F32 {
                        self.renderer.write_at(&s.groups[g], at, f32::as_bytes(part));
                    } else {
                        self.renderer.write_words_at(&s.groups[g], at, storage.encode(part));
                    }
                }
            }
            self.renderer.sync()?;
            self.times[0] += whole.elapsed().saturating_sub(adam);
            self.times[1] = adam;
            self.moved += s.bytes();
            return Ok(());
        }
        let grads = self
            .grads
            .take()
            .ok_or(DeviceError::OutOfOrder("optimize before forward_backward"))?;
        for g in 0..6 {
            let len = s.n * widths[g];
            let per = if g == 5 { widths[5] } else { 0 };
            train::adam::launch::<R>(
                &self.renderer.client,
                grid(len),
                dim(),
                array(&s.groups[g], len),
                array(&grads[g], len),
                array(&self.moments[g][0], len),
                array(&self.moments[g][1], len),
                rates[g],
                c1,
                c2,
                len as u32,
                per as u32,
                active_rest as u32,
            );
        }
        Ok(())
    }

    fn held_bytes(&self) -> [u64; 4] {
        let Some(s) = &self.scene else { return [0; 4] };
        let values: u64 = s.widths().iter().map(|w| (w * s.n) as u64).sum();
        let grads = if self.grads.is_some() { 4 * values } else { 0 };
        // Adam's two moments (unless on the host), and densification's three statistics.
        let moments = if self.host.is_some() { 0 } else { 8 * values };
        [s.bytes(), grads, moments + 12 * s.n as u64, self.workspace]
    }

    fn cleanup(&self) -> Result<std::time::Duration, DeviceError> {
        let client = &self.renderer.client;
        let sync = || cubecl::future::block_on(client.sync()).map_err(DeviceError::runtime);
        sync()?;
        let started = std::time::Instant::now();
        client.memory_cleanup();
        sync()?;
        Ok(started.elapsed())
    }

    fn host_bytes(&self) -> [u64; 2] {
        let moments = self
            .host
            .iter()
            .flat_map(|h| &h.moments)
            .map(|(m, v)| 4 * (m.len() + v.len()) as u64)
            .sum();
        [moments, self.moved]
    }

    fn host_times(&self) -> Option<[f64; 2]> {
        self.host.as_ref().map(|_| self.times.map(|t| t.as_secs_f64() * 1e3))
    }
}

/// A scene fit placed on `device` (named `label`), with `memory` the
/// profiler's reading of its allocator.
pub fn placement<R: Runtime>(
    device: &R::Device,
    label: &'static str,
    memory: impl Fn() -> Box<dyn MemorySource> + 'static,
) -> crate::job::Placement {
    let device = device.clone();
    crate::job::Placement {
        name: DeviceFit::<R>::new(&device, label).name(),
        device: Some(Box::new(move |moments, sh| {
            Box::new(DeviceFit::<R>::with_storage(&device, label, moments, sh))
        })),
        memory: Box::new(memory),
    }
}
