//! A TensorBoard event-file writer for scalars, with no dependencies: the
//! TFRecord framing (length, masked CRC-32C, data, masked CRC-32C) around
//! hand-encoded `Event` protocol buffers (`wall_time` = 1, `step` = 2,
//! `file_version` = 3, `summary` = 5; `Summary.value` = 1;
//! `Value.tag` = 1, `Value.simple_value` = 2).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// CRC-32C (Castagnoli), bitwise: event records are small.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_bytes(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    varint(((field << 3) | 2) as u64, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn event(step: u64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut e = vec![0x09];
    e.extend_from_slice(&wall.to_le_bytes());
    e.push(0x10);
    varint(step, &mut e);
    body(&mut e);
    e
}

/// Appends scalar summaries to `events.out.tfevents.<seconds>.vramfit` in a
/// folder; each call to [`EventWriter::scalars`] is flushed, so a crash
/// loses at most the record being written.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Starts a new event file in `dir` (a resumed run starts another one;
    /// TensorBoard reads every file in the folder).
    pub fn create(dir: &Path) -> io::Result<Self> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // A new name, made here: `create_new` neither follows a link nor
        // replaces a file (a link planted under the next name, even one to
        // nowhere, is skipped, not written through).
        let mut n = 0;
        let (path, file) = loop {
            let p = dir.join(format!("events.out.tfevents.{secs}.vramfit.{}.{n}", std::process::id()));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&p) {
                Ok(f) => break (p, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e),
            }
        };
        let mut w = Self {
            out: BufWriter::new(file),
            path,
        };
        let first = event(0, |e| field_bytes(3, b"brain.Event:2", e));
        w.record(&first)?;
        w.out.flush()?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record(&mut self, data: &[u8]) -> io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes())?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc(data).to_le_bytes())
    }

    /// Writes one event with the scalars `(tag, value)` at `step`.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> io::Result<()> {
        let mut summary = Vec::new();
        for (tag, v) in values {
            let mut value = Vec::new();
            field_bytes(1, tag.as_bytes(), &mut value);
            value.push(0x15);
            value.extend_from_slice(&(*v as f32).to_le_bytes());
            field_bytes(1, &value, &mut summary);
        }
        let e = event(step, |e| field_bytes(5, &summary, e));
        self.record(&e)?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    /// Reads back records, checking both CRCs, and the scalars in them.
    fn read_scalars(bytes: &[u8]) -> Vec<(u64, String, f32)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            assert_eq!(
                u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()),
                masked_crc(len_bytes)
            );
            let data = &bytes[at + 12..at + 12 + len];
            assert_eq!(
                u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap()),
                masked_crc(data)
            );
            at += 16 + len;
            // Event: 0x09 f64, 0x10 varint step, then field 3 or 5.
            assert_eq!(data[0], 0x09);
            assert_eq!(data[9], 0x10);
            let (mut step, mut i, mut shift) = (0u64, 10, 0);
            loop {
                step |= ((data[i] & 0x7f) as u64) << shift;
                shift += 7;
                i += 1;
                if data[i - 1] & 0x80 == 0 {
                    break;
                }
            }
            if data[i] != 0x2a {
                continue; // file_version
            }
            // summary (single-byte lengths suffice for these small tests)
            let mut j = i + 2;
            while j < data.len() {
                assert_eq!(data[j], 0x0a);
                let vlen = data[j + 1] as usize;
                let v = &data[j + 2..j + 2 + vlen];
                let tlen = v[1] as usize;
                let tag = String::from_utf8(v[2..2 + tlen].to_vec()).unwrap();
                assert_eq!(v[2 + tlen], 0x15);
                let val = f32::from_le_bytes(v[3 + tlen..7 + tlen].try_into().unwrap());
                out.push((step, tag, val));
                j += 2 + vlen;
            }
        }
        out
    }

    #[test]
    fn scalars_read_back_with_valid_framing() {
        let dir = std::env::temp_dir().join(format!("vramfit-tb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = EventWriter::create(&dir).unwrap();
        w.scalars(7, &[("loss", 0.25), ("memory/start/parameters", 4096.0)])
            .unwrap();
        w.scalars(300, &[("psnr_db", 31.5)]).unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        assert!(w.path().file_name().unwrap().to_string_lossy().contains("tfevents"));
        assert_eq!(
            read_scalars(&bytes),
            vec![
                (7, "loss".to_string(), 0.25),
                (7, "memory/start/parameters".to_string(), 4096.0),
                (300, "psnr_db".to_string(), 31.5)
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
