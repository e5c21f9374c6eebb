#!/usr/bin/env python3
"""LoRA parity fixtures (stages/coa-model/tests/parity.rs), made with HF transformers + PEFT
on PyTorch CPU; and a check that PEFT loads an adapter coa-train-step saved.

Runs on demand, not in CI; its outputs under tests/parity/fixtures/<case>/ are committed.

    .venv-torch/bin/python tests/parity/make_lora_fixtures.py              # (re)write the fixtures
    .venv-torch/bin/python tests/parity/make_lora_fixtures.py --check-adapter DIR

Each fixture directory <case>/ holds:
  base/      config.json, model.safetensors: the random base model (make_fixtures.py's init)
  adapter/   adapter_config.json, adapter_model.safetensors: PEFT's save_pretrained of a LoRA
             adapter with random A and nonzero random B (a fresh B is zero and would test
             nothing); its base_model_name_or_path is "../base"
  inputs.json      input_ids, loss_mask, loss, the LoRA settings, the library versions
  expected.safetensors  "logits" [T,V] of the adapted model, "merged_logits" of
             merge_and_unload(), and "grad.<adapter tensor name>" for every A and B (the base
             is frozen, as PEFT leaves it)

The loss is HF's causal-LM loss (labels = input_ids, -100 where loss_mask is 0). lora_dropout is
0 here: a dropout mask is a property of a random stream the two sides do not share (our dropout is
checked against finite differences instead).

Needs .venv-torch (bench/requirements-torch.txt: torch, transformers, peft).
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import FIXTURES, build, versions  # noqa: E402

CASES = {
    # llama GQA untied, every linear layer adapted
    "lora_llama_all_linear": dict(
        base=dict(model_type="llama", vocab_size=61, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-5, T=20, seed=11),
        lora=dict(r=4, lora_alpha=8, target_modules="all-linear"),
    ),
    # qwen2 (q/k/v bias), tied, PEFT's default targets for this family (q_proj, v_proj)
    "lora_qwen2_default": dict(
        base=dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=56,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                  tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6, T=18, seed=12),
        lora=dict(r=2, lora_alpha=5),
    ),
}


def all_versions():
    import peft
    v = versions()
    v["peft"] = peft.__version__
    return v


def run_case(name, case, out_root):
    from peft import LoraConfig, get_peft_model
    model, cfg, ids, mask, _ = build(case["base"])
    d = os.path.join(out_root, name)
    base_dir = os.path.join(d, "base")
    model.save_pretrained(base_dir, safe_serialization=True)
    gen = os.path.join(base_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    lc = LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **case["lora"])
    pm = get_peft_model(model, lc)
    g = torch.Generator().manual_seed(case["base"]["seed"] + 200)
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if "lora_" in pname:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    labels = ids.clone()
    labels[mask == 0] = -100
    pm.train()  # dropout 0: train and eval compute the same
    out = pm(input_ids=ids[None], labels=labels[None])
    out.loss.backward()
    tensors = {"logits": out.logits[0].detach().contiguous().float()}
    for pname, p in pm.named_parameters():
        if p.requires_grad:
            tensors["grad." + pname.replace(".default", "")] = p.grad.detach().contiguous().float()
    pm.peft_config["default"].base_model_name_or_path = "../base"
    pm.save_pretrained(os.path.join(d, "adapter"))
    os.remove(os.path.join(d, "adapter", "README.md"))  # PEFT's model card template
    merged = pm.merge_and_unload().eval()
    with torch.no_grad():
        tensors["merged_logits"] = merged(input_ids=ids[None]).logits[0].contiguous().float()
    save_file(tensors, os.path.join(d, "expected.safetensors"))
    info = {
        "input_ids": ids.tolist(),
        "loss_mask": mask.tolist(),
        "loss": float(out.loss.item()),
        "lora": {k: v for k, v in case["lora"].items()},
        "versions": all_versions(),
        "note": "loss = HF causal-LM loss of the PEFT model, labels = input_ids, -100 where loss_mask == 0",
    }
    with open(os.path.join(d, "inputs.json"), "w") as f:
        json.dump(info, f, indent=1)
    n = sum(1 for k in tensors if k.startswith("grad."))
    print(f"{name}: T={ids.shape[0]} loss={out.loss.item():.6f}, {n} adapter gradients")


def check_adapter(d):
    """Loads a directory coa-train-step wrote (base + adapter) the way PEFT users do, and compares
    the adapted model's logits with parity_logits.safetensors ("input_ids" as f32, "logits")
    written beside it by the Rust side."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, d).eval()
    n = sum(p.numel() for n_, p in model.named_parameters() if "lora_" in n_)
    print(f"PEFT loaded {type(model).__name__} from {d}: {n} adapter values")
    t = load_file(os.path.join(d, "parity_logits.safetensors"))
    ids = t["input_ids"].round().long()[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    err = ((t["logits"] - logits).abs().max() / logits.abs().max()).item()
    print(f"logits rel err (max|ours - peft| / max|peft|) = {err:.3e}")
    if not err < 1e-5:
        print("FAIL: above 1e-5")
        sys.exit(1)
    print("OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-adapter", metavar="DIR", help="load an adapter directory we wrote in PEFT")
    ap.add_argument("--out", default=FIXTURES, help="fixture root (default: tests/parity/fixtures)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if a.check_adapter:
        check_adapter(a.check_adapter)
        return
    for name, case in CASES.items():
        run_case(name, case, a.out)


if __name__ == "__main__":
    main()
