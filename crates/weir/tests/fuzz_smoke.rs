//! The fuzz targets of `weir::fuzzing` on the stable toolchain: each target's seed corpus
//! (`fuzz/corpus/TARGET`) and mutations of it (bytes flipped, inserted, deleted, spliced from
//! another seed, interesting tokens) from a fixed-seed generator, so a failure replays. The
//! libFuzzer targets in `fuzz/` (nightly) search far more; this is CI's short pass.
//!
//! `WEIR_FUZZ_SECONDS` (default 1) bounds each target's time, `WEIR_FUZZ_RUNS` (default
//! 20 000) its inputs; `scripts/fuzz` sets them for longer runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A xorshift generator: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Byte strings that matter to the parsers, inserted whole.
const TOKENS: &[&[u8]] = &[
    b"%",
    b"%2F",
    b"%2e",
    b"%00",
    b"/",
    b"//",
    b"/../",
    b"/./",
    b";",
    b"\\",
    b"\r\n",
    b": ",
    b"Host: a\r\n",
    b"Connection: host\r\n",
    b"Via: 1.1 weir-fuzz\r\n",
    b"[",
    b"{",
    b"]",
    b"}",
    b"- ",
    b"  ",
    b"\n",
    b"'",
    b"\"",
    b"*",
    b"&a",
    b"*a",
    b"!!",
    b"\xef\xbb\xbf",
    b"18446744073709551616",
    b"-1",
    b"0",
    b"9007199254740993",
    b"\\ud800",
    b"\xff",
    b"requests_per_unit: ",
    b"window: ",
    b"unit: ",
    b"qps: ",
    b"descriptors:",
    b"\x00",
];

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 => v.insert(at, rng.next() as u8),
            2 if !v.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            3 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(at..at, t.iter().copied());
            }
            4 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len());
                let to = (from + rng.below(64)).min(other.len());
                v.splice(at..at, other[from..to].iter().copied());
            }
            _ => {
                let end = (at + rng.below(8)).min(v.len());
                let dup: Vec<u8> = v[at..end].to_vec();
                v.splice(at..at, dup);
            }
        }
    }
    v
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn every_target_survives_its_corpus_and_mutations() {
    let budget = Duration::from_secs(env("WEIR_FUZZ_SECONDS", 1));
    let runs = env("WEIR_FUZZ_RUNS", 20_000);
    for (name, target) in weir::fuzzing::TARGETS {
        let seeds = corpus(name);
        for s in &seeds {
            target(s);
        }
        let mut rng = Rng(0x5eed_0000 ^ name.len() as u64 ^ (name.as_bytes()[0] as u64) << 32);
        let started = Instant::now();
        let mut n = 0u64;
        while n < runs && started.elapsed() < budget {
            let input = mutate(&mut rng, &seeds);
            let outcome = std::panic::catch_unwind(|| target(&input));
            if outcome.is_err() {
                let path = std::env::temp_dir().join(format!("weir-fuzz-{name}-crash"));
                let _ = std::fs::write(&path, &input);
                panic!(
                    "{name}: input {n} broke an invariant (saved to {})",
                    path.display()
                );
            }
            n += 1;
        }
        eprintln!(
            "{name}: {} seeds, {n} mutated inputs in {:?}",
            seeds.len(),
            started.elapsed()
        );
        assert!(n > 0, "{name}: no input ran");
    }
}
