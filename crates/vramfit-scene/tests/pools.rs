//! The card's allocator modelled (`vramfit::pools`) against the allocator
//! itself: a scene fit's recorded allocations and releases, replayed
//! through CubeCL's memory management configured as the probing device's
//! client is, give the reserved bytes that client reports. One test on
//! the device in this binary, so that no other test's buffers share the
//! device's pools (the probe plan's is arithmetic).
#![cfg(feature = "wgpu")]

use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use vramfit::optim::Moments;
use vramfit::pools::{Allocator, TraceLaw, replay};
use vramfit_scene::gpu::device_fit::StateAllocation;
use vramfit_scene::gpu::device_fit::{CHUNK, backward_chunks};
use vramfit_scene::gpu::memory::{MemoryCase, probe_plan, trace_step};
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

/// The probes a card's counts grow from: with the moments on the device
/// one law through the probe counts serves every count; on the host each
/// count gets three scaled copies of its own step, each with the count's
/// chunk count (the steps are then the same events), chunks a multiple
/// of the device's alignment and smaller than the fit's own.
#[test]
fn each_count_with_host_moments_is_probed_by_copies_of_its_own_step() {
    let probes = [100_000, 200_000, 300_000];
    let targets = [1_000_000, 6_000_000, 70_000];
    let plan = probe_plan(Moments::Device, &probes, &targets);
    assert_eq!(
        plan,
        vec![(targets.to_vec(), probes.iter().map(|&n| (n, None)).collect())]
    );
    let plan = probe_plan(Moments::Host, &probes, &targets);
    assert_eq!(plan.len(), targets.len());
    for ((counts, copies), &target) in plan.iter().zip(&targets) {
        assert_eq!(counts, &vec![target]);
        assert_eq!(copies.len(), 3);
        let chunks = backward_chunks(target, Moments::Host);
        for &(n, chunk) in copies {
            let chunk = chunk.expect("a chunk of its own");
            assert!(chunk < CHUNK && chunk % 128 == 0, "{chunk}");
            assert_eq!(
                n.div_ceil(chunk),
                chunks,
                "{target}: {n} Gaussians in chunks of {chunk}"
            );
            assert!(n < target);
        }
    }
}
