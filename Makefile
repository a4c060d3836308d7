# tpsim — the two commands of the quick start:
#   make demo   creates .venv (if missing), installs tpsim with the MPICH wheel, runs the 8-rank demo
#   make test   same set-up, then the simulator's tests: single-process tests and multi-rank runs at 2 and 4 ranks
#               (and the expert-parallel file at 8)
#               (make check-course: the lessons, exercises, notebooks, book and site; make test-mpi MPIRANKS="1 8":
#               the multi-rank suite at the other sizes; CI runs all three)
PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
NP       ?= 8
MPIRANKS ?= 2 4
MPI8FILES ?= tests/mpi/test_ep_moe.py
# Ranks run whichever python is first on PATH: put the venv's first. Agg backend and a writable
# matplotlib cache so figures work on a headless machine.
export PATH := $(abspath $(BIN)):$(PATH)
export MPLBACKEND := Agg
export MPLCONFIGDIR ?= $(abspath $(VENV))/mplconfig
# Backstop for a rank blocked inside MPI (pytest-timeout's thread method fires first).
export MPIEXEC_TIMEOUT ?= 900

.PHONY: demo test test-serial test-mpi check-course baselines bench bench-torch figures lessons notebooks book docs venv venv-notebooks venv-docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[mpich,test]"
	touch $@

# Bytecode for tpsim's sources, written here once: a rank that finds none compiles every module it imports, and
# with PYTHONDONTWRITEBYTECODE set it does so at every launch (64 ranks: ~2 s of a 20 s demo on 2 cores).
# Only changed files are recompiled, so this costs a moment.
venv: $(VENV)/.installed
	@$(BIN)/python -m compileall -q tpsim

# the notebooks extra (ipyparallel, ipykernel, nbclient, nbformat, nbconvert): make notebooks, make book, and the
# tests that execute notebooks and build the book (skipped without it)
$(VENV)/.notebooks: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[notebooks]"
	touch $@

venv-notebooks: $(VENV)/.notebooks

# the documentation site's toolchain (Sphinx, MyST, pydata-sphinx-theme, pinned in docs/requirements.txt): make docs,
# and tests/test_docs.py (skipped without it)
$(VENV)/.docs: docs/requirements.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -r docs/requirements.txt
	touch $@

venv-docs: $(VENV)/.docs

demo: venv
	$(BIN)/mpirun -n $(NP) $(BIN)/python -m tpsim.demo $(ARGS)

test: test-serial test-mpi

# pytest's default output (not -q): one line per test file, its dots filling in as its tests run
test-serial: venv
	$(BIN)/python -m pytest tests --ignore=tests/mpi -m "not course" --timeout=300 --timeout-method=thread

# the course and the site (tests/conftest.py lists their files): every lesson and exercise on real ranks, the
# notebooks on MPI engines, the book, the docs built and read
check-course: venv-notebooks venv-docs
	$(BIN)/python -m pytest tests --ignore=tests/mpi -m course --timeout=300 --timeout-method=thread

test-mpi: venv
	@set -e; for n in $(MPIRANKS); do \
	  echo "== tests/mpi on $$n ranks"; \
	  $(BIN)/python -m tpsim.launcher -n $$n tests/mpi/pytest_on_every_rank.py -q -p no:cacheprovider --timeout=120 --timeout-method=thread; \
	done; \
	echo "== $(MPI8FILES) on 8 ranks (layouts that need 8: expert parallelism over 8)"; \
	$(BIN)/python -m tpsim.launcher -n 8 tests/mpi/pytest_on_every_rank.py $(MPI8FILES) -q -p no:cacheprovider --timeout=120 --timeout-method=thread

# the demo's losses, grad norms, collective bytes and pipeline numbers on the layouts a redesign touches, against
# tests/baselines.json bit for bit (OPENBLAS_CORETYPE pinned; ~2 min on 2 cores). Record anew only when a number
# changes on purpose: python tests/baselines.py --record
baselines: venv
	$(BIN)/python tests/baselines.py $(ARGS)

bench: venv
	$(BIN)/mpirun -n $(NP) $(BIN)/python bench/bench_core.py

# tpsim vs PyTorch TP over gloo, side by side in the same 8 ranks (needs torch; says so and exits 0 without it);
# writes tpsim-out/bench_vs_torch.json. Smaller shapes: make bench-torch ARGS="--hidden 256 --tokens 512"
bench-torch: venv
	$(BIN)/mpirun -n 8 $(BIN)/python bench/bench_vs_torch.py $(ARGS)

# every lesson at its rank count, every reference solution through `tpsim check`, every stub still a stub
# (tests/test_lessons.py runs the same inside `make test`)
lessons: venv
	$(BIN)/python lessons/run_all.py $(ARGS)

# every lesson as a notebook whose cells run on the lesson's ranks (ipyparallel MPI engines, %%px)
notebooks: venv-notebooks
	$(BIN)/python -m tpsim.cli lesson notebook all --out tpsim-out/notebooks

# every lesson as an HTML page with a real run's output and figures, plus index.html
book: venv-notebooks
	$(BIN)/python -m tpsim.cli lesson book --out tpsim-out/book

# the committed figures in figures/: real mpirun runs at TP 1, 2, 4, 8 plus the formulas (deterministic)
figures: venv
	$(BIN)/python -m tpsim.figures --out figures
	$(BIN)/mpiexec -n 4 $(BIN)/python -m tpsim.figures.drift --out figures --steps 200  # why the loss changes with TP

# the site, warnings as errors, into docs/_build/html/ (open docs/_build/html/index.html); each lesson's page comes
# from a run of it, cached in docs/_build/lesson-runs/ until the lesson or tpsim changes (docs/lesson_pages.py)
docs: venv-docs
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

clean:
	rm -rf $(VENV) tpsim-out .pytest_cache docs/_build docs/course
