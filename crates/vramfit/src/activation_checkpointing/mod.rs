//! Block activation checkpointing by segmented backward.
//!
//! A model is run as `prelude → blocks → head`. What flows between blocks
//! is a stack of tensors: one for a plain chain (a transformer), more for a
//! network with skip connections (a U-Net's encoder stages push their skips,
//! its decoder stages pop them; see [`Block::forward_stack`]). A checkpointed block runs
//! its forward without autodiff (on the inner backend) and keeps only its
//! input; in backward it is run again with autodiff from that input and
//! differentiated on its own. Consecutive blocks that are not checkpointed
//! form one segment whose graph is kept from forward to backward, as in a
//! plain step. Backward walks the segments from the head down, each time
//! feeding the gradient of the segment's output in as `sum(y · g)`, whose
//! gradient with respect to `y` is exactly `g`.
//!
//! Blocks must be deterministic (no dropout) for the recomputation to
//! reproduce the forward; the transformer of `vramfit-models` is. This
//! module must not hold tensors beyond one call.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::grads::add_into;
use crate::precision::{Autocast, cast_to};

/// Which blocks keep only their input.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CheckpointPolicy {
    /// No block: the plain step.
    #[default]
    None,
    /// Every block.
    All,
    /// Blocks 0, k, 2k, …
    Every(usize),
    /// About √n evenly spaced blocks (the classic memory/compute balance).
    Auto,
    /// The listed block indices.
    List(Vec<usize>),
}

/// A checkpoint setting that cannot be parsed or does not fit the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// The text is none of the accepted forms.
    #[error("checkpoint setting `{0}` is not one of none, all, every:K (K ≥ 1), auto, list:I,J,…")]
    Syntax(String),
    /// A listed block does not exist.
    #[error("checkpoint list names block {index}, but the model has {blocks} blocks (0..{blocks})")]
    NoSuchBlock {
        /// The listed index.
        index: usize,
        /// Blocks in the model.
        blocks: usize,
    },
}

impl CheckpointPolicy {
    /// Parses `none`, `all`, `every:K`, `auto` or `list:I,J,…`.
    pub fn parse(text: &str) -> Result<Self, CheckpointError> {
        let bad = || CheckpointError::Syntax(text.to_string());
        match text {
            "none" => return Ok(Self::None),
            "all" => return Ok(Self::All),
            "auto" => return Ok(Self::Auto),
            _ => {}
        }
        if let Some(k) = text.strip_prefix("every:") {
            let k: usize = k.parse().map_err(|_| bad())?;
            return if k == 0 { Err(bad()) } else { Ok(Self::Every(k)) };
        }
        if let Some(list) = text.strip_prefix("list:") {
            let mut out = Vec::new();
            for i in list.split(',').filter(|s| !s.is_empty()) {
                out.push(i.trim().parse().map_err(|_| bad())?);
            }
            return Ok(Self::List(out));
        }
        Err(bad())
    }

    /// The text `parse` reads back.
    pub fn name(&self) -> String {
        match self {
            Self::None => "none".into(),
            Self::All => "all".into(),
            Self::Auto => "auto".into(),
            Self::Every(k) => format!("every:{k}"),
            Self::List(l) => format!("list:{}", l.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
        }
    }

    /// For each of `blocks` blocks, whether it is checkpointed.
    pub fn plan(&self, blocks: usize) -> Result<Vec<bool>, CheckpointError> {
        let mut marks = vec![false; blocks];
        match self {
            Self::None => {}
            Self::All => marks.fill(true),
            Self::Every(k) => (0..blocks).step_by(*k).for_each(|i| marks[i] = true),
            Self::Auto => {
                let n = (blocks as f64).sqrt().round().max(1.0) as usize;
                let n = n.min(blocks);
                // n marks spread evenly, the first at block 0.
                (0..n).for_each(|j| marks[j * blocks / n] = true);
            }
            Self::List(list) => {
                for &index in list {
                    *marks
                        .get_mut(index)
                        .ok_or(CheckpointError::NoSuchBlock { index, blocks })? = true;
                }
            }
        }
        Ok(marks)
    }
}

/// A block of a chain. A plain chain passes one tensor from block to
/// block: implement [`Block::forward`]. A network with skip connections
/// passes a stack of tensors (a U-Net's encoder stage pushes its skip, its
/// decoder stage pops it): implement [`Block::forward_stack`]. Each method's
/// default calls the other, so implement at least one.
pub trait Block<B: Backend, const D: usize> {
    /// Forward under the precision policy, one tensor in and one out.
    fn forward(&self, x: Tensor<B, D>, autocast: &Autocast) -> Tensor<B, D> {
        let mut out = self.forward_stack(vec![x], autocast);
        assert_eq!(out.len(), 1, "this block changes the stack's depth: call forward_stack");
        out.remove(0)
    }

    /// Forward under the precision policy, from the stack before the block
    /// to the stack after it (by default the top tensor goes through
    /// [`Block::forward`]).
    fn forward_stack(&self, mut stack: Vec<Tensor<B, D>>, autocast: &Autocast) -> Vec<Tensor<B, D>> {
        let x = stack.pop().expect("a block's stack holds its input");
        stack.push(self.forward(x, autocast));
        stack
    }
}

/// The stack's tensors on the inner backend (no graph).
fn inner<B: AutodiffBackend, const D: usize>(stack: &[Tensor<B, D>]) -> Vec<Tensor<B::InnerBackend, D>> {
    stack.iter().map(|t| t.clone().inner()).collect()
}

/// New leaves that track gradients, one per tensor.
fn leaves<B: AutodiffBackend, const D: usize>(stack: Vec<Tensor<B::InnerBackend, D>>) -> Vec<Tensor<B, D>> {
    stack
        .into_iter()
        .map(|t| Tensor::<B, D>::from_inner(t).require_grad())
        .collect()
}

/// Runs `blocks` from `input` (the prelude's output, with its graph), the
/// `head` (which returns the scalar to differentiate, the loss already
/// multiplied by any scale), calls `forward_done` (the forward's end: what
/// is held now is what backward needs), and runs backward through
/// everything, recomputing checkpointed blocks. Returns the head's scalar
/// (detached) and the gradients of every parameter of `model` (which must
/// contain the blocks and whatever the prelude and head use).
pub fn forward_backward<B, M, N, const D: usize>(
    model: &N,
    blocks: &[M],
    checkpointed: &[bool],
    autocast: &Autocast,
    input: Vec<Tensor<B, D>>,
    head: impl FnOnce(Tensor<B, D>) -> Tensor<B, 1>,
    forward_done: impl FnOnce(),
) -> (Tensor<B::InnerBackend, 1>, GradientsParams)
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Block<B, D>,
    M::InnerModule: Block<B::InnerBackend, D>,
    N: AutodiffModule<B>,
{
    assert_eq!(blocks.len(), checkpointed.len(), "one checkpoint mark per block");
    enum Segment<B: AutodiffBackend, const D: usize> {
        /// Plain blocks: the leaves they started from and their outputs, graph kept.
        Kept {
            input: Vec<Tensor<B, D>>,
            output: Vec<Tensor<B, D>>,
        },
        /// One checkpointed block: only its input.
        Recompute {
            block: usize,
            input: Vec<Tensor<B::InnerBackend, D>>,
        },
    }
    let mut segments = Vec::new();
    let mut x = inner(&input);
    let mut i = 0;
    while i < blocks.len() {
        if checkpointed[i] {
            let y = blocks[i].valid().forward_stack(x.clone(), autocast);
            segments.push(Segment::Recompute { block: i, input: x });
            x = y;
            i += 1;
        } else {
            let leaf = leaves::<B, D>(x);
            let mut y = leaf.clone();
            while i < blocks.len() && !checkpointed[i] {
                y = blocks[i].forward_stack(y, autocast);
                i += 1;
            }
            x = inner(&y);
            segments.push(Segment::Kept { input: leaf, output: y });
        }
    }

    let mut all = GradientsParams::new();
    assert_eq!(x.len(), 1, "the last block leaves one tensor for the head");
    let leaf = leaves::<B, D>(x);
    let out = head(leaf[0].clone());
    let value = out.clone().inner();
    forward_done();
    let mut grads = out.backward();
    let mut d_x = vec![leaf[0].grad(&grads).expect("the head uses its input")];
    add_into(model, &mut all, GradientsParams::from_module(&mut grads, model));

    // Feeds `d_out` (gradients of `output`) back to `input`: backward of
    // Σ sum(y · g), whose gradient with respect to each y is exactly its g.
    let mut pull = |input: Vec<Tensor<B, D>>, output: Vec<Tensor<B, D>>, d_out: Vec<Tensor<B::InnerBackend, D>>| {
        assert_eq!(output.len(), d_out.len(), "one gradient per output");
        let total = output
            .into_iter()
            .zip(d_out)
            .map(|(y, g)| {
                let g = cast_to(g, y.dtype().into());
                // In f32: a stack may hold tensors of different types (a
                // prompt in f32 beside image tokens in bf16).
                cast_to((y * Tensor::from_inner(g)).sum(), burn::tensor::FloatDType::F32)
            })
            .reduce(|a, b| a + b)
            .expect("a stack is never empty");
        let mut grads = total.backward();
        let d_in: Vec<_> = input
            .iter()
            .map(|t| t.grad(&grads).unwrap_or_else(|| t.clone().inner().zeros_like()))
            .collect();
        add_into(model, &mut all, GradientsParams::from_module(&mut grads, model));
        d_in
    };
    for segment in segments.into_iter().rev() {
        let (input, output) = match segment {
            Segment::Kept { input, output } => (input, output),
            Segment::Recompute { block, input } => {
                let leaf = leaves::<B, D>(input);
                let y = blocks[block].forward_stack(leaf.clone(), autocast);
                (leaf, y)
            }
        };
        d_x = pull(input, output, d_x);
    }
    // The prelude: its graph is still attached to `input`.
    let _ = pull(input.clone(), input, d_x);
    (value, all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_plans() {
        assert_eq!(
            CheckpointPolicy::parse("every:2").unwrap().plan(5).unwrap(),
            [true, false, true, false, true]
        );
        assert_eq!(CheckpointPolicy::parse("all").unwrap().plan(2).unwrap(), [true, true]);
        assert_eq!(
            CheckpointPolicy::parse("none").unwrap().plan(2).unwrap(),
            [false, false]
        );
        assert_eq!(
            CheckpointPolicy::parse("list:1,3").unwrap().plan(4).unwrap(),
            [false, true, false, true]
        );
        // √9 = 3 evenly spaced marks, √16 = 4.
        assert_eq!(
            CheckpointPolicy::Auto.plan(9).unwrap().iter().filter(|&&m| m).count(),
            3
        );
        assert_eq!(
            CheckpointPolicy::Auto.plan(16).unwrap(),
            (0..16).map(|i| i % 4 == 0).collect::<Vec<_>>()
        );
        for bad in ["every:0", "every:x", "some", "list:a"] {
            assert!(CheckpointPolicy::parse(bad).is_err(), "{bad}");
        }
        let e = CheckpointPolicy::parse("list:7").unwrap().plan(4).unwrap_err();
        assert!(e.to_string().contains("block 7"), "{e}");
        for text in ["none", "all", "auto", "every:3", "list:0,2"] {
            assert_eq!(CheckpointPolicy::parse(text).unwrap().name(), text);
        }
    }
}
