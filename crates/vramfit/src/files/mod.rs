//! Files as untrusted input and outputs that destroy nothing: the rules
//! every workload's readers and writers share.
//!
//! - [`confine`]: a path that a file names (a dataset's image, a
//!   checkpoint index's shard) stays inside the folder of the file that
//!   names it, and what is opened is a regular file, not a pipe, a device
//!   or a folder.
//! - [`outputs`]: a file vramfit writes never replaces an input of the
//!   run, a file its owner made read-only, or the target of a link planted
//!   in a run directory.
//! - [`room`]: the memory a process may still take, so that a run too large
//!   for the machine is refused with figures instead of aborting on an
//!   allocation.

pub mod confine;
pub mod outputs;
pub mod room;
