//! The tiles' lists in depth order, front-to-back compositing and its
//! backward: twins of [`crate::cpu::raster`]. One cube a tile, one unit a
//! pixel (the tile is [`UNITS`] pixels).

use cubecl::prelude::*;

use vramfit_gauss::gpu::{TILE, UNITS};

use super::{MAX_ALPHA, MIN_ALPHA, MIN_TRANSMITTANCE, PROJECTED, SCREEN_GRADS};

/// Swaps entries `i < j` of `ids` when `j`'s Gaussian comes first (nearer,
/// or as near with a smaller id).
#[cube]
fn order_pair(ids: &mut Array<u32>, projected: &Array<f32>, i: usize, j: usize) {
    let a = ids[i];
    let b = ids[j];
    let da = projected[(a * PROJECTED) as usize];
    let db = projected[(b * PROJECTED) as usize];
    if da > db || (da == db && a > b) {
        ids[i] = b;
        ids[j] = a;
    }
}

/// Sorts each tile's list `ids[offsets[t]..offsets[t + 1])` by (depth, id),
/// as the CPU does: a bitonic network over the list padded to a power of
/// two, every stage ascending, so the padding (+∞) never moves and needs no
/// storage. One cube a tile; the cube's units share each stage's pairs.
/// The work is `k log² k` for `k` entries (a global radix sort would be
/// `k`; this one needs no scratch and no cross-cube step).
#[cube(launch)]
pub fn sort_tiles(offsets: &Array<u32>, ids: &mut Array<u32>, projected: &Array<f32>, tiles_x: u32) {
    let t = (CUBE_POS_Y * tiles_x + CUBE_POS_X) as usize;
    let start = offsets[t];
    let k = offsets[t + 1] - start;
    let mut p = 1u32;
    while p < k {
        p *= 2;
    }
    let pairs = p / 2;
    let mut block = 2u32;
    while block <= p {
        // Each block's first half against its second half, mirrored.
        let half = block / 2;
        let mut q = UNIT_POS;
        while q < pairs {
            let base = (q / half) * block;
            let off = q % half;
            let j = base + block - 1 - off;
            if j < k {
                order_pair(ids, projected, (start + base + off) as usize, (start + j) as usize);
            }
            q += UNITS;
        }
        sync_storage();
        // Then half-cleaners down to neighbours.
        let mut stride = half / 2;
        while stride > 0 {
            let mut q = UNIT_POS;
            while q < pairs {
                let i = (q / stride) * 2 * stride + q % stride;
                let j = i + stride;
                if j < k {
                    order_pair(ids, projected, (start + i) as usize, (start + j) as usize);
                }
                q += UNITS;
            }
            sync_storage();
            stride /= 2;
        }
        block *= 2;
    }
}

/// Composites each pixel front to back over `background`: `image[3p..]`,
/// and what the backward needs, `final_t[p]` and `walked[p]` (entries of
/// the list walked). See `cpu::raster::composite`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn composite(
    offsets: &Array<u32>,
    ids: &Array<u32>,
    projected: &Array<f32>,
    image: &mut Array<f32>,
    final_t: &mut Array<f32>,
    walked: &mut Array<u32>,
    background_r: f32,
    background_g: f32,
    background_b: f32,
    width: u32,
    height: u32,
    tiles_x: u32,
) {
    let t = (CUBE_POS_Y * tiles_x + CUBE_POS_X) as usize;
    let x = CUBE_POS_X * TILE + UNIT_POS % TILE;
    let y = CUBE_POS_Y * TILE + UNIT_POS / TILE;
    if x < width && y < height {
        let px = x as f32 + 0.5;
        let py = y as f32 + 0.5;
        let start = offsets[t];
        let end = offsets[t + 1];
        let mut transmittance = 1.0f32;
        let mut r = 0.0f32;
        let mut g = 0.0f32;
        let mut b = 0.0f32;
        let mut count = 0u32;
        let mut e = start;
        while e < end {
            let o = (ids[e as usize] * PROJECTED) as usize;
            let dx = projected[o + 1] - px;
            let dy = projected[o + 2] - py;
            let power = -0.5 * (projected[o + 3] * dx * dx + projected[o + 5] * dy * dy) - projected[o + 4] * dx * dy;
            if power <= 0.0 {
                let alpha = f32::min(projected[o + 6] * f32::exp(power), MAX_ALPHA);
                if alpha >= MIN_ALPHA {
                    let next = transmittance * (1.0 - alpha);
                    if next < MIN_TRANSMITTANCE {
                        break;
                    }
                    let weight = alpha * transmittance;
                    r += projected[o + 7] * weight;
                    g += projected[o + 8] * weight;
                    b += projected[o + 9] * weight;
                    transmittance = next;
                    count = e - start + 1;
                }
            }
            e += 1;
        }
        let pixel = (y * width + x) as usize;
        image[3 * pixel] = r + transmittance * background_r;
        image[3 * pixel + 1] = g + transmittance * background_g;
        image[3 * pixel + 2] = b + transmittance * background_b;
        final_t[pixel] = transmittance;
        walked[pixel] = count;
    }
}

/// Accumulates each Gaussian's screen gradients (see [`SCREEN_GRADS`]) for
/// `d_image`, walking each pixel's entries back to front and recovering
/// each transmittance by dividing by `1 − α`. See
/// `cpu::raster::composite_backward`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn composite_backward(
    offsets: &Array<u32>,
    ids: &Array<u32>,
    projected: &Array<f32>,
    final_t: &Array<f32>,
    walked: &Array<u32>,
    d_image: &Array<f32>,
    acc: &mut Array<Atomic<f32>>,
    background_r: f32,
    background_g: f32,
    background_b: f32,
    width: u32,
    height: u32,
    tiles_x: u32,
) {
    let t = (CUBE_POS_Y * tiles_x + CUBE_POS_X) as usize;
    let x = CUBE_POS_X * TILE + UNIT_POS % TILE;
    let y = CUBE_POS_Y * TILE + UNIT_POS / TILE;
    if x < width && y < height {
        let px = x as f32 + 0.5;
        let py = y as f32 + 0.5;
        let pixel = (y * width + x) as usize;
        let d_r = d_image[3 * pixel];
        let d_g = d_image[3 * pixel + 1];
        let d_b = d_image[3 * pixel + 2];
        let last_t = final_t[pixel];
        let d_background = background_r * d_r + background_g * d_g + background_b * d_b;
        let start = offsets[t];
        let mut transmittance = last_t;
        // The colour accumulated behind the current entry, relative to the
        // transmittance just behind it.
        let mut behind_r = 0.0f32;
        let mut behind_g = 0.0f32;
        let mut behind_b = 0.0f32;
        let mut last_alpha = 0.0f32;
        let mut last_r = 0.0f32;
        let mut last_g = 0.0f32;
        let mut last_b = 0.0f32;
        let mut e = start + walked[pixel];
        while e > start {
            e -= 1;
            let id = ids[e as usize];
            let o = (id * PROJECTED) as usize;
            let dx = projected[o + 1] - px;
            let dy = projected[o + 2] - py;
            let ca = projected[o + 3];
            let cb = projected[o + 4];
            let cc = projected[o + 5];
            let power = -0.5 * (ca * dx * dx + cc * dy * dy) - cb * dx * dy;
            if power <= 0.0 {
                let opacity = projected[o + 6];
                let gauss = f32::exp(power);
                let alpha = f32::min(opacity * gauss, MAX_ALPHA);
                if alpha >= MIN_ALPHA {
                    transmittance /= 1.0 - alpha;
                    let cr = projected[o + 7];
                    let cg = projected[o + 8];
                    let cbl = projected[o + 9];
                    behind_r = last_alpha * last_r + (1.0 - last_alpha) * behind_r;
                    behind_g = last_alpha * last_g + (1.0 - last_alpha) * behind_g;
                    behind_b = last_alpha * last_b + (1.0 - last_alpha) * behind_b;
                    last_r = cr;
                    last_g = cg;
                    last_b = cbl;
                    let a = (SCREEN_GRADS * id) as usize;
                    let weight = alpha * transmittance;
                    acc[a + 6].fetch_add(weight * d_r);
                    acc[a + 7].fetch_add(weight * d_g);
                    acc[a + 8].fetch_add(weight * d_b);
                    let mut d_alpha = (cr - behind_r) * d_r + (cg - behind_g) * d_g + (cbl - behind_b) * d_b;
                    d_alpha = d_alpha * transmittance - last_t / (1.0 - alpha) * d_background;
                    last_alpha = alpha;
                    // Clamped at MAX_ALPHA: α does not move with the opacity or the shape.
                    if opacity * gauss < MAX_ALPHA {
                        acc[a + 5].fetch_add(gauss * d_alpha);
                        let d_power = opacity * d_alpha * gauss;
                        acc[a].fetch_add(-d_power * (ca * dx + cb * dy));
                        acc[a + 1].fetch_add(-d_power * (cc * dy + cb * dx));
                        acc[a + 2].fetch_add(-d_power * 0.5 * dx * dx);
                        acc[a + 3].fetch_add(-d_power * dx * dy);
                        acc[a + 4].fetch_add(-d_power * 0.5 * dy * dy);
                    }
                }
            }
        }
    }
}
