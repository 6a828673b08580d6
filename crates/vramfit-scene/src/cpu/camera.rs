//! A pinhole camera in COLMAP's convention: a world point `p` is at
//! `R p + t` in the camera's frame (x right, y down, z forward), and at
//! pixel `(fx x / z + cx, fy y / z + cy)`, where the upper-left pixel's
//! centre is (0.5, 0.5).

use vramfit_gauss::tile::TILE;

/// A camera: intrinsics, image size and world-to-camera pose.
#[derive(Debug, Clone, PartialEq)]
pub struct Camera {
    /// Image width in pixels.
    pub width: usize,
    /// Image height in pixels.
    pub height: usize,
    /// Focal length along x, in pixels.
    pub fx: f64,
    /// Focal length along y, in pixels.
    pub fy: f64,
    /// Principal point, x.
    pub cx: f64,
    /// Principal point, y.
    pub cy: f64,
    /// World-to-camera rotation, row by row.
    pub rotation: [[f64; 3]; 3],
    /// World-to-camera translation.
    pub translation: [f64; 3],
}

impl Camera {
    /// The camera's centre in the world: `−Rᵀ t`.
    pub fn center(&self) -> [f64; 3] {
        let (r, t) = (&self.rotation, &self.translation);
        std::array::from_fn(|j| -(r[0][j] * t[0] + r[1][j] * t[1] + r[2][j] * t[2]))
    }

    /// A camera at `eye` looking at `target`, `up` roughly up in the
    /// picture, with horizontal field of view `fov_x` (radians) and square
    /// pixels: for synthetic scenes and tests.
    pub fn look_at(eye: [f64; 3], target: [f64; 3], up: [f64; 3], width: usize, height: usize, fov_x: f64) -> Self {
        let sub = |a: [f64; 3], b: [f64; 3]| [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
        let cross = |a: [f64; 3], b: [f64; 3]| {
            [
                a[1] * b[2] - a[2] * b[1],
                a[2] * b[0] - a[0] * b[2],
                a[0] * b[1] - a[1] * b[0],
            ]
        };
        let unit = |a: [f64; 3]| {
            let n = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
            [a[0] / n, a[1] / n, a[2] / n]
        };
        let forward = unit(sub(target, eye));
        // Image y points down (≈ −up) and x × y = z: x = down × forward.
        let right = unit(cross([-up[0], -up[1], -up[2]], forward));
        let down = cross(forward, right);
        Self::centred(width, height, fov_x, [right, down, forward], eye)
    }

    /// A camera with square pixels and the principal point at the image's
    /// centre, horizontal field of view `fov_x` (radians), world-to-camera
    /// `rotation` and centre `centre` in the world.
    pub fn centred(width: usize, height: usize, fov_x: f64, rotation: [[f64; 3]; 3], centre: [f64; 3]) -> Self {
        let translation = std::array::from_fn(|i| -(0..3).map(|j| rotation[i][j] * centre[j]).sum::<f64>());
        let f = width as f64 / (2.0 * (fov_x / 2.0).tan());
        Self {
            width,
            height,
            fx: f,
            fy: f,
            cx: width as f64 / 2.0,
            cy: height as f64 / 2.0,
            rotation,
            translation,
        }
    }

    /// Screen tiles across and down.
    /// True when point `p` (world) is in front of the camera and inside its image.
    pub fn sees(&self, p: [f64; 3]) -> bool {
        let (r, t) = (&self.rotation, &self.translation);
        let c: [f64; 3] = std::array::from_fn(|i| r[i][0] * p[0] + r[i][1] * p[1] + r[i][2] * p[2] + t[i]);
        // Behind the camera, on its plane, or not a number: not seen.
        if c[2].is_nan() || c[2] <= 1e-6 {
            return false;
        }
        let (u, v) = (self.fx * c[0] / c[2] + self.cx, self.fy * c[1] / c[2] + self.cy);
        (0.0..self.width as f64).contains(&u) && (0.0..self.height as f64).contains(&v)
    }

    pub fn tiles(&self) -> (usize, usize) {
        (self.width.div_ceil(TILE), self.height.div_ceil(TILE))
    }
}
