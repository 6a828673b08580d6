//! What a user can do about an error, as data. The library's errors name
//! the action ([`Remedy`]) and never a front end's flags; a front end
//! words the actions in its own terms once, at start-up ([`word_with`]: the
//! CLI in its flags), and every error the library shows from then on says
//! them that way. Without it they read in the library's words.

use std::path::PathBuf;
use std::sync::OnceLock;

/// An action that gets past an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remedy {
    /// Continue the run in this directory from its last checkpoint.
    Resume(PathBuf),
    /// Continue the run in `dir` with `command`, the one that started it
    /// (as its run directory records it).
    ResumeWith {
        /// The command that started the run.
        command: String,
        /// The run directory.
        dir: PathBuf,
    },
    /// Start a new run with the settings in this `config.toml`.
    NewRun(PathBuf),
    /// Write the run into a directory that does not exist yet (it is created).
    OtherRunDir,
    /// Name a directory a run wrote.
    RunDirWritten,
    /// Show the finished run in this directory.
    Report(PathBuf),
    /// Plan within this many bytes.
    Budget(u64),
    /// Split each step into `accumulate` micro-batches of `micro` (the same batch).
    MicroBatches {
        /// Samples a micro-batch.
        micro: usize,
        /// Micro-batches a step.
        accumulate: usize,
    },
    /// Probe at an effective batch from 2 to this one.
    ProbeBatch {
        /// The run's effective batch.
        most: usize,
    },
}

/// A front end's words for a remedy (`None`: the library's).
pub type Words = fn(&Remedy) -> Option<String>;

static WORDS: OnceLock<Words> = OnceLock::new();

/// Has every remedy the library shows from now on worded by `words`
/// (once a process; `false` when words were set already).
pub fn word_with(words: Words) -> bool {
    WORDS.set(words).is_ok()
}

impl Remedy {
    /// The library's own words, naming no front end.
    pub fn plain(&self) -> String {
        match self {
            Remedy::Resume(dir) => format!("resume the run in {}", dir.display()),
            Remedy::ResumeWith { command, dir } => format!("resume it with {command} (the run in {})", dir.display()),
            Remedy::NewRun(config) => format!("start a new run with the settings in {}", config.display()),
            Remedy::OtherRunDir => "write the run into a directory that does not exist yet (it is created)".into(),
            Remedy::RunDirWritten => "give the directory a run wrote".into(),
            Remedy::Report(dir) => format!("its summary.json and memory.json are in {}", dir.display()),
            Remedy::Budget(bytes) => format!("a budget of {bytes} bytes"),
            Remedy::MicroBatches { micro, accumulate } => {
                format!("micro-batches of {micro}, {accumulate} a step")
            }
            Remedy::ProbeBatch { most } => format!("probe at an effective batch from 2 to the run's {most}"),
        }
    }
}

impl std::fmt::Display for Remedy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let words = WORDS.get().and_then(|words| words(self));
        f.write_str(&words.unwrap_or_else(|| self.plain()))
    }
}
