//! A trace grown to another size: each reservation's bytes affine in a
//! count (Gaussians, samples), fitted from two traces of the same steps.

use serde::{Deserialize, Serialize};

use super::{Event, Trace};

/// Two traces of the same steps at two counts, and what lies between.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceLaw {
    /// The smaller count and its trace.
    pub low: (u64, Trace),
    /// The larger count and its trace.
    pub high: (u64, Trace),
}

/// Two traces that are not the same steps.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LawError {
    /// The counts must differ.
    #[error("the two traces were recorded at the same count ({0})")]
    SameCount(u64),
    /// The traces differ in more than sizes (another number of
    /// reservations, another order of releases).
    #[error(
        "the traces at {low} and {high} differ in structure at event {event} ({what}): \
         the steps are not the same at both counts, so sizes between them cannot be told"
    )]
    Structure {
        /// The smaller count.
        low: u64,
        /// The larger.
        high: u64,
        /// Where they part.
        event: usize,
        /// How.
        what: String,
    },
}

impl TraceLaw {
    /// The law through `a` and `b` (any order).
    pub fn fit(a: (u64, Trace), b: (u64, Trace)) -> Result<Self, LawError> {
        let (low, high) = if a.0 <= b.0 { (a, b) } else { (b, a) };
        if low.0 == high.0 {
            return Err(LawError::SameCount(low.0));
        }
        let parted = |event, what: String| LawError::Structure {
            low: low.0,
            high: high.0,
            event,
            what,
        };
        if low.1.events.len() != high.1.events.len() {
            return Err(parted(
                low.1.events.len().min(high.1.events.len()),
                format!("{} events against {}", low.1.events.len(), high.1.events.len()),
            ));
        }
        for (i, (x, y)) in low.1.events.iter().zip(&high.1.events).enumerate() {
            let same = match (x, y) {
                (Event::Reserve { persistent: p, .. }, Event::Reserve { persistent: q, .. }) => p == q,
                _ => x == y,
            };
            if !same {
                return Err(parted(i, format!("{x:?} against {y:?}")));
            }
        }
        Ok(Self { low, high })
    }

    /// The trace at `count`: each reservation's bytes on the line through
    /// its two recorded sizes, rounded to the byte (never below zero).
    pub fn at(&self, count: u64) -> Trace {
        let (n0, n1) = (self.low.0 as f64, self.high.0 as f64);
        let t = (count as f64 - n0) / (n1 - n0);
        let events = self
            .low
            .1
            .events
            .iter()
            .zip(&self.high.1.events)
            .map(|(x, y)| match (*x, *y) {
                (Event::Reserve { bytes: b0, persistent }, Event::Reserve { bytes: b1, .. }) => {
                    let bytes = if b0 == b1 {
                        b0
                    } else {
                        (b0 as f64 + (b1 as f64 - b0 as f64) * t).round().max(0.0) as u64
                    };
                    Event::Reserve { bytes, persistent }
                }
                (e, _) => e,
            })
            .collect();
        Trace { events }
    }

    /// How far the law is from `trace` recorded at `count`: the largest
    /// relative error of one reservation's bytes (an error if the steps
    /// differ).
    pub fn error_at(&self, count: u64, trace: &Trace) -> Result<f64, LawError> {
        let predicted = self.at(count);
        Self::fit((count, trace.clone()), (count + 1, predicted.clone()))?;
        Ok(predicted
            .events
            .iter()
            .zip(&trace.events)
            .filter_map(|(p, m)| match (p, m) {
                (Event::Reserve { bytes: p, .. }, Event::Reserve { bytes: m, .. }) => {
                    Some((*p as f64 - *m as f64).abs() / (*m).max(1) as f64)
                }
                _ => None,
            })
            .fold(0.0, f64::max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(n: u64) -> Trace {
        let r = |bytes| Event::Reserve {
            bytes,
            persistent: false,
        };
        Trace {
            events: vec![
                r(64),
                r(4 * n),
                r(60 * n + 4096),
                Event::Free { reserve: 1 },
                Event::Cleanup,
            ],
        }
    }

    #[test]
    fn sizes_grow_on_their_lines() {
        let law = TraceLaw::fit((2000, steps(2000)), (1000, steps(1000))).unwrap();
        assert_eq!(law.at(1_000_000), steps(1_000_000));
        assert_eq!(law.error_at(5000, &steps(5000)).unwrap(), 0.0);
        let mut off = steps(5000);
        off.events[2] = Event::Reserve {
            bytes: 60 * 5000 + 4096 + 3041,
            persistent: false,
        };
        assert!((law.error_at(5000, &off).unwrap() - 3041.0 / (60.0 * 5000.0 + 4096.0 + 3041.0)).abs() < 1e-12);
    }

    #[test]
    fn traces_of_other_steps_are_refused() {
        let mut other = steps(2000);
        other.events.push(Event::Reserve {
            bytes: 4,
            persistent: false,
        });
        let e = TraceLaw::fit((1000, steps(1000)), (2000, other)).unwrap_err();
        assert!(e.to_string().contains("5 events against 6"), "{e}");
        let mut swapped = steps(2000);
        swapped.events[3] = Event::Free { reserve: 0 };
        assert!(matches!(
            TraceLaw::fit((1000, steps(1000)), (2000, swapped)),
            Err(LawError::Structure { event: 3, .. })
        ));
        assert_eq!(TraceLaw::fit((7, steps(7)), (7, steps(7))), Err(LawError::SameCount(7)));
    }
}
