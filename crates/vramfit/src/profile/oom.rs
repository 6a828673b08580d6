//! Recognising a device out-of-memory in a backend's error text. Burn
//! surfaces device failures as strings (an `ExecutionError` from `sync` or
//! a tensor read), so the words are all there is to go on.

use super::phase::PhaseRecord;
use super::report::{NamedTensor, human_bytes};

/// What an out-of-memory message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Bytes the failed allocation asked for, where the message says.
    pub requested_bytes: Option<u64>,
}

/// cubecl's allocation failure (CUDA's `CUDA_ERROR_OUT_OF_MEMORY` and the
/// memory pools' limit both end in it): "can't allocate buffer of size: N".
const BUFFER_TOO_BIG: &str = "can't allocate buffer of size:";

/// `Some` when `message` reports an out-of-memory: cubecl's allocation
/// failure, CUDA's and the common phrasings ("out of memory",
/// "out-of-memory", `OUT_OF_MEMORY`, `OutOfMemory`, a standalone "OOM").
pub fn out_of_memory(message: &str) -> Option<OutOfMemory> {
    let m = message.to_lowercase();
    let requested_bytes = m.find(BUFFER_TOO_BIG).and_then(|at| {
        let digits: String = m[at + BUFFER_TOO_BIG.len()..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    });
    let phrased = ["out of memory", "out-of-memory", "out_of_memory", "outofmemory"]
        .iter()
        .any(|k| m.contains(k));
    // "oom" only as a word: "zoom" or "room" is not an out-of-memory.
    let word = m.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == "oom");
    (requested_bytes.is_some() || m.contains(BUFFER_TOO_BIG) || phrased || word)
        .then_some(OutOfMemory { requested_bytes })
}

/// Out-of-memory panics on threads a backend runs for itself. cubecl-wgpu
/// allocates on its device thread and panics there when an allocation
/// fails ("can't allocate buffer of size: N", for one buffer above the
/// device's limit); the caller's thread is not told and its step goes on
/// with a buffer that was never made, so the run would end "successfully"
/// with wrong numbers. [`watch_panics`] records such panics (only those whose
/// message [`out_of_memory`] recognises: a test's own panics stay its own)
/// and the run driver checks for new ones after every step.
pub mod panics {
    use std::sync::{Mutex, Once};

    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static INSTALL: Once = Once::new();

    /// Installs the recording hook once per process (the previous hook
    /// still runs: the panic is printed as before).
    pub fn watch() {
        INSTALL.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let payload = info.payload();
                let message = payload
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| payload.downcast_ref::<&str>().copied())
                    .unwrap_or("");
                if super::out_of_memory(message).is_some() {
                    let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
                    if let Ok(mut seen) = SEEN.lock() {
                        seen.push(format!("{message} (a panic on thread {thread})"));
                    }
                }
                previous(info);
            }));
        });
    }

    /// Out-of-memory panics seen so far.
    pub fn count() -> usize {
        SEEN.lock().map_or(0, |s| s.len())
    }

    /// The first out-of-memory panic after the first `count` ones.
    pub fn since(count: usize) -> Option<String> {
        SEEN.lock().ok().and_then(|s| s.get(count).cloned())
    }

    /// Records `message` as if a backend thread had panicked with it (tests).
    pub fn record(message: &str) {
        if let Ok(mut seen) = SEEN.lock() {
            seen.push(message.to_string());
        }
    }
}

/// What a job writes to `oom.json` and tells the user after a device
/// out-of-memory: the last recorded breakdown and the largest tensors.
#[derive(Debug, Clone)]
pub struct OomReport {
    /// The body of `oom.json`; a job may add its own fields.
    pub json: serde_json::Value,
    /// `" allocating 512.0 MiB"`, or empty when the message does not say.
    pub requested: String,
    /// The top categories of the largest phase of the last recorded step,
    /// then the largest tensors, in words.
    pub largest: String,
}

/// Builds the report for an out-of-memory `message` at `step` (surfaced
/// after `phase`), from the profiler's `records` and the job's `tensors`
/// (largest first).
pub fn oom_report(
    error: &str,
    message: &str,
    step: u64,
    phase: &str,
    records: &[PhaseRecord],
    tensors: &[NamedTensor],
) -> OomReport {
    let requested_bytes = out_of_memory(message).and_then(|o| o.requested_bytes);
    let last_step = records.last().map(|r| r.step);
    let last: Vec<&PhaseRecord> = records.iter().filter(|r| Some(r.step) == last_step).collect();
    let top = last.iter().max_by_key(|r| r.allocated()).map(|r| {
        let mut cats: Vec<_> = r.categories.iter().collect();
        cats.sort_by(|a, b| b.1.cmp(a.1));
        let words: Vec<String> = cats
            .iter()
            .filter(|(_, b)| **b > 0)
            .take(3)
            .map(|(c, b)| format!("{} {}", c.name(), human_bytes(**b)))
            .collect();
        words.join(", ")
    });
    let biggest: Vec<String> = tensors
        .iter()
        .take(3)
        .map(|t| format!("{} {}", t.name, human_bytes(t.bytes)))
        .collect();
    let biggest = biggest.join(", ");
    let json = serde_json::json!({
        "error": error, "step": step, "surfaced_after_phase": phase,
        "requested_bytes": requested_bytes, "last_recorded_phases": last,
        "largest_tensors": tensors.iter().take(10).collect::<Vec<_>>(),
    });
    OomReport {
        json,
        requested: requested_bytes
            .map(|b| format!(" allocating {}", human_bytes(b)))
            .unwrap_or_default(),
        largest: match (top, biggest.is_empty()) {
            (Some(t), false) => format!("{t}; tensors: {biggest}"),
            (Some(t), true) => t,
            (None, false) => format!("tensors: {biggest}"),
            (None, true) => "nothing recorded yet".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_cubecl_and_cuda_wordings_and_reads_the_size() {
        // The shapes cubecl 0.10 gives an allocation failure, as it reaches
        // a caller wrapped in a launch or server error.
        let wrapped = "An io error happened during launch\nCaused by:\n  can't allocate buffer of size: 34359738368\n";
        assert_eq!(
            out_of_memory(wrapped),
            Some(OutOfMemory {
                requested_bytes: Some(34_359_738_368)
            })
        );
        let unhealthy = "The server is in an invalid state\nCaused by:\n  [Io(can't allocate buffer of size: 512\n)]";
        assert_eq!(out_of_memory(unhealthy).unwrap().requested_bytes, Some(512));
        for text in [
            "An out-of-memory error happened during launch",
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
            "OutOfMemory",
            "simulated OOM at step 3",
        ] {
            assert_eq!(
                out_of_memory(text),
                Some(OutOfMemory { requested_bytes: None }),
                "{text}"
            );
        }
    }

    #[test]
    fn other_failures_are_not_out_of_memory() {
        for text in [
            "zoom factor must be positive",
            "no room for the header",
            "A compilation error happened during launch",
            "Too much shared memory requested.\nRequested 70000 bytes, maximum 49152 bytes available.",
            "couldn't find resource for that handle",
        ] {
            assert_eq!(out_of_memory(text), None, "{text}");
        }
    }

    #[test]
    fn the_report_names_the_request_the_top_categories_and_tensors() {
        use crate::profile::{Accounted, NoAllocator, Profiler};
        let mut prof = Profiler::new(Box::new(NoAllocator), 8);
        let acc = |gradients| Accounted {
            parameters: 4 << 20,
            gradients,
            optimizer_state: 8 << 20,
            activations: Some(1 << 20),
            ..Default::default()
        };
        prof.record(10, "start", acc(0));
        prof.record(20, "start", acc(0));
        prof.record(20, "backward", acc(4 << 20));
        use crate::profile::{Category, NamedTensor};
        let tensors = vec![
            NamedTensor::new("weights", 4 << 20, Category::Parameters),
            NamedTensor::new("bias", 1024, Category::Parameters),
        ];
        let r = oom_report(
            "out of memory at step 21",
            "can't allocate buffer of size: 1073741824",
            21,
            "forward",
            prof.records(),
            &tensors,
        );
        assert_eq!(r.requested, " allocating 1.0 GiB");
        // The largest phase of the last recorded step (20, backward), largest category first.
        assert!(
            r.largest.starts_with("optimizer_state 8.0 MiB, ")
                && r.largest.ends_with("tensors: weights 4.0 MiB, bias 1.0 KiB"),
            "{}",
            r.largest
        );
        assert_eq!(r.json["requested_bytes"], 1u64 << 30);
        assert_eq!(r.json["step"], 21);
        assert_eq!(r.json["surfaced_after_phase"], "forward");
        let phases = r.json["last_recorded_phases"].as_array().unwrap();
        assert_eq!(phases.len(), 2, "only step 20's phases");
        assert_eq!(r.json["largest_tensors"][0]["name"], "weights");
        // A message without a size: no request in words or JSON.
        let r = oom_report("e", "CUDA_ERROR_OUT_OF_MEMORY", 1, "forward", &[], &[]);
        assert_eq!((r.requested.as_str(), r.json["requested_bytes"].is_null()), ("", true));
        assert_eq!(r.largest, "nothing recorded yet");
    }
}
