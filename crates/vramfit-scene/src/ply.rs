//! The `.ply` layout 3DGS viewers read: one binary little-endian vertex
//! per Gaussian with `x y z`, `nx ny nz` (zero), `f_dc_0..2`, `f_rest_*`
//! channel by channel (every red coefficient, then green, then blue),
//! `opacity` (logit), `scale_0..2` (log) and `rot_0..3` (w x y z).

use crate::cpu::sh::coefficients;
use crate::train::Params;

/// The file's bytes.
pub fn encode(p: &Params) -> Vec<u8> {
    let rest = coefficients(p.degree) - 1;
    let mut header = String::from("ply\nformat binary_little_endian 1.0\n");
    header.push_str(&format!("element vertex {}\n", p.len()));
    let mut names: Vec<String> = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        .map(String::from)
        .to_vec();
    names.extend((0..3 * rest).map(|i| format!("f_rest_{i}")));
    names.push("opacity".into());
    names.extend((0..3).map(|i| format!("scale_{i}")));
    names.extend((0..4).map(|i| format!("rot_{i}")));
    for n in &names {
        header.push_str(&format!("property float {n}\n"));
    }
    header.push_str("end_header\n");
    let mut out = header.into_bytes();
    for i in 0..p.len() {
        let mut v: Vec<f32> = p.means[3 * i..3 * i + 3].to_vec();
        v.extend([0.0; 3]);
        v.extend(&p.sh_dc[3 * i..3 * i + 3]);
        let block = &p.sh_rest[3 * rest * i..3 * rest * (i + 1)];
        // Ours is coefficient by coefficient, 3 channels each; the file's is channel by channel.
        for ch in 0..3 {
            v.extend((0..rest).map(|k| block[3 * k + ch]));
        }
        v.push(p.opacity_logits[i]);
        v.extend(&p.log_scales[3 * i..3 * i + 3]);
        v.extend(&p.rotations[4 * i..4 * i + 4]);
        debug_assert_eq!(v.len(), names.len());
        for x in v {
            out.extend(x.to_le_bytes());
        }
    }
    out
}
