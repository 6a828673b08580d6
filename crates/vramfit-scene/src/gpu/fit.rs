//! A scene fit's state on a CubeCL device ([`crate::train::SceneDevice`]):
//! the parameter groups, their gradients and Adam's moments live in device
//! buffers; each step renders, differentiates and updates there. The loss
//! (L1 + SSIM) runs on the host: the image goes down and its gradient up,
//! 24 bytes a pixel each step (the 2D fitter's banded SSIM kernels are
//! written for its own renderer; sharing them is a next step).

use cubecl::prelude::*;
use cubecl::server::Handle;
use vramfit::profile::MemorySource;
use vramfit_splat::gpu::engine::{dim, grid};

use super::engine::{Renderer, SceneBuffers, array};
use super::kernels::{PROJECTED, train};
use crate::cpu::camera::Camera;
use crate::train::{SceneDevice, State, loss_and_gradient};

/// The fit's state on one device.
pub struct DeviceFit<R: Runtime> {
    renderer: Renderer<R>,
    label: &'static str,
    scene: Option<SceneBuffers>,
    moments: Vec<[Handle; 2]>,
    stats: Vec<Handle>,
    grads: Option<[Handle; 6]>,
    workspace: u64,
}

impl<R: Runtime> DeviceFit<R> {
    /// An empty state on `device`, named `label` in reports; a fit's
    /// [`crate::train::Fit::on_device`] loads it.
    pub fn new(device: &R::Device, label: &'static str) -> Self {
        Self {
            renderer: Renderer::new(device),
            label,
            scene: None,
            moments: Vec::new(),
            stats: Vec::new(),
            grads: None,
            workspace: 0,
        }
    }

    fn loaded(&self) -> Result<&SceneBuffers, String> {
        self.scene
            .as_ref()
            .ok_or_else(|| "the scene is not on the device".to_string())
    }
}

impl<R: Runtime> SceneDevice for DeviceFit<R> {
    fn name(&self) -> String {
        format!("{} (the scene renderer's CubeCL kernels)", self.label)
    }

    fn load(&mut self, state: &State) -> Result<(), String> {
        let r = &self.renderer;
        r.check_scene(state.params.len(), state.params.widths(), 0)?;
        self.scene = Some(r.upload(&state.params.scene()));
        self.moments = state
            .moments
            .iter()
            .map(|(m, v)| [r.upload_f32(m), r.upload_f32(v)])
            .collect();
        let s = &state.stats;
        self.stats = [&s.grad, &s.seen, &s.max_radius]
            .iter()
            .map(|v| r.upload_f32(v))
            .collect();
        self.grads = None;
        Ok(())
    }

    fn store(&self, state: &mut State) -> Result<(), String> {
        let s = self.loaded()?;
        let widths = s.widths();
        let r = &self.renderer;
        for (g, (group, h)) in state.params.groups_mut().into_iter().zip(&s.groups).enumerate() {
            *group = r.download(h, s.n * widths[g])?;
        }
        for (g, ((m, v), [hm, hv])) in state.moments.iter_mut().zip(&self.moments).enumerate() {
            *m = r.download(hm, s.n * widths[g])?;
            *v = r.download(hv, s.n * widths[g])?;
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

    fn render(&self, camera: &Camera, background: [f32; 3]) -> Result<Vec<f32>, String> {
        let drawn = self.renderer.render(self.loaded()?, camera, background)?;
        self.renderer.download(&drawn.image, 3 * camera.width * camera.height)
    }

    fn forward_backward(
        &mut self,
        camera: &Camera,
        background: [f32; 3],
        target: &[f32],
        stats: bool,
    ) -> Result<f32, String> {
        let s = self.loaded()?;
        let r = &self.renderer;
        let n = s.n;
        let drawn = r.render(s, camera, background)?;
        let image = r.download(&drawn.image, 3 * camera.width * camera.height)?;
        let (loss, d_image) = loss_and_gradient(&image, target, camera.width, camera.height);
        let d_image = r.upload_f32(&d_image);
        let (grads, screen) = r.backward(s, &drawn, &d_image);
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
        // The render's buffers, the image gradient, the backward's
        // accumulator (9 floats a Gaussian) and the screen gradients.
        let step_bytes = drawn.bytes(n) + 12 * (camera.width * camera.height) as u64 + 44 * n as u64;
        self.workspace = self.workspace.max(step_bytes);
        self.grads = Some(grads);
        Ok(loss)
    }

    fn optimize(&mut self, rates: [f32; 6], c1: f32, c2: f32, active_rest: usize) -> Result<(), String> {
        let grads = self.grads.take().ok_or("optimize before forward_backward")?;
        let s = self.loaded()?;
        let widths = s.widths();
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
        // Adam's two moments, and densification's three statistics.
        [4 * values, grads, 8 * values + 12 * s.n as u64, self.workspace]
    }
}

/// A scene fit placed on `device` (named `label`), with `memory` the
/// profiler's reading of its allocator.
pub fn placement<R: Runtime>(
    device: &R::Device,
    label: &'static str,
    memory: impl Fn() -> Box<dyn MemorySource> + 'static,
) -> crate::job::Placement {
    let fit = DeviceFit::<R>::new(device, label);
    crate::job::Placement {
        name: fit.name(),
        device: Some(Box::new(fit)),
        memory: Box::new(memory),
    }
}
