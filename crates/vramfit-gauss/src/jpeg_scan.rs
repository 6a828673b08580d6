//! Whether a JPEG holds all the image its header promises. Two checks on
//! the bytes, before any decoding: the data must run to its end-of-image
//! marker (`FF D9`), and in a sequential Huffman JPEG (SOF0, SOF1: what
//! cameras and encoders write by default) every scan must hold every block
//! of 8×8 coefficients its frame promises. The second catches a file cut
//! short and given its end marker back: decoders fill the missing blocks
//! with a flat colour without a word. The blocks are counted by walking
//! the Huffman codes (the coefficients' bits are skipped, not decoded).
//! A progressive JPEG sends the coefficients over several scans, each a
//! band of them at some bit precision: there every coefficient of every
//! component must arrive at full precision, or the file stopped before its
//! last scans (a cut inside the last scan present is not seen). What the
//! walk cannot judge (arithmetic-coded scans, a table the file does not
//! define, an invalid code) is left to the decoder: only a file that
//! definitely ends early is refused.

const SOI_LEN: usize = 2;
const EOI: u8 = 0xD9;
const SOS: u8 = 0xDA;
const DHT: u8 = 0xC4;
const DRI: u8 = 0xDD;
/// Baseline and extended sequential, Huffman-coded.
const SEQUENTIAL: [u8; 2] = [0xC0, 0xC1];
/// Progressive, Huffman- or arithmetic-coded (and their differential kinds).
const PROGRESSIVE: [u8; 4] = [0xC2, 0xC6, 0xCA, 0xCE];

/// How an image file ends before all the image its header promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CutShort {
    /// The data stops before the format's end marker.
    #[error("the {format} data stops after {bytes} bytes, before its {end}: the file is cut short")]
    BeforeEnd {
        /// PNG or JPEG.
        format: &'static str,
        /// The bytes there are.
        bytes: usize,
        /// The marker missing, in words.
        end: &'static str,
    },
    /// A progressive JPEG's scans stop before a coefficient arrived at
    /// full precision.
    #[error(
        "its progressive scans end before the image is complete (component {component}, coefficient {coefficient} \
         {}): a file cut short and closed again (or written by a scan script that stops short of full precision); \
         the rest would be decoded coarse or flat, so re-export it",
        match .sent_to { None => "never sent".to_string(), Some(al) => format!("sent to bit {al} only") }
    )]
    Scans {
        /// The component's id.
        component: u8,
        /// The first coefficient short of full precision.
        coefficient: usize,
        /// The lowest bit it arrived at (none: never sent).
        sent_to: Option<u8>,
    },
    /// A sequential JPEG's scan holds fewer blocks than its frame promises.
    #[error(
        "its image data ends after {blocks} of the {promised} blocks its header promises (a file cut short and \
         closed again): the rest would be decoded as a flat colour"
    )]
    Blocks {
        /// The blocks there are.
        blocks: usize,
        /// The blocks the frame promises.
        promised: usize,
    },
}

/// What a progressive JPEG's scans have sent: per component, per
/// coefficient, the lowest bit position (`Al`) it arrived at.
struct Coverage {
    components: Vec<(u8, [Option<u8>; 64])>,
}

impl Coverage {
    fn new(ids: impl Iterator<Item = u8>) -> Self {
        Self {
            components: ids.map(|id| (id, [None; 64])).collect(),
        }
    }

    /// An SOS header: its components, the band `Ss..=Se` and the bit
    /// position `Al` it brings them to.
    fn add(&mut self, body: &[u8]) {
        let n = body.first().copied().unwrap_or(0) as usize;
        let Some(&[ss, se, a]) = body.get(1 + 2 * n..4 + 2 * n) else {
            return;
        };
        let (ss, se, al) = (ss as usize, (se as usize).min(63), a & 15);
        for i in 0..n {
            let Some(&id) = body.get(1 + 2 * i) else { return };
            if let Some((_, bits)) = self.components.iter_mut().find(|(c, _)| *c == id) {
                for b in bits.iter_mut().take(se + 1).skip(ss) {
                    *b = Some(b.map_or(al, |was| was.min(al)));
                }
            }
        }
    }

    fn complete(&self) -> Result<(), CutShort> {
        for (id, bits) in &self.components {
            if let Some(k) = bits.iter().position(|b| *b != Some(0)) {
                return Err(CutShort::Scans {
                    component: *id,
                    coefficient: k,
                    sent_to: bits[k],
                });
            }
        }
        Ok(())
    }
}

/// Checks `bytes` (a JPEG); the error says what is missing.
pub(crate) fn check(bytes: &[u8]) -> Result<(), CutShort> {
    let cut = || CutShort::BeforeEnd {
        format: "JPEG",
        bytes: bytes.len(),
        end: "end-of-image marker (FF D9)",
    };
    let standalone = |m: u8| matches!(m, 0x01 | 0xD0..=0xD8);
    let mut tables: [[Option<Huffman>; 4]; 2] = Default::default();
    let mut frame: Option<Frame> = None;
    let mut coverage: Option<Coverage> = None;
    let mut restart = 0usize;
    let mut at = SOI_LEN;
    loop {
        // Next marker: 0xFF (fill bytes allowed), then a code.
        while at < bytes.len() && bytes[at] != 0xFF {
            at += 1;
        }
        while at < bytes.len() && bytes[at] == 0xFF {
            at += 1;
        }
        let Some(&marker) = bytes.get(at) else {
            return Err(cut());
        };
        at += 1;
        if marker == EOI {
            return match &coverage {
                Some(c) => c.complete(),
                None => Ok(()),
            };
        }
        if standalone(marker) {
            continue;
        }
        let Some(len) = bytes.get(at..at + 2) else {
            return Err(cut());
        };
        let len = u16::from_be_bytes([len[0], len[1]]) as usize;
        let Some(body) = bytes.get(at + 2..at + len.max(2)) else {
            return Err(cut());
        };
        at += len;
        match marker {
            DHT => read_tables(body, &mut tables),
            DRI if body.len() >= 2 => restart = u16::from_be_bytes([body[0], body[1]]) as usize,
            m if (0xC0..=0xCF).contains(&m) && m != DHT && m != 0xC8 && m != 0xCC => {
                frame = Frame::read(body, SEQUENTIAL.contains(&m));
                coverage = frame
                    .as_ref()
                    .filter(|_| PROGRESSIVE.contains(&m))
                    .map(|f| Coverage::new(f.components.iter().map(|c| c.id)));
            }
            _ => {}
        }
        if marker == SOS {
            if let Some(c) = coverage.as_mut() {
                c.add(body);
            }
            if let Some(f) = frame.as_ref().filter(|f| f.sequential)
                && let Some(scan) = Scan::read(body, f, &tables)
            {
                scan.walk(bytes, at, restart)?;
            }
            // The entropy-coded data runs to the next marker other than a
            // stuffed zero (FF 00) or a restart (FF D0..D7).
            loop {
                match bytes.get(at..at + 2) {
                    None => return Err(cut()),
                    Some([0xFF, next]) if *next == 0x00 || (0xD0..=0xD7).contains(next) => at += 2,
                    Some([0xFF, 0xFF]) => at += 1,
                    Some([0xFF, _]) => break,
                    Some(_) => at += 1,
                }
            }
        }
    }
}

/// A Huffman table in the form the JPEG standard decodes with (F.2.2.3):
/// per code length, the largest code, the first code and where its values
/// start.
#[derive(Clone)]
struct Huffman {
    max_code: [i32; 17],
    min_code: [i32; 17],
    first_value: [usize; 17],
    values: Vec<u8>,
}

impl Huffman {
    fn new(counts: &[u8], values: &[u8]) -> Self {
        let (mut max_code, mut min_code, mut first_value) = ([-1i32; 17], [0i32; 17], [0usize; 17]);
        let (mut code, mut k) = (0i32, 0usize);
        for l in 1..=16 {
            let n = counts[l - 1] as usize;
            first_value[l] = k;
            min_code[l] = code;
            code += n as i32;
            k += n;
            if n > 0 {
                max_code[l] = code - 1;
            }
            code <<= 1;
        }
        Self {
            max_code,
            min_code,
            first_value,
            values: values.to_vec(),
        }
    }

    /// The next value, or `None` at the end of the data or on a code the
    /// table does not hold.
    fn decode(&self, bits: &mut Bits) -> Option<Step> {
        let mut code = bits.bit()? as i32;
        for l in 1..=16 {
            if code <= self.max_code[l] {
                let i = self.first_value[l] + (code - self.min_code[l]) as usize;
                return self.values.get(i).map(|v| Step::Value(*v)).or(Some(Step::Invalid));
            }
            code = (code << 1) | bits.bit()? as i32;
        }
        Some(Step::Invalid)
    }
}

enum Step {
    Value(u8),
    Invalid,
}

/// DHT: one or more tables, each a class (DC 0, AC 1), an id, 16 counts
/// and the values.
fn read_tables(mut body: &[u8], tables: &mut [[Option<Huffman>; 4]; 2]) {
    while body.len() >= 17 {
        let (class, id) = ((body[0] >> 4) as usize, (body[0] & 15) as usize);
        let counts = &body[1..17];
        let n: usize = counts.iter().map(|c| *c as usize).sum();
        let Some(values) = body.get(17..17 + n) else { return };
        if class < 2 && id < 4 {
            tables[class][id] = Some(Huffman::new(counts, values));
        }
        body = &body[17 + n..];
    }
}

struct Component {
    id: u8,
    h: usize,
    v: usize,
}

struct Frame {
    width: usize,
    height: usize,
    components: Vec<Component>,
    sequential: bool,
}

impl Frame {
    fn read(body: &[u8], sequential: bool) -> Option<Self> {
        let height = u16::from_be_bytes([*body.get(1)?, *body.get(2)?]) as usize;
        let width = u16::from_be_bytes([*body.get(3)?, *body.get(4)?]) as usize;
        let n = *body.get(5)? as usize;
        let components = (0..n)
            .map(|i| {
                let c = body.get(6 + 3 * i..9 + 3 * i)?;
                let (h, v) = ((c[1] >> 4) as usize, (c[1] & 15) as usize);
                (h > 0 && v > 0).then_some(Component { id: c[0], h, v })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            width,
            height,
            components,
            sequential,
        })
    }
}

/// One scan's layout: the blocks of a unit (an MCU, or one block of a
/// single component), each with its DC and AC tables, and how many units.
struct Scan<'a> {
    blocks: Vec<(&'a Huffman, &'a Huffman)>,
    units: usize,
}

impl<'a> Scan<'a> {
    fn read(body: &[u8], frame: &Frame, tables: &'a [[Option<Huffman>; 4]; 2]) -> Option<Self> {
        let n = *body.first()? as usize;
        // A frame whose height comes later (a DNL marker) is not judged.
        if frame.height == 0 || frame.width == 0 || n == 0 {
            return None;
        }
        let hmax = frame.components.iter().map(|c| c.h).max()?;
        let vmax = frame.components.iter().map(|c| c.v).max()?;
        let mut blocks = Vec::new();
        let mut units = 0;
        for i in 0..n {
            let s = body.get(1 + 2 * i..3 + 2 * i)?;
            let c = frame.components.iter().find(|c| c.id == s[0])?;
            let dc = tables[0].get((s[1] >> 4) as usize)?.as_ref()?;
            let ac = tables[1].get((s[1] & 15) as usize)?.as_ref()?;
            if n == 1 {
                // Non-interleaved: the component's own blocks, one a unit.
                let across = (frame.width * c.h).div_ceil(hmax).div_ceil(8);
                let down = (frame.height * c.v).div_ceil(vmax).div_ceil(8);
                units = across * down;
                blocks.push((dc, ac));
            } else {
                units = frame.width.div_ceil(8 * hmax) * frame.height.div_ceil(8 * vmax);
                blocks.extend(std::iter::repeat_n((dc, ac), c.h * c.v));
            }
        }
        Some(Self { blocks, units })
    }

    /// Walks the scan's data from `at`; an error when it ends before the
    /// last unit.
    fn walk(&self, bytes: &[u8], at: usize, restart: usize) -> Result<(), CutShort> {
        let mut bits = Bits {
            bytes,
            at,
            byte: 0,
            left: 0,
        };
        for unit in 0..self.units {
            if restart > 0 && unit > 0 && unit % restart == 0 && !bits.restart() {
                return self.short(unit);
            }
            for (dc, ac) in &self.blocks {
                match block(&mut bits, dc, ac) {
                    Some(true) => {}
                    Some(false) => return Ok(()), // an invalid code: the decoder's to judge
                    None => return self.short(unit),
                }
            }
        }
        Ok(())
    }

    fn short(&self, unit: usize) -> Result<(), CutShort> {
        Err(CutShort::Blocks {
            blocks: unit,
            promised: self.units,
        })
    }
}

/// Skips one block: a DC difference and up to 63 AC coefficients.
/// `Some(false)` on an invalid code, `None` at the end of the data.
fn block(bits: &mut Bits, dc: &Huffman, ac: &Huffman) -> Option<bool> {
    let Step::Value(size) = dc.decode(bits)? else {
        return Some(false);
    };
    bits.skip(size as usize)?;
    let mut k = 1;
    while k < 64 {
        let Step::Value(rs) = ac.decode(bits)? else {
            return Some(false);
        };
        let (run, size) = ((rs >> 4) as usize, (rs & 15) as usize);
        if size == 0 {
            if run != 15 {
                break; // end of block
            }
            k += 16;
        } else {
            k += run + 1;
            bits.skip(size)?;
        }
    }
    Some(true)
}

/// The entropy-coded bits: `FF 00` is a data byte `FF`; any other marker
/// ends them.
struct Bits<'a> {
    bytes: &'a [u8],
    at: usize,
    byte: u8,
    left: u32,
}

impl Bits<'_> {
    fn bit(&mut self) -> Option<u8> {
        if self.left == 0 {
            let b = *self.bytes.get(self.at)?;
            if b == 0xFF {
                if *self.bytes.get(self.at + 1)? != 0x00 {
                    return None;
                }
                self.at += 1;
            }
            self.at += 1;
            self.byte = b;
            self.left = 8;
        }
        self.left -= 1;
        Some((self.byte >> self.left) & 1)
    }

    fn skip(&mut self, n: usize) -> Option<()> {
        for _ in 0..n {
            self.bit()?;
        }
        Some(())
    }

    /// At a restart interval's end: drops the byte's padding and passes
    /// the restart marker (FF D0..D7, after any fill bytes); false when
    /// there is none.
    fn restart(&mut self) -> bool {
        self.left = 0;
        while self.bytes.get(self.at) == Some(&0xFF) && self.bytes.get(self.at + 1) == Some(&0xFF) {
            self.at += 1;
        }
        match self.bytes.get(self.at..self.at + 2) {
            Some([0xFF, m]) if (0xD0..=0xD7).contains(m) => {
                self.at += 2;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

    fn encode(width: u16, height: u16, sampling: SamplingFactor, restart: u16, progressive: bool) -> Vec<u8> {
        let pixels = vramfit_sample::procedural(width as u32, height as u32).into_raw();
        let mut bytes = Vec::new();
        let mut e = Encoder::new(&mut bytes, 85);
        e.set_sampling_factor(sampling);
        e.set_restart_interval(restart);
        e.set_progressive(progressive);
        e.encode(&pixels, width, height, ColorType::Rgb).unwrap();
        bytes
    }

    const SAMPLINGS: [SamplingFactor; 3] = [
        SamplingFactor::R_4_4_4,
        SamplingFactor::R_4_2_2,
        SamplingFactor::R_4_2_0,
    ];

    #[test]
    fn whole_jpegs_pass_at_odd_sizes_samplings_and_restart_intervals() {
        for (w, h) in [(1, 1), (7, 5), (64, 48), (123, 77)] {
            for sampling in SAMPLINGS {
                for restart in [0, 1, 3] {
                    for progressive in [false, true] {
                        let bytes = encode(w, h, sampling, restart, progressive);
                        assert_eq!(
                            check(&bytes),
                            Ok(()),
                            "{w}×{h} {sampling:?} restart {restart} progressive {progressive}"
                        );
                    }
                }
            }
        }
        // And what the image crate writes.
        let mut bytes = Vec::new();
        vramfit_sample::procedural(97, 61)
            .write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Jpeg)
            .unwrap();
        assert_eq!(check(&bytes), Ok(()));
    }

    /// Cut anywhere in the image data and closed again with FF D9: refused
    /// as ending early (sequential JPEGs; the marker walk alone let these
    /// through).
    #[test]
    fn a_jpeg_cut_and_closed_again_is_refused() {
        for sampling in SAMPLINGS {
            for restart in [0, 2] {
                let whole = encode(123, 77, sampling, restart, false);
                // The scan starts after the last SOS header.
                let sos = whole.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap();
                let scan_start = sos + 2 + u16::from_be_bytes([whole[sos + 2], whole[sos + 3]]) as usize;
                let scan_end = whole.len() - 2;
                for cut in (scan_start + 1..scan_end - 1).step_by(7) {
                    let mut bytes = whole[..cut].to_vec();
                    // A cut between FF and its stuffed 00 would make a marker.
                    if bytes.last() == Some(&0xFF) {
                        bytes.pop();
                    }
                    bytes.extend([0xFF, 0xD9]);
                    let e = check(&bytes).expect_err(&format!(
                        "{sampling:?} restart {restart}: cut at {cut} of {}",
                        whole.len()
                    ));
                    assert!(e.to_string().contains("blocks its header promises"), "{e}");
                }
                let mut two_thirds = whole[..whole.len() * 2 / 3].to_vec();
                two_thirds.extend([0xFF, 0xD9]);
                assert!(check(&two_thirds).is_err());
            }
        }
    }

    /// A progressive JPEG cut before its last scans and closed again is
    /// refused (its coefficients never reach full precision).
    #[test]
    fn a_progressive_jpeg_missing_its_last_scans_is_refused() {
        for sampling in SAMPLINGS {
            let whole = encode(123, 77, sampling, 0, true);
            assert_eq!(check(&whole), Ok(()));
            // Cut just before each scan after the first: the later ones are gone.
            let starts: Vec<usize> = whole
                .windows(2)
                .enumerate()
                .filter(|(_, w)| *w == [0xFF, 0xDA])
                .map(|(i, _)| i)
                .collect();
            assert!(starts.len() > 2, "{sampling:?}: {} scans", starts.len());
            for &at in &starts[1..] {
                let mut bytes = whole[..at].to_vec();
                bytes.extend([0xFF, 0xD9]);
                let e = check(&bytes).expect_err(&format!("{sampling:?}: cut before the scan at {at}"));
                assert!(
                    e.to_string()
                        .contains("progressive scans end before the image is complete"),
                    "{e}"
                );
            }
        }
    }

    /// A file without its end marker is refused as before; bytes that
    /// are not a JPEG at all never panic.
    #[test]
    fn a_jpeg_without_its_end_is_cut_short_and_garbage_does_not_panic() {
        let whole = encode(64, 48, SamplingFactor::R_4_2_0, 0, false);
        let e = check(&whole[..whole.len() / 2]).unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
        let mut x = 0x1234_5678u32;
        for len in 0..600 {
            let mut bytes = vec![0xFF, 0xD8];
            bytes.extend((0..len).map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                if x.is_multiple_of(5) { 0xFF } else { (x >> 8) as u8 }
            }));
            let _ = check(&bytes);
            // Garbage after a real header too.
            let mut mixed = whole[..whole.len().min(700)].to_vec();
            mixed.extend(&bytes[2..]);
            let _ = check(&mixed);
        }
    }
}
