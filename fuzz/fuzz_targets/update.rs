//! Fuzz target `update`: see `sluice::fuzz::update`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::update(data));
