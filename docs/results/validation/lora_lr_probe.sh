#!/bin/bash
# LoRA learning-rate probe: the first steps of the default SFT's schedule, killed after 150 s.
R=runs/default/sft; B=target/release
for lr in 2e-4 1e-3 2e-3; do
  echo "== lr $lr"
  timeout 150 $B/coa-train-step $R/multihop/tokens.parquet $R/math/tokens.parquet $R/code/tokens.parquet --objective sft \
    --init .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --new-token-lr-mult 10 --freeze-layers 0 --tokenizer $R/tokenizer.json \
    --seed 1 --epochs 0.5 --batch-tokens 4096 --lr $lr --min-lr $(python3 -c "print($lr/10)") --warmup-steps 3 --matmul bf16 \
    --lora-rank 16 --lora-alpha 32 --lora-targets all-linear --save /tmp/probe_$lr/checkpoint -o /tmp/probe_$lr/metrics.parquet 2>&1 | tail -30
done
