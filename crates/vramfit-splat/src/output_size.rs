//! Host memory that an output size needs, checked before anything that
//! size is allocated: a mistyped `--size` is refused with the largest size
//! of the same aspect ratio that fits, instead of swapping the machine.

use crate::SplatError;

/// Refuses `width × height` when `bytes(width, height)` exceeds
/// `available` (no check when `available` is unknown). `what` names the
/// work in the message, e.g. "rendering".
pub fn check_size(
    what: &'static str,
    width: u32,
    height: u32,
    available: Option<u64>,
    bytes: impl Fn(u32, u32) -> u64,
) -> Result<(), SplatError> {
    let Some(available) = available else {
        return Ok(());
    };
    let needed = bytes(width, height);
    if needed <= available {
        return Ok(());
    }
    let human = vramfit::profile::human_bytes;
    Err(SplatError::TooLarge {
        what,
        width,
        height,
        needed: human(needed),
        available: human(available),
        fits: largest_fitting(width, height, available, &bytes),
    })
}

/// Refuses `width × height` when its buffers exceed the memory this
/// process may take now (the least of `MemAvailable`, `ulimit -v` less
/// what is mapped, a cgroup's limit: `vramfit::files::room`).
pub fn check_size_here(
    what: &'static str,
    width: u32,
    height: u32,
    bytes: impl Fn(u32, u32) -> u64,
) -> Result<(), SplatError> {
    check_size(
        what,
        width,
        height,
        vramfit::files::room::room().map(|r| r.bytes),
        bytes,
    )
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The largest size below `width × height` with the same aspect ratio whose
/// `bytes` fit in `available`: an exact multiple of the reduced ratio where
/// one fits, else the sides scaled by one factor and rounded down.
fn largest_fitting(width: u32, height: u32, available: u64, bytes: &impl Fn(u32, u32) -> u64) -> Option<(u32, u32)> {
    let fits = |(w, h): (u32, u32)| w >= 1 && h >= 1 && bytes(w, h) <= available;
    let g = gcd(width, height);
    let (rw, rh) = (width / g, height / g);
    // Largest k < g with k·(rw, rh) fitting (bytes grow with k).
    let (mut lo, mut hi) = (0u32, g);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits((mid * rw, mid * rh)) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo >= 1 {
        return Some((lo * rw, lo * rh));
    }
    let scaled = |s: f64| ((width as f64 * s) as u32, (height as f64 * s) as u32);
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if fits(scaled(mid)) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(scaled(lo)).filter(|s| fits(*s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_fit_pass_and_others_name_the_largest_that_fits() {
        let rgb = |w: u32, h: u32| w as u64 * h as u64 * 3;
        check_size("the sample image", 1000, 1000, Some(3_000_000), rgb).unwrap();
        check_size("the sample image", 100_000, 100_000, None, rgb).unwrap();
        let err = check_size("the sample image", 100_000, 100_000, Some(3_000_000), rgb).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the sample image at 100000x100000 needs about 27.9 GiB of memory, but only 2.9 MiB is available; \
             the largest size of the same aspect ratio that fits is 1000x1000 (--size 1000x1000)"
        );
        // 16:9 keeps its exact ratio.
        let err = check_size("rendering", 1920, 1080, Some(1_000_000), rgb).unwrap_err();
        assert!(err.to_string().contains("fits is 768x432 "), "{err}");
        // Coprime sides: scaled as closely as whole pixels allow.
        let err = check_size("rendering", 1921, 1080, Some(1_000_000), rgb).unwrap_err();
        let SplatError::TooLarge { fits: Some((w, h)), .. } = err else {
            panic!("{err}")
        };
        assert!(rgb(w, h) <= 1_000_000 && rgb(w + 2, h + 1) > 1_000_000, "{w}x{h}");
        assert!(((w as f64 / h as f64) - 1921.0 / 1080.0).abs() < 0.01, "{w}x{h}");
        // Nothing fits at all.
        let err = check_size("rendering", 10, 10, Some(1), rgb).unwrap_err();
        assert!(err.to_string().contains("no smaller size"), "{err}");
    }
}
