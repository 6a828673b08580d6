//! The scene's loss on the device: `(1 − λ)·L1 + λ·(1 − SSIM)` of a
//! render against its view's image and the gradient with respect to the
//! render, through the image fit's banded SSIM kernels
//! ([`vramfit_gauss::gpu::ssim`], shared, not copied). The render and its
//! gradient stay on the device: a step sends the target up (one byte a
//! value for an 8-bit image, four otherwise) and reads back a few floats
//! a cube of partial sums, where the host loss moved the image down and
//! its gradient up (24 bytes a pixel) and ran SSIM on the CPU.
//!
//! The gradient is made a band of rows at a time into one image-sized
//! buffer (the backward wants the whole image's), so the SSIM planes take
//! at most about [`BAND_BYTES`] (more only where a band's [`FEWEST_ROWS`]
//! rows of a very wide image take more).

use cubecl::prelude::*;
use cubecl::server::Handle;
use vramfit_gauss::DeviceError;
use vramfit_gauss::gpu::ssim::{self, Band, Buffer, Image, RADIUS, Rows, TAPS, Target, Weights};

use super::engine::{Drawn, Renderer};
use crate::fit::LAMBDA_SSIM;

/// Bytes the SSIM planes of one band may take (five statistics planes
/// over the band and its halo beside three coefficient planes, then the
/// coefficients and their three blurs).
pub const BAND_BYTES: usize = 16 << 20;

/// Fewest rows a band takes: each band's statistics reach `2R` rows past
/// it on both sides, so at 64 rows the halo adds under a third of the
/// work, whatever the image's width.
const FEWEST_ROWS: usize = 64;

/// Rows a band of an image `width × height` takes: as many as keep its
/// planes at their fullest (5 statistics planes over the rows plus `4R`
/// beside 3 coefficient planes over the rows plus `2R`) within
/// [`BAND_BYTES`], at least [`FEWEST_ROWS`], at most the image.
pub fn band_rows(width: usize, height: usize) -> usize {
    let per_row = 8 * 3 * width * 4;
    (BAND_BYTES / per_row.max(1))
        .saturating_sub(4 * RADIUS)
        .max(FEWEST_ROWS)
        .min(height.max(1))
}

/// The most device bytes the loss's scratch takes at once for an image of
/// `width × height`: the target (as f32 at most), the image-sized
/// gradient, the window, one band's planes, and every band's partial sums
/// (kept until they are read back together).
pub fn scratch_bytes(width: usize, height: usize) -> u64 {
    let rows = band_rows(width, height);
    let row = 3 * width;
    let (r, c) = (
        (rows + 4 * RADIUS).min(height) * row,
        (rows + 2 * RADIUS).min(height) * row,
    );
    let planes = (5 * r + 3 * c).max(6 * c);
    let bands = height.div_ceil(rows).max(1);
    let partials = bands * 3 * c.div_ceil(vramfit_gauss::gpu::UNITS as usize);
    4 * (2 * height * row + TAPS as usize + planes + partials) as u64
}

/// What a step's loss left on the device and moved.
pub struct DeviceLoss {
    /// The loss.
    pub loss: f32,
    /// `∂loss/∂image`, `[H, W, 3]`.
    pub d_image: Handle,
    /// Bytes sent up (the target) and read back (the partial sums).
    pub moved: u64,
}

impl<R: Runtime> Renderer<R> {
    /// The loss of `drawn`'s image against `target` (`[H, W, 3]`, values in
    /// `[0, 1]`) and its gradient, on the device.
    pub fn loss(&self, drawn: &Drawn, target: &[f32]) -> Result<DeviceLoss, DeviceError> {
        self.loss_in_bands(drawn, target, band_rows(drawn.width, drawn.height))
    }

    /// [`Self::loss`] in bands of `rows` rows (the check's small images
    /// take several).
    pub fn loss_in_bands(&self, drawn: &Drawn, target: &[f32], rows: usize) -> Result<DeviceLoss, DeviceError> {
        let (w, h) = (drawn.width, drawn.height);
        let values = 3 * w * h;
        if target.len() != values {
            return Err(DeviceError::Unsupported(format!(
                "the target has {} values where a {w}×{h} RGB image has {values}",
                target.len()
            )));
        }
        let target = Target::from_f32(target, |bytes| self.upload_bytes(bytes));
        let window = self.upload_f32(&vramfit_gauss::ssim::window_f32());
        let d_image = self.empty(values);
        let image = Image {
            width: w,
            height: h,
            channels: 3,
        };
        let weights = Weights {
            l1: 1.0 - LAMBDA_SSIM,
            ssim: LAMBDA_SSIM,
        };
        let render = Rows {
            handle: &drawn.image,
            first_row: 0,
            rows: h,
        };
        let partials: Vec<_> = Band::all(h, rows)
            .map(|band| {
                let out = ssim::band(
                    &self.client,
                    &window,
                    render,
                    &target,
                    image,
                    &band,
                    Some(weights),
                    Some(&d_image),
                    |len| Buffer(self.empty(len)),
                );
                (out.partials, out.cubes)
            })
            .collect();
        // Every band's partial sums in one read, one wait.
        let parts: Vec<_> = partials.into_iter().map(|(b, cubes)| (b.0, 3 * cubes)).collect();
        let read = 4 * parts.iter().map(|(_, len)| *len as u64).sum::<u64>();
        let mut sums_read = vec![Vec::new(); parts.len()];
        self.read_later(&parts).append_to(&mut sums_read)?;
        let mut sums = [0.0f64; 3];
        for band in &sums_read {
            ssim::add_partials(band, &mut sums);
        }
        let n = values as f64;
        let (ssim_mean, l1) = (sums[0] / n, sums[1] / n);
        let lambda = LAMBDA_SSIM as f64;
        Ok(DeviceLoss {
            loss: ((1.0 - lambda) * l1 + lambda * (1.0 - ssim_mean)) as f32,
            d_image,
            moved: target.bytes() + read,
        })
    }
}
