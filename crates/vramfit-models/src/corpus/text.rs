//! Text into token ids with the checkpoint's own `tokenizer.json`, through
//! Hugging Face's `tokenizers` crate, streamed: the text is read a piece at
//! a time and its ids written to an anonymous file (unlinked from the
//! start: nothing is left behind, nothing named is written), which is then
//! read as any token file ([`super::token_file`]).
//!
//! Documents: in plain text, runs of lines separated by a blank line
//! (Windows line ends read as line ends, a byte-order mark dropped); in
//! JSONL, each line's `text` field; one longer than 1 MiB cut into parts
//! at line breaks. Each is encoded with the tokenizer's special tokens (a Llama tokenizer's post-processor puts BOS first) and
//! ended with the checkpoint's EOS where its config.json names one (as
//! torchtune's text completion does; Hugging Face's `run_clm` adds none),
//! then concatenated, as both do before packing.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

use vramfit::files::fingerprint::Fnv1a;
use vramfit::files::read::{Links, open, read_at_most};

use super::error::{CorpusError, JsonLineError};
use super::token_file::TokenFile;

/// The largest tokenizer.json read (the largest published ones are some
/// 10 MB).
const MOST_TOKENIZER_BYTES: u64 = 256 << 20;
/// Text tokenized at once (the tokenizer spreads it over the cores).
const PIECE_BYTES: usize = 1 << 20;
/// The longest line read: a file without line breaks is refused, not
/// loaded whole.
const MOST_LINE_BYTES: u64 = 64 << 20;
/// A document longer than this is cut at a line break (else a space), each
/// part encoded as a document of its own: the tokenizer holds some 125
/// times a document's bytes while it encodes it (measured: 16 MB of text
/// in one document, 2 GB resident).
const MOST_DOCUMENT_BYTES: usize = 1 << 20;

/// How documents are laid out in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Plain text: documents separated by blank lines.
    Plain,
    /// JSON lines: one object a line, its `text` field a document.
    JsonLines,
}

/// The tokenizer, refused when its vocabulary is larger than the model's.
pub fn tokenizer(path: &Path, vocab: usize) -> Result<tokenizers::Tokenizer, CorpusError> {
    let bad = |why: String| CorpusError::Tokenizer { path: path.into(), why };
    let bytes = read_at_most(path, Links::Follow, MOST_TOKENIZER_BYTES).map_err(|e| bad(e.to_string()))?;
    let mut tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
        bad(format!(
            "not a tokenizer.json that Hugging Face's tokenizers reads: {e}"
        ))
    })?;
    // A tokenizer.json may keep the truncation and padding it was saved
    // with (`max_length: 512`); a corpus is tokenized whole, unpadded, as
    // the Python library's `tokenizer(text)` does.
    tokenizer
        .with_truncation(None)
        .map_err(|e| bad(format!("turning its truncation off: {e}")))?;
    tokenizer.with_padding(None);
    let size = tokenizer.get_vocab_size(true);
    if size > vocab {
        return Err(bad(format!(
            "its vocabulary has {size} tokens (with its added ones) and the model's embedding {vocab} rows: it is \
             another model's tokenizer; give the checkpoint's own (task.tokenizer), or a corpus tokenized for \
             this model"
        )));
    }
    Ok(tokenizer)
}

/// The ids of `path`'s documents, and the corpus's fingerprint (of the
/// text, the tokenizer's file and the EOS id).
pub fn tokenize(
    path: &Path,
    layout: Layout,
    tokenizer_path: &Path,
    vocab: usize,
    eos: Option<u32>,
) -> Result<(TokenFile, String), CorpusError> {
    let read_err = |source| CorpusError::Read {
        path: path.into(),
        source,
    };
    let tok = tokenizer(tokenizer_path, vocab)?;
    let mut hash = Fnv1a::default();
    hash.add(
        &read_at_most(tokenizer_path, Links::Follow, MOST_TOKENIZER_BYTES).map_err(|e| CorpusError::Tokenizer {
            path: tokenizer_path.into(),
            why: e.to_string(),
        })?,
    );
    hash.add(&eos.map_or(u64::MAX, u64::from).to_le_bytes());
    let mut reader = BufReader::new(open(path, Links::Follow).map_err(read_err)?);
    let ids = tempfile::tempfile().map_err(|source| CorpusError::Scratch { source })?;
    let mut out = BufWriter::new(ids);
    let mut documents: Vec<String> = Vec::new();
    let mut pending = 0usize;
    let mut current = String::new();
    let mut line = String::new();
    let mut number = 0u64;
    let mut text_seen = false;
    let mut written = 0u64;
    let mut flush = |documents: &mut Vec<String>, out: &mut BufWriter<std::fs::File>| -> Result<(), CorpusError> {
        if documents.is_empty() {
            return Ok(());
        }
        let encodings = tok
            .encode_batch_fast(std::mem::take(documents), true)
            .map_err(|e| CorpusError::Tokenizer {
                path: tokenizer_path.into(),
                why: format!("encoding {}: {e}", path.display()),
            })?;
        for e in encodings {
            let mut ids = e.get_ids().to_vec();
            if let Some(eos) = eos
                && ids.last() != Some(&eos)
            {
                ids.push(eos);
            }
            for id in ids {
                out.write_all(&id.to_le_bytes())
                    .map_err(|source| CorpusError::Scratch { source })?;
                written += 1;
            }
        }
        Ok(())
    };
    loop {
        line.clear();
        number += 1;
        let n = (&mut reader)
            .take(MOST_LINE_BYTES + 1)
            .read_line(&mut line)
            .map_err(|source| {
                if source.kind() == std::io::ErrorKind::InvalidData {
                    CorpusError::NotUtf8 {
                        path: path.into(),
                        line: number,
                    }
                } else {
                    read_err(source)
                }
            })?;
        if n as u64 > MOST_LINE_BYTES {
            return Err(CorpusError::LongLine {
                path: path.into(),
                line: number,
                most: MOST_LINE_BYTES,
            });
        }
        hash.add(line.as_bytes());
        if number == 1 && line.starts_with('\u{feff}') {
            // A byte-order mark is the file's, not the text's.
            line.drain(..'\u{feff}'.len_utf8());
        }
        if line.ends_with("\r\n") {
            // Windows line ends read as line ends.
            line.truncate(line.len() - 2);
            line.push('\n');
        }
        let end = n == 0;
        let document = match layout {
            Layout::Plain if end || line.trim().is_empty() => {
                (!current.is_empty()).then(|| std::mem::take(&mut current))
            }
            Layout::Plain => {
                current.push_str(&line);
                (current.len() >= MOST_DOCUMENT_BYTES).then(|| std::mem::take(&mut current))
            }
            Layout::JsonLines if end || line.trim().is_empty() => None,
            Layout::JsonLines => Some(text_field(&line).map_err(|why| CorpusError::Json {
                path: path.into(),
                line: number,
                why,
            })?),
        };
        if let Some(mut d) = document {
            if layout == Layout::Plain {
                // The line break before a blank line parts documents; it is
                // not the document's.
                d.truncate(d.trim_end_matches(['\n', '\r']).len());
            }
            text_seen |= !d.trim().is_empty();
            pending += d.len();
            documents.extend(cut(d));
        }
        if pending >= PIECE_BYTES || end {
            flush(&mut documents, &mut out)?;
            pending = 0;
        }
        if end {
            break;
        }
    }
    if !text_seen {
        return Err(CorpusError::NoText { path: path.into() });
    }
    let mut file = out
        .into_inner()
        .map_err(|e| CorpusError::Scratch { source: e.into_error() })?;
    file.flush().map_err(|source| CorpusError::Scratch { source })?;
    let (tokens, _) = TokenFile::of_written(file, path, vocab)?;
    debug_assert_eq!(tokens.count(), written);
    Ok((tokens, hash.hex()))
}

/// `document` in parts of at most [`MOST_DOCUMENT_BYTES`], each cut after
/// its last line break (else its last space, else a character's end).
fn cut(mut document: String) -> Vec<String> {
    let mut parts = Vec::new();
    while document.len() > MOST_DOCUMENT_BYTES {
        let mut at = MOST_DOCUMENT_BYTES;
        while !document.is_char_boundary(at) {
            at -= 1;
        }
        let head = &document[..at];
        let at = head
            .rfind('\n')
            .or_else(|| head.rfind(' '))
            .map_or(at, |i| i + 1)
            .max(1);
        let rest = document.split_off(at);
        parts.push(std::mem::replace(&mut document, rest));
    }
    parts.push(document);
    parts
}

/// A JSON line's `text` field; its other fields are skipped without being
/// kept (a line may be 64 MiB).
fn text_field(line: &str) -> Result<String, JsonLineError> {
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(borrow)]
        text: Option<std::borrow::Cow<'a, str>>,
    }
    match serde_json::from_str::<Line>(line) {
        Ok(Line { text: Some(t) }) => Ok(t.into_owned()),
        Ok(Line { text: None }) => Err(JsonLineError::NoText),
        Err(e) if e.is_data() && line.contains("\"text\"") => Err(JsonLineError::TextNotString(e)),
        Err(e) => Err(JsonLineError::NotObject(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::{MOST_DOCUMENT_BYTES, cut};

    /// A long document is cut into parts no longer than the most, after a
    /// line break where there is one, else a space, else inside a word on
    /// a character's edge; the parts are the document.
    #[test]
    fn long_documents_are_cut_at_line_breaks_into_bounded_parts() {
        let line = "the fox and the dog are friends now\n";
        let text = line.repeat(2 * MOST_DOCUMENT_BYTES / line.len() + 3);
        let parts = cut(text.clone());
        assert!(parts.len() >= 3);
        assert!(parts.iter().all(|p| p.len() <= MOST_DOCUMENT_BYTES && !p.is_empty()));
        assert!(
            parts[..parts.len() - 1].iter().all(|p| p.ends_with('\n')),
            "cut after a line break"
        );
        assert_eq!(parts.concat(), text);
        let words = "é".repeat(MOST_DOCUMENT_BYTES);
        let parts = cut(words.clone());
        assert!(parts.iter().all(|p| p.len() <= MOST_DOCUMENT_BYTES));
        assert_eq!(parts.concat(), words, "cut on characters' edges");
        assert_eq!(cut("short".into()), vec!["short".to_string()]);
    }
}
