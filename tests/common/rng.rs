//! Small deterministic generators for the tests: the same seed gives the same sequence on every
//! run, so a failure reproduces from the seed it prints. Not for anything but tests.

/// xorshift64 (shifts 13, 7, 17). The seed must not be 0 (0 stays 0).
pub struct XorShift(pub u64);

impl XorShift {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform-ish in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// `len` pseudo-random bytes (xorshift64*, the top byte of each output), drawn from `state`,
/// which moves on: a second call continues the sequence.
pub fn random_bytes(state: &mut u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *state ^= *state >> 12;
            *state ^= *state << 25;
            *state ^= *state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}
