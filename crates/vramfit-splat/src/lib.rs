//! Content-adaptive 2D Gaussian image fitting (Image-GS) on Burn.
//!
//! The renderer and SSIM are Burn operations ([`op`]) with plain-Rust CPU
//! twins ([`cpu`]); the fit loop ([`fit`]) is generic over the backend;
//! [`job`] runs a whole fit into a run directory.
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use vramfit_gauss::picture::Picture;
//! use vramfit_splat::{config::FitConfig, fit::Fit, sample};
//!
//! let picture = Picture::from_rgb8(&sample::procedural(48, 32));
//! let config = FitConfig { gaussians: 64, steps: 20, ..Default::default() };
//! let mut fit = Fit::<Autodiff<Flex>>::new(&picture, &config, &Default::default()).unwrap();
//! while !fit.finished() {
//!     fit.step(false, &mut ()).unwrap();
//! }
//! let (_, psnr_db, _) = fit.evaluate().unwrap();
//! assert!(psnr_db > 10.0);
//! ```

pub mod baseline;
pub mod config;
pub mod cpu;
mod error;
pub mod fit;
pub mod gaussians;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod init;
pub mod job;
pub mod op;
pub mod output_size;
pub mod params;
pub mod plan;
/// The procedural test image (its own crate, which the U-Net uses too).
pub use vramfit_sample as sample;

pub use error::SplatError;
