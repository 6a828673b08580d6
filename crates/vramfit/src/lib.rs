//! vramfit: make GPU training jobs fit in the memory you have, and show
//! where the memory goes.
//!
//! This crate holds what every workload shares: the memory profiler
//! ([`profile`]), the run directory with its atomic checkpoints, metrics
//! stream and TensorBoard events ([`run`]), the optimiser on plain tensors
//! ([`optim`]) and host memory readings ([`memory`]), and the training
//! techniques: mixed precision and loss scaling ([`precision`]), block
//! activation checkpointing ([`checkpoint`]), micro-batching with gradient
//! accumulation ([`batch`]), reduced-precision storage ([`storage`]) and
//! the allocator policy ([`allocator`]).
//!
//! ```
//! use vramfit::run::atomic_write;
//! let dir = std::env::temp_dir().join(format!("vramfit-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! atomic_write(&dir.join("hello.txt"), b"written whole or not at all").unwrap();
//! assert_eq!(std::fs::read(dir.join("hello.txt")).unwrap(), b"written whole or not at all");
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

pub mod allocator;
pub mod backends;
pub mod batch;
pub mod checkpoint;
pub mod grads;
pub mod heap;
pub mod memory;
pub mod optim;
pub mod params;
pub mod plan;
pub mod precision;
pub mod profile;
pub mod run;
pub mod settings;
pub mod step;
pub mod storage;
pub mod trainer;
