# `make test` runs everything CI runs: formatting and lints, the Rust unit and integration
# tests, and every stock-client suite in wire-tests/ (it installs pymongo, mongosh and the
# Node.js driver on first use).

.PHONY: test lint build rust-test wire-test demo conformance soak

test: lint rust-test wire-test

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

build:
	cargo build

rust-test:
	cargo test
	cargo test --bench micro

wire-test: build
	bash wire-tests/run.sh

demo:
	cargo run --release -- demo

# The drivers' unified-format specification suites (pymongo's source distribution, downloaded at
# test time) against `sluice demo` and one `sluice shard`; docs/conformance.md. Not part of
# `make test` yet. SUITES=crud,retryable selects suites, TARGETS=demo|shard a target.
conformance:
	cargo build --release
	bash wire-tests/conformance/run.sh

# A long run of the write path's differential test (tests/write_differential.rs): BULKS random
# bulks per configuration (2, 3 and 5 shards under each ordered_rewrite policy) against the
# one-shard oracle, from SEED (printed at the end; rerun with the same SEED to reproduce a
# failure, which proptest shrinks to a minimal bulk). Release build, lowered priority.
# `make test` runs 300 bulks per configuration from a fixed seed.
SEED ?= $(shell date +%s)
BULKS ?= 20000
soak:
	SLUICE_DIFF_SEED=$(SEED) SLUICE_DIFF_BULKS=$(BULKS) nice -n 10 cargo test --release --test write_differential -- --nocapture
