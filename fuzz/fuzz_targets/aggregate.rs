//! Fuzz target `aggregate`: see `sluice::fuzz::aggregate`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::aggregate(data));
