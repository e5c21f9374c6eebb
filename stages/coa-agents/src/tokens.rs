//! Token counts of agent activations.
//!
//! The scripted backend has no tokenizer, so counts are a documented **estimate**, the usual
//! rule of thumb for English text under GPT-style BPE tokenizers:
//!
//! - a text costs `ceil(chars / 4)` tokens ([`estimate_text`], characters = Unicode scalars);
//! - each chat message adds [`PER_MESSAGE_OVERHEAD`] tokens (role and separators), and each request
//!   [`PER_REQUEST_OVERHEAD`] (the assistant's reply priming), as OpenAI's chat format does.
//!
//! The `openai` backend reports the endpoint's own `usage` counts when the response has them and
//! falls back to this estimate otherwise.

use crate::event::ChatMessage;

/// Tokens added per chat message (role, separators).
pub const PER_MESSAGE_OVERHEAD: i64 = 4;
/// Tokens added per request (reply priming).
pub const PER_REQUEST_OVERHEAD: i64 = 3;

/// `ceil(chars / 4)`.
pub fn estimate_text(text: &str) -> i64 {
    let chars = text.chars().count() as i64;
    (chars + 3) / 4
}

/// The prompt tokens of a request made of `messages`.
pub fn estimate_messages(messages: &[ChatMessage]) -> i64 {
    PER_REQUEST_OVERHEAD + messages.iter().map(|m| PER_MESSAGE_OVERHEAD + estimate_text(&m.content)).sum::<i64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates() {
        assert_eq!(estimate_text(""), 0);
        assert_eq!(estimate_text("abcd"), 1);
        assert_eq!(estimate_text("abcde"), 2);
        assert_eq!(estimate_text("éééé"), 1);
        let m = [ChatMessage::system("abcd"), ChatMessage::user("abcdefgh")];
        assert_eq!(estimate_messages(&m), 3 + 4 + 1 + 4 + 2);
    }
}
