//! The order training windows are visited in: every window once an epoch,
//! in an order drawn afresh for each epoch from the run's seed, computed
//! from the sample's index alone. No table of the order is kept (a corpus
//! of billions of tokens has millions of windows) and nothing about the
//! position needs saving: sample `k` of the run is the same window however
//! the run was interrupted, which makes a resume exact.
//!
//! Each epoch's order is an affine map `w = (a·i + c) mod n` with `a`
//! coprime to `n`, a permutation of `0..n`. It spreads neighbours `a`
//! windows apart rather than shuffling uniformly: enough that a batch does
//! not read one stretch of text, as fine-tuning needs.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The window visited at the run's `index`-th sample, of `windows`.
pub fn window(index: u64, windows: u64, seed: u64) -> u64 {
    assert!(windows > 0, "a corpus has at least one training window");
    let epoch = index / windows;
    let i = index % windows;
    let (a, c) = epoch_map(epoch, windows, seed);
    ((a as u128 * i as u128 + c as u128) % windows as u128) as u64
}

/// The epoch's multiplier (coprime to `windows`) and offset.
fn epoch_map(epoch: u64, windows: u64, seed: u64) -> (u64, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636f_7270_7573);
    rng.set_stream(epoch);
    let c = rng.random_range(0..windows);
    let mut a = rng.random_range(0..windows).max(1);
    while gcd(a, windows) != 1 {
        a = a % windows + 1;
    }
    (a, c)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::window;

    #[test]
    fn each_epoch_visits_every_window_once_in_an_order_of_its_own() {
        for n in [1u64, 2, 7, 12, 100] {
            let epochs: Vec<Vec<u64>> = (0..3)
                .map(|e| (e * n..(e + 1) * n).map(|k| window(k, n, 5)).collect())
                .collect();
            for order in &epochs {
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "{n} windows: {order:?}");
            }
            if n >= 12 {
                assert_ne!(epochs[0], epochs[1], "epochs are ordered afresh");
            }
        }
        // Another seed, another order.
        let a: Vec<u64> = (0..100).map(|k| window(k, 100, 5)).collect();
        let b: Vec<u64> = (0..100).map(|k| window(k, 100, 6)).collect();
        assert_ne!(a, b);
    }
}
