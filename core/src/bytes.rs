//! Comparing the short byte strings the hot path compares on every call (a key, its
//! namespace, a `rate cap` pair) without a call into the C library: a handful of word
//! compares for up to 16 bytes.

/// Whether `a` and `b` hold the same bytes.
#[inline]
pub fn equal(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => word4(a, 0) == word4(b, 0) && word4(a, n - 4) == word4(b, n - 4),
        8..=16 => word8(a, 0) == word8(b, 0) && word8(a, n - 8) == word8(b, n - 8),
        _ => a == b,
    }
}

#[inline]
fn word4(s: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&s[at..at + 4]);
    u32::from_ne_bytes(w)
}

#[inline]
fn word8(s: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[at..at + 8]);
    u64::from_ne_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::equal;

    #[test]
    fn equal_is_slice_equality() {
        let base: Vec<u8> = (0u8..40).collect();
        for len in 0..40 {
            let a = &base[..len];
            let copy = a.to_vec();
            assert!(equal(a, a));
            assert!(equal(a, &copy));
            // Every single-byte difference, and every other length, is seen.
            for i in 0..len {
                let mut b = a.to_vec();
                b[i] ^= 0x80;
                assert!(!equal(a, &b), "len {len} byte {i}");
            }
            assert!(!equal(a, &base[..len + 1]));
        }
    }
}
