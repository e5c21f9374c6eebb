"""Loads a checkpoint coa-train-step saved with HF transformers, as verl, vLLM and TRL users do.

    python tests/hf/check_checkpoint.py CKPT CASE.json

CASE.json (written by tests/tests/hf_checkpoint.rs): the system prompt and question of a task,
the prompt ids coa-tokenize laid out for it (`prefix_ids`), a CoA text, and the CoA tags.
Checks, each an assertion: the special ids agree across tokenizer, config.json and
generation_config.json; `apply_chat_template` gives our prompt ids; every tag is one id that
`decode(skip_special_tokens=True)` keeps, and the CoA text round-trips; `tokenizer.pad` works;
and, where PyTorch is installed, greedy `generate` stops at EOS on its own. Prints one line per
check; exit status 0 when all hold.
"""
import json
import sys

from transformers import AutoConfig, AutoTokenizer, GenerationConfig


def ids_of(encoded):
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list
    return list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)


def main(ckpt, case_path):
    case = json.load(open(case_path))
    tok = AutoTokenizer.from_pretrained(ckpt)
    config = AutoConfig.from_pretrained(ckpt)
    gen = GenerationConfig.from_pretrained(ckpt)

    eos = tok.eos_token_id
    assert eos is not None, "tokenizer has no eos_token"
    gen_eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    assert config.eos_token_id == eos and eos in gen_eos, (config.eos_token_id, gen.eos_token_id, eos)
    assert tok.pad_token_id is not None and gen.pad_token_id == tok.pad_token_id, (tok.pad_token_id, gen.pad_token_id)
    print(f"special ids: eos {eos} ({tok.eos_token}), pad {tok.pad_token_id}, bos {tok.bos_token_id}")

    messages = [{"role": "system", "content": case["system"]}, {"role": "user", "content": case["question"]}]
    prefix = ids_of(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    assert prefix == case["prefix_ids"], f"apply_chat_template gives\n{prefix}\nour prompt ids are\n{case['prefix_ids']}"
    print(f"apply_chat_template: the {len(prefix)} prompt ids coa-tokenize laid out")

    text = case["coa_text"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for tag in case["tags"]:
        one = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(one) == 1, f"{tag} encodes to {one}"
        assert tok.decode(one, skip_special_tokens=True) == tag, f"{tag} is dropped by skip_special_tokens"
    back = tok.decode(ids, skip_special_tokens=True)
    assert back == text, f"round trip differs:\n{back!r}\n{text!r}"
    print(f"CoA text: {len(ids)} ids, {len(case['tags'])} tags single ids, decode(skip_special_tokens=True) round-trips")

    padded = tok.pad({"input_ids": [ids[:5], ids[:3]]})
    assert padded["input_ids"][1].count(tok.pad_token_id) >= 2 and padded["attention_mask"][1].count(0) == 2, padded
    print("tokenizer.pad: ok")

    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("generate: skipped (no PyTorch in this Python; .venv-torch has it)")
        return
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    question = [{"role": "user", "content": "What is 2 + 3? Reply with the number only."}]
    prompt = torch.tensor([ids_of(tok.apply_chat_template(question, add_generation_prompt=True, tokenize=True))])
    budget = 48
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=budget, do_sample=False)
    new = out[0, prompt.shape[1]:].tolist()
    assert new and new[-1] == eos and len(new) < budget, f"generate did not stop at EOS: {tok.decode(new)!r}"
    print(f"generate: stopped at EOS after {len(new)} tokens: {tok.decode(new, skip_special_tokens=True)!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
