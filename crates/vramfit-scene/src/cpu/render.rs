//! A whole scene through a camera: every Gaussian projected
//! ([`super::project`]), binned and composited ([`super::raster`]), and
//! the backward from the image to every parameter.

use super::camera::Camera;
use super::project::{Gaussian, Projected, project, project_backward};
use super::raster::{Bins, Kept, bin, composite, composite_backward};
use super::sh::{MAX_DEGREE, coefficients};
use vramfit_gauss::Real;

/// A scene's Gaussians as parameter arrays (one row per Gaussian), in the
/// groups a run's memory report names.
#[derive(Debug, Clone, Copy)]
pub struct Scene<'a, F> {
    /// Means, 3 a Gaussian.
    pub means: &'a [F],
    /// Log scales, 3 a Gaussian.
    pub log_scales: &'a [F],
    /// Rotation quaternions (w, x, y, z), 4 a Gaussian.
    pub rotations: &'a [F],
    /// Opacity logits, 1 a Gaussian.
    pub opacity_logits: &'a [F],
    /// Degree-0 SH coefficients, 3 a Gaussian.
    pub sh_dc: &'a [F],
    /// The other SH coefficients, `3 · ((degree + 1)² − 1)` a Gaussian.
    pub sh_rest: &'a [F],
    /// SH degree, 0 to 3.
    pub degree: usize,
}

/// Floats a Gaussian holds in each group, in [`Scene`]'s order, at SH
/// `degree`: the one table of the groups' widths.
pub fn group_widths(degree: usize) -> [usize; 6] {
    [3, 3, 4, 1, 3, 3 * (coefficients(degree) - 1)]
}

impl<'a, F: Real> Scene<'a, F> {
    /// Gaussians.
    pub fn len(&self) -> usize {
        self.opacity_logits.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.opacity_logits.is_empty()
    }

    /// SH "rest" values a Gaussian holds.
    pub fn rest_per_gaussian(&self) -> usize {
        self.widths()[5]
    }

    /// Floats a Gaussian holds in each group ([`group_widths`]).
    pub fn widths(&self) -> [usize; 6] {
        group_widths(self.degree)
    }

    /// Panics with the group's name when an array's length does not fit
    /// the number of Gaussians (a programming error, not bad input).
    fn check(&self) {
        assert!(
            self.degree <= MAX_DEGREE,
            "SH degree {} is above {MAX_DEGREE}",
            self.degree
        );
        let n = self.len();
        for (name, len, per) in [
            ("means", self.means.len(), 3),
            ("log_scales", self.log_scales.len(), 3),
            ("rotations", self.rotations.len(), 4),
            ("sh_dc", self.sh_dc.len(), 3),
            ("sh_rest", self.sh_rest.len(), self.rest_per_gaussian()),
        ] {
            assert_eq!(len, n * per, "{name}: {len} values for {n} Gaussians of {per}");
        }
    }

    fn gaussian(&self, i: usize) -> Gaussian<'a, F> {
        let r = self.rest_per_gaussian();
        Gaussian {
            mean: std::array::from_fn(|k| self.means[3 * i + k]),
            log_scale: std::array::from_fn(|k| self.log_scales[3 * i + k]),
            rotation: std::array::from_fn(|k| self.rotations[4 * i + k]),
            opacity_logit: self.opacity_logits[i],
            sh_dc: &self.sh_dc[3 * i..3 * i + 3],
            sh_rest: &self.sh_rest[r * i..r * (i + 1)],
        }
    }
}

/// A rendered view and what its backward needs.
#[derive(Debug, Clone)]
pub struct Rendered<F> {
    /// The image, row by row, 3 channels a pixel.
    pub image: Vec<F>,
    /// Each Gaussian on the screen (`None`: not drawn).
    pub projected: Vec<Option<Projected<F>>>,
    /// The tiles' depth-ordered lists.
    pub bins: Bins,
    /// Per pixel, the final transmittance and the entries walked.
    pub kept: Kept<F>,
}

/// Renders `scene` through `camera` over `background`.
pub fn render<F: Real>(scene: &Scene<F>, camera: &Camera, background: [F; 3]) -> Rendered<F> {
    scene.check();
    let projected: Vec<Option<Projected<F>>> = (0..scene.len())
        .map(|i| project(&scene.gaussian(i), scene.degree, camera))
        .collect();
    let bins = bin(&projected, camera);
    let (image, kept) = composite(&projected, &bins, camera, background);
    Rendered {
        image,
        projected,
        bins,
        kept,
    }
}

/// Gradients with respect to every parameter array of a [`Scene`].
#[derive(Debug, Clone, PartialEq)]
pub struct SceneGrads<F> {
    /// Means.
    pub means: Vec<F>,
    /// Log scales.
    pub log_scales: Vec<F>,
    /// Rotations.
    pub rotations: Vec<F>,
    /// Opacity logits.
    pub opacity_logits: Vec<F>,
    /// Degree-0 SH.
    pub sh_dc: Vec<F>,
    /// The other SH.
    pub sh_rest: Vec<F>,
    /// The gradient with respect to each Gaussian's screen mean (x, y in
    /// pixels; zero where not drawn): what densification reads.
    pub screen_means: Vec<F>,
}

impl<F> SceneGrads<F> {
    /// The parameter groups' gradients, in the order of [`Scene`]'s fields.
    pub fn groups(&self) -> [&Vec<F>; 6] {
        [
            &self.means,
            &self.log_scales,
            &self.rotations,
            &self.opacity_logits,
            &self.sh_dc,
            &self.sh_rest,
        ]
    }
}

/// The backward of [`render`] for a gradient `d_image` on its image.
pub fn render_backward<F: Real>(
    scene: &Scene<F>,
    camera: &Camera,
    background: [F; 3],
    rendered: &Rendered<F>,
    d_image: &[F],
) -> SceneGrads<F> {
    scene.check();
    assert_eq!(d_image.len(), rendered.image.len(), "the image gradient's size");
    let screen = composite_backward(
        &rendered.projected,
        &rendered.bins,
        camera,
        background,
        &rendered.kept,
        d_image,
    );
    let n = scene.len();
    let r = scene.rest_per_gaussian();
    let zero = F::zero();
    let mut out = SceneGrads {
        means: vec![zero; 3 * n],
        log_scales: vec![zero; 3 * n],
        rotations: vec![zero; 4 * n],
        opacity_logits: vec![zero; n],
        sh_dc: vec![zero; 3 * n],
        sh_rest: vec![zero; r * n],
        screen_means: vec![zero; 2 * n],
    };
    for (i, d) in screen.iter().enumerate() {
        if rendered.projected[i].is_none() {
            continue;
        }
        let g = project_backward(
            &scene.gaussian(i),
            scene.degree,
            camera,
            d,
            &mut out.sh_dc[3 * i..3 * i + 3],
            &mut out.sh_rest[r * i..r * (i + 1)],
        );
        out.means[3 * i..3 * i + 3].copy_from_slice(&g.mean);
        out.log_scales[3 * i..3 * i + 3].copy_from_slice(&g.log_scale);
        out.rotations[4 * i..4 * i + 4].copy_from_slice(&g.rotation);
        out.opacity_logits[i] = g.opacity_logit;
        out.screen_means[2 * i..2 * i + 2].copy_from_slice(&d.mean);
    }
    out
}
