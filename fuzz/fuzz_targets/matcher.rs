//! Fuzz target `matcher`: see `sluice::fuzz::matcher`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::matcher(data));
