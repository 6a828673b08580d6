//! Images in and out: decoding with clear errors, f32 `[H, W, 3]` in
//! `[0, 1]` for fitting, PNG encoding written atomically.

use std::path::{Path, PathBuf};

use image::{ImageError, ImageFormat, ImageReader, RgbImage};

/// What can go wrong reading or writing a picture: each names the file,
/// the problem and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PictureError {
    /// The image file does not exist.
    #[error("image '{0}' does not exist; check the path")]
    Missing(PathBuf),
    /// The image file exists but could not be read.
    #[error("cannot read image '{path}': {cause}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The format is not one vramfit decodes.
    #[error("image '{path}' is in an unsupported format ({detail}); convert it to PNG or JPEG")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        detail: String,
    },
    /// The file claims a supported format but does not decode.
    #[error("image '{path}' is corrupt or truncated ({detail}); re-export or re-download it")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        detail: String,
    },
    /// The file ends before all the image its header promises (decoders
    /// would fill the rest with grey or a flat colour without a word).
    #[error("image '{path}' is corrupt or truncated ({cut}); re-export or re-download it")]
    CutShort {
        /// The file.
        path: PathBuf,
        /// How it ends short.
        cut: crate::jpeg_scan::CutShort,
    },
    /// Too small to fit.
    #[error("image is {width}×{height}; fitting needs at least {min}×{min} pixels")]
    TooSmall {
        /// Width.
        width: usize,
        /// Height.
        height: usize,
        /// Minimum side.
        min: usize,
    },
    /// Writing a picture failed, or its path cannot name one.
    #[error("cannot write '{path}': {why}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

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
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self, PictureError> {
        Ok(Self::from_rgb8(&decode_rgb8(bytes, path)?))
    }

    /// Reads and decodes a file.
    pub fn load(path: &Path) -> Result<Self, PictureError> {
        let bytes =
            vramfit::files::read::read(path, vramfit::files::read::Links::Follow).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => PictureError::Missing(path.into()),
                _ => PictureError::Unreadable {
                    path: path.into(),
                    cause: e,
                },
            })?;
        Self::decode(&bytes, path)
    }

    /// True when the image file has an alpha channel (read from its header
    /// only). Fitting uses the colour channels and ignores alpha.
    pub fn has_alpha(path: &Path) -> Result<bool, PictureError> {
        let unreadable = |cause| PictureError::Unreadable {
            path: path.into(),
            cause,
        };
        let file = vramfit::files::read::open(path, vramfit::files::read::Links::Follow).map_err(unreadable)?;
        let reader = ImageReader::new(std::io::BufReader::new(file))
            .with_guessed_format()
            .map_err(unreadable)?;
        let decoder = reader.into_decoder().map_err(|e| PictureError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
        })?;
        Ok(image::ImageDecoder::color_type(&decoder).has_alpha())
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
    pub fn check_fittable(&self) -> Result<(), PictureError> {
        if self.width < MIN_SIDE || self.height < MIN_SIDE {
            return Err(PictureError::TooSmall {
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

/// Errors unless `path` can name an output file: it must not be a
/// directory. Cheap: callers check before expensive work.
pub fn check_output_path(path: &Path) -> Result<(), PictureError> {
    if path.is_dir() {
        return Err(PictureError::Write {
            path: path.into(),
            why: "it is a directory; give a file name, e.g. DIR/out.png".into(),
        });
    }
    // PNG is what is written: another extension would misname the file.
    let png = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        return Err(PictureError::Write {
            path: path.into(),
            why: "images are written as PNG: give a name ending in .png".into(),
        });
    }
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
    {
        return Err(PictureError::Write {
            path: path.into(),
            why: "it is not a regular file (a device, pipe or socket), which writing would replace: give a file path"
                .into(),
        });
    }
    Ok(())
}

/// [`check_output_path`], and the folder the image will be written in
/// (a link's target's) there and writable, tried with a probe file that
/// is removed: for a command to call before the work that makes the image.
pub fn check_output_target(path: &Path) -> Result<(), PictureError> {
    check_output_path(path)?;
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    match vramfit::files::outputs::output_folder_problem(&target, "nothing was made") {
        None => Ok(()),
        Some(why) => Err(PictureError::Write { path: path.into(), why }),
    }
}

/// Encodes PNG to `path` atomically; a failure leaves no temporary file.
pub fn save_png(path: &Path, img: &RgbImage) -> Result<(), PictureError> {
    check_output_path(path)?;
    let write_err = |why: String| PictureError::Write { path: path.into(), why };
    let bytes = encode_png(img)?;
    vramfit::run::atomic_write(path, &bytes).map_err(|e| write_err(e.to_string()))
}

/// The PNG bytes of `img`.
pub fn encode_png(img: &RgbImage) -> Result<Vec<u8>, PictureError> {
    let mut bytes = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut bytes), ImageFormat::Png)
        .map_err(|e| PictureError::Write {
            path: "(PNG in memory)".into(),
            why: e.to_string(),
        })?;
    Ok(bytes)
}

/// Checks that PNG bytes run to their `IEND` chunk: every chunk's declared
/// length must be present.
fn png_complete(bytes: &[u8]) -> Result<(), crate::jpeg_scan::CutShort> {
    const SIGNATURE: usize = 8;
    let mut at = SIGNATURE;
    while at < bytes.len() {
        let Some(header) = bytes.get(at..at + 8) else { break };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let end = at.saturating_add(12).saturating_add(len);
        if end > bytes.len() {
            break;
        }
        if &header[4..8] == b"IEND" {
            return Ok(());
        }
        at = end;
    }
    Err(crate::jpeg_scan::CutShort::BeforeEnd {
        format: "PNG",
        bytes: bytes.len(),
        end: "end chunk (IEND)",
    })
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

/// The most bytes an image's decoder may allocate: 4 GiB holds a
/// 32768 × 32768 RGB image, beyond the 16K images the GPU path exists for
/// (the decoder's default, 512 MiB, refuses a 13,400² PNG), and a header
/// claiming more is refused before anything is allocated.
pub const MAX_DECODE_BYTES: u64 = 4 << 30;

/// Decodes PNG or JPEG bytes to 8-bit RGB; `path` names the source in errors.
pub fn decode_rgb8(bytes: &[u8], path: &Path) -> Result<RgbImage, PictureError> {
    let mut reader = ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| PictureError::Unreadable {
            path: path.into(),
            cause: e,
        })?;
    let Some(format) = reader.format() else {
        return Err(PictureError::Unsupported {
            path: path.into(),
            detail: "not a recognised image format".into(),
        });
    };
    if !matches!(format, ImageFormat::Png | ImageFormat::Jpeg) {
        return Err(PictureError::Unsupported {
            path: path.into(),
            detail: format!("{format:?}"),
        });
    }
    // The decoders fill a cut-short image's missing part with grey
    // without a word: refuse it before decoding.
    let complete = if format == ImageFormat::Png {
        png_complete(bytes)
    } else {
        crate::jpeg_scan::check(bytes)
    };
    if let Err(cut) = complete {
        return Err(PictureError::CutShort { path: path.into(), cut });
    }
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| match e {
        ImageError::Unsupported(u) => PictureError::Unsupported {
            path: path.into(),
            detail: u.to_string(),
        },
        ImageError::Limits(l) => PictureError::Unsupported {
            path: path.into(),
            detail: format!(
                "decoding it needs more than {} GiB ({l}); give a smaller image",
                MAX_DECODE_BYTES >> 30
            ),
        },
        other => PictureError::Corrupt {
            path: path.into(),
            detail: other.to_string(),
        },
    })?;
    Ok(img.to_rgb8())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(format: ImageFormat) -> Vec<u8> {
        let img = vramfit_sample::procedural(64, 48);
        let mut bytes = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut bytes), format).unwrap();
        bytes
    }

    /// A valid image larger than the decoder's default allocation limit
    /// (512 MiB: 13,400² RGB is 538.7 MB) decodes; one whose header claims
    /// more than [`MAX_DECODE_BYTES`] is refused as too large, not corrupt.
    #[test]
    fn large_images_decode_and_absurd_ones_are_refused_by_size() {
        let side = 13_400;
        let img = RgbImage::new(side, side);
        let mut bytes = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut bytes), ImageFormat::Png)
            .unwrap();
        drop(img);
        let decoded = decode_rgb8(&bytes, Path::new("big.png")).unwrap();
        assert_eq!(decoded.dimensions(), (side, side));
        drop(decoded);
        // The same stream with the header's size raised to 40,000² (4.8 GB of RGB).
        let mut claimed = bytes.clone();
        claimed[16..20].copy_from_slice(&40_000u32.to_be_bytes());
        claimed[20..24].copy_from_slice(&40_000u32.to_be_bytes());
        // The IHDR chunk's CRC-32 (IEEE) over its type and data, bit by bit.
        let crc = !claimed[12..29].iter().fold(!0u32, |mut c, &byte| {
            c ^= byte as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
            }
            c
        });
        claimed[29..33].copy_from_slice(&crc.to_be_bytes());
        let e = decode_rgb8(&claimed, Path::new("claimed.png")).unwrap_err().to_string();
        assert!(e.contains("GiB"), "{e}");
    }

    #[test]
    fn cut_short_images_are_refused_whole_ones_decoded() {
        for (format, name) in [(ImageFormat::Jpeg, "x.jpg"), (ImageFormat::Png, "x.png")] {
            let whole = encoded(format);
            let p = Picture::decode(&whole, Path::new(name)).unwrap();
            assert_eq!((p.width, p.height), (64, 48));
            // Bytes after the end marker are not a truncation.
            let mut trailing = whole.clone();
            trailing.extend_from_slice(b"\0\0trailer");
            Picture::decode(&trailing, Path::new(name)).unwrap();
            let cuts = [30, 50, 90].map(|pct| whole.len() * pct / 100);
            for cut in cuts.into_iter().chain([whole.len() - 2]) {
                let err = Picture::decode(&whole[..cut], Path::new(name)).unwrap_err();
                let msg = err.to_string();
                assert!(
                    msg.contains(name) && msg.contains("corrupt or truncated") && msg.contains("cut short"),
                    "{name} cut to {cut} of {} bytes: {msg}",
                    whole.len()
                );
            }
        }
    }

    #[test]
    fn an_alpha_channel_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let rgba = dir.path().join("rgba.png");
        let rgb = dir.path().join("rgb.png");
        image::RgbaImage::new(8, 8).save(&rgba).unwrap();
        image::RgbImage::new(8, 8).save(&rgb).unwrap();
        assert!(Picture::has_alpha(&rgba).unwrap());
        assert!(!Picture::has_alpha(&rgb).unwrap());
    }

    #[test]
    fn a_directory_is_not_an_output_file_and_nothing_is_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.png");
        std::fs::create_dir(&target).unwrap();
        let err = save_png(&target, &RgbImage::new(4, 4)).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["out.png"]);
    }
}
