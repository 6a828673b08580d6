//! A user's corpus for `vramfit train llm --data FILE`: token ids from a
//! flat binary file ([`token_file`]: nanoGPT's and llm.c's `.bin`) or text
//! and JSON lines tokenized with the checkpoint's `tokenizer.json`
//! ([`text`]), packed into windows of `task.tokens + 1` ids (inputs and
//! their next-token targets), the last `task.validation` of them held out.
//!
//! Batch `s` is a function of the step alone ([`order`]), so a resumed run
//! reads exactly the windows it would have read; the corpus's fingerprint
//! is kept in each checkpoint, and a resume over a changed corpus is
//! refused. Nothing is loaded whole: a batch reads its windows from the
//! file.

mod error;
pub mod order;
pub mod text;
pub mod token_file;

pub use error::{CorpusError, JsonLineError};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use burn::prelude::*;
use burn::tensor::TensorData;

use crate::data::{TaskConfig, TokenBatch};
use token_file::{TokenFile, Width};

/// The corpus of a run: its windows and how they are split.
#[derive(Debug, Clone)]
pub struct Corpus {
    ids: Arc<TokenFile>,
    fingerprint: String,
    path: PathBuf,
    /// Ids a sample's inputs take (the window is one more).
    tokens: usize,
    /// Windows trained on (the first ones).
    training: u64,
    /// Windows held out (the last ones).
    held_out: u64,
    /// Of the held-out windows, those an evaluation reads.
    evaluated: u64,
    seed: u64,
}

/// Where a text corpus's tokenizer is and what ends a document.
#[derive(Debug, Clone, Default)]
pub struct TokenizerSource {
    /// tokenizer.json (`None`: not found, with why in `missing`).
    pub path: Option<PathBuf>,
    /// Why there is none, for the error.
    pub missing: String,
    /// The id appended after each document, where the checkpoint names one.
    pub eos: Option<u32>,
}

impl TokenizerSource {
    /// The tokenizer for a text corpus: `task.tokenizer`, else the
    /// `tokenizer.json` beside the checkpoint `weights` names; the EOS id
    /// from the checkpoint's config.json (without a checkpoint, the one
    /// beside the tokenizer).
    pub fn beside(task: &TaskConfig, weights: &str) -> Self {
        let folder = |w: &Path| -> PathBuf {
            if w.is_dir() {
                w.to_path_buf()
            } else {
                w.parent().map(Path::to_path_buf).unwrap_or_default()
            }
        };
        let path = if !task.tokenizer.is_empty() {
            Some(PathBuf::from(&task.tokenizer))
        } else if weights.is_empty() {
            None
        } else {
            Some(folder(Path::new(weights)).join("tokenizer.json")).filter(|p| p.exists())
        };
        let missing = if weights.is_empty() {
            "no checkpoint is given (--weights), and no task.tokenizer".to_string()
        } else {
            format!("{} holds no tokenizer.json", folder(Path::new(weights)).display())
        };
        let config_folder = if weights.is_empty() {
            path.as_deref().and_then(Path::parent).map(Path::to_path_buf)
        } else {
            Some(folder(Path::new(weights)))
        };
        let eos = config_folder
            .and_then(|d| {
                vramfit::files::read::read_at_most(&d.join("config.json"), vramfit::files::read::Links::Follow, 1 << 20)
                    .ok()
            })
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|c| match c.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => n.as_u64(),
                Some(serde_json::Value::Array(a)) => a.first().and_then(|n| n.as_u64()),
                _ => None,
            })
            .and_then(|id| u32::try_from(id).ok());
        Self { path, missing, eos }
    }
}

/// Files already read in this process, by what identifies their contents:
/// the planner builds a run many times over, and a text corpus is tokenized
/// once.
type Opened = (PathBuf, Option<PathBuf>, String, u64, Option<std::time::SystemTime>);

#[allow(clippy::type_complexity)]
static OPENED: Mutex<Vec<(Opened, Arc<TokenFile>, String)>> = Mutex::new(Vec::new());

impl Corpus {
    /// The corpus `task.data` names, for a model of `vocab` tokens.
    pub fn open(task: &TaskConfig, vocab: usize, tokenizer: &TokenizerSource) -> Result<Self, CorpusError> {
        let path = PathBuf::from(&task.data);
        let (ids, fingerprint) = Self::ids(&path, task, vocab, tokenizer)?;
        let t = task.tokens as u64;
        let windows = ids.count().saturating_sub(1) / t;
        let short = |why: String| CorpusError::TooShort {
            path: path.clone(),
            why,
        };
        if windows == 0 {
            return Err(short(format!(
                "it holds {} tokens and one sample needs task.tokens + 1 = {}: give a longer corpus or lower \
                 task.tokens",
                ids.count(),
                t + 1
            )));
        }
        let held_out = if task.validation > 0.0 {
            ((windows as f64 * task.validation).round() as u64).max(1)
        } else {
            0
        };
        if held_out >= windows {
            return Err(short(format!(
                "it holds {windows} windows of {} tokens, and holding out {held_out} for validation \
                 (task.validation = {}) leaves none to train on: give a longer corpus, lower task.tokens, or set \
                 task.validation = 0",
                t + 1,
                task.validation
            )));
        }
        Ok(Self {
            ids,
            fingerprint,
            path,
            tokens: task.tokens,
            training: windows - held_out,
            held_out,
            evaluated: held_out.min(task.eval_sequences as u64),
            seed: task.seed,
        })
    }

    fn ids(
        path: &Path,
        task: &TaskConfig,
        vocab: usize,
        tokenizer: &TokenizerSource,
    ) -> Result<(Arc<TokenFile>, String), CorpusError> {
        let kind = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        let layout = match kind.as_deref() {
            Some("bin") => None,
            Some("txt" | "text") => Some(text::Layout::Plain),
            Some("jsonl") => Some(text::Layout::JsonLines),
            _ => return Err(CorpusError::UnknownKind { path: path.into() }),
        };
        let tokenizer_path = match (layout, &tokenizer.path) {
            (None, _) => None,
            (Some(_), Some(p)) => Some(p.clone()),
            (Some(_), None) => {
                return Err(CorpusError::NoTokenizer {
                    path: path.into(),
                    why: tokenizer.missing.clone(),
                });
            }
        };
        let read_err = |source| CorpusError::Read {
            path: path.into(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        let canonical = std::fs::canonicalize(path).map_err(read_err)?;
        let key: Opened = (
            canonical,
            tokenizer_path.clone(),
            format!("{}:{vocab}:{:?}", task.token_type, tokenizer.eos),
            meta.len(),
            meta.modified().ok(),
        );
        let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, ids, fingerprint)) = opened.iter().find(|(k, ..)| *k == key) {
            return Ok((ids.clone(), fingerprint.clone()));
        }
        let (ids, fingerprint) = match (layout, tokenizer_path) {
            (Some(layout), Some(tp)) => text::tokenize(path, layout, &tp, vocab, tokenizer.eos)?,
            _ => {
                let width = Width::parse(&task.token_type, vocab).ok_or_else(|| CorpusError::Layout {
                    path: path.into(),
                    why: format!(
                        "task.token_type = {:?}: give `u16`, `u32`, or nothing (u16 where the vocabulary fits)",
                        task.token_type
                    ),
                })?;
                TokenFile::open(path, width, vocab)?
            }
        };
        let ids = Arc::new(ids);
        opened.push((key, ids.clone(), fingerprint.clone()));
        Ok((ids, fingerprint))
    }

    /// Window `w` as inputs and targets.
    fn window(&self, w: u64) -> (Vec<i64>, Vec<i64>) {
        let t = self.tokens;
        let ids = self.ids.read(w * t as u64, t + 1).unwrap_or_else(|e| {
            // Checked whole when opened: only a file changed under the run
            // gets here.
            panic!(
                "{}: reading window {w}: {e}: the corpus changed while the run read it; resume the run with the \
                 file as it was",
                self.path.display()
            )
        });
        let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
        (ids[..t].to_vec(), ids[1..].to_vec())
    }

    fn batch_of<B: Backend>(&self, windows: impl Iterator<Item = u64>, device: &B::Device) -> TokenBatch<B> {
        let mut tokens = Vec::new();
        let mut targets = Vec::new();
        let mut size = 0;
        for w in windows {
            let (x, y) = self.window(w);
            tokens.extend(x);
            targets.extend(y);
            size += 1;
        }
        let t = self.tokens;
        TokenBatch {
            tokens: Tensor::from_data(TensorData::new(tokens, [size, t]), device),
            targets: Tensor::from_data(TensorData::new(targets, [size, t]), device),
            frames: None,
            video: None,
        }
    }

    /// Training batch `step` (1-based) of `size` windows.
    pub fn batch<B: Backend>(&self, step: u64, size: usize, device: &B::Device) -> TokenBatch<B> {
        let first = (step - 1) * size as u64;
        self.batch_of(
            (first..first + size as u64).map(|k| order::window(k, self.training, self.seed)),
            device,
        )
    }

    /// The held-out windows an evaluation reads, `size` at a time (each
    /// batch read when it is reached).
    pub fn held_out<'a, B: Backend>(
        &'a self,
        size: usize,
        device: &'a B::Device,
    ) -> impl Iterator<Item = TokenBatch<B>> + 'a {
        let first = self.training;
        let end = first + self.evaluated;
        (first..end)
            .step_by(size.max(1))
            .map(move |s| self.batch_of(s..(s + size as u64).min(end), device))
    }

    /// The fingerprint of the ids (and, for text, the tokenizer).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Windows trained on and held out.
    pub fn windows(&self) -> (u64, u64) {
        (self.training, self.held_out)
    }

    /// Held-out windows an evaluation reads.
    pub fn evaluated(&self) -> u64 {
        self.evaluated
    }

    /// Input tokens a sample.
    pub fn tokens_per_sample(&self) -> usize {
        self.tokens
    }

    /// Ids in the corpus.
    pub fn id_count(&self) -> u64 {
        self.ids.count()
    }
}

#[cfg(test)]
mod tests;
