#![no_main]
//! libFuzzer target: `weir::fuzzing::csv_trace` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::csv_trace(data));
