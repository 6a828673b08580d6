//! Times the parts of one fit step on the built-in sample (CPU twins and
//! the Burn step), to see where a step's time goes.
use std::time::Instant;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use burn::backend::{Autodiff, Flex};
use rand::SeedableRng;
use vramfit_splat::config::FitConfig;
use vramfit_splat::cpu::project::Frame;
use vramfit_splat::cpu::render::{Splats, render, render_backward};
use vramfit_splat::cpu::ssim::{ssim, ssim_backward};
use vramfit_splat::fit::Fit;
use vramfit_splat::{init, job};

fn time<T>(name: &str, reps: u32, mut f: impl FnMut() -> T) {
    f();
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    println!("{name:>20}: {:8.2} ms", t.elapsed().as_secs_f64() * 1e3 / reps as f64);
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let p = job::load_image("builtin:astronaut").unwrap();
    let g = init::initial(&p, n, &mut rand_chacha::ChaCha8Rng::seed_from_u64(0));
    let s = Splats::new(&g, 3);
    let frame = Frame::new(p.width, p.height);
    let out = render(&s, &frame, 10);
    let binned = vramfit_splat::cpu::project::project_and_bin(&g.xy, &g.inv_scale, &g.theta, &frame);
    println!(
        "pairs {} over {} tiles: {:.1} per tile",
        binned.ids.len(),
        frame.tiles_x() * frame.tiles_y(),
        binned.ids.len() as f64 / (frame.tiles_x() * frame.tiles_y()) as f64
    );
    time("render", 5, || render(&s, &frame, 10));
    time("render_backward", 5, || render_backward(&s, &frame, 10, &out));
    time("ssim", 5, || ssim(&out, &p.data, p.height, p.width, 3));
    time("ssim_backward", 5, || {
        ssim_backward(&out, &p.data, p.height, p.width, 3, 1.0)
    });
    let config = FitConfig {
        gaussians: n,
        progressive: false,
        ..Default::default()
    };
    let mut fit = Fit::<Autodiff<Flex>>::new(&p, &config, &Default::default()).unwrap();
    time("fit step", 5, || fit.step(false, &mut ()).unwrap());
}
