//! Replays the fuzz corpus: every committed input of `fuzz/corpus/<target>/` and every crash
//! kept in `fuzz/regressions/<target>/` runs through its target's entry point
//! (`sluice::fuzz`), which must return without panicking. A few thousand generated inputs per
//! target follow, so `cargo test` is a small fuzz run of its own.
//!
//! The seed corpus is made by `sluice::fuzz::seeds()`; `SLUICE_WRITE_SEEDS=1 cargo test --test
//! fuzz_corpus` writes it to `fuzz/corpus/` after a change there.

use std::path::Path;

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| {
            let bytes = std::fs::read(e.path()).ok()?;
            Some((e.path().display().to_string(), bytes))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn committed_corpus_and_regressions_replay_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for (name, entry) in sluice::fuzz::TARGETS {
        for kind in ["corpus", "regressions"] {
            for (path, bytes) in inputs(&root.join(kind).join(name)) {
                eprintln!("{path}");
                sluice::fuzz::run_on_worker_stack(*entry, &bytes);
                replayed += 1;
            }
        }
    }
    assert!(replayed > 0, "the committed corpus is missing");
}

#[test]
fn generated_inputs_run_cleanly() {
    // xorshift64*: the same inputs on every run.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for (name, entry) in sluice::fuzz::TARGETS {
        for _ in 0..300 {
            let len = (next() % 256) as usize;
            let input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            sluice::fuzz::run_on_worker_stack(*entry, &input);
        }
        eprintln!("{name}: 300 generated inputs");
    }
}

#[test]
fn seed_corpus_is_the_generated_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus");
    let write = std::env::var_os("SLUICE_WRITE_SEEDS").is_some();
    let seeds = sluice::fuzz::seeds();
    for (name, _) in sluice::fuzz::TARGETS {
        assert!(
            seeds.iter().filter(|s| s.target == *name).count() >= 6,
            "{name} has seeds"
        );
    }
    for seed in &seeds {
        assert!(seed.bytes.len() <= 16 * 1024, "{} is small", seed.name);
        let path = root.join(seed.target).join(&seed.name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &seed.bytes).unwrap();
        }
        let committed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (SLUICE_WRITE_SEEDS=1 writes it)", path.display()));
        assert_eq!(committed, seed.bytes, "{} is out of date", path.display());
    }
}
