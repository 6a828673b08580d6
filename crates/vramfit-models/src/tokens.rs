//! Where an llm run's tokens come from: the synthetic task by default, or
//! the user's corpus (`--data FILE`, [`crate::corpus`]). Batches of either
//! have the same shape, so a run is planned the same with both.

use std::path::{Path, PathBuf};

use burn::prelude::*;

use crate::corpus::{Corpus, TokenizerSource};
use crate::data::{SyntheticTask, TaskConfig, TokenBatch, TokenData};

/// The tokens of a run.
#[derive(Debug, Clone)]
pub enum Tokens {
    /// Drawn from the seed.
    Synthetic(SyntheticTask),
    /// Read from a file.
    Corpus(Corpus),
}

impl Tokens {
    /// Batch `step` (1-based) of `size` samples.
    pub fn batch<B: Backend>(&self, step: u64, size: usize, device: &B::Device) -> TokenBatch<B> {
        match self {
            Self::Synthetic(task) => task.batch::<B>(step, size, device),
            Self::Corpus(corpus) => corpus.batch::<B>(step, size, device),
        }
    }
}

impl TokenData for Tokens {
    fn tokens_per_sample(&self) -> usize {
        match self {
            Self::Synthetic(t) => t.tokens_per_sample(),
            Self::Corpus(c) => c.tokens_per_sample(),
        }
    }
    fn floor(&self) -> Option<f64> {
        match self {
            Self::Synthetic(t) => t.floor(),
            Self::Corpus(_) => None,
        }
    }
}

/// The tokenizer for a text corpus: `task.tokenizer`, else the
/// `tokenizer.json` beside the checkpoint `weights` names; the EOS id from
/// the config.json beside it.
pub fn tokenizer_source(task: &TaskConfig, weights: &str) -> TokenizerSource {
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
    let eos = path
        .as_deref()
        .and_then(Path::parent)
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
    TokenizerSource { path, missing, eos }
}

/// The tokens `task` names for a model of `vocab` tokens whose checkpoint
/// is `weights` (empty: none).
pub fn open(task: &TaskConfig, vocab: usize, weights: &str) -> Result<Tokens, crate::corpus::CorpusError> {
    if task.data.is_empty() {
        return Ok(Tokens::Synthetic(SyntheticTask::new(task.clone(), vocab, 0)));
    }
    Corpus::open(task, vocab, &tokenizer_source(task, weights)).map(Tokens::Corpus)
}
