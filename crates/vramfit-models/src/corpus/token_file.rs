//! A flat file of token ids, read where a batch needs them, never loaded
//! whole: nanoGPT's `.bin` (little-endian u16 ids, no header) and llm.c's
//! (a 1,024-byte header: magic 20240520, version 1 for u16 ids or 2 for
//! u32, the count of ids; then the ids). A text corpus is tokenized into
//! one of these too ([`super::text`]), in a file of its own.
//!
//! Opening scans the file once, in pieces: every id must be below the
//! model's vocabulary (a batch with a larger one would index past the
//! embedding), and the bytes are hashed into the fingerprint a resume
//! checks.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Mutex;

use vramfit::files::fingerprint::Fnv1a;

use super::error::CorpusError;

/// Bytes of llm.c's header.
const LLMC_HEADER: u64 = 256 * 4;
/// llm.c's magic number (the header's first i32).
const LLMC_MAGIC: u32 = 20240520;

/// How wide each id is in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// Two bytes (vocabularies up to 65,536: GPT-2's, Llama 2's).
    U16,
    /// Four bytes (Llama 3's 128k vocabulary, Qwen2's 152k).
    U32,
}

impl Width {
    /// Bytes an id takes.
    pub fn bytes(self) -> u64 {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    /// `task.token_type`'s word for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::U16 => "u16",
            Self::U32 => "u32",
        }
    }

    /// `task.token_type`: `u16`, `u32`, or empty for what the vocabulary
    /// needs (nanoGPT writes u16 where the ids fit).
    pub fn parse(text: &str, vocab: usize) -> Option<Self> {
        match text {
            "" if vocab <= 1 << 16 => Some(Self::U16),
            "" | "u32" => Some(Self::U32),
            "u16" => Some(Self::U16),
            _ => None,
        }
    }
}

/// The ids of one file.
#[derive(Debug)]
pub struct TokenFile {
    file: Mutex<File>,
    /// Byte offset of the first id.
    start: u64,
    width: Width,
    count: u64,
}

impl TokenFile {
    /// Opens `path`, scanning every id against `vocab`; `width` applies to a
    /// file without llm.c's header. Returns the file and its fingerprint.
    pub fn open(path: &Path, width: Width, vocab: usize) -> Result<(Self, String), CorpusError> {
        let read_err = |source| CorpusError::Read {
            path: path.into(),
            source,
        };
        let file = vramfit::files::read::open(path, vramfit::files::read::Links::Follow).map_err(read_err)?;
        let length = file.metadata().map_err(read_err)?.len();
        let (start, width, count) = Self::layout(&file, path, length, width)?;
        let this = Self {
            file: Mutex::new(file),
            start,
            width,
            count,
        };
        let fingerprint = this.scan(path, vocab)?;
        Ok((this, fingerprint))
    }

    /// Over an anonymous file of u32 ids a tokenizer wrote, scanned as any other.
    pub(super) fn of_written(file: File, path: &Path, vocab: usize) -> Result<(Self, String), CorpusError> {
        let length = file
            .metadata()
            .map_err(|source| CorpusError::Read {
                path: path.into(),
                source,
            })?
            .len();
        let this = Self {
            file: Mutex::new(file),
            start: 0,
            width: Width::U32,
            count: length / 4,
        };
        let fingerprint = this.scan(path, vocab)?;
        Ok((this, fingerprint))
    }

    /// Where the ids start, how wide they are and how many there are.
    fn layout(mut file: &File, path: &Path, length: u64, width: Width) -> Result<(u64, Width, u64), CorpusError> {
        let bad = |why: String| CorpusError::Layout { path: path.into(), why };
        let mut head = [0u8; 12];
        let headed = length >= 4
            && file.read_exact(&mut head[..length.min(12) as usize]).is_ok()
            && u32::from_le_bytes(head[0..4].try_into().unwrap()) == LLMC_MAGIC;
        if headed && length < LLMC_HEADER {
            return Err(bad(format!(
                "it starts with llm.c's magic number and holds {length} bytes, fewer than llm.c's header \
                 ({LLMC_HEADER}): a truncated file; write it again"
            )));
        }
        if headed {
            let version = u32::from_le_bytes(head[4..8].try_into().unwrap());
            // llm.c writes the header as int32s.
            let count = i32::from_le_bytes(head[8..12].try_into().unwrap());
            let Ok(count) = u64::try_from(count) else {
                return Err(bad(format!("llm.c's header gives {count} ids: a damaged header")));
            };
            let width = match version {
                1 => Width::U16,
                2 => Width::U32,
                v => {
                    return Err(bad(format!(
                        "llm.c's header gives version {v}; known: 1 (u16 ids), 2 (u32 ids)"
                    )));
                }
            };
            let expected = LLMC_HEADER + count * width.bytes();
            if expected != length {
                return Err(bad(format!(
                    "llm.c's header says {count} {} ids ({expected} bytes with the header) and the file has {length} \
                     bytes: a truncated or altered file; write it again",
                    width.name()
                )));
            }
            return Ok((LLMC_HEADER, width, count));
        }
        if !length.is_multiple_of(width.bytes()) {
            return Err(bad(format!(
                "{length} bytes is not a whole number of {} ids ({} bytes each): a truncated file, or ids of another \
                 width (set task.token_type to `u16` or `u32`, as the file was written)",
                width.name(),
                width.bytes()
            )));
        }
        Ok((0, width, length / width.bytes()))
    }

    /// Every id checked against `vocab`, in pieces of a MiB; the fingerprint
    /// of the ids' bytes.
    fn scan(&self, path: &Path, vocab: usize) -> Result<String, CorpusError> {
        const PIECE: u64 = 1 << 20;
        let mut hash = Fnv1a::default();
        let mut at = 0u64;
        // Zeros at every odd position of u16 ids: u32 ids read as u16.
        let mut odd_zeros = 0u64;
        while at < self.count {
            let n = (PIECE / self.width.bytes()).min(self.count - at);
            let bytes = self.bytes(at, n as usize).map_err(|source| CorpusError::Read {
                path: path.into(),
                source,
            })?;
            hash.add(&bytes);
            for (i, id) in self.decode(&bytes).enumerate() {
                if id as usize >= vocab {
                    return Err(CorpusError::BeyondVocabulary {
                        path: path.into(),
                        position: at + i as u64,
                        id,
                        vocab,
                        hint: match self.width {
                            Width::U32 => " If the file holds u16 ids, set task.token_type = \"u16\".",
                            Width::U16 => "",
                        },
                    });
                }
                if self.width == Width::U16 && (at + i as u64) % 2 == 1 && id == 0 {
                    odd_zeros += 1;
                }
            }
            at += n;
        }
        if self.width == Width::U16 && self.count >= 64 && odd_zeros == self.count / 2 {
            return Err(CorpusError::Layout {
                path: path.into(),
                why: "every second u16 id is 0: the file holds u32 ids (little-endian, their high halves zero); set \
                      task.token_type = \"u32\""
                    .into(),
            });
        }
        Ok(hash.hex())
    }

    fn bytes(&self, first: u64, n: usize) -> std::io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; n * self.width.bytes() as usize];
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.seek(SeekFrom::Start(self.start + first * self.width.bytes()))?;
        file.read_exact(&mut bytes)?;
        Ok(bytes)
    }

    fn decode<'a>(&self, bytes: &'a [u8]) -> Box<dyn Iterator<Item = u32> + 'a> {
        match self.width {
            Width::U16 => Box::new(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)),
            Width::U32 => Box::new(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
        }
    }

    /// Ids `first..first + n`.
    pub fn read(&self, first: u64, n: usize) -> std::io::Result<Vec<u32>> {
        let bytes = self.bytes(first, n)?;
        Ok(self.decode(&bytes).collect())
    }

    /// How many ids the file holds.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The ids' width.
    pub fn width(&self) -> Width {
        self.width
    }
}
