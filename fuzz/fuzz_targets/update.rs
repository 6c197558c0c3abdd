//! Fuzz target `update`: see `sluice::fuzz::update`, run on a thread with the server's stack.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::run_on_worker_stack(sluice::fuzz::update, data));
