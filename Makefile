# Two entry points (see README.md): `make demo` and `make test`. Both create .venv if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

install-dev: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,rtl,fpga]'

demo: install
	$(BIN)/vtakit demo

test: install-dev
	$(BIN)/python -m pytest -n auto --dist worksteal

lint: install-dev
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
