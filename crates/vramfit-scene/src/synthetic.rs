//! The built-in scenes: small enough for the CPU, deterministic, and made
//! by an independent renderer (a ray caster, not the splatting renderer
//! under test) so that fitting them measures the splats, not agreement
//! with themselves.
//!
//! `builtin` (the default): a textured ground square with a broad sheen,
//! a textured sphere (both carry the procedural sample's content) and a
//! glossy red sphere with a specular highlight. `builtin:glossy`: the
//! same ground, glossier, under another light, with a textured glossy
//! sphere in the middle of a ring of five coloured ones whose highlights
//! run from broad to sharp, so that view-dependent colour covers much of
//! every image: the harder case for a lower SH degree or 16-bit SH. In
//! both the sheen and the highlights move with the viewpoint, so the SH
//! degree matters. Cameras circle the objects at varying heights, looking
//! at their middle; the sparse points are samples of the visible surfaces
//! with their diffuse colour, as a structure-from-motion run would give.

use image::RgbImage;

use crate::cpu::camera::Camera;
use crate::dataset::{Dataset, Point, View};

/// Which built-in scene.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Builtin {
    /// `builtin`: a ground, a textured sphere and a glossy red one.
    #[default]
    Spheres,
    /// `builtin:glossy`: a glossier ground, a textured glossy sphere and
    /// five coloured glossy spheres.
    Glossy,
}

impl Builtin {
    /// Every built-in scene.
    pub const ALL: [Builtin; 2] = [Builtin::Spheres, Builtin::Glossy];

    /// Its name in place of a dataset folder.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Spheres => "builtin",
            Builtin::Glossy => "builtin:glossy",
        }
    }

    /// Every built-in scene's name, for messages: `builtin, builtin:glossy`.
    pub fn names() -> String {
        Builtin::ALL.map(Builtin::name).join(", ")
    }

    /// The scene a dataset name names, if it names one.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The colour behind everything (the fit's default background).
    pub fn sky(self) -> [f64; 3] {
        self.layout().sky
    }

    fn layout(self) -> &'static Layout {
        match self {
            Builtin::Spheres => &SPHERES,
            Builtin::Glossy => &GLOSSY_SCENE,
        }
    }
}

/// The scene's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    /// Which scene.
    pub scene: Builtin,
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
            scene: Builtin::Spheres,
            views: 24,
            width: 96,
            height: 72,
            points: 2_000,
        }
    }
}

/// The default scene's sky.
pub const SKY: [f64; 3] = [0.55, 0.65, 0.8];

/// What a sphere's surface shows.
enum Albedo {
    /// The procedural sample, wrapped around it.
    Textured,
    /// One colour.
    Colour([f64; 3]),
}

struct Ball {
    centre: [f64; 3],
    radius: f64,
    albedo: Albedo,
    /// Specular strength and Phong exponent, if glossy.
    gloss: Option<(f64, i32)>,
}

/// A scene: a textured ground square (half its side), its gloss, the
/// spheres, one directional light and the sky.
struct Layout {
    ground_half: f64,
    /// The ground's sheen: seen from every camera over much of the image,
    /// it changes with the viewpoint, which SH degrees above 0 fit and
    /// degree 0 cannot.
    ground_gloss: (f64, i32),
    balls: &'static [Ball],
    light: [f64; 3],
    sky: [f64; 3],
}

const SPHERES: Layout = Layout {
    ground_half: 2.0,
    ground_gloss: (0.35, 4),
    balls: &[
        Ball {
            centre: [-0.6, 0.3, 0.5],
            radius: 0.5,
            albedo: Albedo::Textured,
            gloss: None,
        },
        Ball {
            centre: [0.7, -0.35, 0.4],
            radius: 0.4,
            albedo: Albedo::Colour([0.75, 0.2, 0.15]),
            gloss: Some((0.8, 12)),
        },
    ],
    light: [0.4, -0.5, 0.8],
    sky: SKY,
};

/// A ring of five coloured spheres, highlights from broad (exponent 4) to
/// sharp (64), round a textured glossy one.
const GLOSSY_SCENE: Layout = Layout {
    ground_half: 2.0,
    ground_gloss: (0.5, 6),
    balls: &[
        Ball {
            centre: [0.0, 0.0, 0.55],
            radius: 0.55,
            albedo: Albedo::Textured,
            gloss: Some((0.5, 8)),
        },
        Ball {
            centre: [1.25, 0.0, 0.3],
            radius: 0.3,
            albedo: Albedo::Colour([0.15, 0.3, 0.8]),
            gloss: Some((0.9, 4)),
        },
        Ball {
            centre: [0.39, 1.19, 0.35],
            radius: 0.35,
            albedo: Albedo::Colour([0.2, 0.65, 0.25]),
            gloss: Some((0.85, 8)),
        },
        Ball {
            centre: [-1.01, 0.73, 0.3],
            radius: 0.3,
            albedo: Albedo::Colour([0.85, 0.65, 0.15]),
            gloss: Some((0.8, 16)),
        },
        Ball {
            centre: [-1.01, -0.73, 0.4],
            radius: 0.4,
            albedo: Albedo::Colour([0.85, 0.85, 0.85]),
            gloss: Some((0.75, 32)),
        },
        Ball {
            centre: [0.39, -1.19, 0.3],
            radius: 0.3,
            albedo: Albedo::Colour([0.55, 0.2, 0.65]),
            gloss: Some((0.9, 64)),
        },
    ],
    light: [-0.3, 0.6, 0.75],
    sky: [0.25, 0.28, 0.36],
};

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

fn hit(layout: &Layout, origin: [f64; 3], dir: [f64; 3], texture: &RgbImage) -> Option<Hit> {
    let mut best: Option<Hit> = None;
    let mut keep = |h: Hit| {
        if best.as_ref().is_none_or(|b| h.t < b.t) {
            best = Some(h);
        }
    };
    let half = layout.ground_half;
    if dir[2] < 0.0 {
        let t = -origin[2] / dir[2];
        let (x, y) = (origin[0] + t * dir[0], origin[1] + t * dir[1]);
        if t > 1e-6 && x.abs() <= half && y.abs() <= half {
            let u = (x + half) / (2.0 * half);
            let v = (y + half) / (2.0 * half);
            keep(Hit {
                t,
                normal: [0.0, 0.0, 1.0],
                albedo: texel(texture, u, v),
                gloss: Some(layout.ground_gloss),
            });
        }
    }
    for ball in layout.balls {
        if let Some((t, n)) = sphere(origin, dir, (ball.centre, ball.radius)) {
            keep(Hit {
                t,
                normal: n,
                albedo: ball.albedo_at(n, texture),
                gloss: ball.gloss,
            });
        }
    }
    best
}

impl Ball {
    /// The albedo where the outward unit normal is `n`.
    fn albedo_at(&self, n: [f64; 3], texture: &RgbImage) -> [f64; 3] {
        match self.albedo {
            Albedo::Textured => {
                let u = 0.5 + n[1].atan2(n[0]) / std::f64::consts::TAU;
                let v = n[2].clamp(-1.0, 1.0).acos() / std::f64::consts::PI;
                texel(texture, u, v)
            }
            Albedo::Colour(c) => c,
        }
    }
}

/// The diffuse colour of a surface point (no highlight).
fn diffuse(layout: &Layout, albedo: [f64; 3], normal: [f64; 3]) -> [f64; 3] {
    let light = unit(layout.light);
    let shade = 0.35 + 0.65 * dot(normal, light).max(0.0);
    albedo.map(|a| (a * shade).min(1.0))
}

/// The colour seen along the ray from `origin` in unit direction `dir`.
fn shade(layout: &Layout, origin: [f64; 3], dir: [f64; 3], texture: &RgbImage) -> [f64; 3] {
    let Some(h) = hit(layout, origin, dir, texture) else {
        return layout.sky;
    };
    let mut c = diffuse(layout, h.albedo, h.normal);
    if let Some((specular, shininess)) = h.gloss {
        let light = unit(layout.light);
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

/// Ray-casts view `camera` of `scene` with 2×2 samples a pixel.
pub fn render(scene: Builtin, camera: &Camera, texture: &RgbImage) -> Vec<f32> {
    let layout = scene.layout();
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
                let c = shade(layout, origin, d, texture);
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

/// Points on the surfaces (half on the ground, the rest shared evenly by
/// the spheres, above the ground), with their diffuse colour.
fn points(layout: &Layout, count: usize, texture: &RgbImage) -> Vec<Point> {
    let mut s = Stream(26);
    let half = layout.ground_half;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let pick = s.next();
        let (position, albedo, normal) = if pick < 0.5 {
            let (x, y) = ((2.0 * s.next() - 1.0) * half, (2.0 * s.next() - 1.0) * half);
            let (u, v) = ((x + half) / (2.0 * half), (y + half) / (2.0 * half));
            ([x, y, 0.0], texel(texture, u, v), [0.0, 0.0, 1.0])
        } else {
            // (pick - 0.5) is exact, so two spheres split at pick 0.75.
            let k = (((pick - 0.5) * 2.0 * layout.balls.len() as f64) as usize).min(layout.balls.len() - 1);
            let ball = &layout.balls[k];
            let z = 2.0 * s.next() - 1.0;
            let phi = std::f64::consts::TAU * s.next();
            let rho = (1.0 - z * z).sqrt();
            let n = [rho * phi.cos(), rho * phi.sin(), z];
            let p = [0, 1, 2].map(|i| ball.centre[i] + ball.radius * n[i]);
            if p[2] < 0.02 {
                continue;
            }
            (p, ball.albedo_at(n, texture), n)
        };
        let c = diffuse(layout, albedo, normal);
        out.push(Point {
            position,
            color: c.map(|v| (v * 255.0).round() as u8),
        });
    }
    out
}

/// The built-in scene `spec.scene` at `spec`: views named `view_000.png`, … and points.
pub fn dataset(spec: &Spec) -> Dataset {
    let texture = vramfit_sample::procedural(256, 256);
    let views = (0..spec.views)
        .map(|i| {
            let camera = camera(spec, i);
            View {
                name: format!("view_{i:03}.png"),
                image: render(spec.scene, &camera, &texture),
                camera,
            }
        })
        .collect();
    Dataset {
        notes: Vec::new(),
        views,
        points: points(spec.scene.layout(), spec.points, &texture),
        held_out: None,
    }
}
