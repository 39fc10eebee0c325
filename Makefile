# Two commands do everything on a fresh machine (Python 3.11+, git, a C++ toolchain, cmake):
#   make reproduce   the pipeline on config/config.yaml (engine build, models, sessions, replay, figures, the verdict),
#                    then its report: report.html
#   make test        the test suite (builds the engine CPU-only once, cached in build/)
#   make test-fast   the tests that need neither the engine build nor papermill nor snakemake (under a minute)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: reproduce test test-fast engine-cpu lint clean-results

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	rm -f $(VENV)/.installed-*
	touch $@

reproduce: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --cores all
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --report report.html
	@echo "make reproduce: open report.html (the verdict first, then every result) and tables/claims.md"

engine-cpu: $(STAMP)
	$(BIN)/ostinato engine build --backend cpu --jobs $(JOBS)

# The suite's outcome goes to results/artifact/pytest.xml, where the verdict (tables/claims.md) reads the tests' checks.
test: engine-cpu
	$(BIN)/python -m pytest --junitxml=results/artifact/pytest.xml

# The edit-test loop: no engine build, no notebooks, no snakemake subprocesses (tests marked slow or gpu).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not gpu"

lint: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --lint

clean-results:
	rm -rf results figures tables report.html
