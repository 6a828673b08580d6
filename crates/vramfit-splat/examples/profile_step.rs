//! Times the parts of one fit step on the built-in sample (CPU twins and
//! the Burn step), to see where a step's time goes. Arguments: the number
//! of Gaussians to place (default 5000), or a fitted `.vfg` file of the
//! sample (the Gaussians of a finished fit, whose footprints differ from
//! the initial ones). Further arguments name the parts to time (all when
//! none), e.g. `profile_step run/gaussians.vfg render_keeping`.
use std::time::Instant;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use burn::backend::{Autodiff, Flex};
use rand::SeedableRng;
use vramfit_gauss::ssim::{ssim, ssim_and_backward, ssim_backward};
use vramfit_splat::config::FitConfig;
use vramfit_splat::cpu::project::Frame;
use vramfit_splat::cpu::render::{Splats, render, render_backward, render_backward_kept, render_keeping};
use vramfit_splat::fit::Fit;
use vramfit_splat::gaussians::Gaussians;
use vramfit_splat::{init, job};

fn time<T>(name: &str, reps: u32, mut f: impl FnMut() -> T) {
    let only: Vec<String> = std::env::args().skip(2).collect();
    if !only.is_empty() && !only.iter().any(|o| o == name) {
        return;
    }
    // One part alone: more repetitions for a steadier figure.
    let reps = if only.is_empty() { reps } else { 4 * reps };
    f();
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    println!("{name:>20}: {:8.2} ms", t.elapsed().as_secs_f64() * 1e3 / reps as f64);
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "5000".into());
    let p = job::load_image("builtin:astronaut").unwrap();
    let g = match arg.parse::<usize>() {
        Ok(n) => init::initial(&p, n, &mut rand_chacha::ChaCha8Rng::seed_from_u64(0)),
        Err(_) => Gaussians::load(std::path::Path::new(&arg)).unwrap().params,
    };
    let n = g.count();
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
    let mut sizes: Vec<usize> = (0..frame.tiles_x() * frame.tiles_y())
        .map(|t| binned.tile(t).len())
        .collect();
    sizes.sort_unstable();
    println!(
        "candidates per tile before pruning: median {}, 90th percentile {}, largest {}",
        sizes[sizes.len() / 2],
        sizes[sizes.len() * 9 / 10],
        sizes[sizes.len() - 1]
    );
    time("render", 5, || render(&s, &frame, 10));
    time("render_backward", 5, || render_backward(&s, &frame, 10, &out));
    time("ssim", 5, || ssim(&out, &p.data, p.height, p.width, 3));
    time("ssim_backward", 5, || {
        ssim_backward(&out, &p.data, p.height, p.width, 3, 1.0)
    });
    time("render_keeping", 5, || render_keeping(&s, &frame, 10));
    let (_, kept) = render_keeping(&s, &frame, 10);
    time("render_backward_kept", 5, || {
        render_backward_kept(&s, &frame, &kept, &out)
    });
    time("ssim_and_backward", 5, || {
        ssim_and_backward(&out, &p.data, p.height, p.width, 3, 1.0)
    });
    let config = FitConfig {
        gaussians: n,
        progressive: false,
        ..Default::default()
    };
    let mut fit = Fit::<Autodiff<Flex>>::new(&p, &config, &Default::default()).unwrap();
    time("fit step", 5, || fit.step(false, &mut ()).unwrap());
}
