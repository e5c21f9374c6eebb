//! Chat templates: the Jinja template a tokenizer carries (`chat_template` of an HF
//! `tokenizer_config.json`, a `chat_template.jinja` beside it, or a GGUF's
//! `tokenizer.chat_template`), rendered with minijinja the way HF transformers renders it
//! (`trim_blocks` and `lstrip_blocks` on, loop controls, `raise_exception`, Python string methods).
//!
//! A CoA row becomes two turns: the system turn is the suite's instruction and the user turn the
//! question (see [`coa_format::split_prompt`]); the model's CoA text is the assistant turn. The
//! conditioning prefix is the template rendered with `add_generation_prompt=True`, encoded without
//! adding special tokens (as `apply_chat_template(tokenize=True)` does): the template writes
//! whatever BOS or turn markers it wants.
//!
//! A tokenizer without a template is given [`PLAIN_TEMPLATE`] when it is saved, so that HF users
//! (`apply_chat_template`, verl's datasets) condition a model trained here on the very prefix it
//! was trained on.

use anyhow::{anyhow, Context, Result};
use minijinja::{Environment, ErrorKind, Value};

/// Our plain layout as a chat template: `[BOS] instruction "\n\nQuestion: " question "\n"`, the
/// assistant's text then EOS. Rendering it gives exactly the sequence `coa-tokenize` builds when
/// no template is used (a test checks it).
pub const PLAIN_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message['role'] == 'system' %}{{ message['content'] }}\n\nQuestion: \
{% elif message['role'] == 'user' %}{{ message['content'] }}\n\
{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}\
{% endif %}{% endfor %}";

/// A compiled chat template with the special-token strings it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template text, as it will be written back into `tokenizer_config.json`.
    pub source: String,
    pub bos_token: String,
    pub eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bytes", &self.source.len()).finish()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; errors name the template's line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // What transformers' ImmutableSandboxedEnvironment sets.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |_fmt: String| -> String {
            // Renders must be reproducible: no clock. Templates use it for a "today" line.
            String::new()
        });
        env.add_template_owned(NAME, source.to_string()).map_err(|e| anyhow!("the chat template does not compile: {e:#}"))?;
        Ok(ChatTemplate { env, source: source.to_string(), bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// Renders `messages` (`(role, content)` pairs).
    pub fn render(&self, messages: &[(&str, &str)], add_generation_prompt: bool) -> Result<String> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|(role, content)| Value::from_iter([("role", Value::from(*role)), ("content", Value::from(*content))]))
            .collect();
        let ctx = Value::from_iter([
            ("messages", Value::from(msgs)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
            ("tools", Value::from(())),
        ]);
        let tmpl = self.env.get_template(NAME).context("the chat template")?;
        tmpl.render(ctx).map_err(|e| anyhow!("rendering the chat template: {e:#}"))
    }

    /// The conditioning prefix of a CoA prompt: its system and user turns and the generation
    /// prompt that opens the assistant turn.
    pub fn prefix(&self, prompt: &str) -> Result<String> {
        let (system, question) = coa_format::split_prompt(prompt);
        match system {
            Some(s) => self.render(&[("system", s), ("user", question)], true),
            None => self.render(&[("user", question)], true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_like_transformers() {
        let t = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let s = t.render(&[("system", "Sys."), ("user", "Q?")], true).unwrap();
        assert_eq!(s, "<|im_start|>system\nSys.<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n");
        let s = t.render(&[("user", "Q?")], false).unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_and_python_methods() {
        // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before it;
        // `.strip()` is a Python string method (pycompat).
        let src = "{% for m in messages %}\n  {{ m['content'].strip() }}|\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.render(&[("user", "  a "), ("user", "b")], false).unwrap(), "  a|\n  b|\n");
    }

    #[test]
    fn raise_exception_and_bad_templates_are_errors() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let e = format!("{:#}", t.render(&[("user", "x")], true).unwrap_err());
        assert!(e.contains("roles must alternate"), "{e}");
        let e = format!("{:#}", ChatTemplate::new("{% for %}", "", "").unwrap_err());
        assert!(e.contains("chat template does not compile"), "{e}");
    }

    #[test]
    fn plain_template_is_the_plain_layout() {
        let t = ChatTemplate::new(PLAIN_TEMPLATE, "<s>", "</s>").unwrap();
        let prompt = coa_format::build_prompt("math", "What is 2+2?");
        let prefix = t.prefix(&prompt).unwrap();
        assert_eq!(prefix, format!("<s>{prompt}{}", crate::encode::PROMPT_SEPARATOR));
        let (sys, q) = coa_format::split_prompt(&prompt);
        let full = t.render(&[("system", sys.unwrap()), ("user", q), ("assistant", "<answer>4</answer>")], false).unwrap();
        assert_eq!(full, format!("{prefix}<answer>4</answer></s>"));
        // a prompt that is not ours is one user turn
        assert_eq!(t.prefix("Just a question").unwrap(), "<s>Just a question\n");
    }
}
