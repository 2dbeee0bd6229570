#![no_main]
//! libFuzzer target: `weir::fuzzing::path` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::path(data));
