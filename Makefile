# shoal — two commands do everything on a fresh Debian 12 machine:
#   make demo   set up, then run the main job (a local cluster over a local S3 endpoint)
#   make test   set up, then run lint, type checks, layer contracts and the test suite
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEBS := procps iproute2
# tools the tests drive where they can be installed (a test that needs a missing one
# skips with the reason): gateways' real clients, the console's browser, promtool
# issue 15 gateways:
GATEWAY_DEBS := openjdk-17-jdk-headless rclone
# issue 17 console:
CONSOLE_DEBS := prometheus chromium
# issue 14 kubernetes:
K8S_DEBS :=
TOOL_DEBS := $(GATEWAY_DEBS) $(CONSOLE_DEBS) $(K8S_DEBS)

BENCH_DEBS := ceph ceph-mon ceph-osd ceph-mgr radosgw rclone s3fs fuse3 iproute2

.PHONY: setup debs demo test lint unit integration bench bench-quick clean

setup: debs $(STAMP)

debs:
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@missing=""; for p in $(TOOL_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the tests' real clients:$$missing"; \
	  (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null \
	    || echo "warning: could not install$$missing; the tests that need them will skip"; \
	fi

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q -p no:cacheprovider tests

unit: setup
	$(BIN)/pytest -q tests/unit

demo: setup
	$(BIN)/python -m shoal.demo

bench-setup: setup
	@missing=""; for p in $(BENCH_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,bench]'

bench-quick: bench-setup
	$(BIN)/shoal bench --quick

bench: bench-setup
	$(BIN)/shoal bench

.PHONY: image
# the container image of every role (deploy/image/); needs root for buildah's vfs storage
image: setup
	$(MAKE) debs DEBS="mmdebstrap buildah podman"
	nice -n 19 deploy/image/build.sh

clean:
	rm -rf $(VENV) build dist src/*.egg-info
