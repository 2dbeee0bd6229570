#![no_main]
//! libFuzzer target: `weir::fuzzing::lyft_config` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::lyft_config(data));
