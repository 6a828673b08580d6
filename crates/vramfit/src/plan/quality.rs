//! Settings that cost quality (a video model's frames, a segmenter's image
//! size, an LLM's sequence tokens): the planner lowers one only where no
//! plan of the exact knobs fits at the value asked for, as little as it
//! must, and says what it gave up ("frames 100 → 64"). A run that forbids
//! it (`keep_quality`) is refused instead, with what the asked value needs.

use serde::{Deserialize, Serialize};

/// A setting that costs quality and the values it may be lowered to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QualityKnob {
    /// In words (`frames`, `image px`, `tokens`).
    pub name: String,
    /// Its setting (`task.frames`).
    pub key: String,
    /// The value asked for.
    pub asked: usize,
    /// The values below it the planner may take, ascending.
    pub lower: Vec<usize>,
}

/// What a plan gave up of a [`QualityKnob`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GivenUp {
    /// In words.
    pub name: String,
    /// Its setting.
    pub key: String,
    /// Asked for.
    pub asked: usize,
    /// Planned at.
    pub planned: usize,
}

impl std::fmt::Display for GivenUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} → {}", self.name, self.asked, self.planned)
    }
}

impl QualityKnob {
    /// The largest of the lower values at which `fits` holds, found by
    /// bisection (a plan that fits at a value fits at every smaller one:
    /// each of these settings only shrinks tensors), with what was given
    /// up; `None` where not even the smallest fits. `fits` is asked about
    /// some ⌈log₂(n + 1)⌉ of the n values.
    pub fn largest<E>(&self, mut fits: impl FnMut(usize) -> Result<bool, E>) -> Result<Option<GivenUp>, E> {
        let (mut lo, mut hi) = (0usize, self.lower.len());
        // Invariant: every value below `lo` fits; none from `hi` does.
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits(self.lower[mid])? {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo.checked_sub(1).map(|i| GivenUp {
            name: self.name.clone(),
            key: self.key.clone(),
            asked: self.asked,
            planned: self.lower[i],
        }))
    }

    /// Multiples of `step` below `asked` (at least `step`), ascending.
    pub fn multiples_below(asked: usize, step: usize) -> Vec<usize> {
        (1..).map(|k| k * step.max(1)).take_while(|&v| v < asked).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knob(asked: usize, lower: Vec<usize>) -> QualityKnob {
        QualityKnob {
            name: "frames".into(),
            key: "task.frames".into(),
            asked,
            lower,
        }
    }

    #[test]
    fn the_largest_value_that_fits_is_found_in_few_asks() {
        let k = knob(100, (1..100).collect());
        let mut asked = Vec::new();
        let given = k
            .largest::<()>(|v| {
                asked.push(v);
                Ok(v <= 64)
            })
            .unwrap()
            .unwrap();
        assert_eq!(given.planned, 64);
        assert_eq!(given.to_string(), "frames 100 → 64");
        assert!(asked.len() <= 7, "{asked:?}");
        // Nothing fits: none; everything fits: the largest lower value.
        assert_eq!(k.largest::<()>(|_| Ok(false)).unwrap(), None);
        assert_eq!(k.largest::<()>(|_| Ok(true)).unwrap().unwrap().planned, 99);
        assert_eq!(knob(10, vec![]).largest::<()>(|_| Ok(true)).unwrap(), None);
        assert_eq!(QualityKnob::multiples_below(1024, 256), vec![256, 512, 768]);
        assert_eq!(QualityKnob::multiples_below(100, 256), Vec::<usize>::new());
    }
}
