//! The quality bar: bicubic upsampling of the image downsampled to as many
//! stored values as the Gaussians hold.

use image::imageops::{FilterType, resize};

use vramfit_gauss::picture::{CHANNELS, Picture, psnr, to_rgb8};

/// Bicubic baseline at equal storage.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Bicubic {
    /// Width of the downsampled image.
    pub width: u32,
    /// Height of the downsampled image.
    pub height: u32,
    /// Values it stores (width × height × 3).
    pub stored_values: usize,
    /// PSNR of its bicubic upsampling against the original, dB.
    pub psnr_db: f64,
}

/// Downsamples `p` (Catmull-Rom) to at most `values` stored values with its
/// aspect ratio, upsamples back (Catmull-Rom) and measures PSNR.
pub fn bicubic_at_equal_storage(p: &Picture, values: usize) -> Bicubic {
    let pixels = (values / CHANNELS) as f64;
    let scale = (pixels / p.pixels() as f64).sqrt().min(1.0);
    let w = ((p.width as f64 * scale).floor() as u32).max(1);
    let h = ((p.height as f64 * scale).floor() as u32).max(1);
    let original = to_rgb8(p.width, p.height, &p.data);
    let small = resize(&original, w, h, FilterType::CatmullRom);
    let back = resize(&small, p.width as u32, p.height as u32, FilterType::CatmullRom);
    let up: Vec<f32> = back.as_raw().iter().map(|&v| v as f32 / 255.0).collect();
    Bicubic {
        width: w,
        height: h,
        stored_values: (w * h) as usize * CHANNELS,
        psnr_db: psnr(&up, &p.data),
    }
}
