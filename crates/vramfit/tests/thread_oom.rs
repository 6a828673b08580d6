//! An out-of-memory that a backend reports only by panicking on its own
//! thread (cubecl-wgpu's device thread does, for a buffer above the
//! device's limit: measured with the standard attention at 4,096 tokens on
//! lavapipe, where the run went on and ended "successfully" with wrong
//! numbers) ends the run as an out-of-memory: `oom.json`, no summary, the
//! checkpoints kept. Here the batch maker of step 3 makes such a panic on a
//! thread of its own, with cubecl's words, and its step then returns
//! normally, as the real one did.

use std::ops::ControlFlow;
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use vramfit::plan::{Knobs, Runnable};
use vramfit::run::{RunError, RunPath, Start};
use vramfit::trainer::{Schedule, TrainerTarget};

mod common;

type A = Autodiff<Flex>;

#[test]
fn an_out_of_memory_panic_on_a_backend_thread_ends_the_run_as_an_out_of_memory() {
    let (k, batch, n) = (2, 8, 16);
    let device = Default::default();
    let schedule = Schedule {
        steps: 5,
        batch_size: batch,
        lr: 1e-3,
        checkpoint_every: 2,
        profile_every: 1,
    };
    let data = move |step: u64, size: usize, d: &burn::tensor::Device<A>| {
        if step == 3 {
            let thread = std::thread::Builder::new().name("backend device thread".into());
            let panicked = thread
                .spawn(|| {
                    panic!("called `Result::unwrap()` on an `Err` value: can't allocate buffer of size: 268435456")
                })
                .unwrap()
                .join();
            assert!(panicked.is_err());
        }
        Tensor::<A, 2>::from_data(
            TensorData::new((0..size * n).map(|i| (i % 7) as f32 / 7.0).collect(), [size, n]),
            d,
        )
    };
    let target = TrainerTarget::new(move |d| common::chain::<A>(k, n, d), Arc::new(data), schedule, &device);
    let tmp = std::env::temp_dir().join(format!("vramfit-thread-oom-{}", std::process::id()));
    let out = tmp.join("run");
    let (run, workload) = target
        .launch(Start::New(Knobs::base(k, batch), RunPath::At(out.clone())))
        .unwrap();
    let e = run.drive(workload, |_| ControlFlow::Continue(())).unwrap_err();
    assert!(matches!(e, RunError::OutOfMemory(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("step 3") && msg.contains("256.0 MiB") && msg.contains("oom.json"),
        "{msg}"
    );
    let oom: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("oom.json")).unwrap()).unwrap();
    assert_eq!(oom["step"], 3);
    assert_eq!(oom["requested_bytes"], 256 << 20);
    assert!(!out.join("summary.json").exists(), "not mistaken for a finished run");
    assert!(
        out.join("checkpoints/step-00000002.ckpt").is_file(),
        "the checkpoint before it is kept"
    );
    std::fs::remove_dir_all(&tmp).ok();
}
