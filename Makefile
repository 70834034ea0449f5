# Lakeshore — `make run` runs the demo (an elastic queue at work); `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test lint types check format mutate clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/lakeshore demo

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

types: install
	$(BIN)/mypy

check: lint types test

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Mutation testing of src/lakeshore/domain/ against tests/unit ([tool.mutmut] in
# pyproject.toml). Slow (about 12 minutes on 2 cores), so neither `check`, `test` nor CI
# runs it. One worker by default; MUTATE_JOBS=2 for more. A timeout counts as killed.
MUTATE_JOBS ?= 1

mutate: install
	rm -rf mutants
	$(BIN)/mutmut run --max-children $(MUTATE_JOBS)
	@$(BIN)/mutmut results --all true | awk -F': ' \
	  '{ n++; s[$$2]++ } END { k = s["killed"] + s["timeout"]; \
	     printf "mutation score: %d of %d mutants killed (%.3f); %d survived, %d reached by no test\n", \
	       k, n, (n ? k / n : 0), s["survived"], s["no tests"] }'
	@echo "equivalent mutants, and the score without them: docs/architecture.md, Mutation testing"

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis mutants
