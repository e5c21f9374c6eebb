#!/usr/bin/env python3
"""GGUF parity fixtures: what HF transformers reads from GGUF files, for the Rust GGUF import
(stages/coa-model/tests/gguf_parity.rs). Runs on demand, not in CI; its outputs are committed.

    make model        # fetch SmolLM2-135M-Instruct.Q4_1.gguf into .cache/models/ (optional)
    .venv-torch/bin/python tests/parity/make_gguf_fixtures.py [--smollm2 PATH]

Writes tests/parity/fixtures/gguf/:

  tiny_llama.gguf, tiny_qwen2.gguf
      Two tiny random models converted to GGUF here as llama.cpp's converter would (gguf-py
      writer; llama q/k rows permuted), their tensors spread over F32, F16, BF16, Q8_0, Q4_0 and
      Q4_1, each with a small byte-level BPE vocabulary (control tokens, user-defined tokens, a
      token needing respelling; tiny_llama has no <|endoftext|>, adds BOS and uses GPT-2's split;
      tiny_qwen2 uses the qwen2 split regex, a pad token and a ChatML template).
  tiny_llama_kq.gguf
      A tiny llama with 256-wide rows so that K-quants fit: its weights in Q4_K, Q5_K, Q6_K
      (encoded by quantize_k below: gguf-py 0.19 decodes K-quants but has no encoder), Q5_0 and
      Q5_1 (gguf-py's quantize), tied Q6_K embeddings.
  tiny_llama_spm.gguf
      A tiny llama with a SentencePiece vocabulary (tokenizer.ggml.model "llama", scores and no
      merges, byte-fallback tokens, control and user-defined tokens), as Llama 2 / Mistral files.
  tiny_llama31.gguf
      A tiny Llama 3.1-style model: rope_parameters llama3 in HF, converted as llama.cpp does, i.e.
      plain llama metadata plus the per-frequency factors in `rope_freqs.weight`; all tensors F32.
  quant_blocks.gguf
      Random bytes as blocks of every quantized type read (scales set to finite f16 values), each
      followed by `<TYPE>.want`: gguf-py's dequantization of it, in F32.
  tiny_llama.json, tiny_qwen2.json, tiny_llama_kq.json, tiny_llama31.json, smollm2.json
      HF transformers' view of each file (AutoConfig / AutoTokenizer / AutoModelForCausalLM with
      gguf_file=..., float32, eager attention, CPU): the config; the tokenizer.json it derives,
      with model.vocab and model.merges replaced by SHA-256 digests (the whole vocabulary would be
      2 MB for SmolLM2); the ids of TEXTS; logits of a few prompts at some positions (a fixed
      subset of vocabulary columns, plus each row's log-sum-exp and argmax); for SmolLM2 also
      the greedy continuation of the chat prompt. smollm2.json is written only when the file is
      found (--smollm2, default .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf).
      tiny_llama_kq.json and tiny_llama31.json are compact (no tokenizer part: the vocabulary is
      tiny_llama's; 64 columns); tiny_llama_spm.json keeps 64 columns. transformers' GGUF loader ignores `rope_freqs.weight` (plain RoPE
      for llama), so tiny_llama31.json's logits are those of the HF model the file was converted
      from, as llama.cpp computes them; `hf_gguf_rel_err` records how far transformers' own GGUF
      load is from them.
  gemma3_270m_q4_k_m.json (--gemma3 PATH, default .cache/models/gemma-3-270m-q4_k_m.gguf from
      `make model-gemma3`; written only when the file is found)
      For every tensor of that real Q4_K_M file (Q4_K, Q6_K, Q5_0, Q8_0, F32): its type, dims and
      a digest of gguf-py's dequantization, sum over i of bits_i * (2 i + 1) mod 2^64 with bits_i
      the f32 bit pattern of value i in file order (any one value off changes it; cheap to
      recompute in an unoptimised test build, unlike SHA-256 over 1 GB), and a few sampled values;
      also the tokenizer transformers derives from it (Gemma's SentencePiece, as for the tiny
      files) and the ids of TEXTS.

Digests (so Rust can recompute them from its own tokenizer.json): vocab = SHA-256 of
"<id>\\t<token>\\n" for every entry sorted by id then token; merges = SHA-256 of "<a> <b>\\n" per
merge in order.

Needs the torch venv (bench/requirements-torch.txt: torch, transformers, gguf).
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch

from make_fixtures import randomize_parameters

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "fixtures", "gguf")
SMOLLM2_DEFAULT = os.path.join(REPO, ".cache", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3_DEFAULT = os.path.join(REPO, ".cache", "models", "gemma-3-270m-q4_k_m.gguf")

# Texts whose token ids must match exactly: digits, runs of spaces, newlines, unicode, code,
# contractions, the ChatML and think tokens (whole and glued to text), empty and blank strings.
TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    "digits 1234567890, 3.14159 and 1e-5; 17 * 23 = 391",
    "multiple   spaces\tand\ttabs  \t ",
    "new\nlines\n\n\nand\r\nCRLF\r\n",
    "unicode: café naïve Straße 日本語のテキスト Ελληνικά emoji 🙂👍🏽 ü€",
    "def f(x):\n    return x**2  # square\n\nprint(f(17 * 23))\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n",
    "<think>reasoning here</think> the answer<|im_end|>",
    "a<|im_end|>b<|im_start|>c<|endoftext|>d",
    "<|endoftext|>",
    "don't I'll we've they'RE",
    "   ",
    "",
    "\u00a0non-breaking\u200bzero-width",
    "{\"json\": [1, 2, 3], \"key\": null}",
]

CHAT_QUESTION = "What is 17 * 23? Write a short Python program that prints it."

PROMPTS = {
    "plain": "The capital of France is",
    "code": "def fibonacci(n):\n    if n < 2:\n        return n\n",
}

N_COLUMNS = 512  # vocabulary columns kept per logits row (all of a smaller vocabulary)
GREEDY_TOKENS = 32


def sha256_lines(lines):
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def tokenizer_summary(tok, digest_added=False):
    """The derived tokenizer.json with vocab and merges as digests (and with `digest_added`, the
    added tokens: SHA-256 of "<id>\\t<content>\\t<special>\\t<normalized>\\t<lstrip>\\t<rstrip>\\t
    <single_word>\\n" per entry in order, booleans as 0/1; Gemma's file has 6k of them)."""
    j = json.loads(tok.backend_tokenizer.to_str())
    if digest_added:
        keys = ("special", "normalized", "lstrip", "rstrip", "single_word")
        lines = ["\t".join([str(a["id"]), a["content"], *(str(int(a[k])) for k in keys)]) for a in j["added_tokens"]]
        j["added_tokens"] = {"entries": len(lines), "sha256": sha256_lines(lines)}
    model = j["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: (kv[1], kv[0]))
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    model["vocab"] = {"entries": len(vocab), "sha256": sha256_lines(f"{i}\t{t}" for t, i in vocab)}
    model["merges"] = {"entries": len(merges), "sha256": sha256_lines(merges)}
    return {
        "json": j,
        "chat_template": tok.chat_template,
        "special_tokens": {k: str(v) for k, v in tok.special_tokens_map.items()},
    }


def load_hf(path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.dirname(path), os.path.basename(path)
    config = AutoConfig.from_pretrained(d, gguf_file=f)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager")
    return config, tok, model.eval()


def logits_rows(model, ids, columns, positions):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    rows = logits[positions]
    return {
        "positions": positions,
        "logits": rows[:, columns].float().tolist(),
        "logsumexp": torch.logsumexp(rows, dim=-1).tolist(),
        "argmax": rows.argmax(dim=-1).tolist(),
    }


def reference(path, name, greedy, compact=False, hf_model=None, n_columns=N_COLUMNS):
    """HF's view of the GGUF file `path`; `hf_model` replaces the model transformers loads from it
    (for logits the GGUF loader cannot give), `compact` leaves out the tokenizer part and keeps
    64 logit columns, `n_columns` sets how many otherwise."""
    config, tok, model = load_hf(path)
    gguf_model = None
    if hf_model is not None:
        gguf_model, model = model, hf_model
    V = config.vocab_size
    rng = np.random.default_rng(0)
    n_columns = 64 if compact else n_columns
    columns = sorted(rng.choice(V, n_columns, replace=False).tolist()) if V > n_columns else list(range(V))
    prompts = dict(PROMPTS)
    if tok.chat_template:
        prompts["chat"] = tok.apply_chat_template(
            [{"role": "user", "content": CHAT_QUESTION}], add_generation_prompt=True, tokenize=False
        )
    out_prompts = []
    gguf_err = 0.0
    for pname, text in prompts.items():
        ids = tok(text)["input_ids"]
        T = len(ids)
        positions = sorted({0, 1, T // 3, T // 2, (2 * T) // 3, T - 2, T - 1} & set(range(T)))
        out_prompts.append({"name": pname, "text": text, "ids": ids, **logits_rows(model, ids, columns, positions)})
        if gguf_model is not None:
            with torch.no_grad():
                a = gguf_model(torch.tensor([ids])).logits[0].double()
                b = model(torch.tensor([ids])).logits[0].double()
            gguf_err = max(gguf_err, ((a - b).abs().max() / b.abs().max()).item())
    result = {
        "file": os.path.basename(path),
        "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
        "versions": versions(),
        "config": {k: v for k, v in config.to_dict().items() if k in CONFIG_KEYS},
    }
    if not compact:
        result["tokenizer"] = tokenizer_summary(tok)
        result["texts"] = [{"text": t, "ids": tok(t)["input_ids"]} for t in TEXTS]
    result["columns"] = columns
    result["prompts"] = out_prompts
    if gguf_model is not None:
        result["hf_gguf_rel_err"] = gguf_err
    result["config"]["rope_theta"] = config.rope_parameters["rope_theta"]
    if greedy and "chat" in prompts:
        ids = tok(prompts["chat"])["input_ids"]
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False)[0, len(ids):]
        result["greedy"] = {"prompt": "chat", "ids": gen.tolist(), "text": tok.decode(gen)}
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump(result, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    extra = f", transformers' GGUF load {gguf_err:.2e} from the HF model" if gguf_model is not None else ""
    print(f"{name}: vocab {V}, {len(out_prompts)} prompts, {os.path.getsize(os.path.join(OUT, name + '.json'))} bytes{extra}")


CONFIG_KEYS = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
}


def versions():
    from importlib.metadata import version
    return {"torch": torch.__version__, "transformers": version("transformers"), "gguf": version("gguf"),
            "python": sys.version.split()[0]}


# ---- the tiny synthetic models -------------------------------------------------------------

TINY = {
    "tiny_llama": dict(
        arch="llama", hidden=32, inter=64, layers=2, heads=4, kv_heads=2, tie=False,
        rope_theta=50000.0, eps=1e-5, seed=11, pre=None, add_bos=True,
        specials=["<|begin|>", "<|end|>"], bos="<|begin|>", eos="<|end|>", pad=None,
        chat_template=None,
    ),
    "tiny_qwen2": dict(
        arch="qwen2", hidden=32, inter=64, layers=2, heads=4, kv_heads=1, tie=True,
        rope_theta=1000000.0, eps=1e-6, seed=12, pre="qwen2", add_bos=False,
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=(
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
            " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
        ),
    ),    # K-quants need rows of 256: hidden 256, two heads of 64 (q [128, 256], o rows of 128 in the
    # 32-blocks), one kv head, intermediate 64 (down rows of 64 in the 32-blocks).
    "tiny_llama_kq": dict(
        arch="llama", hidden=256, inter=64, layers=1, heads=2, kv_heads=1, head_dim=64, tie=True,
        rope_theta=10000.0, eps=1e-5, seed=13, pre=None, add_bos=True,
        specials=["<|begin|>", "<|end|>"], bos="<|begin|>", eos="<|end|>", pad=None,
        chat_template=None, embd_type="Q6_K",
        types=["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q4_K", "Q6_K", "Q5_1"],
    ),
    # A SentencePiece vocabulary (tokenizer.ggml.model "llama", as Llama 2 and Mistral files):
    # no add_bos_token key (llama.cpp and transformers then add BOS), no merges.
    "tiny_llama_spm": dict(
        arch="llama", hidden=32, inter=64, layers=1, heads=4, kv_heads=2, tie=True,
        rope_theta=10000.0, eps=1e-5, seed=15, pre="default", add_bos=None, spm=True,
        specials=[], bos="<s>", eos="</s>", unk="<unk>", pad=None, chat_template=None, columns=64,
    ),
    # Llama 3.1-style RoPE scaling, as in make_fixtures.py's llama3_rope: head_dim 8 and
    # original_max_position_embeddings 64 put the four frequencies in all three bands.
    "tiny_llama31": dict(
        arch="llama", hidden=32, inter=64, layers=1, heads=4, kv_heads=2, tie=True,
        rope_theta=10000.0, eps=1e-5, seed=14, pre=None, add_bos=True,
        specials=["<|begin|>", "<|end|>"], bos="<|begin|>", eos="<|end|>", pad=None,
        chat_template=None, embd_type="F32", types=["F32"],
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64),
    ),
}

# Tensor types, assigned in turn to the 2-D weights of each layer (every type appears on q, k, v,
# o, gate, up and down somewhere), so each dequantization feeds the logits.
TYPE_CYCLE = ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "F32"]

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(17, 23))\n",
    "What is 17 * 23? The answer is 391. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "Hello world! Hello there, world. Think step by step, then answer.",
    "<think>",  # the word, not the token
]


def tiny_vocab(spec):
    """A byte-level BPE trained here: (tokens, token types, merges)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(TRAIN_TEXT * 20, trainer)
    j = json.loads(tk.to_str())
    vocab = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    assert [i for _, i in vocab] == list(range(len(tokens)))
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    types = [1] * len(tokens)
    extra = [(t, 3) for t in spec["specials"]]
    extra += [("<think>", 4), ("</think>", 4)]  # USER_DEFINED: added whole, not special
    extra += [("<ctl x>", 3)]  # CONTROL with a space: not in the byte alphabet, HF skips it
    extra += [("€", 1)]  # outside the byte alphabet: respelled through its UTF-8 bytes
    for t, ty in extra:
        tokens.append(t)
        types.append(ty)
    return tokens, types, merges


def tiny_spm_vocab(spec):
    """A SentencePiece-style vocabulary as Llama 2 / Mistral GGUFs carry it: (tokens, types,
    scores). <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF> (byte fallback), the pieces of
    a BPE trained here with ▁ for spaces (merged pieces in merge order, score -rank; single
    characters last with lower scores, as in Llama 2's file), then a CONTROL and two
    USER_DEFINED tokens. No merges: transformers rebuilds them from the scores."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False)
    tk.train_from_iterator(TRAIN_TEXT * 20, trainer)
    j = json.loads(tk.to_str())
    merged = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in j["model"]["merges"]]
    chars = [t for t, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]) if len(t) == 1]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for rank, t in enumerate(dict.fromkeys(merged)):
        tokens.append(t), types.append(1), scores.append(-float(rank))
    for k, t in enumerate(chars):
        tokens.append(t), types.append(1), scores.append(-1000.0 - k)
    for t, ty in (("<ctl>", 3), ("<think>", 4), ("</think>", 4)):
        tokens.append(t), types.append(ty), scores.append(0.0)
    return tokens, types, scores


def permute_qk(w, n_head):
    """llama.cpp's converter: within each head, rows (half, half) -> interleaved pairs."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny(name, spec):
    import gguf
    from gguf import GGMLQuantizationType as Q
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spm = spec.get("spm", False)
    tokens, types, merges = tiny_spm_vocab(spec) if spm else tiny_vocab(spec)
    V = len(tokens)
    arch = spec["arch"]
    cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    head_dim = spec.get("head_dim", spec["hidden"] // spec["heads"])
    extra = {"head_dim": head_dim} if "head_dim" in spec else {}
    if "rope_scaling" in spec:
        extra["rope_parameters"] = dict(rope_theta=spec["rope_theta"], **spec["rope_scaling"])
        extra["attn_implementation"] = "eager"  # this model is the logits reference itself
    else:
        extra["rope_theta"] = spec["rope_theta"]
    cfg = cfg_cls(vocab_size=V, hidden_size=spec["hidden"], intermediate_size=spec["inter"],
                  num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                  num_key_value_heads=spec["kv_heads"], tie_word_embeddings=spec["tie"],
                  rms_norm_eps=spec["eps"], max_position_embeddings=256, **extra)
    torch.manual_seed(spec["seed"])
    model = model_cls(cfg).float().eval()
    randomize_parameters(model)

    path = os.path.join(OUT, f"{name}.gguf")
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_block_count(spec["layers"])
    w.add_context_length(256)
    w.add_embedding_length(spec["hidden"])
    w.add_feed_forward_length(spec["inter"])
    w.add_head_count(spec["heads"])
    w.add_head_count_kv(spec["kv_heads"])
    w.add_rope_freq_base(spec["rope_theta"])
    w.add_layer_norm_rms_eps(spec["eps"])
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
        w.add_vocab_size(V)  # qwen2 leaves it out: the size comes from the token list
    w.add_tokenizer_model("llama" if spm else "gpt2")
    if spec["pre"]:
        w.add_tokenizer_pre(spec["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    if spm:
        w.add_token_scores(merges)  # the scores: SentencePiece files carry no merges
    else:
        w.add_token_merges(merges)
    for key, tok in (("bos", spec["bos"]), ("eos", spec["eos"]), ("pad", spec["pad"]), ("unk", spec.get("unk"))):
        if tok is not None:
            getattr(w, f"add_{key}_token_id")(tokens.index(tok))
    if spec["add_bos"] is not None:
        w.add_add_bos_token(spec["add_bos"])
    if spec["chat_template"]:
        w.add_chat_template(spec["chat_template"])

    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    cycle = iter(spec.get("types", TYPE_CYCLE) * 100)

    def put(gguf_name, arr, qtype):
        qt = getattr(Q, qtype)
        if qt == Q.F32:
            w.add_tensor(gguf_name, arr.astype(np.float32))
        elif qt == Q.F16:
            w.add_tensor(gguf_name, arr.astype(np.float16))
        elif qtype in K_QUANTS:
            w.add_tensor(gguf_name, quantize_k(arr, qtype), raw_dtype=qt)
        else:
            w.add_tensor(gguf_name, gguf.quants.quantize(arr, qt), raw_dtype=qt)

    if "rope_scaling" in spec:
        # As llama.cpp's converter: the factors go into a tensor, the metadata stays plain llama.
        put("rope_freqs.weight", llama3_rope_factors(head_dim, spec["rope_theta"], spec["rope_scaling"]), "F32")
    embd_type = spec.get("embd_type", "Q8_0" if arch == "llama" else "F16")
    put("token_embd.weight", sd["model.embed_tokens.weight"], embd_type)
    hf_names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
    for layer in range(spec["layers"]):
        for g, h in hf_names.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{layer}.{h}.{kind}"
                if key not in sd:
                    continue
                arr = sd[key]
                if arch == "llama" and g in ("attn_q", "attn_k"):
                    arr = permute_qk(arr, spec["heads"] if g == "attn_q" else spec["kv_heads"])
                qtype = next(cycle) if kind == "weight" else ("F16" if layer == 1 and g == "attn_v" else "F32")
                if embd_type == "F32":
                    qtype = "F32"  # exact weights: the reference is the HF model itself
                put(f"blk.{layer}.{g}.{kind}", arr, qtype)
        put(f"blk.{layer}.attn_norm.weight", sd[f"model.layers.{layer}.input_layernorm.weight"], "F32")
        put(f"blk.{layer}.ffn_norm.weight", sd[f"model.layers.{layer}.post_attention_layernorm.weight"],
            "F16" if layer == 1 and embd_type != "F32" else "F32")
    put("output_norm.weight", sd["model.norm.weight"], "F32")
    if not spec["tie"]:
        put("output.weight", sd["lm_head.weight"], "Q4_1")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{name}.gguf: {os.path.getsize(path)} bytes")
    return path, model


def llama3_rope_factors(head_dim, theta, r):
    """The `rope_freqs.weight` llama.cpp's converter writes for rope_type llama3: per frequency, 1
    (short wavelengths), `factor` (long ones) or the inverse of HF's smoothing weight between."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    old = r["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / r["low_freq_factor"], old / r["high_freq_factor"]
    out = []
    for f in inv_freq:
        wavelen = 2 * np.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(r["factor"])
        else:
            smooth = (old / wavelen - r["low_freq_factor"]) / (r["high_freq_factor"] - r["low_freq_factor"])
            out.append(1.0 / ((1 - smooth) / r["factor"] + smooth))
    return np.array(out, dtype=np.float32)


# ---- K-quant encoding ----------------------------------------------------------------------

K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
QK_K = 256


def _div(a, b):
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32), where=b != 0)


def quantize_k(arr, qtype):
    """Rows of `arr` (a multiple of 256 long) as Q4_K / Q5_K / Q6_K blocks, shaped as
    gguf.quants.quantize returns them. A plain fit (per sub-block: min/max for Q4_K/Q5_K, the
    signed extreme for Q6_K; 6-bit or int8 scales of those), not ggml's search for the best
    scales: any bytes are valid blocks, and what the parity test checks is decoding them."""
    rows = arr.astype(np.float32).reshape(-1, QK_K)
    n = rows.shape[0]
    f16 = lambda x: x.astype(np.float16)
    if qtype == "Q6_K":
        g = rows.reshape(n, 16, 16)
        extreme = np.take_along_axis(g, np.abs(g).argmax(axis=-1)[..., None], axis=-1)[..., 0]
        s = extreme / -32  # the extreme maps to q = 0 (value -32), as in ggml: negative scales too
        d = f16(np.abs(s).max(axis=-1) / 127)
        sc = _div(s, d.astype(np.float32)[:, None]).round().clip(-128, 127).astype(np.int8)
        eff = d.astype(np.float32)[:, None] * sc.astype(np.float32)
        q = (_div(g, eff[..., None]).round() + 32).clip(0, 63).astype(np.uint8).reshape(n, 2, 4, 32)
        ql = np.zeros((n, 2, 64), np.uint8)
        qh = np.zeros((n, 2, 32), np.uint8)
        for grp in range(4):
            ql[:, :, 32 * (grp % 2):][:, :, :32] |= (q[:, :, grp] & 15) << np.uint8(4 * (grp // 2))
            qh |= (q[:, :, grp] >> np.uint8(4)) << np.uint8(2 * grp)
        blocks = [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d.reshape(n, 1).view(np.uint8)]
    else:
        top = 15 if qtype == "Q4_K" else 31
        g = rows.reshape(n, 8, 32)
        lo = np.minimum(g.min(axis=-1), 0)
        scale, mins = (g.max(axis=-1) - lo) / top, -lo
        d, dmin = f16(scale.max(axis=-1) / 63), f16(mins.max(axis=-1) / 63)
        sc = _div(scale, d.astype(np.float32)[:, None]).round().clip(0, 63).astype(np.uint8)
        mn = _div(mins, dmin.astype(np.float32)[:, None]).round().clip(0, 63).astype(np.uint8)
        eff = d.astype(np.float32)[:, None] * sc.astype(np.float32)
        effmin = dmin.astype(np.float32)[:, None] * mn.astype(np.float32)
        q = _div(g + effmin[..., None], eff[..., None]).round().clip(0, top).astype(np.uint8)
        # 6-bit scales: sub-blocks 0-3 in the low bits of bytes 0-3 (scale) and 4-7 (min); 4-7
        # in nibbles of bytes 8-11, their top two bits in the spare bits of bytes 0-7.
        packed = np.zeros((n, 12), np.uint8)
        for i in range(4):
            packed[:, i] = sc[:, i] | ((sc[:, i + 4] >> 4) << 6)
            packed[:, i + 4] = mn[:, i] | ((mn[:, i + 4] >> 4) << 6)
            packed[:, i + 8] = (sc[:, i + 4] & 15) | ((mn[:, i + 4] & 15) << 4)
        qs = np.concatenate([(q[:, 2 * c] & 15) | ((q[:, 2 * c + 1] & 15) << 4) for c in range(4)], axis=1)
        blocks = [d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8), packed]
        if qtype == "Q5_K":
            qh = np.zeros((n, 32), np.uint8)
            for i in range(8):
                qh |= ((q[:, i] >> 4) & 1) << np.uint8(i)
            blocks.append(qh)
        blocks.append(qs)
    out = np.concatenate(blocks, axis=1)
    return out.reshape(*arr.shape[:-1], -1)


QUANT_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
# Where each type keeps its f16 scales: byte offsets of d (and m / dmin) within a block.
SCALE_OFFSETS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
                 "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def write_quant_blocks():
    """quant_blocks.gguf: random blocks of each type and gguf-py's dequantization of them. Random
    bytes set every bit of every field (6-bit scale packing, high bits, signs); only the f16
    scales are drawn as finite values (one subnormal), so the reference has no NaN."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    rng = np.random.default_rng(47)
    path = os.path.join(OUT, "quant_blocks.gguf")
    w = gguf.GGUFWriter(path, "llama")
    for name in QUANT_TYPES:
        qt = getattr(Q, name)
        block, size = gguf.GGML_QUANT_SIZES[qt]
        n_blocks = 1024 // block
        raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
        for off in SCALE_OFFSETS[name]:
            scales = rng.normal(0, 0.05, n_blocks).astype(np.float16)
            scales[0] = np.float16(3e-6)  # subnormal in f16
            raw[:, off:off + 2] = scales.reshape(-1, 1).view(np.uint8)
        raw = raw.reshape(-1)
        want = gguf.quants.dequantize(raw, qt).astype(np.float32)
        assert want.shape == (n_blocks * block,) and np.isfinite(want).all()
        w.add_tensor(name, raw, raw_dtype=qt)
        w.add_tensor(f"{name}.want", want)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"quant_blocks.gguf: {len(QUANT_TYPES)} types, {os.path.getsize(path)} bytes")


def position_digest(values):
    """sum_i bits_i * (2 i + 1) mod 2^64 over the f32 bit patterns, in chunks (the embedding has
    168M values)."""
    bits = values.reshape(-1).view(np.uint32)
    total = 0
    chunk = 1 << 24
    for start in range(0, bits.size, chunk):
        b = bits[start:start + chunk].astype(np.uint64)
        weights = np.arange(start, start + b.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        total = (total + int(np.sum(b * weights, dtype=np.uint64))) % 2**64  # numpy's sum wraps too
    return total


def gemma3_digests(path):
    import gguf
    reader = gguf.GGUFReader(path)
    rng = np.random.default_rng(3)
    tensors = []
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        assert values.size == int(np.prod(t.shape)), t.name
        idx = sorted({0, values.size - 1, *rng.integers(0, values.size, 4).tolist()})
        tensors.append({
            "name": t.name, "type": t.tensor_type.name, "dims": [int(d) for d in t.shape],
            "digest": str(position_digest(values)),
            "samples": [[i, float(values[i])] for i in idx],
        })
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    result = {
        "file": os.path.basename(path),
        "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
        "versions": versions(),
        "tensors": tensors,
        # Gemma's SentencePiece vocabulary, as transformers builds it from the file.
        "tokenizer": tokenizer_summary(tok, digest_added=True),
        "texts": [{"text": t, "ids": tok(t)["input_ids"]} for t in TEXTS],
    }
    out = os.path.join(OUT, "gemma3_270m_q4_k_m.json")
    with open(out, "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")
    types = sorted({t["type"] for t in tensors})
    print(f"gemma3_270m_q4_k_m.json: {len(tensors)} tensors ({', '.join(types)}), {os.path.getsize(out)} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", default=SMOLLM2_DEFAULT, help="SmolLM2-135M-Instruct.Q4_1.gguf (make model)")
    ap.add_argument("--gemma3", default=GEMMA3_DEFAULT, help="gemma-3-270m-q4_k_m.gguf (make model-gemma3)")
    ap.add_argument("--only-gemma3", action="store_true", help="write gemma3_270m_q4_k_m.json alone")
    args = ap.parse_args()
    if args.only_gemma3:
        return gemma3_digests(args.gemma3)
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(2)
    write_quant_blocks()
    for name, spec in TINY.items():
        path, model = write_tiny(name, spec)
        compact = name not in ("tiny_llama", "tiny_qwen2", "tiny_llama_spm")
        reference(path, name, greedy=False, compact=compact, hf_model=model if "rope_scaling" in spec else None,
                  n_columns=spec.get("columns", N_COLUMNS))
    if os.path.exists(args.smollm2):
        reference(args.smollm2, "smollm2", greedy=True)
    else:
        print(f"skipping smollm2.json: {args.smollm2} not found (make model)")
    if os.path.exists(args.gemma3):
        gemma3_digests(args.gemma3)
    else:
        print(f"skipping gemma3_270m_q4_k_m.json: {args.gemma3} not found (make model-gemma3)")


if __name__ == "__main__":
    main()
