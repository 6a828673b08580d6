//! The scene fit through the run driver: the held-out PSNR it states rises
//! from the seeded Gaussians', the memory report names the parameter groups
//! with the bytes the count gives, `gaussians.ply` is written, and a run
//! stopped after a checkpoint resumes to the same Gaussians bit for bit.

use std::ops::ControlFlow;

use vramfit::run::{Event, RunPath, Start};
use vramfit_scene::config::SceneConfig;
use vramfit_scene::job::{Placement, launch};

fn config() -> SceneConfig {
    SceneConfig {
        views: 9,
        width: 32,
        height: 24,
        points: 200,
        steps: 60,
        sh_every: 15,
        log_every: 5,
        checkpoint_every: 20,
        profile_every: 10,
        // Densification inside the run, so that resuming restores a grown set.
        densify_from: 10,
        densify_every: 10,
        densify_until: 50,
        densify_grad_threshold: 1e-6,
        opacity_reset_every: 0,
        max_gaussians: 260,
        frame_every: 30,
        ..SceneConfig::default()
    }
}

#[test]
fn a_scene_fit_runs_states_its_psnr_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let (run, job) = launch(Start::New(config(), RunPath::At(whole.clone())), Placement::cpu()).unwrap();
    let summary = run
        .drive(job, |_| ControlFlow::Continue(()))
        .unwrap()
        .expect("finished");
    let s = &summary.workload;
    eprintln!(
        "held-out PSNR {:.2} dB from {:.2} dB, {} Gaussians",
        s.held_out_psnr_db, s.initial_psnr_db, s.gaussians
    );
    assert!(s.held_out_psnr_db > s.initial_psnr_db, "{s:?}");
    assert!(s.held_out_ssim > 0.0 && s.held_out_ssim < 1.0, "SSIM stated: {s:?}");
    let n = s.gaussians as u64;
    assert!(n > 200 && n <= 260, "densified within the cap: {n}");
    // Degree 3: 45 rest coefficients a Gaussian, 4 bytes each.
    assert_eq!(s.parameter_bytes["sh_rest"], n * 45 * 4);
    assert_eq!(s.parameter_bytes["means"], n * 3 * 4);
    let memory = std::fs::read_to_string(whole.join("memory.json")).unwrap();
    assert!(
        memory.contains("sh_rest") && memory.contains("sh_dc"),
        "groups named in the report"
    );
    let frames = std::fs::read_dir(whole.join("frames")).unwrap().count();
    assert!(frames >= 1, "frames of a held-out view");
    let ply = std::fs::read(whole.join("gaussians.ply")).unwrap();
    let header_end = ply.windows(11).position(|w| w == b"end_header\n").unwrap() + 11;
    // x y z, nx ny nz, 3 dc, 45 rest, opacity, 3 scales, 4 rotations: 62 floats.
    assert_eq!(ply.len() - header_end, n as usize * 62 * 4);
    // The file reads back to the same Gaussians, and `render-scene` draws
    // the end of the run from it.
    let decoded = vramfit_scene::ply::decode(&ply).unwrap();
    assert_eq!(vramfit_scene::ply::encode(&decoded), ply);
    let view = vramfit_scene::view::render_run_view(&whole, 0).unwrap();
    assert_eq!(view.step, 60);
    assert!(view.held_out && view.png.starts_with(b"\x89PNG"));
    assert!(view.psnr_db > s.initial_psnr_db - 3.0, "{}", view.psnr_db);
    // A run whose GPU kept the moments on the host and the SH in f16 is
    // drawn the same way (the saved parameters are the f32 masters).
    let config_path = whole.join("config.toml");
    let text = std::fs::read_to_string(&config_path).unwrap();
    let gpu_text = text
        .replace("moments = \"device\"", "moments = \"host\"")
        .replace("sh_storage = \"f32\"", "sh_storage = \"f16\"");
    assert_ne!(gpu_text, text, "the settings name both keys");
    std::fs::write(&config_path, gpu_text).unwrap();
    let again = vramfit_scene::view::render_run_view(&whole, 0).unwrap();
    assert_eq!(again.png, view.png);
    let cut_ply = vramfit_scene::ply::decode(&ply[..ply.len() - 4])
        .unwrap_err()
        .to_string();
    assert!(cut_ply.contains("cut"), "{cut_ply}");

    // Stopped just after the checkpoint at step 20, then resumed.
    let cut = tmp.path().join("cut");
    let (run, job) = launch(Start::New(config(), RunPath::At(cut.clone())), Placement::cpu()).unwrap();
    let stopped = run
        .drive(job, |e| match e {
            Event::Checkpoint(_) => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
        .unwrap();
    assert!(stopped.is_none(), "stopped before the end");
    let (run, job) = launch(Start::Resume(cut.clone()), Placement::cpu()).unwrap();
    assert_eq!(job.fit().step, 0, "restored by the driver, not yet");
    let resumed = run
        .drive(job, |_| ControlFlow::Continue(()))
        .unwrap()
        .expect("finished");
    assert_eq!(resumed.steps, 60);
    assert_eq!(
        std::fs::read(cut.join("gaussians.ply")).unwrap(),
        ply,
        "the resumed fit ends with the same Gaussians"
    );
    assert_eq!(resumed.workload.held_out_psnr_db, s.held_out_psnr_db);
    assert_eq!(resumed.workload.held_out_ssim, s.held_out_ssim);
    // What densification did before the checkpoint is counted too: the
    // summary reports what the uninterrupted run's does.
    assert!(s.densified.iter().sum::<usize>() > 0, "{:?}", s.densified);
    assert_eq!(resumed.workload.densified, s.densified);
}

/// A loss that stops being a number stops the run at that step with an
/// error that says so, and the checkpoints written before it are kept
/// (issue 47: a NaN background once trained to NaN and printed a PSNR).
#[test]
fn a_non_finite_loss_stops_the_fit_and_keeps_its_checkpoints() {
    let c = SceneConfig {
        steps: 6,
        checkpoint_every: 2,
        densify_from: 100,
        frame_every: 0,
        ..config()
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nan");
    let (run, job) = launch(Start::New(c.clone(), RunPath::At(dir.clone())), Placement::cpu()).unwrap();
    let stopped = run
        .drive(job, |e| match e {
            Event::Checkpoint(_) => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
        .unwrap();
    assert!(stopped.is_none());
    // The checkpoint's colours poisoned (infinite): the next step's loss is not a number.
    let checkpoints = vramfit::run::checkpoints_newest_first(&dir.join("checkpoints"));
    let mut file = vramfit::run::ArrayFile::read(&checkpoints[0]).unwrap();
    let n = file.get("param/sh_dc").unwrap().len();
    file.insert("param/sh_dc", vec![n], vec![f32::INFINITY; n]);
    vramfit::run::atomic_write(&checkpoints[0], &file.to_bytes()).unwrap();
    let (run, job) = launch(Start::Resume(dir.clone()), Placement::cpu()).unwrap();
    let Err(e) = run.drive(job, |_| ControlFlow::Continue(())) else {
        panic!("the run stops")
    };
    let e = e.to_string();
    assert!(
        e.contains("the loss became") && e.contains("at step 3") && e.contains("checkpoints"),
        "{e}"
    );
    assert!(checkpoints[0].is_file(), "the checkpoint is kept");
    assert!(!dir.join("summary.json").exists(), "no summary of a diverged fit");

    // A background that is not a colour is refused before anything runs.
    let bad = SceneConfig {
        background: Some([f32::NAN, 0.0, 0.0]),
        ..c
    };
    let Err(e) = launch(Start::New(bad, RunPath::At(tmp.path().join("bg"))), Placement::cpu()) else {
        panic!("refused")
    };
    let e = e.to_string();
    assert!(e.contains("background") && e.contains("from 0 to 1"), "{e}");
    assert!(!tmp.path().join("bg").exists());
}

/// `dataset = "builtin:glossy"` names the second built-in scene: its views
/// are that scene's, a fit of it runs, and the name is kept as it is in the
/// run's settings (not made a path, as a dataset folder's is).
#[test]
fn the_second_built_in_scene_is_named_as_a_dataset() {
    use vramfit_scene::synthetic::{Builtin, Spec, dataset};
    let c = SceneConfig {
        dataset: Builtin::Glossy.name().into(),
        steps: 20,
        checkpoint_every: 0,
        frame_every: 0,
        ..config()
    };
    assert_eq!(c.builtin(), Some(Builtin::Glossy));
    let spec = Spec {
        scene: Builtin::Glossy,
        views: 9,
        width: 32,
        height: 24,
        points: 200,
    };
    assert_eq!(c.dataset().unwrap(), dataset(&spec));
    assert_ne!(
        c.dataset().unwrap(),
        dataset(&Spec {
            scene: Builtin::Spheres,
            ..spec
        })
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("glossy");
    let (run, job) = launch(Start::New(c, RunPath::At(dir.clone())), Placement::cpu()).unwrap();
    let summary = run
        .drive(job, |_| ControlFlow::Continue(()))
        .unwrap()
        .expect("finished");
    let s = &summary.workload;
    assert!(s.held_out_psnr_db > s.initial_psnr_db, "{s:?}");
    let text = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    assert!(text.contains("dataset = \"builtin:glossy\""), "{text}");
}

/// A scene where every camera looks away from the Gaussians' start is
/// fitted with a warning at its first step, not silently to a blank.
#[test]
fn a_fit_that_sees_no_gaussian_warns() {
    use vramfit_scene::synthetic::{Spec, dataset};
    let tmp = tempfile::tempdir().unwrap();
    let mut data = dataset(&Spec {
        views: 4,
        width: 16,
        height: 16,
        points: 50,
        ..Spec::default()
    });
    let notes_of = |data: &vramfit_scene::dataset::Dataset, name: &str| {
        let folder = tmp.path().join(name);
        vramfit_scene::colmap::write(&folder, data).unwrap();
        let c = SceneConfig {
            dataset: folder.display().to_string(),
            steps: 2,
            checkpoint_every: 0,
            frame_every: 0,
            ..SceneConfig::default()
        };
        let out = RunPath::At(tmp.path().join(format!("{name}-run")));
        let (run, job) = launch(Start::New(c, out), Placement::cpu()).unwrap();
        let mut notes = Vec::new();
        run.drive(job, |e| {
            if let Event::Step(r) = e {
                notes.extend(r.notes.clone());
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        notes
    };
    let warned = |notes: &[String]| {
        notes
            .iter()
            .any(|n| n.contains("no Gaussian's centre is inside any training view"))
    };
    let facing = notes_of(&data, "facing");
    assert!(!warned(&facing), "{facing:?}");
    // Each camera turned half round about its own vertical axis: the same
    // centre, looking the other way.
    for v in &mut data.views {
        let c = &mut v.camera;
        for i in [0, 2] {
            c.rotation[i] = c.rotation[i].map(|x| -x);
            c.translation[i] = -c.translation[i];
        }
    }
    let away = notes_of(&data, "away");
    assert!(warned(&away), "{away:?}");
}
