//! Screen tiles: their side, and the binning of Gaussians' tile rectangles
//! into per-tile lists on the CPU (count, prefix sum, scatter), as the GPU
//! kernels of [`crate::gpu::binning`] do it.

/// Side of a square screen tile in pixels, in both workloads.
pub const TILE: usize = 16;

/// A Gaussian's tiles `[x0, x1) × [y0, y1)`, as `[x0, x1, y0, y1]`.
pub type TileRect = [usize; 4];

/// Per tile (row major), the indices of the Gaussians whose rectangle
/// covers it, in ascending Gaussian order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileLists {
    /// `offsets[t]..offsets[t + 1]` indexes `ids` for tile `t`.
    pub offsets: Vec<usize>,
    /// Gaussian indices, grouped by tile.
    pub ids: Vec<u32>,
}

impl TileLists {
    /// The Gaussians binned to tile `t`.
    pub fn tile(&self, t: usize) -> &[u32] {
        &self.ids[self.offsets[t]..self.offsets[t + 1]]
    }

    /// Tiles binned into.
    pub fn tiles(&self) -> usize {
        self.offsets.len() - 1
    }
}

/// Bins Gaussians into `tiles_x × tiles_y` tiles by their rectangles
/// (`None`: not drawn): count, prefix sum, scatter in Gaussian order, so
/// a tile's list is ascending and the result does not depend on threads.
pub fn bin_rects(rects: impl Iterator<Item = Option<TileRect>> + Clone, tiles_x: usize, tiles_y: usize) -> TileLists {
    let tiles = tiles_x * tiles_y;
    let mut offsets = vec![0usize; tiles + 1];
    for [x0, x1, y0, y1] in rects.clone().flatten() {
        for ty in y0..y1 {
            for tx in x0..x1 {
                offsets[ty * tiles_x + tx + 1] += 1;
            }
        }
    }
    for t in 0..tiles {
        offsets[t + 1] += offsets[t];
    }
    let mut cursor = offsets.clone();
    let mut ids = vec![0u32; offsets[tiles]];
    for (i, rect) in rects.enumerate() {
        let Some([x0, x1, y0, y1]) = rect else { continue };
        for ty in y0..y1 {
            for tx in x0..x1 {
                let t = ty * tiles_x + tx;
                ids[cursor[t]] = i as u32;
                cursor[t] += 1;
            }
        }
    }
    TileLists { offsets, ids }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_hold_each_covering_gaussian_in_order() {
        // 3 × 2 tiles; Gaussian 1 is not drawn, 3 covers nothing.
        let rects = [
            Some([0, 2, 0, 1]),
            Some([0, 3, 0, 2]),
            Some([1, 3, 0, 2]),
            Some([2, 2, 1, 1]),
        ];
        let lists = bin_rects(
            rects.iter().enumerate().map(|(i, r)| if i == 1 { None } else { *r }),
            3,
            2,
        );
        assert_eq!(lists.tiles(), 6);
        let all: Vec<&[u32]> = (0..6).map(|t| lists.tile(t)).collect();
        assert_eq!(all, [&[0][..], &[0, 2], &[2], &[], &[2], &[2]]);
        assert_eq!(lists.offsets, [0, 1, 3, 4, 4, 5, 6]);
    }
}
