//! The `.ply` layout 3DGS viewers read: one binary little-endian vertex
//! per Gaussian with `x y z`, `nx ny nz` (zero), `f_dc_0..2`, `f_rest_*`
//! channel by channel (every red coefficient, then green, then blue),
//! `opacity` (logit), `scale_0..2` (log) and `rot_0..3` (w x y z); and
//! the reader of that layout (the end of a run, for `render-scene`).

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

/// The Gaussians of a file in [`encode`]'s layout (properties in any
/// order, all `float`); an error says what does not fit.
pub fn decode(bytes: &[u8]) -> Result<Params, String> {
    let end = bytes
        .windows(11)
        .position(|w| w == b"end_header\n")
        .ok_or("no end_header line: not a binary PLY file")?;
    let header = std::str::from_utf8(&bytes[..end]).map_err(|_| "the header is not text")?;
    let mut lines = header.lines();
    if lines.next() != Some("ply") {
        return Err("it does not start with 'ply'".into());
    }
    let (mut count, mut names) = (None, Vec::new());
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["format", "binary_little_endian", _] | [] | ["comment", ..] => {}
            ["format", other, ..] => return Err(format!("format {other}: only binary_little_endian is read")),
            ["element", "vertex", n] => count = Some(n.parse::<usize>().map_err(|_| format!("vertex count '{n}'"))?),
            ["element", other, ..] => return Err(format!("element '{other}': only vertices are read")),
            ["property", "float", name] => names.push(name.to_string()),
            ["property", kind, name] => {
                return Err(format!("property {name} is {kind}: only float properties are read"));
            }
            _ => return Err(format!("header line '{line}' is not understood")),
        }
    }
    let n = count.ok_or("no 'element vertex' line")?;
    let rest_values = names.iter().filter(|s| s.starts_with("f_rest_")).count();
    let degree = (0..=crate::cpu::sh::MAX_DEGREE)
        .find(|d| 3 * (coefficients(*d) - 1) == rest_values)
        .ok_or(format!("{rest_values} f_rest values: not an SH degree from 0 to 3"))?;
    let column = |name: &str| {
        names
            .iter()
            .position(|s| s == name)
            .ok_or(format!("no '{name}' property"))
    };
    let body = &bytes[end + 11..];
    let per = names.len();
    if body.len() != 4 * per * n {
        return Err(format!(
            "{} bytes of vertices for {n} vertices of {per} floats: the file is cut or padded",
            body.len()
        ));
    }
    let value = |i: usize, c: usize| {
        let at = 4 * (i * per + c);
        f32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]])
    };
    let read = |cols: &[usize]| -> Vec<f32> { (0..n).flat_map(|i| cols.iter().map(move |&c| value(i, c))).collect() };
    let cols = |names: &[String]| names.iter().map(|s| column(s)).collect::<Result<Vec<_>, _>>();
    let rest = coefficients(degree) - 1;
    // The file's rest is channel by channel; ours coefficient by coefficient.
    let rest_cols = cols(
        &(0..rest)
            .flat_map(|k| (0..3).map(move |ch| format!("f_rest_{}", ch * rest + k)))
            .collect::<Vec<_>>(),
    )?;
    let named = |list: &[&str]| cols(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    let params = Params {
        means: read(&named(&["x", "y", "z"])?),
        log_scales: read(&named(&["scale_0", "scale_1", "scale_2"])?),
        rotations: read(&named(&["rot_0", "rot_1", "rot_2", "rot_3"])?),
        opacity_logits: read(&named(&["opacity"])?),
        sh_dc: read(&named(&["f_dc_0", "f_dc_1", "f_dc_2"])?),
        sh_rest: read(&rest_cols),
        degree,
    };
    if params.groups().iter().any(|g| g.iter().any(|v| !v.is_finite())) {
        return Err("a value is not a finite number".into());
    }
    Ok(params)
}
