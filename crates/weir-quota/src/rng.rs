//! The small deterministic generator of refresh jitter and the simulators: xorshift64 from a
//! state that every seed sets apart (a bijective mix, so seeds 0 and 1 — or any two — give
//! sequences of their own).

/// A xorshift64 generator.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator whose sequence is `seed`'s own.
    pub(crate) fn new(seed: u64) -> Self {
        // splitmix64's finaliser: a bijection of the 64-bit seeds; xorshift needs a non-zero
        // state, and only one seed maps to 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Self(if z == 0 { 0x9e37_79b9_7f4a_7c15 } else { z })
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_has_its_own_sequence() {
        let first = |seed| Rng::new(seed).unit();
        let all: Vec<f64> = (0..64).map(first).collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
