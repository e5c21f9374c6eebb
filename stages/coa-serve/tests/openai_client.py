"""The official `openai` client against a running coa-serve: chat (whole and streamed), `n`,
`stop`, `seed`, logprobs, text completions, usage, and the client's error classes for bad
requests. Usage: python openai_client.py BASE_URL MODEL. Raises on any mismatch; prints one
summary line."""

import sys

import openai
from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
messages = [{"role": "user", "content": "Hello there, tell me a story"}]

assert [m.id for m in client.models.list()] == [model]

# Greedy, whole: 20 tokens (the test server has no EOS), usage counts them.
greedy = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0)
text = greedy.choices[0].message.content
assert greedy.choices[0].finish_reason == "length", greedy
assert greedy.usage.completion_tokens == 20 and greedy.usage.total_tokens == greedy.usage.prompt_tokens + 20, greedy.usage

# Streamed: the deltas add up to the same text; the last chunk has the usage.
chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert streamed == text, (streamed, text)
assert chunks[-1].usage.completion_tokens == 20, chunks[-1]
assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

# n and seed: three choices; the same seed gives the same three.
a = client.chat.completions.create(model=model, messages=messages, max_tokens=12, n=3, seed=7)
b = client.chat.completions.create(model=model, messages=messages, max_tokens=12, n=3, seed=7)
assert len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2]
assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
assert a.usage.completion_tokens == 36

# stop: the text before the stop string's first occurrence, the stop string not included.
stop = text[5:9]
cut = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0, stop=[stop])
assert cut.choices[0].message.content == text[: text.index(stop)], (cut.choices[0].message.content, text, stop)
assert cut.choices[0].finish_reason == "stop"

# logprobs: one entry per token, with the alternatives asked for.
lp = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
content = lp.choices[0].logprobs.content
assert len(content) == 5 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)

# Text completions.
comp = client.completions.create(model=model, prompt="Hello there", max_tokens=6, temperature=0, logprobs=1)
assert comp.usage.completion_tokens == 6 and len(comp.choices[0].logprobs.tokens) == 6

# Errors arrive as the client's own exception classes.
def raises(cls, **kw):
    try:
        client.chat.completions.create(model=kw.pop("model", model), messages=messages, **kw)
    except cls as e:
        return e
    raise AssertionError(f"{kw}: no {cls.__name__}")

assert raises(openai.BadRequestError, max_tokens=0).status_code == 400
assert raises(openai.NotFoundError, model="not-this-one").status_code == 404
assert raises(openai.UnprocessableEntityError, max_tokens=3, extra_body={"unknown_field": 1}).status_code == 422
assert raises(openai.BadRequestError, max_tokens=10**9).code == "context_length_exceeded"

print(f"openai {openai.__version__}: chat, stream, n, seed, stop, logprobs, completions and errors agree; greedy text {text!r}")
