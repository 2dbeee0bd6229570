#![no_main]
//! libFuzzer target: `weir::fuzzing::proxy_head` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::proxy_head(data));
