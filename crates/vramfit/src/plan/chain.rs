//! Which blocks of a chain to checkpoint: the set with the least
//! recomputation whose activation peak fits a limit, found exactly by a
//! dynamic programme over the chain (in the spirit of Chen et al.'s and
//! Rotor's programmes, for the memory behaviour of vramfit's own segmented
//! backward, [`crate::activation_checkpointing`]).
//!
//! That executor keeps, from forward to backward, every activation of a
//! plain block and only the input of a checkpointed one. In backward, a
//! checkpointed block `j` is run again from its input while everything
//! before it is still held, so the chain's peak is
//! `max(total kept, max over checkpointed j of (kept before j + j's activations))`.
//! Blocks may differ (a U-Net's stages do), so each carries its own costs.
//!
//! What follows the chain (a language model's head: its logits and loss)
//! holds its own bytes at the forward's end, on top of everything the chain
//! keeps but not while a block is recomputed: the `head` term of
//! [`peak_with_head`]. Where the head is large against a block (32,000
//! logits a position against a 2,048-wide block), it, not the
//! recomputation, decides a checkpointed chain's peak.

/// What one block costs, per unit of work (per sample, say).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BlockCost {
    /// Bytes its activations hold from forward to backward when it is not checkpointed.
    pub activations: f64,
    /// Bytes it holds when it is checkpointed (its input).
    pub input: f64,
    /// Time to run its forward again in backward.
    pub recompute: f64,
}

/// The activation peak of the chain when `marks[i]` says block `i` is checkpointed.
pub fn chain_peak(blocks: &[BlockCost], marks: &[bool]) -> f64 {
    peak_with_head(blocks, marks, 0.0)
}

/// [`chain_peak`] with `head` bytes held on top of all the chain keeps at
/// the forward's end.
pub fn peak_with_head(blocks: &[BlockCost], marks: &[bool], head: f64) -> f64 {
    let (mut kept, mut peak) = (0.0_f64, 0.0_f64);
    for (b, &m) in blocks.iter().zip(marks) {
        if m {
            peak = peak.max(kept + b.activations);
            kept += b.input;
        } else {
            kept += b.activations;
        }
    }
    peak.max(kept + head)
}

/// The recomputation `marks` costs.
pub fn recompute(blocks: &[BlockCost], marks: &[bool]) -> f64 {
    blocks
        .iter()
        .zip(marks)
        .filter(|(_, m)| **m)
        .map(|(b, _)| b.recompute)
        .sum()
}

/// The marks with the least recomputation whose [`peak_with_head`] is at
/// most `limit`, or `None` when no set fits. Exact: the programme walks the chain
/// keeping, for each prefix, every (bytes kept, time) pair that no other
/// pair beats on both, which is all an optimal completion depends on.
pub fn optimal(blocks: &[BlockCost], head: f64, limit: f64) -> Option<Vec<bool>> {
    // (bytes kept so far, recomputation so far, marks so far)
    let mut states: Vec<(f64, f64, Vec<bool>)> = vec![(0.0, 0.0, Vec::with_capacity(blocks.len()))];
    for b in blocks {
        let mut next = Vec::with_capacity(states.len() * 2);
        for (kept, time, marks) in &states {
            // Plain, the block adds its activations; checkpointed, it adds
            // its input but needs its activations on top of what is kept
            // while it is recomputed. Either way `kept + activations` must
            // fit (what is kept only grows along the chain).
            if kept + b.activations > limit {
                continue;
            }
            for (mark, bytes, cost) in [(false, b.activations, 0.0), (true, b.input, b.recompute)] {
                let mut m = marks.clone();
                m.push(mark);
                next.push((kept + bytes, time + cost, m));
            }
        }
        states = pareto(next);
        if states.is_empty() {
            return None;
        }
    }
    states
        .into_iter()
        .filter(|(kept, _, _)| *kept + head <= limit)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(_, _, marks)| marks)
}

/// Keeps the states that no other state beats on both bytes and time
/// (ties: the first, which checkpoints later blocks less).
fn pareto(mut states: Vec<(f64, f64, Vec<bool>)>) -> Vec<(f64, f64, Vec<bool>)> {
    states.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut out: Vec<(f64, f64, Vec<bool>)> = Vec::with_capacity(states.len());
    for s in states {
        if out.last().is_none_or(|last| s.1 < last.1) {
            out.push(s);
        }
    }
    out
}

/// The least `limit` at which [`optimal`] finds a set: the smallest peak any
/// checkpoint set reaches.
pub fn least_peak(blocks: &[BlockCost], head: f64) -> f64 {
    // Feasibility is monotone in the limit; the answer is one of the peaks
    // of the sets the programme keeps, so bisect then snap to the found set.
    let all_plain = vec![false; blocks.len()];
    let (mut lo, mut hi) = (
        0.0_f64,
        peak_with_head(blocks, &all_plain, head).max(peak_with_head(blocks, &vec![true; blocks.len()], head)),
    );
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if optimal(blocks, head, mid).is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    optimal(blocks, head, hi).map_or(hi, |m| peak_with_head(blocks, &m, head))
}

/// Every set tried: the reference [`optimal`] is tested against (chains of
/// a few blocks only: 2ⁿ sets).
pub fn brute_force(blocks: &[BlockCost], head: f64, limit: f64) -> Option<(Vec<bool>, f64)> {
    let n = blocks.len();
    assert!(n <= 20, "brute force over {n} blocks is 2^{n} sets");
    (0u32..1 << n)
        .map(|bits| (0..n).map(|i| bits >> i & 1 == 1).collect::<Vec<bool>>())
        .filter(|m| peak_with_head(blocks, m, head) <= limit)
        .map(|m| {
            let t = recompute(blocks, &m);
            (m, t)
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic generator of chains (no dependency for a test).
    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn programme_equals_brute_force_on_chains_up_to_eight_blocks() {
        let mut seed = 7;
        let mut compared = 0;
        for n in 1..=8 {
            for _ in 0..60 {
                let blocks: Vec<BlockCost> = (0..n)
                    .map(|_| {
                        let input = 1.0 + 4.0 * lcg(&mut seed);
                        BlockCost {
                            input,
                            activations: input * (1.0 + 6.0 * lcg(&mut seed)),
                            recompute: 0.5 + 3.0 * lcg(&mut seed),
                        }
                    })
                    .collect();
                // A head of none, or up to a few blocks' activations.
                let head = [0.0, 8.0 * lcg(&mut seed)][usize::from(lcg(&mut seed) < 0.5)];
                let none = peak_with_head(&blocks, &vec![false; n], head);
                for f in [0.2, 0.35, 0.5, 0.65, 0.8, 1.0, 1.2] {
                    let limit = none * f;
                    let dp = optimal(&blocks, head, limit);
                    let brute = brute_force(&blocks, head, limit);
                    match (&dp, &brute) {
                        (None, None) => {}
                        (Some(m), Some((_, t))) => {
                            assert!(peak_with_head(&blocks, m, head) <= limit);
                            assert!(
                                (recompute(&blocks, m) - t).abs() < 1e-9,
                                "n {n}, limit {limit}: programme {} vs brute force {t}",
                                recompute(&blocks, m)
                            );
                            compared += 1;
                        }
                        _ => panic!("n {n}, limit {limit}: programme {dp:?} vs brute force {brute:?}"),
                    }
                }
            }
        }
        assert!(compared > 1500, "{compared} feasible cases compared");
    }

    #[test]
    fn uniform_chain_checkpoints_as_few_blocks_as_the_limit_needs() {
        let b = BlockCost {
            activations: 10.0,
            input: 1.0,
            recompute: 1.0,
        };
        let blocks = vec![b; 6];
        assert_eq!(optimal(&blocks, 0.0, 60.0), Some(vec![false; 6]));
        // 51 fits one checkpointed block (51 kept); 41 needs two.
        let one = optimal(&blocks, 0.0, 51.0).unwrap();
        assert_eq!(one.iter().filter(|m| **m).count(), 1);
        let two = optimal(&blocks, 0.0, 42.0).unwrap();
        assert_eq!(two.iter().filter(|m| **m).count(), 2);
        // All checkpointed: 5 inputs kept + the last block recomputed = 15.
        assert_eq!(least_peak(&blocks, 0.0), 15.0);
        assert!(optimal(&blocks, 0.0, 14.9).is_none());
    }

    #[test]
    fn a_large_head_decides_the_checkpointed_peak() {
        let b = BlockCost {
            activations: 10.0,
            input: 1.0,
            recompute: 1.0,
        };
        let blocks = vec![b; 6];
        // Six inputs kept and a head of 20 on top: 26, above the last
        // block's recomputation (5 + 10).
        assert_eq!(peak_with_head(&blocks, &[true; 6], 20.0), 26.0);
        assert_eq!(least_peak(&blocks, 20.0), 26.0);
        // The head counts where the chain ends, not during recomputation.
        assert_eq!(peak_with_head(&blocks, &[true; 6], 2.0), 15.0);
        assert_eq!(optimal(&blocks, 20.0, 80.0), Some(vec![false; 6]));
        assert!(optimal(&blocks, 20.0, 79.0).unwrap().contains(&true));
    }
}
