//! `vramfit sample`: the deterministic procedural test image at any size,
//! and `vramfit sample scene DIR`: the built-in 3D scene (ray-cast views,
//! cameras, sparse points) written as a COLMAP text dataset.

use std::path::PathBuf;

use anyhow::{Result, bail};
use vramfit_gauss::picture::{check_output_target, save_png};
use vramfit_scene::synthetic::Builtin;
use vramfit_splat::output_size::check_size_here;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SampleArgs {
    #[command(subcommand)]
    what: Option<What>,
    /// Size, WIDTHxHEIGHT (up to 16K and beyond).
    #[arg(long, allow_hyphen_values = true, value_parser = crate::flags::parse_size, default_value = "1024x1024")]
    size: (u32, u32),
    /// Output PNG.
    out: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum What {
    /// The built-in 3D scene as a COLMAP text dataset: DIR/images/*.png and
    /// DIR/sparse/0/{cameras,images,points3D}.txt.
    Scene {
        /// A new folder (or an empty one).
        dir: PathBuf,
        /// Views around the objects (every 8th is held out for evaluation), 1 to 4,096.
        #[arg(long, default_value_t = 24, allow_negative_numbers = true, value_parser = crate::flags::parse_at_most::<4096>)]
        views: usize,
        /// Image size, WIDTHxHEIGHT.
        #[arg(long, allow_hyphen_values = true, value_parser = crate::flags::parse_size, default_value = "96x72")]
        size: (u32, u32),
        /// Sparse points seeding the Gaussians, at most 100,000,000.
        #[arg(long, default_value_t = 2000, allow_negative_numbers = true, value_parser = crate::flags::parse_at_most::<100_000_000>)]
        points: usize,
        /// Which built-in scene: builtin, or builtin:glossy (glossier, view-dependent colour over more of each image).
        #[arg(long, default_value = "builtin", value_parser = parse_scene)]
        scene: Builtin,
    },
}

pub fn run(args: SampleArgs) -> Result<()> {
    match (args.what, args.out) {
        (
            Some(What::Scene {
                dir,
                views,
                size,
                points,
                scene: which,
            }),
            _,
        ) => scene(dir, which, views, size, points),
        (None, Some(out)) => {
            check_output_target(&out)?;
            check_size_here(
                "the sample image",
                args.size.0,
                args.size.1,
                vramfit_splat::sample::bytes_needed,
            )?;
            save_png(&out, &vramfit_splat::sample::procedural(args.size.0, args.size.1))?;
            println!("wrote {} ({}x{})", out.display(), args.size.0, args.size.1);
            Ok(())
        }
        (None, None) => bail!(
            "give an output PNG (vramfit sample --size 1024x1024 OUT.png), or `vramfit sample scene DIR` for the \
             built-in 3D scene"
        ),
    }
}

fn parse_scene(name: &str) -> Result<Builtin, String> {
    Builtin::from_name(name)
        .ok_or_else(|| format!("`{name}` is not a built-in scene: give one of {}", Builtin::names()))
}

fn scene(dir: PathBuf, which: Builtin, views: usize, (width, height): (u32, u32), points: usize) -> Result<()> {
    // A symlink to nowhere: where the dataset would go is not there.
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) && !dir.exists() {
        bail!(
            "{} is a symbolic link to {}, which does not exist: create that folder, or give another path (nothing \
             was written)",
            dir.display(),
            std::fs::read_link(&dir).map_or("nowhere".into(), |t| t.display().to_string())
        );
    }
    if dir.exists() && (!dir.is_dir() || std::fs::read_dir(&dir)?.next().is_some()) {
        bail!(
            "{} already exists and is not an empty folder: give a new folder (nothing was written)",
            dir.display()
        );
    }
    if views < 2 || points == 0 {
        bail!("--views must be at least 2 (a scene is fitted from two views or more) and --points at least 1");
    }
    let least = vramfit_scene::dataset::MIN_VIEW as u32;
    if width < least || height < least {
        bail!(
            "--size {width}x{height} is below {least}x{least}, the smallest view `vramfit scene` fits: give \
             {least}x{least} or more (nothing was written)"
        );
    }
    let spec = vramfit_scene::synthetic::Spec {
        scene: which,
        views,
        width: width as usize,
        height: height as usize,
        points,
    };
    let data = vramfit_scene::synthetic::dataset(&spec);
    let existed = dir.exists();
    if let Err(e) = vramfit_scene::colmap::write(&dir, &data) {
        // A dataset half written (a full disk) is no dataset: what was
        // written goes (the folder too, unless it was there before), so
        // that the same command works once there is room.
        if existed {
            let _ = std::fs::remove_dir_all(dir.join("images"));
            let _ = std::fs::remove_dir_all(dir.join("sparse"));
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Err(anyhow::Error::from(e).context("nothing was kept"));
    }
    let (train, held) = data.split();
    println!(
        "wrote {}: {} views of {width}x{height} ({} for training, {} held out: every 8th), {} sparse points, as a \
         COLMAP text model (sparse/0/) and images/",
        dir.display(),
        data.views.len(),
        train.len(),
        held.len(),
        data.points.len()
    );
    let sky = which.sky();
    println!(
        "fit it as the built-in scene is fitted (its sky is the background; a COLMAP dataset's default is black): \
         vramfit scene {} --set 'background=[{}, {}, {}]'",
        dir.display(),
        sky[0],
        sky[1],
        sky[2]
    );
    Ok(())
}
