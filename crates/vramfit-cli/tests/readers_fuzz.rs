//! The readers a user can hand a bad file or string to, fed mutated and
//! random input: none may panic. Each target starts from valid input
//! (an image, a checkpoint, a Gaussians file, a `.ply`, settings files,
//! size strings) and mutates it (bit flips, cuts, inserted and repeated
//! bytes, random bytes); array files get their checksum recomputed after
//! the mutation, so that their header and shapes are reached, not only the
//! checksum. A fixed seed and case count keep it short in CI; set
//! `VRAMFIT_FUZZ_CASES` (cases per target) and `VRAMFIT_FUZZ_SEED` to run
//! it longer (`scripts/fuzz-readers.sh`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn cases() -> usize {
    std::env::var("VRAMFIT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn seed() -> u64 {
    std::env::var("VRAMFIT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(29)
}

/// One mutation of `input`.
fn mutate(rng: &mut ChaCha8Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..rng.random_range(1..4) {
        let len = v.len().max(1);
        match rng.random_range(0..6) {
            0 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v[i] ^= 1 << rng.random_range(0..8);
            }
            1 => v.truncate(rng.random_range(0..len)),
            2 => {
                let at = rng.random_range(0..=v.len());
                let bytes: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
                v.splice(at..at, bytes);
            }
            3 if !v.is_empty() => {
                let a = rng.random_range(0..v.len());
                let b = (a + rng.random_range(1..64)).min(v.len());
                let chunk = v[a..b].to_vec();
                let at = rng.random_range(0..=v.len());
                v.splice(at..at, chunk);
            }
            4 if !v.is_empty() => {
                // A byte set to an extreme: lengths and counts read as huge or zero.
                let i = rng.random_range(0..v.len());
                v[i] = if rng.random() { 0xFF } else { 0 };
            }
            _ => v = (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
        }
    }
    v
}

/// An array file's checksum made right again (FNV-1a over the body, the
/// format's own), so that mutations reach the header.
fn fix_checksum(v: &mut [u8]) {
    if v.len() < 8 {
        return;
    }
    let body = v.len() - 8;
    let sum = v[..body].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    v[body..].copy_from_slice(&sum.to_le_bytes());
}

/// Runs `read` on `cases()` mutations of each of `seeds`; returns the inputs that panicked.
fn fuzz(name: &str, seeds: &[Vec<u8>], fix: bool, read: impl Fn(&[u8])) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed() ^ name.len() as u64);
    let mut panicked = Vec::new();
    for s in seeds {
        // The valid input reads too.
        if catch_unwind(AssertUnwindSafe(|| read(s))).is_err() {
            panicked.push(format!("{name}: the valid seed panicked"));
        }
    }
    for i in 0..cases() {
        let mut input = mutate(&mut rng, &seeds[i % seeds.len()]);
        if fix {
            fix_checksum(&mut input);
        }
        if catch_unwind(AssertUnwindSafe(|| read(&input))).is_err() {
            panicked.push(format!(
                "{name}: case {i}, {} bytes: {:02x?}",
                input.len(),
                &input[..input.len().min(48)]
            ));
        }
    }
    panicked
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn no_reader_panics_on_mutated_input() {
    // Panics are caught and counted; their messages would only clutter the log.
    std::panic::set_hook(Box::new(|_| {}));
    let mut panicked = Vec::new();

    let img = vramfit_sample::procedural(24, 16);
    let encode = |format| {
        let mut b = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut b), format).unwrap();
        b
    };
    let images = vec![encode(image::ImageFormat::Png), encode(image::ImageFormat::Jpeg)];
    panicked.extend(fuzz("image", &images, false, |b| {
        let _ = vramfit_gauss::picture::Picture::decode(b, Path::new("fuzz.png"));
    }));

    let mut ckpt = vramfit::run::ArrayFile::new("checkpoint", serde_json::json!({ "step": 3 }));
    ckpt.insert("xy", vec![4, 2], vec![0.5; 8]);
    ckpt.insert("theta", vec![4], vec![0.1; 4]);
    // A header whose shapes multiply past the address space, and one whose
    // array would run past the end.
    let hand_made = |shape: &str| {
        let json = format!(r#"{{"kind": "checkpoint", "meta": {{}}, "arrays": [{{"name": "a", "shape": {shape}}}]}}"#);
        let mut v = b"VRAMFIT\0".to_vec();
        v.extend(1u32.to_le_bytes());
        v.extend((json.len() as u32).to_le_bytes());
        v.extend(json.as_bytes());
        v.extend([0u8; 16]);
        v.extend([0u8; 8]);
        fix_checksum(&mut v);
        v
    };
    let array_seeds = [
        ckpt.to_bytes(),
        hand_made("[4294967296, 4294967296]"),
        hand_made("[18446744073709551615, 2]"),
        hand_made("[4611686018427387904]"),
    ];
    panicked.extend(fuzz("array file", &array_seeds, true, |b| {
        let _ = vramfit::run::ArrayFile::from_bytes(b, "fuzz.ckpt");
    }));

    let gaussians = {
        let mut f = vramfit::run::ArrayFile::new(
            "gaussians",
            serde_json::json!({ "width": 8, "height": 8, "channels": 3 }),
        );
        for (name, shape) in [
            ("xy", vec![2, 2]),
            ("inv_scale", vec![2, 2]),
            ("theta", vec![2]),
            ("color", vec![2, 3]),
        ] {
            let n = shape.iter().product();
            f.insert(name, shape, vec![0.3; n]);
        }
        f.to_bytes()
    };
    panicked.extend(fuzz("gaussians file", &[gaussians], true, |b| {
        if let Ok(f) = vramfit::run::ArrayFile::from_bytes(b, "fuzz.vfg") {
            let _ = vramfit_splat::gaussians::Gaussians::from_file(&f, "fuzz.vfg");
        }
    }));

    let data = vramfit_scene::synthetic::dataset(&vramfit_scene::synthetic::Spec {
        views: 2,
        width: 8,
        height: 8,
        points: 5,
        ..vramfit_scene::synthetic::Spec::default()
    });
    let params = vramfit_scene::params::Params::from_points(&data, 1, 10).unwrap();
    panicked.extend(fuzz("ply", &[vramfit_scene::ply::encode(&params)], false, |b| {
        let _ = vramfit_scene::ply::decode(b);
    }));

    let fit_toml = vramfit_splat::config::FitConfig::default().to_toml().into_bytes();
    let scene_toml = vramfit_scene::config::SceneConfig::default().to_toml().into_bytes();
    panicked.extend(fuzz("settings files", &[fit_toml, scene_toml], false, |b| {
        let t = text(b);
        let _ = vramfit_splat::config::FitConfig::from_toml(&t, Path::new("fuzz.toml"));
        let _ = vramfit_scene::config::SceneConfig::from_toml(&t, Path::new("fuzz.toml"));
        let _ = vramfit_models::gpt::TrainConfig::from_toml(&t, Path::new("fuzz.toml"));
    }));

    let sizes: Vec<Vec<u8>> = ["16GiB", "1.5e3MiB", "512 KiB", "80GB", "1_000_000"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    panicked.extend(fuzz("byte sizes", &sizes, false, |b| {
        let _ = vramfit::plan::parse_bytes(&text(b));
    }));

    let report = br#"{"schema": "vramfit.memory", "version": 4, "device": "cpu", "records": []}"#.to_vec();
    panicked.extend(fuzz("memory report", &[report], false, |b| {
        let _ = serde_json::from_slice::<vramfit::profile::MemoryReport>(b);
    }));

    let _ = std::panic::take_hook();
    assert!(
        panicked.is_empty(),
        "{} inputs panicked:\n{}",
        panicked.len(),
        panicked.join("\n")
    );
}

// Round trips (issue 47), as property tests: for any valid input, write
// then read gives the same values (COLMAP text, a scene's PLY, a 2D fit's
// `.vfg`, a scene's config.toml); for the checksummed `.vfg`, any byte
// changed is refused or reads to the same values. (A text or PLY file has
// no checksum: a changed digit is another valid value, so for them the
// fuzzing above proves the rest, no panic.)
mod round_trips {
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use vramfit_scene::cpu::camera::Camera;
    use vramfit_scene::dataset::{Dataset, Point, View};

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / a.abs().max(b.abs()).max(1.0)
    }

    /// A valid dataset from `seed`: pinhole cameras at any pose, 8-bit pixels.
    fn dataset(seed: u64, views: usize, (w, h): (usize, usize), points: usize) -> Dataset {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let views = (0..views)
            .map(|i| {
                let q: [f64; 4] = std::array::from_fn(|_| rng.random_range(-1.0..1.0));
                let camera = Camera {
                    width: w,
                    height: h,
                    fx: rng.random_range(1.0..2000.0),
                    fy: rng.random_range(1.0..2000.0),
                    cx: rng.random_range(0.0..w as f64),
                    cy: rng.random_range(0.0..h as f64),
                    rotation: vramfit_scene::colmap::rotation_from_quaternion(q),
                    translation: std::array::from_fn(|_| rng.random_range(-100.0..100.0)),
                };
                let image = (0..3 * w * h).map(|_| rng.random::<u8>() as f32 / 255.0).collect();
                View {
                    name: format!("v{i:03}.png"),
                    camera,
                    image,
                }
            })
            .collect();
        let points = (0..points)
            .map(|_| Point {
                position: std::array::from_fn(|_| rng.random_range(-1e3..1e3)),
                color: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        Dataset {
            views,
            points,
            held_out: None,
            notes: Vec::new(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

        #[test]
        fn colmap_text_reads_back_as_written(
            seed: u64, views in 2usize..5, w in 8usize..13, h in 8usize..13, points in 0usize..30,
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let written = dataset(seed, views, (w, h), points);
            vramfit_scene::colmap::write(tmp.path(), &written).unwrap();
            let read = vramfit_scene::colmap::read(tmp.path()).unwrap();
            prop_assert_eq!(read.views.len(), written.views.len());
            for (r, v) in read.views.iter().zip(&written.views) {
                let (a, b) = (&r.camera, &v.camera);
                prop_assert_eq!((&r.name, a.width, a.height), (&v.name, b.width, b.height));
                for (x, y) in [(a.fx, b.fx), (a.fy, b.fy), (a.cx, b.cx), (a.cy, b.cy)] {
                    prop_assert!(rel(x, y) < 1e-12, "{x} {y}");
                }
                for i in 0..3 {
                    prop_assert!(rel(a.translation[i], b.translation[i]) < 1e-12);
                    for k in 0..3 {
                        prop_assert!((a.rotation[i][k] - b.rotation[i][k]).abs() < 1e-9);
                    }
                }
                prop_assert!(r.image.iter().zip(&v.image).all(|(x, y)| (x - y).abs() < 1e-6));
            }
            prop_assert_eq!(read.points.len(), written.points.len());
            for (r, p) in read.points.iter().zip(&written.points) {
                prop_assert_eq!(r.color, p.color);
                prop_assert!((0..3).all(|i| rel(r.position[i], p.position[i]) < 1e-12));
            }
        }

        #[test]
        fn a_scene_ply_reads_back_as_written(seed: u64, n in 0usize..40, degree in 0usize..4) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut values = |k: usize| -> Vec<f32> { (0..k).map(|_| rng.random_range(-1e6f32..1e6)).collect() };
            let rest = (degree + 1) * (degree + 1) - 1;
            let params = vramfit_scene::params::Params {
                means: values(3 * n),
                log_scales: values(3 * n),
                rotations: values(4 * n),
                opacity_logits: values(n),
                sh_dc: values(3 * n),
                sh_rest: values(3 * rest * n),
                degree,
            };
            let bytes = vramfit_scene::ply::encode(&params);
            prop_assert_eq!(vramfit_scene::ply::decode(&bytes).unwrap(), params);
        }

        #[test]
        fn gaussians_files_read_back_and_refuse_any_changed_byte(
            seed: u64, n in 0usize..40, channels in 1usize..4, at: prop::sample::Index, flip in 1u8..=255,
        ) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let g = vramfit_splat::gaussians::Gaussians {
                width: rng.random_range(1..4096),
                height: rng.random_range(1..4096),
                channels,
                params: vramfit_splat::params::HostParams::from_fn(|p| {
                    (0..n * p.width(channels)).map(|_| rng.random_range(-1e3f32..1e3)).collect()
                }),
            };
            let bytes = g.to_file().to_bytes();
            let read = |b: &[u8]| {
                vramfit::run::ArrayFile::from_bytes(b, "g.vfg")
                    .and_then(|f| vramfit_splat::gaussians::Gaussians::from_file(&f, "g.vfg"))
            };
            prop_assert_eq!(read(&bytes).unwrap(), g.clone());
            let mut changed = bytes.clone();
            changed[at.index(bytes.len())] ^= flip;
            if let Ok(back) = read(&changed) {
                prop_assert_eq!(back, g);
            }
        }

        #[test]
        fn a_scene_config_reads_back_as_written(
            steps in 1u64..1_000_000, sh_degree in 0usize..4, background in proptest::option::of([0f32..=1.0, 0f32..=1.0, 0f32..=1.0]),
            max_gaussians in 1usize..10_000_000, threshold in 1e-9f32..1.0, every in 0u64..10_000, downscale in 1usize..9,
            host: bool,
        ) {
            let config = vramfit_scene::config::SceneConfig {
                dataset: "some/folder with spaces/ünïcode".into(),
                steps,
                sh_degree,
                background,
                max_gaussians,
                densify_grad_threshold: threshold,
                densify_every: every,
                checkpoint_every: every,
                downscale,
                moments: if host { vramfit::optim::Moments::Host } else { vramfit::optim::Moments::Device },
                ..Default::default()
            };
            let text = config.to_toml();
            let read = vramfit_scene::config::SceneConfig::from_toml(&text, std::path::Path::new("config.toml")).unwrap();
            prop_assert_eq!(read, config);
        }
    }
}
