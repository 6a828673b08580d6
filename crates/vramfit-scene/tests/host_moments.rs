//! Adam's moments in host memory (`--moments host`) on wgpu against the
//! moments on the device. lavapipe runs a dispatch's workgroups on several
//! threads, so the backward's atomic additions land in a different order
//! from run to run and two fits differ in their last bits, which Adam's
//! sign-like steps at tiny gradients amplify. On one thread (`LP_NUM_THREADS
//! =0`, set before this process creates its device) the order is fixed and
//! the comparison is exact.
#![cfg(feature = "wgpu")]

use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

/// Makes lavapipe run on one thread: must run before the first device.
fn single_threaded_device() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: called before any other thread of this test reads the
    // environment (the device, created after, reads it once).
    ONCE.call_once(|| unsafe { std::env::set_var("LP_NUM_THREADS", "0") });
}

/// A fit with Adam's moments on the host gives the fit with them on the
/// device bit for bit over 20 steps (SH bands raised on the way; the
/// backward in chunks of 256 Gaussians, each read while the next is made),
/// holds no
/// moments in device memory, and its allocator holds less by at least the
/// moments' bytes. With the SH stored in f16 as well, the device holds two
/// bytes less a coefficient, the updates land in f32 masters (values no
/// f16 can hold), and the held-out PSNR stays within 0.1 dB.
#[test]
fn moments_on_the_host_give_the_device_fit_in_less_device_memory() {
    use vramfit::optim::Moments;
    use vramfit_scene::fit::{Fit, Settings};
    use vramfit_scene::gpu::device_fit::DeviceFit;
    use vramfit_scene::sh_storage::ShStorage;
    use vramfit_scene::synthetic::{SKY, Spec, dataset};

    let data = dataset(&Spec {
        views: 9,
        width: 48,
        height: 36,
        points: 3000,
        ..Spec::default()
    });
    let settings = Settings {
        steps: 20,
        sh_every: 5,
        background: SKY.map(|v| v as f32),
        ..Settings::default()
    };
    let seeded = Fit::new(data.clone(), settings.clone())
        .unwrap()
        .params()
        .unwrap()
        .means
        .clone();
    let in_use = || {
        let client = <WgpuRuntime as cubecl::Runtime>::client(&WgpuDevice::default());
        client.memory_cleanup();
        client.memory_usage().unwrap().bytes_in_use
    };
    let mut fits = Vec::new();
    let mut held = Vec::new();
    for (moments, sh) in [
        (Moments::Device, ShStorage::F32),
        (Moments::Host, ShStorage::F32),
        (Moments::Device, ShStorage::F32),
        (Moments::Host, ShStorage::F16),
    ] {
        single_threaded_device();
        let mut device = DeviceFit::<WgpuRuntime>::with_storage(&WgpuDevice::default(), "wgpu", moments, sh);
        if moments == Moments::Host {
            // Many chunks (thousands of Gaussians): the pipelined reads and
            // the uploads in parts are what is compared.
            device = device.with_backward_chunk(256);
        }
        let before = in_use();
        let mut fit = Fit::new(data.clone(), settings.clone())
            .unwrap()
            .on_device(Box::new(device))
            .unwrap();
        for _ in 0..20 {
            fit.step().unwrap();
        }
        held.push((in_use() - before, fit.device_bytes().unwrap()));
        fits.push(fit);
    }
    let diff = |i: usize, j: usize| {
        let (a, b) = (fits[i].params().unwrap(), fits[j].params().unwrap());
        let mut worst = [0.0f32; 6];
        for (k, (ga, gb)) in a.groups().iter().zip(b.groups()).enumerate() {
            let scale = ga.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
            for (x, y) in ga.iter().zip(gb.iter()) {
                worst[k] = worst[k].max((x - y).abs() / scale);
            }
        }
        worst
    };
    eprintln!("held (allocator in use, categories): {held:?}");
    assert_eq!(diff(0, 2), [0.0; 6], "two device fits agree (lavapipe on one thread)");
    assert_eq!(diff(0, 1), [0.0; 6], "host and device Adam give the same parameters");
    let moved = fits[1].params().unwrap().means.clone();
    assert_ne!(moved, seeded, "the fit moved the Gaussians");
    let values: usize = fits[0].params().unwrap().groups().iter().map(|g| g.len()).sum();
    let moments_bytes = 8 * values as u64;
    assert_eq!(
        held[0].1[2] - held[1].1[2],
        moments_bytes,
        "the optimizer category loses the moments"
    );
    assert!(
        held[0].0 >= held[1].0 + moments_bytes,
        "the allocator holds at least the moments less: {held:?}, moments {moments_bytes}"
    );

    // The SH in f16 on the device, f32 masters on the host.
    let f16 = fits[3].params().unwrap();
    let sh_values = (f16.sh_dc.len() + f16.sh_rest.len()) as u64;
    assert_eq!(
        held[1].1[0] - held[3].1[0],
        2 * sh_values,
        "two bytes less a coefficient"
    );
    // (Less one alignment unit: buffers are rounded up, and the render's
    // intersections may differ by one.)
    assert!(
        held[1].0 + 256 >= held[3].0 + 2 * sh_values,
        "the allocator holds that less: {held:?}"
    );
    let not_half = f16
        .sh_dc
        .iter()
        .chain(&f16.sh_rest)
        .filter(|v| ShStorage::F16.round(&[**v])[0] != **v)
        .count();
    assert!(not_half > 0, "the masters hold what f16 cannot");
    let psnr = [fits[1].held_out_psnr().unwrap(), fits[3].held_out_psnr().unwrap()];
    eprintln!("held-out PSNR f32 / f16 SH: {psnr:?}; {not_half} of {sh_values} masters not f16 values");
    assert!((psnr[0] - psnr[1]).abs() < 0.1, "{psnr:?}");
}
