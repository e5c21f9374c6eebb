#!/bin/bash
# Issue 47: LoRA against the default's full fine-tune (B), on the validation split (seed 3).
set -euo pipefail
B=target/release; D=runs/default/sft; V=runs/val47; S=$V/lora
mkdir -p $V/test $S
$B/coa-generate tasks --split test --seed 3 --suite multihop --n 100 --suite math --n 100 --suite code --n 100 \
    --corpus-out $V/test/corpus.parquet -o $V/test/tasks.parquet
/usr/bin/time -v $B/coa-train-step $D/multihop/tokens.parquet $D/math/tokens.parquet $D/code/tokens.parquet --objective sft \
    --init .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --new-token-lr-mult 10 --freeze-layers 0 --tokenizer $D/tokenizer.json \
    --seed 1 --epochs 0.5 --batch-tokens 4096 --lr 2e-3 --min-lr 2e-4 --warmup-steps 3 --matmul bf16 \
    --lora-rank 16 --lora-alpha 32 --lora-targets all-linear --save-every 20 \
    --save $S/checkpoint --plot $S/loss.png --stats $S/train.json -o $S/metrics.parquet
eval_ckpt() {  # $1 checkpoint, $2 output dir
  mkdir -p $2
  $B/coa-generate policy --checkpoint $1 -i $V/test/tasks.parquet --corpus $V/test/corpus.parquet \
      --n 1 --temperature 0 --max-response-tokens 3072 --max-turns 16 --batch 50 --decode-weights bf16-matmul --kv-cache bf16 \
      --stats $2/policy.json -o $2/rollouts.parquet
  $B/coa-score -i $2/rollouts.parquet --tasks $V/test/tasks.parquet --max-response-len 3072 --overlong-cache 0 \
      --report $2/report.json -o $2/scores.parquet
}
eval_ckpt $S/checkpoint $S/eval
