#!/usr/bin/env python3
"""Serving throughput: coa-serve against llama.cpp's server (llama-cpp-python[server]) on the same
GGUF, both over the OpenAI chat-completions API on loopback, both limited to the same threads.

Each server is started, warmed up with one request, and measured three ways:
- single stream: one streamed request of `--tokens` tokens at temperature 0; decode tokens/s is
  (tokens - 1) / (time of the last token - time of the first), and time to first token is from
  sending the request to the first content chunk;
- concurrent: `--clients` clients at once, each one request of `--tokens` tokens (temperature 1,
  its own seed), throughput = all completion tokens / wall time of the whole wave.
Completion tokens are the servers' own `usage` counts. A request may stop early at EOS; the prompts
ask for long answers and the counts are what was generated. Run it on an otherwise idle machine.

coa-serve decodes with `--coa-flags` (default bf16 products and KV cache); llama.cpp computes on the
GGUF's own quantized blocks.

usage: python bench/serve_bench.py --coa-serve target/release/coa-serve --gguf MODEL.gguf \
           --threads 2 --clients 16 --tokens 128 --out bench/results/serve.md
"""
import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a map.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a journey across a desert, day by day.",
    "Write a long letter to a friend about your new garden.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def wait_ready(base, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=2) as r:
                return json.load(r)["data"][0]["id"]
        except OSError:
            time.sleep(0.5)
    sys.exit(f"{what} did not answer on {base} within 300 s")


def body(model, prompt, tokens, stream, temperature=0.0, seed=0):
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": temperature, "seed": seed, "stream": stream}


def single_stream(base, model, tokens):
    """(time to first token s, decode tokens/s, completion tokens) of one streamed request."""
    t0 = time.perf_counter()
    times, usage = [], None
    with post(base + "/v1/chat/completions", body(model, PROMPTS[0], tokens, True) | {"stream_options": {"include_usage": True}}) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                if (c.get("delta") or {}).get("content"):
                    times.append(time.perf_counter())
    n = usage["completion_tokens"] if usage else len(times)
    ttft = times[0] - t0
    decode = (n - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")
    return ttft, decode, n


def concurrent(base, model, clients, tokens):
    """(completion tokens / s over the wave, completion tokens, seconds)."""
    counts = [0] * clients
    errors = []

    def one(i):
        try:
            with post(base + "/v1/chat/completions", body(model, PROMPTS[i % len(PROMPTS)], tokens, False, 1.0, i)) as r:
                counts[i] = json.load(r)["usage"]["completion_tokens"]
        except Exception as e:  # reported after the wave
            errors.append(f"client {i}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    if errors:
        sys.exit("concurrent wave failed: " + "; ".join(errors[:3]))
    return sum(counts) / secs, sum(counts), secs


def measure(name, cmd, env, base, args):
    # The server's log goes to a file (a pipe nobody reads fills up and stops the server).
    log = open(f"{args.out}.{name}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        model = wait_ready(base, proc, f"{name} (log: {log.name})")
        post(base + "/v1/chat/completions", body(model, "Hi", 8, False)).read()  # warm-up
        ttft, decode, n1 = single_stream(base, model, args.tokens)
        tput, n, secs = concurrent(base, model, args.clients, args.tokens)
        print(f"{name}: single stream {decode:.1f} tok/s (TTFT {ttft * 1000:.0f} ms, {n1} tokens); "
              f"{args.clients} clients {tput:.1f} tok/s ({n} tokens in {secs:.1f} s)", flush=True)
        return {"ttft": ttft, "decode": decode, "tput": tput, "n1": n1, "n": n, "secs": secs}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        os.remove(log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coa-serve", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--llama-python", default=sys.executable, help="a Python with llama-cpp-python[server]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--coa-flags", default="--decode-weights bf16-matmul --kv-cache bf16",
                    help="coa-serve's decoder flags (default: bf16 products and KV cache, AMX tiles where the CPU has them)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    port = free_port()
    coa = measure("coa-serve", [args.coa_serve, "--checkpoint", args.gguf, "--port", str(port), "--batch", str(args.clients),
                                "--threads", str(args.threads), "--context", "1024"] + args.coa_flags.split(), env, f"http://127.0.0.1:{port}", args)
    port = free_port()
    llama = measure("llama.cpp", [args.llama_python, "-m", "llama_cpp.server", "--model", args.gguf, "--host", "127.0.0.1", "--port", str(port),
                                  "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "1024"],
                    env, f"http://127.0.0.1:{port}", args)
    llama_version = subprocess.run([args.llama_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                   capture_output=True, text=True).stdout.strip()

    rows = [
        ("single-stream decode (tok/s)", coa["decode"], llama["decode"], "higher"),
        ("time to first token (ms)", coa["ttft"] * 1000, llama["ttft"] * 1000, "lower"),
        (f"throughput, {args.clients} clients (tok/s)", coa["tput"], llama["tput"], "higher"),
    ]
    lines = [
        "# Serving: coa-serve vs llama.cpp's server",
        "",
        f"`python bench/serve_bench.py --gguf {os.path.basename(args.gguf)} --threads {args.threads} --clients {args.clients} "
        f"--tokens {args.tokens}` (`make bench-serve`), {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, both servers limited to {args.threads} threads; coa-serve `{args.coa_flags}`; llama-cpp-python {llama_version}.",
        "",
        "| measure | coa-serve | llama.cpp | coa-serve / llama.cpp |",
        "|---|---:|---:|---:|",
    ]
    for name, a, b, better in rows:
        ratio = a / b if b else float("nan")
        lines.append(f"| {name} | {a:.1f} | {b:.1f} | {ratio:.2f}x ({better} is better) |")
    lines += [
        "",
        f"Completion tokens counted by each server's `usage`: single stream {coa['n1']} / {llama['n1']}; "
        f"{args.clients} clients {coa['n']} in {coa['secs']:.1f} s / {llama['n']} in {llama['secs']:.1f} s.",
        "Targets (issue 45): at least llama.cpp's tokens/s at one stream, at least 2x its throughput at 16 clients.",
        "",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
