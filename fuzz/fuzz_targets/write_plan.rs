//! Fuzz target `write_plan`: see `sluice::fuzz::write_plan`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::write_plan(data));
