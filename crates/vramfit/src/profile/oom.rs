//! Recognising a device out-of-memory in a backend's error text. Burn
//! surfaces device failures as strings (an `ExecutionError` from `sync` or
//! a tensor read), so the words are all there is to go on.

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
}
