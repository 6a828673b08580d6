//! Where an llm run's tokens come from: the synthetic task by default, or
//! the user's corpus (`--data FILE`, [`crate::corpus`]). Batches of either
//! have the same shape, so a run is planned the same with both.

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

/// The tokens `task` names for a model of `vocab` tokens whose checkpoint
/// is `weights` (empty: none).
pub fn open(task: &TaskConfig, vocab: usize, weights: &str) -> Result<Tokens, crate::corpus::CorpusError> {
    if task.data.is_empty() {
        return Ok(Tokens::Synthetic(SyntheticTask::new(task.clone(), vocab, 0)));
    }
    Corpus::open(task, vocab, &TokenizerSource::beside(task, weights)).map(Tokens::Corpus)
}
