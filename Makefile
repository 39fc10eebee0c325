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

.PHONY: reproduce test test-fast engine-cpu chromium lint clean-results

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

# The report's browser test opens report.html in Debian's Chromium: installed here when it is missing on a Debian
# machine where make runs as root (a CI runner); elsewhere that test skips and says why.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "make: installing Debian's chromium for the report's browser test (apt-get install -y chromium)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	    || echo "make: apt-get install chromium failed; the report's browser test will skip"; \
	else echo "make: no chromium, and no apt-get run as root to install it: the report's browser test will skip"; fi

# The suite's outcome goes to results/artifact/pytest.xml, where the verdict (tables/claims.md) reads the tests' checks.
test: engine-cpu chromium
	$(BIN)/python -m pytest --junitxml=results/artifact/pytest.xml

# The edit-test loop: no engine build, no notebooks, no snakemake subprocesses (tests marked slow or gpu).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not gpu"

lint: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --lint

clean-results:
	rm -rf results figures tables report.html
