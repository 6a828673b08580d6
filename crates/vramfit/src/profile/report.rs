//! `memory.json` (schema `vramfit.memory`) and its terminal table: the
//! headline peak and what it means, where it was reached, the categories
//! there, the timeline, the largest tensors and what lowers the peak.

use serde::{Deserialize, Serialize};

use super::phase::{Category, LeakWarning, PhaseRecord};

/// Version of the `memory.json` schema written by [`MemoryReport`].
/// 2 added the reserved and driver peaks, 3 the driver's context share,
/// 4 the headline (the figure that decides an out-of-memory), the
/// categories `inputs`, `workspace`, `other` and `cached` (which replace
/// `temporaries` and `fragmentation`), per-micro-batch phases, tensor
/// categories and advice, 5 `frozen_parameters` beside `parameters`
/// (which since holds the trainable ones only).
pub const REPORT_VERSION: u32 = 5;

/// The high-water mark of the figure that decides an out-of-memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    /// Bytes at the high-water mark.
    pub bytes: u64,
    /// The figure, e.g. "allocator reserved bytes".
    pub figure: String,
    /// Why this figure decides an out-of-memory on this backend.
    pub why: String,
    /// True for a true high-water mark, false for the largest sample.
    pub exact: bool,
    /// Step in which it was reached.
    pub step: u64,
    /// Phase in which it was reached (the window that ended with this phase).
    pub phase: String,
    /// Micro-batch, for per-micro-batch phases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
}

impl Headline {
    /// `backward[1]`-style label of where it was reached.
    pub fn label(&self) -> String {
        match self.micro_batch {
            Some(m) => format!("{}[{m}]", self.phase),
            None => self.phase.clone(),
        }
    }
}

/// A tensor a workload holds, with its category.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NamedTensor {
    /// Its name (a parameter path, "target image", …).
    pub name: String,
    /// Bytes.
    pub bytes: u64,
    /// What it is.
    pub category: Option<Category>,
}

impl NamedTensor {
    /// A tensor of `category`.
    pub fn new(name: impl Into<String>, bytes: u64, category: Category) -> Self {
        Self {
            name: name.into(),
            bytes,
            category: Some(category),
        }
    }
}

// Reports before version 4 stored `[name, bytes]` pairs.
impl<'de> Deserialize<'de> for NamedTensor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Pair(String, u64),
            Named {
                name: String,
                bytes: u64,
                #[serde(default)]
                category: Option<Category>,
            },
        }
        Ok(match Either::deserialize(d)? {
            Either::Pair(name, bytes) => NamedTensor {
                name,
                bytes,
                category: None,
            },
            Either::Named { name, bytes, category } => NamedTensor { name, bytes, category },
        })
    }
}

/// The content of `memory.json` (schema `vramfit.memory`, [`REPORT_VERSION`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Always `"vramfit.memory"`.
    pub schema: String,
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// Device the run used.
    pub device: String,
    /// Where in-use and reserved figures came from.
    pub source: String,
    /// The high-water mark of the figure that decides an out-of-memory on
    /// this backend, where it is measured.
    #[serde(default)]
    pub headline: Option<Headline>,
    /// What is measured.
    pub measured: Vec<String>,
    /// What is derived, and how.
    pub derived: Vec<String>,
    /// The headline's bytes (kept for readers of older versions).
    pub peak_bytes: Option<u64>,
    /// The headline's figure, or why there is none.
    pub peak_source: String,
    /// `(step, phase, in use)` of the recorded phase with the most in use.
    pub largest_phase: Option<(u64, String, u64)>,
    /// The timeline (the last steps kept).
    pub records: Vec<PhaseRecord>,
    /// A leak, if one was seen.
    pub leak: Option<LeakWarning>,
    /// The workload's largest tensors, largest first.
    #[serde(default)]
    pub largest_tensors: Vec<NamedTensor>,
    /// What to turn to lower the peak, largest category first.
    #[serde(default)]
    pub advice: Vec<String>,
    /// Largest in-use bytes over the run, where measured.
    #[serde(default)]
    pub in_use_peak_bytes: Option<u64>,
    /// Largest reserved bytes over the run, where measured.
    #[serde(default)]
    pub reserved_peak_bytes: Option<u64>,
    /// Largest driver figure for this process over the run (NVML), where
    /// there is one: reserved plus the CUDA context and libraries.
    #[serde(default)]
    pub driver_peak_bytes: Option<u64>,
    /// The driver reading's source, or why there is none.
    #[serde(default)]
    pub driver_source: Option<String>,
    /// The driver's figure beyond the allocator's reserved bytes when the
    /// profiler opened (CUDA context, modules), where there is a driver reading.
    #[serde(default)]
    pub driver_context_bytes: Option<u64>,
    /// The process's peak resident set (VmHWM), beside the device figures.
    #[serde(default)]
    pub host_peak_bytes: Option<u64>,
}

/// Bytes in the largest binary unit that keeps the figure at or above 1.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Why a `memory.json` cannot be read as a report of this version.
#[derive(Debug, thiserror::Error)]
pub enum ReportFileError {
    /// The file cannot be read.
    #[error("cannot read {path}: {cause}")]
    Unreadable {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// Not JSON.
    #[error("{path} is not JSON: the file is damaged or not a memory report ({cause})")]
    NotJson {
        /// The file.
        path: std::path::PathBuf,
        /// The parser's words.
        cause: serde_json::Error,
    },
    /// JSON of another schema.
    #[error("{path} is not a vramfit memory report (schema {schema}, expected vramfit.memory)")]
    OtherSchema {
        /// The file.
        path: std::path::PathBuf,
        /// The schema it names, quoted, or "missing".
        schema: String,
    },
    /// A report of another version: its fields may mean something else.
    #[error(
        "{path} is a memory report of version {version}, and this vramfit reads version {REPORT_VERSION}: read it \
         with the vramfit that wrote it"
    )]
    OtherVersion {
        /// The file.
        path: std::path::PathBuf,
        /// The version it names, or "(missing)".
        version: String,
    },
    /// A field the report always writes is missing.
    #[error(
        "{path} is not a whole vramfit memory report: its `{field}` field is missing (the file was edited or \
         damaged; a new run writes it again)"
    )]
    FieldMissing {
        /// The file.
        path: std::path::PathBuf,
        /// The field.
        field: &'static str,
    },
    /// The fields do not read as a report.
    #[error("{path} is not a vramfit memory report ({cause})")]
    Malformed {
        /// The file.
        path: std::path::PathBuf,
        /// The parser's words.
        cause: serde_json::Error,
    },
}

impl MemoryReport {
    /// Reads a `memory.json`, refusing a file of another schema or version
    /// (whose fields may parse and mean something else) and one with a
    /// field removed (a table without it would say what the run did not).
    pub fn read(path: &std::path::Path) -> Result<Self, ReportFileError> {
        let bytes = crate::files::read::read(path, crate::files::read::Links::Follow).map_err(|cause| {
            ReportFileError::Unreadable {
                path: path.into(),
                cause,
            }
        })?;
        let head: serde_json::Value = serde_json::from_slice(&bytes).map_err(|cause| ReportFileError::NotJson {
            path: path.into(),
            cause,
        })?;
        let (schema, version) = (head["schema"].as_str(), head["version"].as_u64());
        if schema != Some("vramfit.memory") {
            return Err(ReportFileError::OtherSchema {
                path: path.into(),
                schema: schema.map_or("missing".into(), |s| format!("'{s}'")),
            });
        }
        if version != Some(REPORT_VERSION as u64) {
            return Err(ReportFileError::OtherVersion {
                path: path.into(),
                version: match &head["version"] {
                    serde_json::Value::Null => "(missing)".into(),
                    other => other.to_string(),
                },
            });
        }
        // Every field the report writes is there (`null` where nothing was measured).
        if let Some(field) = ["headline", "records", "peak_bytes", "advice"]
            .into_iter()
            .find(|k| head.get(*k).is_none())
        {
            return Err(ReportFileError::FieldMissing {
                path: path.into(),
                field,
            });
        }
        serde_json::from_value(head).map_err(|cause| ReportFileError::Malformed {
            path: path.into(),
            cause,
        })
    }

    /// The recorded phase where the headline was reached: the record of that
    /// step and phase, else the same phase of the last recorded step.
    pub fn peak_record(&self) -> Option<&PhaseRecord> {
        let h = self.headline.as_ref()?;
        let same = |r: &&PhaseRecord| r.phase == h.phase && r.micro_batch == h.micro_batch;
        self.records
            .iter()
            .find(|r| r.step == h.step && same(r))
            .or_else(|| self.records.iter().rev().find(same))
    }

    /// Categories that are above zero in some record, in stacking order.
    pub fn categories_present(&self) -> Vec<Category> {
        Category::ALL
            .into_iter()
            .filter(|c| self.records.iter().any(|r| r.categories.get(c).is_some_and(|b| *b > 0)))
            .collect()
    }

    /// The headline in words: "peak 296.0 MiB: allocator reserved bytes
    /// (exact high-water), at step 2, backward".
    pub fn headline_line(&self) -> String {
        match &self.headline {
            Some(h) => format!(
                "peak {}: {} ({} high-water) at step {}, {}",
                human_bytes(h.bytes),
                h.figure,
                if h.exact { "exact" } else { "sampled" },
                h.step,
                h.label()
            ),
            None => format!(
                "no device peak measured ({}); host peak resident set {}",
                self.peak_source,
                self.host_peak_bytes
                    .map(human_bytes)
                    .unwrap_or_else(|| "unknown".into())
            ),
        }
    }

    /// A compact terminal table: the headline and why it decides an
    /// out-of-memory, the categories where it was reached, the last
    /// recorded step's phases, the largest tensors and the advice.
    pub fn table(&self) -> String {
        let mut out = format!("{}\n", self.headline_line());
        if let Some(h) = &self.headline {
            out.push_str(&format!("  why this figure: {}\n", h.why));
        }
        let cats = self.categories_present();
        if let Some(r) = self.peak_record() {
            let exact = self.headline.as_ref().is_some_and(|h| h.step == r.step);
            let parts: Vec<String> = cats
                .iter()
                .filter_map(|c| r.categories.get(c).filter(|b| **b > 0).map(|b| (c, b)))
                .map(|(c, b)| format!("{} {}", c.name(), human_bytes(*b)))
                .collect();
            out.push_str(&format!(
                "  at the end of that phase{}: {}\n",
                if exact {
                    String::new()
                } else {
                    format!(" (step {}, the nearest recorded)", r.step)
                },
                parts.join(", ")
            ));
            let end = r.device.map(|d| d.reserved).unwrap_or_else(|| r.allocated());
            if let Some(peak) = r.peak_reserved.or(r.peak_in_use).filter(|p| *p > end) {
                out.push_str(&format!(
                    "  inside the phase it rose {} above its end figure: scratch allocated and freed within the phase\n",
                    human_bytes(peak - end)
                ));
            }
        }
        let Some(last) = self.records.last().map(|r| r.step) else {
            out.push_str("no phases recorded\n");
            return out;
        };
        out.push_str(&format!("{:<17} {:>10} {:>10}", "phase", "in use", "peak"));
        for c in &cats {
            out.push_str(&format!(" {:>15}", c.name()));
        }
        out.push('\n');
        for r in self.records.iter().filter(|r| r.step == last) {
            let peak = r.peak_reserved.or(r.peak_in_use).map(human_bytes).unwrap_or("-".into());
            out.push_str(&format!(
                "{:<17} {:>10} {:>10}",
                r.label(),
                human_bytes(r.allocated()),
                peak
            ));
            for c in &cats {
                let cell = r.categories.get(c).map(|b| human_bytes(*b)).unwrap_or("-".into());
                out.push_str(&format!(" {cell:>15}"));
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "(step {last}; 'peak' is the largest figure inside the phase)\n"
        ));
        if !self.largest_tensors.is_empty() {
            let names: Vec<String> = self
                .largest_tensors
                .iter()
                .take(5)
                .map(|t| match t.category {
                    Some(c) => format!("{} {} ({})", t.name, human_bytes(t.bytes), c.name()),
                    None => format!("{} {}", t.name, human_bytes(t.bytes)),
                })
                .collect();
            out.push_str(&format!("largest tensors: {}\n", names.join(", ")));
        }
        for a in &self.advice {
            out.push_str(&format!("to lower it: {a}\n"));
        }
        if let Some(l) = &self.leak {
            out.push_str(&format!(
                "warning: in-use memory at phase '{}' grew at each of the last {} recorded steps (+{}); {} grew most\n",
                l.phase,
                l.steps,
                human_bytes(l.growth_bytes),
                l.category.name()
            ));
        }
        out
    }
}
