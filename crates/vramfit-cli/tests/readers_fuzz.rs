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
