//! The scene workload: 3D Gaussian splatting with view-dependent colour in
//! spherical harmonics (3DGS), the system whose memory was studied most
//! closely. Built as the 2D fitter was: a CPU twin of the renderer first
//! ([`cpu`]), generic over the float type so that its backward is proven
//! against finite differences in f64; the CubeCL kernels, the training
//! loop and the data formats come on top of it.

pub mod cpu;
