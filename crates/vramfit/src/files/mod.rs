//! Files as untrusted input and outputs that destroy nothing: the rules
//! every workload's readers and writers share.
//!
//! - [`confine`]: a path that a file names (a dataset's image, a
//!   checkpoint index's shard) stays inside the folder of the file that
//!   names it, and what is opened is a regular file, not a pipe, a device
//!   or a folder.
//! - [`read`]: a file read is a regular file (a FIFO refused without
//!   blocking, a device without reading for ever), a run's own files
//!   without following a link.
//! - [`outputs`]: a file vramfit writes never replaces an input of the
//!   run, a file its owner made read-only, or the target of a link planted
//!   in a run directory.
//! - [`fingerprint`]: FNV-1a, to tell the input a run started on from
//!   another under the same path.
//! - [`room`]: the memory a process may still take, so that a run too large
//!   for the machine is refused with figures instead of aborting on an
//!   allocation.

pub mod confine;
pub mod fingerprint;
pub mod outputs;
pub mod read;
pub mod room;
