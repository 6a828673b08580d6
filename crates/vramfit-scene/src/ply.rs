//! The `.ply` layout 3DGS viewers read: one binary little-endian vertex
//! per Gaussian with `x y z`, `nx ny nz` (zero), `f_dc_0..2`, `f_rest_*`
//! channel by channel (every red coefficient, then green, then blue),
//! `opacity` (logit), `scale_0..2` (log) and `rot_0..3` (w x y z); and
//! the reader of that layout (the end of a run, for `render-scene`).

use crate::cpu::sh::coefficients;
use crate::fit::Params;

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

/// Why a `.ply` file is not Gaussians in [`encode`]'s layout.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlyError {
    /// No `end_header` line.
    #[error("no end_header line: not a binary PLY file")]
    NoEndHeader,
    /// A header that is not UTF-8.
    #[error("the header is not text")]
    HeaderNotText,
    /// Not a PLY file.
    #[error("it does not start with 'ply'")]
    NotPly,
    /// Another format than little-endian binary.
    #[error("format {0}: only binary_little_endian is read")]
    Format(String),
    /// A vertex count that is not a number.
    #[error("vertex count '{0}'")]
    VertexCount(String),
    /// An element other than vertices.
    #[error("element '{0}': only vertices are read")]
    Element(String),
    /// A property that is not a float.
    #[error("property {name} is {kind}: only float properties are read")]
    PropertyKind {
        /// The property.
        name: String,
        /// Its type.
        kind: String,
    },
    /// A header line of no known kind.
    #[error("header line '{0}' is not understood")]
    HeaderLine(String),
    /// No vertex element.
    #[error("no 'element vertex' line")]
    NoVertices,
    /// A count of SH rest values of no degree.
    #[error("{0} f_rest values: not an SH degree from 0 to 3")]
    Degree(usize),
    /// A property the Gaussians need is missing.
    #[error("no '{0}' property")]
    NoProperty(String),
    /// The body is not the vertices the header promises.
    #[error("{bytes} bytes of vertices for {vertices} vertices of {floats} floats: the file is cut or padded")]
    Length {
        /// The body's bytes.
        bytes: usize,
        /// Vertices promised.
        vertices: usize,
        /// Floats a vertex.
        floats: usize,
    },
    /// NaN or an infinity among the values.
    #[error("a value is not a finite number")]
    NotFinite,
}

/// The Gaussians of a file in [`encode`]'s layout (properties in any
/// order, all `float`); an error says what does not fit.
pub fn decode(bytes: &[u8]) -> Result<Params, PlyError> {
    let end = bytes
        .windows(11)
        .position(|w| w == b"end_header\n")
        .ok_or(PlyError::NoEndHeader)?;
    let header = std::str::from_utf8(&bytes[..end]).map_err(|_| PlyError::HeaderNotText)?;
    let mut lines = header.lines();
    if lines.next() != Some("ply") {
        return Err(PlyError::NotPly);
    }
    let (mut count, mut names) = (None, Vec::new());
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["format", "binary_little_endian", _] | [] | ["comment", ..] => {}
            ["format", other, ..] => return Err(PlyError::Format(other.to_string())),
            ["element", "vertex", n] => {
                count = Some(n.parse::<usize>().map_err(|_| PlyError::VertexCount(n.to_string()))?)
            }
            ["element", other, ..] => return Err(PlyError::Element(other.to_string())),
            ["property", "float", name] => names.push(name.to_string()),
            ["property", kind, name] => {
                return Err(PlyError::PropertyKind {
                    name: name.to_string(),
                    kind: kind.to_string(),
                });
            }
            _ => return Err(PlyError::HeaderLine(line.into())),
        }
    }
    let n = count.ok_or(PlyError::NoVertices)?;
    let rest_values = names.iter().filter(|s| s.starts_with("f_rest_")).count();
    let degree = (0..=crate::cpu::sh::MAX_DEGREE)
        .find(|d| 3 * (coefficients(*d) - 1) == rest_values)
        .ok_or(PlyError::Degree(rest_values))?;
    let column = |name: &str| {
        names
            .iter()
            .position(|s| s == name)
            .ok_or_else(|| PlyError::NoProperty(name.into()))
    };
    let body = &bytes[end + 11..];
    let per = names.len();
    if body.len() != 4 * per * n {
        return Err(PlyError::Length {
            bytes: body.len(),
            vertices: n,
            floats: per,
        });
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
        return Err(PlyError::NotFinite);
    }
    Ok(params)
}
