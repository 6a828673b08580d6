//! A deterministic procedural test image at any size: smooth gradients,
//! hard-edged shapes, fine pixel-scale texture and text-like strokes, so
//! that benchmarks exercise every regime a fitter meets, up to 16K.

use image::RgbImage;
use rayon::prelude::*;

/// SplitMix64: a tiny fixed generator so the image never depends on a
/// library's random stream.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn unit(seed: u64) -> f32 {
    (mix(seed) >> 40) as f32 / (1u64 << 24) as f32
}

struct Shape {
    disk: bool,
    c: [f32; 2],
    r: [f32; 2],
    color: [f32; 3],
}

fn shapes() -> Vec<Shape> {
    (0..14u64)
        .map(|i| {
            let s = 1000 + i * 16;
            Shape {
                disk: i % 2 == 0,
                c: [0.05 + 0.9 * unit(s), 0.04 + 0.5 * unit(s + 1)],
                r: [0.03 + 0.09 * unit(s + 2), 0.03 + 0.09 * unit(s + 3)],
                color: [unit(s + 4), unit(s + 5), unit(s + 6)],
            }
        })
        .collect()
}

/// Distance from `p` to segment `a–b`.
fn seg_dist(p: [f32; 2], a: [f32; 2], b: [f32; 2]) -> f32 {
    let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
    let t = (((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / (dx * dx + dy * dy).max(1e-12)).clamp(0.0, 1.0);
    ((p[0] - a[0] - t * dx).powi(2) + (p[1] - a[1] - t * dy).powi(2)).sqrt()
}

/// Host bytes that generating and encoding a `width × height` sample takes
/// at its peak: the 8-bit RGB buffer and the PNG bytes (at most about as
/// many as the raw pixels).
pub fn bytes_needed(width: u32, height: u32) -> u64 {
    let raw = (width as u64).saturating_mul(height as u64).saturating_mul(3);
    raw.saturating_mul(2).saturating_add(height as u64)
}

/// Generates the image.
pub fn procedural(width: u32, height: u32) -> RgbImage {
    let (w, h) = (width as usize, height as usize);
    let shapes = shapes();
    // Glyph cells: at least 10 px tall, about 40 lines over the image height.
    let cell_h = (h as f32 / 40.0).max(10.0);
    let cell_w = cell_h * 0.65;
    let stroke = (cell_h * 0.07).max(1.0);
    let mut buf = vec![0u8; w * h * 3];
    buf.par_chunks_mut(w * 3).enumerate().for_each(|(y, row)| {
        let v = (y as f32 + 0.5) / h as f32;
        for x in 0..w {
            let u = (x as f32 + 0.5) / w as f32;
            let tau = std::f32::consts::TAU;
            let mut c = [
                0.5 + 0.35 * (tau * (0.7 * u + 0.3 * v)).sin(),
                0.25 + 0.55 * v,
                0.65 - 0.4 * u + 0.1 * (tau * 2.0 * v).cos(),
            ];
            for s in &shapes {
                let (du, dv) = ((u - s.c[0]) / s.r[0], (v - s.c[1]) / s.r[1]);
                let inside = if s.disk {
                    du * du + dv * dv <= 1.0
                } else {
                    du.abs() <= 1.0 && dv.abs() <= 1.0
                };
                if inside {
                    c = s.color;
                }
            }
            if (0.55..0.95).contains(&u) && (0.6..0.95).contains(&v) {
                // Pixel-scale texture: a 4-px checker under 6-px diagonal stripes.
                let checker = ((x / 4 + y / 4) % 2) as f32;
                let stripes = 0.5 + 0.5 * (tau * (x + y) as f32 / 6.0).sin();
                let t = 0.15 + 0.35 * checker + 0.4 * stripes;
                c = [t, 0.8 * t + 0.1, 1.0 - t];
            }
            if (0.05..0.5).contains(&u) && (0.62..0.95).contains(&v) {
                c = [0.95, 0.94, 0.9];
                let (gx, gy) = (x as f32 / cell_w, y as f32 / cell_h);
                let (cx, cy) = (gx.floor() as u64, gy.floor() as u64);
                let p = [gx.fract(), gy.fract()];
                let glyph = mix(cx.wrapping_mul(7919) ^ cy.wrapping_mul(104_729));
                // Three strokes between nodes of a 3×3 grid inside the cell.
                for k in 0..3u64 {
                    let bits = glyph >> (k * 8);
                    let node = |n: u64| [0.2 + 0.3 * (n % 3) as f32, 0.15 + 0.35 * ((n / 3) % 3) as f32];
                    let (a, b) = (node(bits & 0xf), node((bits >> 4) & 0xf));
                    if seg_dist(
                        [p[0] * cell_w, p[1] * cell_h],
                        [a[0] * cell_w, a[1] * cell_h],
                        [b[0] * cell_w, b[1] * cell_h],
                    ) <= stroke
                    {
                        c = [0.08, 0.08, 0.12];
                    }
                }
            }
            for ch in 0..3 {
                row[x * 3 + ch] = (c[ch].clamp(0.0, 1.0) * 255.0).round() as u8;
            }
        }
    });
    RgbImage::from_raw(width, height, buf).expect("buffer is [H, W, 3]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_deterministic_at_any_size() {
        for (w, h) in [(64, 48), (37, 101)] {
            let a = procedural(w, h);
            assert_eq!((a.width(), a.height()), (w, h));
            assert_eq!(a, procedural(w, h));
        }
    }

    #[test]
    fn has_flat_regions_hard_edges_and_texture() {
        let img = procedural(256, 256);
        let luma = |x: u32, y: u32| img.get_pixel(x, y).0.iter().map(|&v| v as i32).sum::<i32>();
        // Horizontal neighbour differences over the whole image.
        let diffs: Vec<i32> = (0..256)
            .flat_map(|y| (1..256).map(move |x| (x, y)))
            .map(|(x, y)| (luma(x, y) - luma(x - 1, y)).abs())
            .collect();
        let flat = diffs.iter().filter(|d| **d <= 3).count();
        let edges = diffs.iter().filter(|d| **d >= 150).count();
        assert!(flat > diffs.len() / 3, "too few smooth pixels: {flat}");
        assert!(edges > diffs.len() / 50, "too few hard edges: {edges}");
    }
}
