//! Atomics used on the lock-free paths, swapped for loom's under `--cfg loom` so the CAS paths can
//! be model-checked (`scripts/test` runs `tests/loom.rs`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
