//! Adam's moments in host memory on wgpu: the device's allocator holds
//! their bytes less. Alone in its test binary, because it reads the
//! allocator's bytes in use, which tests running beside it on the same
//! device would change.
#![cfg(feature = "wgpu")]

mod common;

use burn::tensor::backend::AutodiffBackend;
use common::stepper;
use vramfit::activation_checkpointing::CheckpointPolicy;
use vramfit::batch::MicroBatching;
use vramfit::precision::Precision;
use vramfit_models::data::{SyntheticTask, TaskConfig};
use vramfit_models::gpt::GptConfig;

/// On wgpu (CubeCL's allocator), training with the moments on the host
/// holds at least the moments' bytes less in device memory than with them
/// on the device, read from the allocator after the same steps.
#[test]
fn moments_on_the_host_leave_device_memory_on_wgpu() {
    use vramfit::profile::DeviceMemory;
    type B = vramfit::backends::Wgpu;
    let device = Default::default();
    let config = GptConfig {
        vocab: 16,
        width: 128,
        depth: 4,
        heads: 4,
        context: 24,
        mlp_ratio: 2,
        frame_dim: 6,
        max_frames: 3,
        attention: vramfit::fused::Attention::Standard,
    };
    let task = SyntheticTask::new(
        TaskConfig {
            tokens: 12,
            frames: 5,
            ..Default::default()
        },
        config.vocab,
        config.frame_dim,
    );
    let in_use = |host: bool| {
        let mut model = config.init::<B>(11, &device);
        let mut s = stepper::<B>(
            Precision::F32,
            &CheckpointPolicy::parse("none").unwrap(),
            MicroBatching::whole(4),
            config.depth,
        );
        if host {
            s.optimizer = s.optimizer.on_host();
        }
        for step in 0..3 {
            let (m, _) = s
                .step(model, &task.batch(step, 4, &device), 3e-3, &device, &mut ())
                .unwrap();
            model = m;
        }
        let source = <<B as AutodiffBackend>::InnerBackend as DeviceMemory>::memory_source(&device);
        let held = source.read().expect("the allocator reads").allocated;
        (held, s.optimizer.state_bytes(), model)
    };
    let (device_held, moments, _kept) = in_use(false);
    drop(_kept);
    let (host_held, none, _kept2) = in_use(true);
    eprintln!(
        "allocator in use: moments on the device {device_held} B, on the host {host_held} B; moments {moments} B"
    );
    assert_eq!(none, 0);
    assert!(moments > 0);
    assert!(
        device_held >= host_held + moments,
        "the moments' {moments} bytes left the device: {device_held} vs {host_held}"
    );
}
