# asrkit: `make test` and `make demo` set everything up on a fresh machine (venv, Python and Debian packages).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: test demo install system-deps kenlm clean-demo mutation docs

$(PY):
	$(PYTHON) -m venv $(VENV)

# asrkit with the extras named after the dash (setup.py), reinstalled only when the package metadata changes:
# .installed-dev is everything (make install, make test), .installed-synth,augment the core, the demo's corpus
# synthesis and its simulated rooms (data/test_reverb_noise).
$(VENV)/.installed-%: setup.py | $(PY)
	@free_kb=$$(df -Pk . | awk 'NR == 2 { print $$4 }'); if [ "$${free_kb:-0}" -lt $$((8 * 1024 * 1024)) ]; then \
	  echo "asrkit: warning: $$((free_kb / 1024)) MB free on the disk of $(CURDIR); the venv takes about 6.5 GB" \
	    "(torch's CUDA build and its libraries): pip may stop with 'No space left on device'" >&2; fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$*]'
	@touch $@

install: $(STAMP) system-deps kenlm native

.PHONY: native
native: | $(PY)
	@$(PY) -c "from asrkit.search import native_build; native_build.build()" || echo "asrkit: the native CTC prefix search did not build (a C++ compiler?); searches use the torch loop"

# espeak-ng, festival and flite voices (speech synthesis for the demo and tests), sox, flac.
system-deps:
	@bash tools/install/install_system_deps.sh

# KenLM's lmplz (asrkit train-ngram: the demo's word n-gram LM), built once into tools/kenlm/bin (~1 min).
kenlm: | $(PY)
	@PYTHON=$(PY) bash tools/install/install_kenlm.sh

test: install
	$(PY) -m pytest -q tests

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or reference fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Mutation score of the core modules (tools/mutation/modules.yaml); a benchmark, not part of CI.
mutation: install
	$(PY) tools/mutation.py

# DEMO_OPTS: more recipes/mini/run.sh options, e.g. DEMO_OPTS="--size small-joint" (docs/results.md).
DEMO_OPTS ?=
demo: $(VENV)/.installed-synth,augment system-deps kenlm native
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash recipes/mini/run.sh $(DEMO_OPTS)

clean-demo:
	rm -rf recipes/mini/data recipes/mini/exp
