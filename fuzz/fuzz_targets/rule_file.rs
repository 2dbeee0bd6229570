#![no_main]
//! libFuzzer target: `weir::fuzzing::rule_file` (see docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::rule_file(data));
