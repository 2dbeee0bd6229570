#![no_main]
//! libFuzzer target: `weir::fuzzing::json_body` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::json_body(data));
