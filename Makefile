# `make test` runs everything CI runs: formatting and lints, the Rust unit and integration
# tests, and every stock-client suite in wire-tests/ (it installs pymongo, mongosh and the
# Node.js driver on first use).

.PHONY: test lint build rust-test wire-test demo

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
