"""Checks a sharded checkpoint our save wrote against huggingface_hub's own sharding.

    python check_sharded.py DIR MAX_SHARD_BYTES < names.json

names.json: the parameter names in the model's order (the order HF's state_dict has them).
huggingface_hub's split_state_dict_into_shards_factory (what save_pretrained calls) cuts the
tensors read back from DIR's shards at MAX_SHARD_BYTES; the files, the tensor -> file map and the
total size must equal DIR's index. Prints "ok" or exits non-zero with the difference.
"""
import json
import sys

from huggingface_hub import split_state_dict_into_shards_factory
from safetensors import safe_open
from safetensors.numpy import load_file

directory, limit = sys.argv[1], int(sys.argv[2])
order = json.load(sys.stdin)
with open(f"{directory}/model.safetensors.index.json") as f:
    index = json.load(f)
tensors = {}
for name in sorted(set(index["weight_map"].values())):
    with safe_open(f"{directory}/{name}", framework="numpy") as f:
        if f.metadata() != {"format": "pt"}:
            sys.exit(f"{name}: metadata {f.metadata()}, expected {{'format': 'pt'}} (transformers refuses others)")
    part = load_file(f"{directory}/{name}")
    for key in part:
        if index["weight_map"].get(key) != name:
            sys.exit(f"{key} is in {name} but the index says {index['weight_map'].get(key)}")
    tensors.update(part)
if sorted(tensors) != sorted(order):
    sys.exit(f"the shards hold {sorted(tensors)}, the model {sorted(order)}")
split = split_state_dict_into_shards_factory(
    {k: tensors[k] for k in order},
    get_storage_size=lambda t: t.nbytes,
    filename_pattern="model{suffix}.safetensors",
    max_shard_size=limit,
)
if not split.is_sharded:
    sys.exit("huggingface_hub would write one file at this size")
if split.tensor_to_filename != index["weight_map"]:
    diff = {k: (v, index["weight_map"].get(k)) for k, v in split.tensor_to_filename.items() if index["weight_map"].get(k) != v}
    sys.exit(f"tensor -> file differs (hub, ours): {diff}")
if index["metadata"].get("total_size") != split.metadata["total_size"]:
    sys.exit(f"total_size {index['metadata'].get('total_size')}, hub {split.metadata['total_size']}")
print("ok")
