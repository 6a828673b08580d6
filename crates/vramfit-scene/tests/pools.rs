//! The card's allocator modelled (`vramfit::pools`) against the allocator
//! itself: a scene fit's recorded allocations and releases, replayed
//! through CubeCL's memory management configured as the probing device's
//! client is, give the reserved bytes that client reports. One test in
//! this binary, so that no other test's buffers share the device's pools.
#![cfg(feature = "wgpu")]

use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use vramfit::optim::Moments;
use vramfit::pools::{Allocator, TraceLaw, replay};
use vramfit_scene::gpu::fit::StateAllocation;
use vramfit_scene::gpu::memory::{MemoryCase, trace_step};
use vramfit_scene::sh_storage::ShStorage;

/// How far a trace grown from two counts may put the reserved peak from
/// the one measured at a third: the buffers proportional to the count are
/// exact, the tile lists' length (intersections) is a random scene's and
/// only close to proportional, so the replayed figure may land a page off.
const GROWN_BOUND: f64 = 0.10;

#[test]
fn a_replayed_scene_step_gives_the_reserved_bytes_of_the_device() {
    let device = WgpuDevice::default();
    let client = <WgpuRuntime as cubecl::Runtime>::client(&device);
    let allocator = Allocator::from(&client.properties().memory);
    let case = |gaussians| MemoryCase {
        gaussians,
        degree: 3,
        width: 64,
        height: 48,
    };
    // Three fits that use the pools differently: the state in exact-size
    // allocations, the state in the pools, and the moments on the host
    // with 16-bit SH (the backward chunk by chunk).
    for (moments, sh, state) in [
        (Moments::Device, ShStorage::F32, StateAllocation::Exact),
        (Moments::Device, ShStorage::F32, StateAllocation::Pooled),
        (Moments::Host, ShStorage::F16, StateAllocation::Exact),
    ] {
        let what = format!("{moments:?} moments, {sh:?} SH, {state:?} state");
        let mut traces = Vec::new();
        for n in [3_000u64, 6_000, 9_000] {
            let (measured, trace) =
                trace_step::<WgpuRuntime>(&device, &case(n as usize), moments, sh, state, 3, None).unwrap();
            assert!(
                trace.reserves() > 20,
                "{what}: {} reservations recorded",
                trace.reserves()
            );
            let replayed = replay(&trace, &allocator).unwrap();
            assert_eq!(
                replayed.reserved_peak, measured.reserved,
                "{what}, {n} Gaussians: replayed {replayed:?} against the client's {} reserved",
                measured.reserved
            );
            eprintln!(
                "{what}, {n} Gaussians: {} reservations, reserved {} (in use at most {})",
                trace.reserves(),
                measured.reserved,
                replayed.in_use_peak
            );
            traces.push((n, trace, measured.reserved));
        }
        // Grown from the first two to the third.
        let law = TraceLaw::fit((traces[0].0, traces[0].1.clone()), (traces[1].0, traces[1].1.clone())).unwrap();
        let (n, _, measured) = &traces[2];
        let grown = replay(&law.at(*n), &allocator).unwrap().reserved_peak;
        let off = (grown as f64 - *measured as f64) / *measured as f64;
        eprintln!(
            "{what}: grown to {n} Gaussians {grown} against {measured} ({:+.2} %)",
            100.0 * off
        );
        assert!(
            off.abs() <= GROWN_BOUND,
            "{what}: grown to {n} Gaussians {grown} against {measured} measured ({:+.1} %)",
            100.0 * off
        );
    }
}
