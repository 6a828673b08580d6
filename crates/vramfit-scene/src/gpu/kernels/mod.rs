//! The renderer's CubeCL kernels, split as the CPU twin is: spherical
//! harmonics ([`sh`]), one Gaussian projected and its backward
//! ([`project`]), and the tiles' depth order, compositing and its backward
//! ([`raster`]), and Adam and densification's statistics ([`train`]).
//! Tile binning (count, scan, scatter) is shared with the 2D fitter
//! ([`vramfit_gauss::gpu::binning`]): one implementation for both.
//!
//! Arrays are flat f32 unless named otherwise. The constants are the CPU
//! twin's, converted here: defined once.

pub mod project;
pub mod raster;
pub mod sh;
pub mod train;

use crate::cpu::{project as cpu_project, raster as cpu_raster};

/// Floats per projected Gaussian: depth, screen mean (2), conic (3),
/// opacity, colour (3), radius in pixels.
pub const PROJECTED: u32 = 11;
/// Floats per Gaussian of the compositing backward's accumulator: screen
/// mean (2), conic (3), opacity, colour (3).
pub const SCREEN_GRADS: u32 = 9;

/// The camera as one array of [`CAMERA`] floats: world-to-camera rotation
/// (9, row by row), translation (3), fx, fy, cx, cy, width, height, the
/// centre in the world (3), and the slack frustum's x/z and y/z limits.
pub const CAMERA: usize = 23;

const NEAR: f32 = cpu_project::NEAR as f32;
const LOW_PASS: f32 = cpu_project::LOW_PASS as f32;
const MAX_ALPHA: f32 = cpu_raster::MAX_ALPHA as f32;
const MIN_ALPHA: f32 = cpu_raster::MIN_ALPHA as f32;
const MIN_TRANSMITTANCE: f32 = cpu_raster::MIN_TRANSMITTANCE as f32;

/// [`CAMERA`]'s floats for `camera`.
pub fn camera_array(camera: &crate::cpu::camera::Camera) -> Vec<f32> {
    let mut v: Vec<f32> = camera.rotation.iter().flatten().map(|&x| x as f32).collect();
    v.extend(camera.translation.map(|x| x as f32));
    v.extend([camera.fx, camera.fy, camera.cx, camera.cy].map(|x| x as f32));
    v.extend([camera.width as f32, camera.height as f32]);
    v.extend(camera.center().map(|x| x as f32));
    let slack = cpu_project::FRUSTUM_SLACK;
    v.push((slack * camera.width as f64 / (2.0 * camera.fx)) as f32);
    v.push((slack * camera.height as f64 / (2.0 * camera.fy)) as f32);
    debug_assert_eq!(v.len(), CAMERA);
    v
}
