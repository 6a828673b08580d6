//! The built-in scene: small enough for the CPU, deterministic, and made
//! by an independent renderer (a ray caster, not the splatting renderer
//! under test) so that fitting it measures the splats, not agreement with
//! themselves.
//!
//! A textured ground square with a broad sheen, a textured sphere (both
//! carry the procedural sample's content) and a glossy red sphere with a
//! specular highlight; the sheen and the highlight move with the
//! viewpoint, so that the SH degree matters. Cameras
//! circle the objects at varying heights, looking at their middle; the
//! sparse points are samples of the visible surfaces with their diffuse
//! colour, as a structure-from-motion run would give.

use image::RgbImage;

use crate::cpu::camera::Camera;
use crate::dataset::{Dataset, Point, View};

/// The scene's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    /// Views around the objects.
    pub views: usize,
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
    /// Sparse points.
    pub points: usize,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            views: 24,
            width: 96,
            height: 72,
            points: 2_000,
        }
    }
}

/// The sky behind everything.
pub const SKY: [f64; 3] = [0.55, 0.65, 0.8];
const LIGHT: [f64; 3] = [0.4, -0.5, 0.8];
const GROUND_HALF: f64 = 2.0;
const TEXTURED: ([f64; 3], f64) = ([-0.6, 0.3, 0.5], 0.5);
const GLOSSY: ([f64; 3], f64) = ([0.7, -0.35, 0.4], 0.4);
const GLOSSY_ALBEDO: [f64; 3] = [0.75, 0.2, 0.15];
/// The red sphere's highlight: strength and Phong exponent.
const SPHERE_GLOSS: (f64, i32) = (0.8, 12);
/// The ground's broad sheen: seen from every camera over much of the
/// image, it changes with the viewpoint, which SH degrees above 0 fit and
/// degree 0 cannot.
const GROUND_GLOSS: (f64, i32) = (0.35, 4);

fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

fn unit(a: [f64; 3]) -> [f64; 3] {
    let n = dot(a, a).sqrt();
    a.map(|v| v / n)
}

/// What a ray hits: distance, normal, albedo, and its gloss (specular
/// strength and Phong exponent), if any.
struct Hit {
    t: f64,
    normal: [f64; 3],
    albedo: [f64; 3],
    gloss: Option<(f64, i32)>,
}

fn texel(texture: &RgbImage, u: f64, v: f64) -> [f64; 3] {
    let (w, h) = (texture.width() as f64, texture.height() as f64);
    let x = ((u.rem_euclid(1.0)) * w).min(w - 1.0) as u32;
    let y = ((v.clamp(0.0, 1.0)) * h).min(h - 1.0) as u32;
    texture.get_pixel(x, y).0.map(|c| c as f64 / 255.0)
}

fn sphere(origin: [f64; 3], dir: [f64; 3], (centre, radius): ([f64; 3], f64)) -> Option<(f64, [f64; 3])> {
    let oc = [origin[0] - centre[0], origin[1] - centre[1], origin[2] - centre[2]];
    let b = dot(oc, dir);
    let disc = b * b - (dot(oc, oc) - radius * radius);
    if disc < 0.0 {
        return None;
    }
    let t = -b - disc.sqrt();
    (t > 1e-6).then(|| {
        let p = [origin[0] + t * dir[0], origin[1] + t * dir[1], origin[2] + t * dir[2]];
        (
            t,
            [
                (p[0] - centre[0]) / radius,
                (p[1] - centre[1]) / radius,
                (p[2] - centre[2]) / radius,
            ],
        )
    })
}

fn hit(origin: [f64; 3], dir: [f64; 3], texture: &RgbImage) -> Option<Hit> {
    let mut best: Option<Hit> = None;
    let mut keep = |h: Hit| {
        if best.as_ref().is_none_or(|b| h.t < b.t) {
            best = Some(h);
        }
    };
    if dir[2] < 0.0 {
        let t = -origin[2] / dir[2];
        let (x, y) = (origin[0] + t * dir[0], origin[1] + t * dir[1]);
        if t > 1e-6 && x.abs() <= GROUND_HALF && y.abs() <= GROUND_HALF {
            let u = (x + GROUND_HALF) / (2.0 * GROUND_HALF);
            let v = (y + GROUND_HALF) / (2.0 * GROUND_HALF);
            keep(Hit {
                t,
                normal: [0.0, 0.0, 1.0],
                albedo: texel(texture, u, v),
                gloss: Some(GROUND_GLOSS),
            });
        }
    }
    if let Some((t, n)) = sphere(origin, dir, TEXTURED) {
        let u = 0.5 + n[1].atan2(n[0]) / std::f64::consts::TAU;
        let v = n[2].clamp(-1.0, 1.0).acos() / std::f64::consts::PI;
        keep(Hit {
            t,
            normal: n,
            albedo: texel(texture, u, v),
            gloss: None,
        });
    }
    if let Some((t, n)) = sphere(origin, dir, GLOSSY) {
        keep(Hit {
            t,
            normal: n,
            albedo: GLOSSY_ALBEDO,
            gloss: Some(SPHERE_GLOSS),
        });
    }
    best
}

/// The diffuse colour of a surface point (no highlight).
fn diffuse(albedo: [f64; 3], normal: [f64; 3]) -> [f64; 3] {
    let light = unit(LIGHT);
    let shade = 0.35 + 0.65 * dot(normal, light).max(0.0);
    albedo.map(|a| (a * shade).min(1.0))
}

/// The colour seen along the ray from `origin` in unit direction `dir`.
fn shade(origin: [f64; 3], dir: [f64; 3], texture: &RgbImage) -> [f64; 3] {
    let Some(h) = hit(origin, dir, texture) else {
        return SKY;
    };
    let mut c = diffuse(h.albedo, h.normal);
    if let Some((specular, shininess)) = h.gloss {
        let light = unit(LIGHT);
        let nl = dot(h.normal, light);
        let reflected = [0, 1, 2].map(|i| 2.0 * nl * h.normal[i] - light[i]);
        let to_eye = dir.map(|v| -v);
        let highlight = specular * dot(reflected, to_eye).max(0.0).powi(shininess);
        c = c.map(|v| (v + highlight).min(1.0));
    }
    c
}

/// The camera of view `i` of `spec`.
pub fn camera(spec: &Spec, i: usize) -> Camera {
    let angle = std::f64::consts::TAU * i as f64 / spec.views as f64 + 0.3;
    let eye = [3.2 * angle.cos(), 3.2 * angle.sin(), 1.4 + 0.3 * (3.0 * angle).sin()];
    Camera::look_at(eye, [0.0, 0.0, 0.35], [0.0, 0.0, 1.0], spec.width, spec.height, 0.85)
}

/// Ray-casts view `camera` with 2×2 samples a pixel.
pub fn render(camera: &Camera, texture: &RgbImage) -> Vec<f32> {
    let origin = camera.center();
    let r = &camera.rotation;
    let mut image = Vec::with_capacity(3 * camera.width * camera.height);
    for y in 0..camera.height {
        for x in 0..camera.width {
            let mut sum = [0.0; 3];
            for (sx, sy) in [(0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75)] {
                let d_cam = [
                    (x as f64 + sx - camera.cx) / camera.fx,
                    (y as f64 + sy - camera.cy) / camera.fy,
                    1.0,
                ];
                // World direction: Rᵀ d.
                let d = unit([0, 1, 2].map(|j| r[0][j] * d_cam[0] + r[1][j] * d_cam[1] + r[2][j] * d_cam[2]));
                let c = shade(origin, d, texture);
                for ch in 0..3 {
                    sum[ch] += c[ch] / 4.0;
                }
            }
            image.extend(sum.map(|v| v as f32));
        }
    }
    image
}

/// A deterministic stream of numbers in [0, 1) (SplitMix64).
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0)
    }
}

/// Points on the surfaces (half on the ground, a quarter on each sphere,
/// above the ground), with their diffuse colour.
fn points(count: usize, texture: &RgbImage) -> Vec<Point> {
    let mut s = Stream(26);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let pick = s.next();
        let (position, albedo, normal) = if pick < 0.5 {
            let (x, y) = (
                (2.0 * s.next() - 1.0) * GROUND_HALF,
                (2.0 * s.next() - 1.0) * GROUND_HALF,
            );
            let (u, v) = (
                (x + GROUND_HALF) / (2.0 * GROUND_HALF),
                (y + GROUND_HALF) / (2.0 * GROUND_HALF),
            );
            ([x, y, 0.0], texel(texture, u, v), [0.0, 0.0, 1.0])
        } else {
            let (centre, radius) = if pick < 0.75 { TEXTURED } else { GLOSSY };
            let z = 2.0 * s.next() - 1.0;
            let phi = std::f64::consts::TAU * s.next();
            let rho = (1.0 - z * z).sqrt();
            let n = [rho * phi.cos(), rho * phi.sin(), z];
            let p = [0, 1, 2].map(|i| centre[i] + radius * n[i]);
            if p[2] < 0.02 {
                continue;
            }
            let albedo = if pick < 0.75 {
                let u = 0.5 + n[1].atan2(n[0]) / std::f64::consts::TAU;
                texel(texture, u, n[2].acos() / std::f64::consts::PI)
            } else {
                GLOSSY_ALBEDO
            };
            (p, albedo, n)
        };
        let c = diffuse(albedo, normal);
        out.push(Point {
            position,
            color: c.map(|v| (v * 255.0).round() as u8),
        });
    }
    out
}

/// The built-in scene at `spec`: views named `view_000.png`, … and points.
pub fn dataset(spec: &Spec) -> Dataset {
    let texture = vramfit_sample::procedural(256, 256);
    let views = (0..spec.views)
        .map(|i| {
            let camera = camera(spec, i);
            View {
                name: format!("view_{i:03}.png"),
                image: render(&camera, &texture),
                camera,
            }
        })
        .collect();
    Dataset {
        views,
        points: points(spec.points, &texture),
        held_out: None,
    }
}
