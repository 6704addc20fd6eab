# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Each creates .venv and installs what it needs first (idempotent; a stamp file skips reinstalls).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
EXTRAS := torch,remote,serve,distributed,hpc,grib,hdf5,bench,dev

.PHONY: venv anemoi-venv sysdeps demo test test-slow test-all test-fast lint typecheck bench clean

# Debian tools some tests use for real (SLURM + munge for the job-queue tests, squashfs-tools +
# squashfuse for `shardload pack`). Installed when running as root with apt-get; otherwise those
# tests skip and say why.
SYSPKGS := slurm-wlm munge squashfs-tools squashfuse fuse3

# setup.py builds the optional compiled kernel (formats/zarr/_decode_rows.c) in place: a change
# to it reinstalls, which rebuilds it
$(STAMP): pyproject.toml constraints.txt setup.py src/shardload/formats/zarr/_decode_rows.c \
	  src/shardload/formats/zarr/_stats_f32.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

venv: $(STAMP)

# anemoi-datasets (the reference the anemoi tests compare with) needs zarr 2: its own venv, pinned
# in constraints-anemoi.txt, no torch. `make test` builds it; if that fails it warns, and the tests
# that need it skip and say why (tests/anemoi_helpers.py).
ANEMOI_VENV := .venv-anemoi
ANEMOI_STAMP := $(ANEMOI_VENV)/.installed-stamp

$(ANEMOI_STAMP): constraints-anemoi.txt
	test -x $(ANEMOI_VENV)/bin/python || $(PY) -m venv $(ANEMOI_VENV)
	$(ANEMOI_VENV)/bin/python -m pip install -q --upgrade pip
	$(ANEMOI_VENV)/bin/python -m pip install -q -c constraints-anemoi.txt anemoi-datasets netCDF4
	touch $(ANEMOI_STAMP)

anemoi-venv:
	@$(MAKE) --no-print-directory $(ANEMOI_STAMP) \
	  || echo "WARNING: could not build $(ANEMOI_VENV); the tests comparing with anemoi-datasets will skip"

demo: $(STAMP)
	$(BIN)/shardload demo

sysdeps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=""; for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing system packages:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "WARNING: could not install$$missing; the tests that need them will skip"; \
	  fi; \
	else echo "not root or no apt-get: tests needing $(SYSPKGS) will skip"; fi

# Two processes (pytest-xdist), each test file in one of them: the suite takes about half the
# time on 2 cores. PYTEST_ARGS="-n 0" runs it in one process.
PYTEST_ARGS ?= -n 2 --dist loadfile

# `make test`: every test but the slow campaigns (marked `slow`: long sweeps, kill -9 loops,
# clusters, torchrun worlds), under 20 minutes on 2 cores; `make test-slow` runs those;
# `make test-all` (what CI runs, .ci/run) both. --durations lists the slowest in each log.
test: $(STAMP) sysdeps anemoi-venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) -m "not slow" --durations=15

test-slow: $(STAMP) sysdeps anemoi-venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) -m slow --durations=15

test-all: test test-slow

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) -m "not slow and not integration"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(ANEMOI_VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
