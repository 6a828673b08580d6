//! What a scene takes in device memory, measured on the CubeCL allocator:
//! its parameters group by group, Adam's moments with densification's
//! statistics, one render's buffers and the backward's, each read as the
//! growth of the allocator's bytes in use when it is created, beside what
//! the layout predicts (the count, the SH degree, the image and the tile
//! intersections), and the reserved bytes after the step (the deciding
//! figure; the pools only grow between cleanups).

use cubecl::prelude::*;
use serde::Serialize;

use std::sync::{Arc, Mutex};

use vramfit::optim::Moments;
use vramfit::pools::{Recorder, Trace};
use vramfit_gauss::gpu::DeviceError;

use super::check::{Case, case_camera, random_scene, scene};
use super::device_fit::{CHUNK, DeviceFit, StateAllocation, backward_chunks};
use super::engine::CHUNK_ALIGN;
use super::engine::Renderer;
use crate::fit::{ADAM, GROUPS, Params, SceneDevice, State};
use crate::sh_storage::ShStorage;

/// One measurement.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryCase {
    /// Gaussians.
    pub gaussians: usize,
    /// SH degree.
    pub degree: usize,
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
}

/// Bytes measured (allocator bytes in use added) and predicted (from the
/// layout), for one stage.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stage {
    /// Measured.
    pub measured: u64,
    /// Predicted.
    pub predicted: u64,
}

/// What one case took.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// The case.
    pub case: MemoryCase,
    /// Tile intersections of the render.
    pub intersections: usize,
    /// Each parameter group (in [`GROUPS`]' order), measured.
    pub groups: Vec<(String, u64)>,
    /// All parameters.
    pub parameters: Stage,
    /// Adam's two moments and densification's three statistics.
    pub optimizer: Stage,
    /// The render's buffers kept for the backward (projected Gaussians,
    /// rectangles, tile offsets, sorted ids, image, per-pixel state).
    pub render: Stage,
    /// The backward's results: the gradients, the screen means' gradients,
    /// and the image gradient it read.
    pub backward: Stage,
    /// Allocator reserved bytes after the step.
    pub reserved: u64,
    /// Allocator bytes in use at the end (everything above alive).
    pub in_use: u64,
}

impl MemoryCase {
    /// The kernel check's random problem of this size (seed 7).
    fn check_case(&self) -> Case {
        Case {
            width: self.width,
            height: self.height,
            gaussians: self.gaussians,
            degree: self.degree,
            seed: 7,
            sh: ShStorage::F32,
        }
    }
}

/// The cases for `counts` × `degrees` at `width` × `height`.
pub fn cases(counts: &[usize], degrees: &[usize], width: usize, height: usize) -> Vec<MemoryCase> {
    counts
        .iter()
        .flat_map(|&gaussians| {
            degrees.iter().map(move |&degree| MemoryCase {
                gaussians,
                degree,
                width,
                height,
            })
        })
        .collect()
}

/// Measures `case` on `device`: a random scene (the kernel check's) seen
/// through the check's camera.
pub fn measure<R: Runtime>(device: &R::Device, case: &MemoryCase) -> Result<MemoryRow, DeviceError> {
    let check = case.check_case();
    let params = random_scene(&check);
    let s = scene(&params, case.degree);
    let camera = case_camera(&check);
    let renderer = Renderer::<R>::new(device);
    renderer.check_scene(case.gaussians, s.widths(), ShStorage::F32, case.width * case.height)?;
    let client = R::client(device);
    client.memory_cleanup();
    let in_use = || -> Result<u64, DeviceError> {
        client
            .memory_usage()
            .map(|u| u.bytes_in_use)
            .map_err(DeviceError::runtime)
    };
    let n = case.gaussians as u64;
    let start = in_use()?;

    let mut groups = Vec::new();
    let mut handles = Vec::new();
    let mut before = start;
    for (name, values) in GROUPS.iter().zip(&params) {
        handles.push(renderer.upload_f32(values));
        let now = in_use()?;
        groups.push((name.to_string(), now - before));
        before = now;
    }
    let values: u64 = params.iter().map(|g| g.len() as u64).sum();
    let parameters = Stage {
        measured: before - start,
        predicted: 4 * values,
    };
    drop(handles);
    let at = in_use()?;
    let buffers = renderer.upload(&s);
    let after_params = in_use()?;
    let moments: Vec<_> = params
        .iter()
        .flat_map(|g| {
            [
                renderer.upload_f32(&vec![0.0; g.len()]),
                renderer.upload_f32(&vec![0.0; g.len()]),
            ]
        })
        .chain((0..3).map(|_| renderer.upload_f32(&vec![0.0; case.gaussians])))
        .collect();
    let after_moments = in_use()?;
    let optimizer = Stage {
        measured: after_moments - after_params,
        predicted: 8 * values + 12 * n,
    };

    let drawn = renderer.render(&buffers, &camera, [0.0; 3])?;
    let after_render = in_use()?;
    let pixels = (case.width * case.height) as u64;
    let render = Stage {
        measured: after_render - after_moments,
        // `Drawn::bytes` without the tile counters, which the render frees.
        predicted: drawn.bytes(case.gaussians) - 4 * 2 * (camera.tiles().0 * camera.tiles().1) as u64,
    };
    let d_image = renderer.upload_f32(&vec![1e-3; 3 * case.width * case.height]);
    let (grads, screen) = renderer.backward(&buffers, &drawn, &d_image);
    let after_backward = in_use()?;
    let backward = Stage {
        measured: after_backward - after_render,
        predicted: 4 * values + 8 * n + 12 * pixels,
    };
    let usage = client.memory_usage().map_err(DeviceError::runtime)?;
    let row = MemoryRow {
        case: *case,
        intersections: drawn.intersections,
        groups,
        parameters,
        optimizer,
        render,
        backward,
        reserved: usage.bytes_reserved,
        in_use: usage.bytes_in_use - at,
    };
    drop((grads, screen, d_image, drawn, moments, buffers));
    Ok(row)
}

/// What whole training steps of a scene took on the device's allocator
/// (the planner's probe): a [`DeviceFit`] holding a random scene, each step
/// a render, the loss, the backward and Adam.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StepMemory {
    /// The case.
    pub case: MemoryCase,
    /// Where Adam's moments were.
    pub moments: Moments,
    /// How the SH was stored.
    pub sh: ShStorage,
    /// How the long-lived state was allocated.
    pub state: StateAllocation,
    /// The allocator's reserved bytes after the steps (its high-water: the
    /// pools grow until a cleanup; the probe starts after one). The figure
    /// that decides an out-of-memory.
    pub reserved: u64,
    /// The fit's device bytes by category at the end (parameters,
    /// gradients, optimizer state, workspace high-water), from its layout.
    pub held: [u64; 4],
    /// Bytes copied between host and device in a step.
    pub moved: u64,
    /// Median step time (ms), the first step left out.
    pub step_ms: f64,
    /// With the moments on the host: the medians (ms, the first step left
    /// out) of the step's copies between host and device and of the host's
    /// Adam, parts of `step_ms`.
    pub host_ms: Option<[f64; 2]>,
}

/// Runs `steps` training steps (two at least) of a random scene of
/// `case`'s size and degree on `device` with the moments where `moments`
/// says and the SH stored as `sh` says, and reads the allocator.
pub fn measure_step<R: Runtime>(
    device: &R::Device,
    case: &MemoryCase,
    moments: Moments,
    sh: ShStorage,
    allocation: StateAllocation,
    steps: usize,
) -> Result<StepMemory, DeviceError> {
    measure_step_recorded::<R>(device, case, moments, sh, allocation, steps, None, None)
}

/// [`measure_step`] with the fit's allocations and releases recorded (from
/// the cleanup before the fit is loaded), for [`vramfit::pools::replay`];
/// with the moments on the host, the chunks `chunk` Gaussians long where
/// given ([`DeviceFit::with_backward_chunk`]).
pub fn trace_step<R: Runtime>(
    device: &R::Device,
    case: &MemoryCase,
    moments: Moments,
    sh: ShStorage,
    allocation: StateAllocation,
    steps: usize,
    chunk: Option<usize>,
) -> Result<(StepMemory, Trace), DeviceError> {
    let recorder = Arc::new(Mutex::new(Recorder::new()));
    let m = measure_step_recorded::<R>(
        device,
        case,
        moments,
        sh,
        allocation,
        steps,
        chunk,
        Some(recorder.clone()),
    )?;
    let trace = recorder.lock().map_err(DeviceError::runtime)?.trace();
    Ok((m, trace))
}

/// Counts a card is predicted at, and the probes whose traces grow to
/// them: (Gaussians, the backward's chunk where not the fit's own).
pub type ProbePlan = (Vec<usize>, Vec<(usize, Option<usize>)>);

/// Which probes grow to which counts: (the counts, the probes as
/// (Gaussians, chunk)). With the moments on the device one law through
/// `probe_gaussians` serves every count. With them on the host the
/// backward's chunk count grows with the count, so each count gets
/// probes of its own: scaled copies of its step, with its chunk count,
/// each chunk 1,024, 2,048 (the law) and 1,536 (the check) Gaussians
/// instead of [`CHUNK`](super::device_fit::CHUNK) and the last chunk in proportion. Small probes
/// misgrow the tile lists: the random scene's Gaussians shrink as their
/// count grows, so its intersections are not proportional to the count
/// (at 3,906 and 7,813 Gaussians the grown list at 1 M was 3.5 times
/// too long and took a larger page).
pub fn probe_plan(moments: Moments, probe_gaussians: &[usize], targets: &[usize]) -> Vec<ProbePlan> {
    if moments == Moments::Device {
        return vec![(targets.to_vec(), probe_gaussians.iter().map(|&n| (n, None)).collect())];
    }
    targets
        .iter()
        .map(|&target| {
            let chunks = backward_chunks(target, moments);
            let last = target - (chunks - 1) * CHUNK;
            let probes = [8, 16, 12]
                .map(|k| {
                    let chunk = k * CHUNK_ALIGN;
                    let scaled_last = ((chunk * last) as f64 / CHUNK as f64).round().max(1.0) as usize;
                    ((chunks - 1) * chunk + scaled_last, Some(chunk))
                })
                .to_vec();
            (vec![target], probes)
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn measure_step_recorded<R: Runtime>(
    device: &R::Device,
    case: &MemoryCase,
    moments: Moments,
    sh: ShStorage,
    allocation: StateAllocation,
    steps: usize,
    chunk: Option<usize>,
    recorder: Option<Arc<Mutex<Recorder>>>,
) -> Result<StepMemory, DeviceError> {
    use rand::{Rng, SeedableRng};

    let check = case.check_case();
    let [means, log_scales, rotations, opacity_logits, sh_dc, sh_rest] = random_scene(&check);
    let params = Params {
        means,
        log_scales,
        rotations,
        opacity_logits,
        sh_dc,
        sh_rest,
        degree: case.degree,
    };
    Renderer::<R>::new(device).check_scene(case.gaussians, params.widths(), sh, case.width * case.height)?;
    let state = State::fresh(params);
    let camera = case_camera(&check);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let target: Vec<f32> = (0..3 * case.width * case.height)
        .map(|_| rng.random_range(0.0..1.0))
        .collect();
    let client = R::client(device);
    client.memory_cleanup();
    let mut fit = DeviceFit::<R>::with_storage(device, "probe", moments, sh).with_state_allocation(allocation);
    if let Some(recorder) = recorder {
        fit = fit.recorded_into(recorder);
    }
    if let Some(chunk) = chunk {
        fit = fit.with_backward_chunk(chunk);
    }
    fit.load(&state)?;
    drop(state);
    let active = 3 * (crate::cpu::sh::coefficients(case.degree) - 1);
    let mut times = Vec::new();
    let mut host_times = Vec::new();
    for t in 1..=steps.max(2) as i32 {
        let started = std::time::Instant::now();
        fit.forward_backward(&camera, [0.0; 3], &target, true)?;
        let (c1, c2) = (1.0 - ADAM.beta1.powi(t), 1.0 - ADAM.beta2.powi(t));
        fit.optimize([1e-4, 5e-3, 1e-3, 5e-2, 2.5e-3, 1.25e-4], c1, c2, active)?;
        cubecl::future::block_on(client.sync()).map_err(DeviceError::runtime)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        host_times.extend(fit.host_times().filter(|_| t > 1));
    }
    times.remove(0);
    times.sort_by(f64::total_cmp);
    let usage = client.memory_usage().map_err(DeviceError::runtime)?;
    Ok(StepMemory {
        case: *case,
        moments,
        sh,
        state: allocation,
        reserved: usage.bytes_reserved,
        held: fit.held_bytes(),
        moved: fit.moved_bytes(),
        step_ms: times[times.len() / 2],
        host_ms: crate::job::median_pair(&host_times),
    })
}
