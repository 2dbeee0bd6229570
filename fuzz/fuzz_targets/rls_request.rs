#![no_main]
//! libFuzzer target: `weir::fuzzing::rls_request` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::rls_request(data));
