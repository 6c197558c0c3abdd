//! Fuzz target `command_envelope`: see `sluice::fuzz::command_envelope`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::command_envelope(data));
