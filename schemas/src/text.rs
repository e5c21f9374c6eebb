//! Text cut for a message: error lines and listings quote a value without printing all of it.

/// `s` cut to `max_chars` characters (Unicode scalars) with `...` after, or unchanged if it fits.
pub fn shorten(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::shorten;

    #[test]
    fn cuts_at_characters_not_bytes() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcd", 3), "abc...");
        assert_eq!(shorten("ééé", 2), "éé...");
    }
}
