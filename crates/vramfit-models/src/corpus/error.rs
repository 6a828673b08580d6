//! Why a corpus cannot be used: each error names the file and what to do.

use std::path::PathBuf;

/// Why a corpus cannot be used; each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The anonymous file of a text corpus's ids cannot be written.
    #[error(
        "writing the tokenized corpus to a temporary file (in $TMPDIR, removed when the run ends): {source}; free \
         space there or point TMPDIR at a folder with room"
    )]
    Scratch {
        /// The system's error.
        source: std::io::Error,
    },
    /// A token file's length or header does not hold whole ids.
    #[error("{}: {why}", path.display())]
    Layout {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// An id the model's embedding has no row for.
    #[error(
        "{}: id {id} at position {position} is beyond the model's vocabulary of {vocab}: the corpus was tokenized for \
         another model (tokenize it with this checkpoint's tokenizer).{hint}",
        path.display()
    )]
    BeyondVocabulary {
        /// The file.
        path: PathBuf,
        /// Its index among the file's ids.
        position: u64,
        /// The id.
        id: u32,
        /// The model's vocabulary.
        vocab: usize,
        /// A hint on the width, where another one would read.
        hint: &'static str,
    },
    /// Fewer ids than one window and a held-out one.
    #[error("{}: {why}", path.display())]
    TooShort {
        /// The file.
        path: PathBuf,
        /// What it holds and what a run needs.
        why: String,
    },
    /// A text file that is not UTF-8.
    #[error("{}: line {line} is not UTF-8 text: convert the file to UTF-8 (e.g. iconv -t UTF-8)", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// The first line that is not.
        line: u64,
    },
    /// A line longer than the reader takes.
    #[error(
        "{}: line {line} is longer than {most} bytes: a text corpus is read a line at a time; break it into lines \
         (or documents separated by blank lines)",
        path.display()
    )]
    LongLine {
        /// The file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// The longest line read.
        most: u64,
    },
    /// A JSON line without a string `text`.
    #[error("{}: line {line}: {why}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// What is wrong.
        why: JsonLineError,
    },
    /// A text file with nothing but blank lines.
    #[error("{}: holds no text (empty, or blank lines only): give a corpus with text in it", path.display())]
    NoText {
        /// The file.
        path: PathBuf,
    },
    /// The tokenizer cannot be read, or is another model's.
    #[error("tokenizer {}: {why}", path.display())]
    Tokenizer {
        /// Its tokenizer.json.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A text corpus and no tokenizer.json to read it with.
    #[error(
        "{}: a text corpus is tokenized with the checkpoint's tokenizer.json, and {why}: give --weights DIR of a \
         checkpoint with its tokenizer.json, or --set task.tokenizer=PATH, or a corpus of token ids (.bin)",
        path.display()
    )]
    NoTokenizer {
        /// The corpus.
        path: PathBuf,
        /// Where it was looked for.
        why: String,
    },
    /// A file of a kind the reader does not know.
    #[error(
        "{}: not a corpus vramfit reads: give token ids as .bin (u16 or u32, nanoGPT's or llm.c's), plain text as \
         .txt (documents separated by blank lines) or JSON lines as .jsonl (a `text` field a line)",
        path.display()
    )]
    UnknownKind {
        /// The file.
        path: PathBuf,
    },
}

/// What a JSON line of a corpus lacks.
#[derive(Debug, thiserror::Error)]
pub enum JsonLineError {
    /// An object with no `text`.
    #[error("an object without a `text` field (each line is {{\"text\": \"...\"}})")]
    NoText,
    /// A `text` that is not a string.
    #[error("its `text` is not a string: {0}")]
    TextNotString(serde_json::Error),
    /// Not a JSON object.
    #[error("not a JSON object with a string `text`: {0}")]
    NotObject(serde_json::Error),
}
