//! A folder of a user's images and masks for the segmenter (`task.data`):
//! `images/NAME.png|jpg` beside `masks/NAME.png`, every pair read and
//! checked before the run starts, so a bad file is refused by name and
//! nothing is written. An image is square, `task.image` pixels a side
//! (vramfit does not resize: the size decides the memory), its mask the
//! same size, grey, and binary (0 and 255, or 0 and 1). The prompt is the
//! start token and class 0 (one kind of object a folder). The last tenth of
//! the pairs (at least one, where there are two or more) is held out for
//! the Dice.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::TensorData;

use super::data::{START, SegBatch};

/// Why a folder cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    /// No `images` folder, or nothing in it.
    #[error(
        "{0}: expected a folder `images` of PNG or JPEG files and a folder `masks` with a PNG of the same name for each"
    )]
    Layout(PathBuf),
    /// An image without its mask.
    #[error("{image}: no mask for it ({expected} does not exist)")]
    NoMask {
        /// The image.
        image: PathBuf,
        /// Where its mask was looked for.
        expected: PathBuf,
    },
    /// A file that cannot be decoded.
    #[error(transparent)]
    Picture(#[from] vramfit_gauss::picture::PictureError),
    /// An image of another size than the task's.
    #[error(
        "{path} is {width}×{height} px: the segmenter reads square images of task.image = {side} px; resize it, or set task.image"
    )]
    ImageSize {
        /// The file.
        path: PathBuf,
        /// Its width.
        width: u32,
        /// Its height.
        height: u32,
        /// What the task reads.
        side: usize,
    },
    /// A mask of another size than its image.
    #[error("{path} is {width}×{height} px and its image {side}×{side}: a mask is its image's size")]
    MaskSize {
        /// The mask.
        path: PathBuf,
        /// Its width.
        width: u32,
        /// Its height.
        height: u32,
        /// The image's side.
        side: usize,
    },
    /// A mask with a value that is neither background nor object.
    #[error(
        "{path} is not a binary mask: pixel ({x}, {y}) is {value} (a mask holds 0 and 255, or 0 and 1, in every channel)"
    )]
    NotBinary {
        /// The mask.
        path: PathBuf,
        /// The pixel's column.
        x: u32,
        /// Its row.
        y: u32,
        /// Its value.
        value: String,
    },
    /// The folder could not be listed.
    #[error("{path}: {cause}")]
    Io {
        /// The folder.
        path: PathBuf,
        /// The OS's error.
        cause: std::io::Error,
    },
}

/// The pairs, decoded.
#[derive(Debug, Clone)]
pub struct Pairs {
    /// `[3, side, side]` in [0, 1], a pair each.
    images: Vec<Vec<f32>>,
    /// `[side, side]` in {0, 1}.
    masks: Vec<Vec<f32>>,
    side: usize,
    prompt: usize,
    /// Pairs held out (the last ones).
    held_out: usize,
    /// The files' names and sizes, for a resume.
    fingerprint: String,
}

impl Pairs {
    /// Reads every pair of `dir` for images of `side` px and prompts of
    /// `prompt` tokens.
    pub fn open(dir: &Path, side: usize, prompt: usize) -> Result<Self, FolderError> {
        let list = |d: &Path| -> Result<Vec<PathBuf>, FolderError> {
            let mut files: Vec<PathBuf> = std::fs::read_dir(d)
                .map_err(|cause| FolderError::Io { path: d.into(), cause })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            Ok(files)
        };
        let images_dir = dir.join("images");
        if !images_dir.is_dir() {
            return Err(FolderError::Layout(dir.into()));
        }
        let files = list(&images_dir)?;
        if files.is_empty() {
            return Err(FolderError::Layout(dir.into()));
        }
        let mut out = Pairs {
            images: Vec::new(),
            masks: Vec::new(),
            side,
            prompt,
            held_out: 0,
            fingerprint: String::new(),
        };
        let mut fingerprint = Vec::new();
        for image in files {
            let stem = image
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            let mask = dir.join("masks").join(format!("{stem}.png"));
            if !mask.is_file() {
                return Err(FolderError::NoMask { image, expected: mask });
            }
            let mut read = |p: &Path| -> Result<image::RgbImage, FolderError> {
                let bytes = std::fs::read(p).map_err(|cause| FolderError::Io { path: p.into(), cause })?;
                fingerprint.push(format!("{}:{}", p.display(), bytes.len()));
                Ok(vramfit_gauss::picture::decode_rgb8(&bytes, p)?)
            };
            let rgb = read(&image)?;
            if (rgb.width() as usize, rgb.height() as usize) != (side, side) {
                return Err(FolderError::ImageSize {
                    path: image,
                    width: rgb.width(),
                    height: rgb.height(),
                    side,
                });
            }
            let m = read(&mask)?;
            if (m.width() as usize, m.height() as usize) != (side, side) {
                return Err(FolderError::MaskSize {
                    path: mask,
                    width: m.width(),
                    height: m.height(),
                    side,
                });
            }
            // 0/255 or 0/1, the same in every channel.
            let top = if m.pixels().any(|p| p.0.iter().any(|&v| v > 1)) {
                255
            } else {
                1
            };
            let mut values = Vec::with_capacity(side * side);
            for (x, y, p) in m.enumerate_pixels() {
                let [r, g, b] = p.0;
                if r != g || g != b || (r != 0 && r != top) {
                    return Err(FolderError::NotBinary {
                        path: mask,
                        x,
                        y,
                        value: format!("({r}, {g}, {b})"),
                    });
                }
                values.push(if r == 0 { 0.0 } else { 1.0 });
            }
            let mut planes = vec![0f32; 3 * side * side];
            for (i, p) in rgb.pixels().enumerate() {
                for c in 0..3 {
                    planes[c * side * side + i] = p.0[c] as f32 / 255.0;
                }
            }
            out.images.push(planes);
            out.masks.push(values);
        }
        let n = out.images.len();
        out.held_out = if n >= 2 { (n / 10).max(1) } else { 0 };
        out.fingerprint = fingerprint.join(";");
        Ok(out)
    }

    /// Pairs read.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// Whether none were read (never: `open` refuses an empty folder).
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// The files' names and sizes.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Batch `step` of `size` training pairs, in order, wrapping around;
    /// `held_out`: of the held-out pairs instead (all of them where there
    /// are none: a folder of one pair).
    pub fn batch<B: Backend>(&self, step: u64, size: usize, held_out: bool, device: &B::Device) -> SegBatch<B> {
        let n = self.images.len();
        let (first, count) = match (held_out, self.held_out) {
            (true, 0) | (false, 0) => (0, n),
            (true, h) => (n - h, h),
            (false, h) => (0, n - h),
        };
        let s = self.side;
        let (mut images, mut masks, mut prompts) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..size {
            let k = first + ((step.saturating_sub(1) as usize).wrapping_mul(size).wrapping_add(i)) % count;
            images.extend_from_slice(&self.images[k]);
            masks.extend_from_slice(&self.masks[k]);
            let mut prompt = vec![0i64; self.prompt];
            prompt[0] = START as i64;
            if self.prompt > 1 {
                prompt[1] = 2;
            }
            prompts.extend(prompt);
        }
        SegBatch {
            images: Tensor::from_data(TensorData::new(images, [size, 3, s, s]), device),
            masks: Tensor::from_data(TensorData::new(masks, [size, 1, s, s]), device),
            prompts: Tensor::from_data(TensorData::new(prompts, [size, self.prompt]), device),
        }
    }

    /// Held-out pairs (all of them for a folder of one).
    pub fn held_out(&self) -> usize {
        if self.held_out == 0 {
            self.images.len()
        } else {
            self.held_out
        }
    }
}
