//! Bounded capture of a child's output stream: the first and the last bytes, and a count.

/// Keeps the first `cap / 2` bytes and the last `cap - cap / 2` bytes of a stream, counting
/// everything, so memory stays bounded however much the code prints. The head shows how the
/// output started, the tail how it ended (usually the error or the result).
#[derive(Debug)]
pub(crate) struct HeadTail {
    head: Vec<u8>,
    head_cap: usize,
    /// Ring buffer of the most recent bytes once the head is full.
    tail: Vec<u8>,
    tail_cap: usize,
    /// Next write position in `tail` once it is full.
    tail_pos: usize,
    total: u64,
}

impl HeadTail {
    pub(crate) fn new(cap: usize) -> Self {
        Self::with_tail_reserve(cap, 0)
    }

    /// Like [`HeadTail::new`] with `reserve` more bytes of tail: room for a trailer the caller
    /// removes afterwards (the harness's token line), so what remains is still `cap` bytes.
    pub(crate) fn with_tail_reserve(cap: usize, reserve: usize) -> Self {
        let head_cap = cap / 2;
        Self {
            head: Vec::new(),
            head_cap,
            tail: Vec::new(),
            tail_cap: cap - head_cap + reserve,
            tail_pos: 0,
            total: 0,
        }
    }

    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.head_cap - self.head.len();
        let n = room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..n]);
        bytes = &bytes[n..];
        if self.tail_cap == 0 || bytes.is_empty() {
            return;
        }
        // Only the last tail_cap bytes of this chunk can survive.
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail
                .extend_from_slice(&bytes[bytes.len() - self.tail_cap..]);
            self.tail_pos = 0;
            return;
        }
        for &b in bytes {
            if self.tail.len() < self.tail_cap {
                self.tail.push(b);
            } else {
                self.tail[self.tail_pos] = b;
                self.tail_pos = (self.tail_pos + 1) % self.tail_cap;
            }
        }
    }

    /// Total bytes seen.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The kept text, with `... [N bytes truncated] ...` where bytes were dropped, and whether
    /// any were. Cuts are moved to UTF-8 character boundaries; invalid UTF-8 is replaced.
    pub(crate) fn finish(self) -> (String, bool) {
        let mut tail = Vec::with_capacity(self.tail.len());
        tail.extend_from_slice(&self.tail[self.tail_pos..]);
        tail.extend_from_slice(&self.tail[..self.tail_pos]);
        let kept = (self.head.len() + tail.len()) as u64;
        if kept == self.total {
            let mut all = self.head;
            all.extend_from_slice(&tail);
            return (String::from_utf8_lossy(&all).into_owned(), false);
        }
        let head = &self.head[..utf8_prefix_len(&self.head)];
        let skip = tail
            .iter()
            .take_while(|&&b| b & 0xC0 == 0x80)
            .count()
            .min(3);
        let tail = &tail[skip..];
        let dropped = self.total - head.len() as u64 - tail.len() as u64;
        let text = format!(
            "{}\n... [{dropped} bytes truncated] ...\n{}",
            String::from_utf8_lossy(head),
            String::from_utf8_lossy(tail)
        );
        (text, true)
    }
}

/// Length of `bytes` without a trailing incomplete UTF-8 sequence.
fn utf8_prefix_len(bytes: &[u8]) -> usize {
    // Look back at most 3 bytes for the lead byte of the last character.
    for back in 1..=bytes.len().min(4) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 != 0x80 {
            let need = if b < 0x80 {
                1
            } else if b >= 0xF0 {
                4
            } else if b >= 0xE0 {
                3
            } else {
                2
            };
            return if back >= need {
                bytes.len()
            } else {
                bytes.len() - back
            };
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut h = HeadTail::new(16);
        h.push(b"hello ");
        h.push(b"world");
        assert_eq!(h.total(), 11);
        assert_eq!(h.finish(), ("hello world".to_owned(), false));
    }

    #[test]
    fn exactly_full_is_not_truncated() {
        let mut h = HeadTail::new(8);
        h.push(b"0123");
        h.push(b"4567");
        assert_eq!(h.finish(), ("01234567".to_owned(), false));
    }

    #[test]
    fn long_output_keeps_head_and_tail() {
        let mut h = HeadTail::new(8);
        for chunk in [&b"abc"[..], b"defgh", b"ijklmnop", b"qr", b"s", b"tuvwxyz"] {
            h.push(chunk);
        }
        assert_eq!(h.total(), 26);
        let (text, truncated) = h.finish();
        assert!(truncated);
        assert_eq!(text, "abcd\n... [18 bytes truncated] ...\nwxyz");
    }

    #[test]
    fn cuts_land_on_character_boundaries() {
        let mut h = HeadTail::new(8);
        h.push("ééééééééé".as_bytes()); // 18 bytes, 2 per char
        h.push(b"x");
        let (text, truncated) = h.finish();
        assert!(truncated);
        assert_eq!(text, "éé\n... [12 bytes truncated] ...\néx");
        assert!(!text.contains('\u{FFFD}'));
    }
}
