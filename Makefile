# `make test` runs everything CI runs: formatting and lints, the Rust unit and integration
# tests, every stock-client suite in wire-tests/ (it installs pymongo, Beanie, mongosh and the
# Node.js driver on first use), and the drivers' CRUD and retryable-writes specification suites
# through `sluice demo`.

.PHONY: test lint build rust-test wire-test conformance-test demo conformance soak fuzz fuzz-build mutation-run

test: lint rust-test wire-test conformance-test

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
# test time) against `sluice demo` and one `sluice shard`; docs/conformance.md. SUITES=crud,retryable
# selects suites, TARGETS=demo|shard a target. A test that fails must be in
# wire-tests/conformance/expected-failures.txt, and a listed test must still fail.
conformance:
	cargo build --release
	bash wire-tests/conformance/run.sh

# What `make test` runs of them: CRUD, retryable writes and sessions through `sluice demo`, on
# the debug binary `make build` made, against the same expected-failure list (about three
# minutes).
conformance-test: build
	SUITES=crud,retryable,sessions TARGETS=demo SLUICE_BIN=target/debug/sluice \
		RESULTS_DIR=target/conformance-results SUITE_TIMEOUT=900 \
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

# Coverage-guided fuzzing (cargo-fuzz, libFuzzer) of every target in fuzz/fuzz_targets/, one
# after the other: `make fuzz SECONDS=60` runs each for 60 s, `make fuzz RUNS=10000000` for that
# many executions, at the lowest priority (builds and tests come first). `JOBS=2` runs two
# processes per target at once on the same corpus (one per core; RUNS and SECONDS are per
# process, so `JOBS=2 RUNS=5000000` gives each target 10 million). New inputs go to
# fuzz/work/<target>/ (not committed); a crash is written to fuzz/artifacts/<target>/ and stops
# the run: keep it in fuzz/regressions/<target>/ with the fix.
# The stable toolchain builds libFuzzer's instrumentation with RUSTC_BOOTSTRAP=1 (cargo-fuzz
# passes nightly-only flags); cargo-fuzz itself comes from crates.io on first use.
# `cargo test` (tests/fuzz_corpus.rs) replays fuzz/corpus/ and fuzz/regressions/.
# libFuzzer's -timeout is wall-clock time: at the lowest priority beside a build, an input that
# takes 1 s alone can wait 20 s for the CPU, so the limit is 120 s (a hang still stops the run;
# replay a reported timeout alone to tell the two apart).
FUZZ_TARGETS ?= wire_decode command_envelope matcher update aggregate write_plan
SECONDS ?= 60
RUNS ?=
FUZZ_BUILD = RUSTC_BOOTSTRAP=1 cargo fuzz build -O --debug-assertions --sanitizer none
FUZZ_HOST = $(shell rustc -vV | sed -n "s/host: //p")
FUZZ_LIMIT = $(if $(RUNS),-runs=$(RUNS),-max_total_time=$(SECONDS))
# Longest input libFuzzer makes: by default the longest committed seed of the target, at least
# 4096 bytes (the generator's node budget reads fewer), so inputs kept in fuzz/work/ cannot raise
# it (libFuzzer would take the longest file it loads, up to 1 MiB). FUZZ_MAX_LEN=N overrides.
FUZZ_MAX_LEN ?=
JOBS ?= 1

fuzz-build:
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	$(FUZZ_BUILD)

fuzz: fuzz-build
	set -e; for t in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/work/$$t fuzz/regressions/$$t fuzz/artifacts/$$t; \
		echo "== $$t"; \
		len=$(FUZZ_MAX_LEN); [ -n "$$len" ] || len=$$(for f in fuzz/corpus/$$t/*; do \
			wc -c < $$f; done | awk 'BEGIN {m = 4096} $$1 > m {m = $$1} END {print m}'); \
		pids=""; for j in $$(seq $(JOBS)); do \
			nice -n 19 fuzz/target/$(FUZZ_HOST)/release/$$t \
				-artifact_prefix=fuzz/artifacts/$$t/ -timeout=120 -rss_limit_mb=4096 \
				-max_len=$$len \
				-print_final_stats=1 $(FUZZ_LIMIT) \
				fuzz/work/$$t fuzz/corpus/$$t fuzz/regressions/$$t & pids="$$pids $$!"; \
		done; \
		for p in $$pids; do wait $$p; done; \
	done

# Damaged messages against one `sluice demo` process (router and embedded shards): no abort, no
# hang, no panic, RSS back within 20 % of its start afterwards. docs/hardening.md.
MESSAGES ?= 200000
mutation-run:
	cargo build --release --bin sluice --example mutation_run
	nice -n 10 target/release/examples/mutation_run --messages $(MESSAGES)
