//! Images in and out: decoding with clear errors, f32 `[H, W, 3]` in
//! `[0, 1]` for fitting, PNG encoding written atomically.

use std::path::Path;

use image::{ImageError, ImageFormat, ImageReader, RgbImage};

use crate::SplatError;

/// Smallest side a fit accepts.
pub const MIN_SIDE: usize = 4;

/// An RGB image as f32 in `[0, 1]`, row major `[H, W, 3]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Picture {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `[H, W, 3]` values.
    pub data: Vec<f32>,
}

/// Channels of every picture (RGB).
pub const CHANNELS: usize = 3;

impl Picture {
    /// Decodes PNG or JPEG bytes; `path` names the source in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self, SplatError> {
        let reader = ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| SplatError::ImageUnreadable {
                path: path.into(),
                cause: e,
            })?;
        let Some(format) = reader.format() else {
            return Err(SplatError::ImageUnsupported {
                path: path.into(),
                detail: "not a recognised image format".into(),
            });
        };
        if !matches!(format, ImageFormat::Png | ImageFormat::Jpeg) {
            return Err(SplatError::ImageUnsupported {
                path: path.into(),
                detail: format!("{format:?}"),
            });
        }
        let img = reader.decode().map_err(|e| match e {
            ImageError::Unsupported(u) => SplatError::ImageUnsupported {
                path: path.into(),
                detail: u.to_string(),
            },
            other => SplatError::ImageCorrupt {
                path: path.into(),
                detail: other.to_string(),
            },
        })?;
        Ok(Self::from_rgb8(&img.to_rgb8()))
    }

    /// Reads and decodes a file.
    pub fn load(path: &Path) -> Result<Self, SplatError> {
        let bytes = std::fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => SplatError::ImageMissing(path.into()),
            _ => SplatError::ImageUnreadable {
                path: path.into(),
                cause: e,
            },
        })?;
        Self::decode(&bytes, path)
    }

    /// Converts 8-bit RGB.
    pub fn from_rgb8(img: &RgbImage) -> Self {
        Self {
            width: img.width() as usize,
            height: img.height() as usize,
            data: img.as_raw().iter().map(|&v| v as f32 / 255.0).collect(),
        }
    }

    /// Errors unless both sides are at least [`MIN_SIDE`].
    pub fn check_fittable(&self) -> Result<(), SplatError> {
        if self.width < MIN_SIDE || self.height < MIN_SIDE {
            return Err(SplatError::ImageTooSmall {
                width: self.width,
                height: self.height,
                min: MIN_SIDE,
            });
        }
        Ok(())
    }

    /// Pixels.
    pub fn pixels(&self) -> usize {
        self.width * self.height
    }
}

/// Quantises `[H, W, 3]` f32 values (clamped to `[0, 1]`) to 8-bit RGB.
pub fn to_rgb8(width: usize, height: usize, data: &[f32]) -> RgbImage {
    let bytes = data.iter().map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8).collect();
    RgbImage::from_raw(width as u32, height as u32, bytes).expect("buffer is [H, W, 3]")
}

/// Encodes PNG to `path` atomically.
pub fn save_png(path: &Path, img: &RgbImage) -> Result<(), SplatError> {
    let write_err = |why: String| SplatError::Write { path: path.into(), why };
    let bytes = encode_png(img)?;
    vramfit::run::atomic_write(path, &bytes).map_err(|e| write_err(e.to_string()))
}

/// The PNG bytes of `img`.
pub fn encode_png(img: &RgbImage) -> Result<Vec<u8>, SplatError> {
    let mut bytes = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut bytes), ImageFormat::Png)
        .map_err(|e| SplatError::Write {
            path: "(PNG in memory)".into(),
            why: e.to_string(),
        })?;
    Ok(bytes)
}

/// Peak signal-to-noise ratio in dB of `x` (clamped to `[0, 1]`) against `y`.
pub fn psnr(x: &[f32], y: &[f32]) -> f64 {
    let mse = x
        .iter()
        .zip(y)
        .map(|(a, b)| (a.clamp(0.0, 1.0) as f64 - *b as f64).powi(2))
        .sum::<f64>()
        / x.len() as f64;
    if mse == 0.0 { f64::INFINITY } else { -10.0 * mse.log10() }
}
