//! Plain-Rust twin of the 3D renderer: the oracle that GPU kernels will be
//! tested against, and the CPU execution path. One concept a file: the
//! camera ([`camera`]), spherical harmonics ([`sh`]), projecting one
//! Gaussian to the screen ([`project`]), binning and compositing the
//! screen-space Gaussians ([`raster`]), and the two joined with their
//! backward ([`render`]).
//!
//! Where it differs from the 2D fitter: colour is view-dependent (SH),
//! each Gaussian is a 3D mean, scale and rotation seen through a pinhole
//! camera (EWA splatting, with the usual 0.3-pixel low-pass term), and the
//! pixels composite front to back by depth with early termination instead
//! of a normalised blend of the top K.

pub mod camera;
pub mod project;
pub mod raster;
pub mod render;
pub mod sh;
