#!/usr/bin/env python3
"""gguf-py's view of GGUF files written by coa_model::gguf::save, for
stages/coa-model/tests/gguf_export.rs.

    python check_gguf_export.py F32.gguf [F16.gguf BF16.gguf Q8_0.gguf ...]

The first file must be the F32 export; the others the same model in other dtypes. Prints a JSON
list, one entry per file: its tensors (name, ggml dims, type name) as GGUFReader reads them, its
metadata (scalars by value, arrays by length and first element), and how many of its non-F32
tensors hold exactly the bytes gguf-py's own `quantize` makes of the F32 file's values (any
other is an error).
"""
import json
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import quantize


def metadata(reader):
    out = {}
    for name, field in reader.fields.items():
        if field.types and field.types[0] == GGUFValueType.ARRAY:
            items = field.contents()
            out[name] = {"len": len(items), "first": items[0] if items and isinstance(items[0], str) else None}
        else:
            v = field.contents()
            out[name] = v.item() if hasattr(v, "item") else v
    return out


def main(paths):
    base = {t.name: np.asarray(t.data) for t in GGUFReader(paths[0]).tensors}
    report = []
    for path in paths:
        reader = GGUFReader(path)
        same = 0
        for t in reader.tensors:
            if t.tensor_type.name == "F32":
                continue
            want = quantize(base[t.name].astype(np.float32), t.tensor_type)
            got = np.asarray(t.data)
            if want.tobytes() != got.tobytes():
                sys.exit(f"{path}: tensor {t.name} ({t.tensor_type.name}) differs from gguf-py's quantize")
            same += 1
        report.append({
            "file": path,
            "tensors": [[t.name, [int(d) for d in t.shape], t.tensor_type.name] for t in reader.tensors],
            "metadata": metadata(reader),
            "quantized_like_gguf_py": same,
        })
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
