#![no_main]
//! libFuzzer target: `weir::fuzzing::lean_head` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::lean_head(data));
