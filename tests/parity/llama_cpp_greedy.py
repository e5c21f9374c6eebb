#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) on a GGUF file written by coa_model::gguf::save, for
stages/coa-model/tests/gguf_export.rs.

    python llama_cpp_greedy.py FILE.gguf IDS_JSON N TEXT

Loads the file, evaluates the prompt ids IDS_JSON (a JSON list), decodes N tokens greedily (the
argmax of each last row of logits) and tokenizes TEXT (no BOS, special tokens parsed). Prints
{"greedy": [...], "tokenize": [...], "n_vocab": ...} as JSON.
"""
import json
import sys

import numpy as np
from llama_cpp import Llama


def main(path, ids_json, n, text):
    # One thread: OpenMP workers spin-wait for each other on a shared 2-core machine.
    # logits_all: without it llama-cpp-python 0.3 leaves `scores` unfilled (sampling is done
    # inside its sampler), and every argmax would read zeros.
    llm = Llama(model_path=path, n_ctx=512, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False)
    ids = json.loads(ids_json)
    llm.eval(ids)
    greedy = []
    for _ in range(int(n)):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(nxt)
        llm.eval([nxt])
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    print(json.dumps({"greedy": greedy, "tokenize": list(tokens), "n_vocab": llm.n_vocab()}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
