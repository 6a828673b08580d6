//! One view of a fitted scene rendered on the CPU twin, from a run's
//! `gaussians.ply` or its newest checkpoint (`vramfit render-scene`).

use std::path::Path;

use vramfit::optim::Moments;
use vramfit::run::Workload;

use crate::config::SceneConfig;
use crate::error::SceneError;
use crate::fit::State;
use crate::job::{Placement, SceneJob};
use crate::sh_storage::ShStorage;

/// One view of a fitted scene, rendered by [`render_run_view`].
pub struct RenderedView {
    /// PNG bytes.
    pub png: Vec<u8>,
    /// The step of the checkpoint it was rendered from.
    pub step: u64,
    /// Whether the view was held out of training.
    pub held_out: bool,
    /// PSNR of the render against the view's image (dB).
    pub psnr_db: f64,
    /// Views in the dataset.
    pub views: usize,
    /// The dataset's folder (a built-in scene's name where it has none).
    pub dataset: std::path::PathBuf,
}

/// View `view` of the scene that the run in `dir` fits, rendered on the CPU
/// twin: from `gaussians.ply` when the run has finished, else from its
/// newest checkpoint that reads back.
pub fn render_run_view(dir: &Path, view: usize) -> Result<RenderedView, SceneError> {
    // Another workload's run (a 2D fit, a model) has other settings: said
    // as such, not as their first unknown key.
    // A link planted in the run is refused before anything is read through it.
    vramfit::files::outputs::no_planted_link(dir).map_err(|e| SceneError::Setting(e.to_string()))?;
    if let Ok(started) = vramfit::files::read::read_text(&dir.join("workload"), vramfit::files::read::Links::Refuse)
        && started.trim() != crate::job::WORKLOAD
    {
        return Err(SceneError::Drawing(format!(
            "{} is a run of `{}`, not of `{}`: render-scene draws a scene fit's views{}",
            dir.display(),
            started.trim(),
            crate::job::WORKLOAD,
            if started.trim() == "vramfit fit" {
                " (a 2D fit is drawn with `vramfit render`)"
            } else {
                ""
            }
        )));
    }
    let config_path = dir.join("config.toml");
    let text = vramfit::files::read::read_text(&config_path, vramfit::files::read::Links::Refuse).map_err(|e| {
        SceneError::Setting(format!(
            "{}: cannot read it ({e}); give the run directory of a `vramfit scene` run",
            config_path.display()
        ))
    })?;
    let mut config = SceneConfig::from_toml(&text, &config_path)?;
    // The CPU twin draws the f32 parameters the run saved, wherever the
    // run kept its moments and however its device stored the SH.
    config.moments = Moments::Device;
    config.sh_storage = ShStorage::F32;
    let dataset = std::path::PathBuf::from(&config.dataset);
    let mut job = SceneJob::new(config, Placement::cpu())?;
    let views = job.fit.data().views.len();
    if view >= views {
        return Err(SceneError::Setting(format!(
            "--view {view}: the scene has {views} views, numbered 0 to {}",
            views - 1
        )));
    }
    let render = |job: &SceneJob| -> Result<RenderedView, SceneError> {
        let fit = &job.fit;
        let image = fit.render_image(view).map_err(SceneError::Device)?;
        Ok(RenderedView {
            png: fit.render_view(view).map_err(SceneError::Device)?,
            step: fit.step,
            held_out: fit.data().split().1.contains(&view),
            psnr_db: crate::fit::psnr(&image, &fit.data().views[view].image),
            views,
            dataset: dataset.clone(),
        })
    };
    // A finished run's Gaussians are in gaussians.ply (no checkpoint is
    // taken at the last step); a run in progress has its checkpoints.
    let ply = dir.join("gaussians.ply");
    if ply.is_file() {
        let read = vramfit::files::read::read(&ply, vramfit::files::read::Links::Refuse).map_err(|e| e.to_string());
        let params = read
            .and_then(|bytes| crate::ply::decode(&bytes).map_err(|e| e.to_string()))
            .map_err(|e| {
                SceneError::Drawing(format!(
                    "{}, the run's final Gaussians, does not read: {e}. Its checkpoints may still: move gaussians.ply \
                 out of the run directory to draw the newest of them",
                    ply.display()
                ))
            })?;
        let steps = vramfit::files::read::read(&dir.join("summary.json"), vramfit::files::read::Links::Refuse)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|s| s["steps"].as_u64())
            .unwrap_or(0);
        job.fit
            .restore(State::fresh(params), steps)
            .map_err(|e| SceneError::Checkpoint(e.to_string()))?;
        return render(&job);
    }
    let checkpoints = vramfit::run::checkpoints_newest_first(&dir.join("checkpoints"));
    let mut why = Vec::new();
    for path in &checkpoints {
        let restored = vramfit::run::ArrayFile::read(path)
            .map_err(|e| e.to_string())
            .and_then(|file| job.restore(&file).map_err(|e| e.to_string()));
        match restored {
            Ok(()) => return render(&job),
            Err(e) => why.push(format!("{}: {e}", path.display())),
        }
    }
    Err(SceneError::Drawing(if why.is_empty() {
        format!(
            "no checkpoint in {}: the run has not written one yet (it writes one every checkpoint_every steps and at its end)",
            dir.join("checkpoints").display()
        )
    } else {
        format!("no checkpoint reads back: {}", why.join("; "))
    }))
}
