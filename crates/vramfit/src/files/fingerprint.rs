//! FNV-1a, 64 bits: the fingerprint of an input a run was started on (a
//! corpus, a checkpoint's sampled bytes, an array file's body), kept so a
//! resume can tell the same file from another under the same path. Not a
//! cryptographic hash: it tells accidents apart, not adversaries.

/// FNV-1a over bytes given in pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(pub u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    /// Mixes in `bytes`.
    pub fn add(&mut self, bytes: &[u8]) {
        self.0 = bytes
            .iter()
            .fold(self.0, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    }

    /// The hash as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Fnv1a;

    #[test]
    fn pieces_hash_as_the_whole() {
        let mut whole = Fnv1a::default();
        whole.add(b"corpus bytes");
        let mut pieces = Fnv1a::default();
        pieces.add(b"corpus ");
        pieces.add(b"bytes");
        assert_eq!(whole, pieces);
        // The published FNV-1a 64 value of "a".
        let mut a = Fnv1a::default();
        a.add(b"a");
        assert_eq!(a.0, 0xaf63_dc4c_8601_ec8c);
    }
}
