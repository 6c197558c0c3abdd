//! Fuzz target `wire_decode`: see `sluice::fuzz::wire_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::wire_decode(data));
