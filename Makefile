# pspnode — see README.md. Every target works on a fresh clone with only Go
# installed; dependencies come through the Go module proxy at pinned versions.
# `make test` first installs the Debian packages its tests need (test-deps).
GO      ?= go
BIN     := bin/pspnode
PKGS    := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build test tidy-check test-deps test-norace bench bench-idle run figures figures-sim figures-testnet dist fuzz lint clean proto wheel torch-example bench-trainer compare-ddp compare-diloco compare-diloco-mnist diloco-matrix

all: build

## build: the pspnode binary in bin/
build:
	$(GO) build -o $(BIN) ./cmd/pspnode

## test-deps: install the Debian packages the tests need when missing
## (iproute2, nftables, prometheus, the PyTorch trainer client's python3
## packages and protoc; gcc without a C compiler), as root or through
## passwordless sudo; without either it says what is missing and why, and
## fails. Installed packages cost one dpkg query. See scripts/test-deps.sh
test-deps:
	scripts/test-deps.sh

## test: test-deps, then vet, every test under the race detector, then the
## whole-testnet runs that are too slow for it (the CI command; under 10
## minutes on 2 cores). The netns tests need root. The interop test runs a
## js-libp2p client and needs node (20.19 or later) and npm from the
## machine; it skips without them unless PSPNODE_REQUIRE_NODE is set
test: test-deps tidy-check
	$(GO) vet $(PKGS)
	PATH="$$PATH:/usr/sbin:/sbin" PSPNODE_REQUIRE_PROMTOOL=1 CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 9m $(PKGS)
	PATH="$$PATH:/usr/sbin:/sbin" $(GO) test -count=1 -timeout 5m ./testnet/

## tidy-check: fail if go.mod or go.sum is not what `go mod tidy` makes
## (a dependency added, dropped or marked indirect by hand); it prints the
## difference. It reads the module cache, and the proxy only for what the
## cache lacks
tidy-check:
	$(GO) mod tidy -diff

## test-norace: every test without the race detector (faster)
test-norace:
	$(GO) test -count=1 -timeout 9m $(PKGS)

## bench: the benchmarks, 5 runs each (compare runs with benchstat)
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 -timeout 60m $(PKGS)

## bench-idle: what an idle node costs: 51 `pspnode run` processes on
## loopback; prints the CPU share and RSS of one node with 50 peers (2 min)
bench-idle: build
	scripts/idle-node.sh $(BIN)

## run: the main job on embedded defaults: a 50-node testnet (pSSP(10,4),
## synthetic linear regression exchanged by epidemic:4, one minute) that
## prints its figures and writes CSV files and plots under results/testnet
run: build
	$(BIN) testnet --out results/testnet

## figures: regenerate every figure and table in docs/results.md. The
## testnet experiments run on the virtual clock: their figures do not depend
## on this machine; they take about 22 minutes of wall time on 2 cores
figures: figures-sim figures-testnet

## PAPER: the figures that reproduce the PSP paper's barriers run them
## without the pace rule (docs/barriers.md); the pace rule's own figures
## are the runs without $(PAPER)
PAPER = --pace off
figures-sim: build
	$(BIN) sim $(PAPER) --out results/sim
	$(BIN) sim $(PAPER) --barrier pbsp:10 --sweep-beta 0,1,2,4,8,16,32,64 --out results/sweep
	$(BIN) sim $(PAPER) --barrier bsp,ssp:4,dssp:2:6,pbsp:10,pssp:10:4,pdssp:10:2:6 --churn 0.2 --churn-mode crash --out results/sim-churn
	$(BIN) bound --out results/bound
	mkdir -p docs/figures
	cp results/sim/step_distribution.png results/sweep/beta_sweep.png docs/figures/
	cp results/sim-churn/step_distribution.png docs/figures/step_distribution_churn.png
	cp results/bound/bound_mean.png results/bound/bound_variance.png docs/figures/

ALL_BARRIERS = asp,bsp,ssp:4,pbsp:10,pssp:10:4
figures-testnet: build
	$(BIN) testnet --quiet $(PAPER) --nodes 200 --model none --time-scale 0.05 --duration 10s \
	  --barrier $(ALL_BARRIERS) --compare-sim --out results/fidelity-0.05
	$(BIN) testnet --quiet $(PAPER) --nodes 200 --model none --time-scale 0.01 --duration 2s \
	  --barrier $(ALL_BARRIERS) --compare-sim --out results/fidelity-0.01
	$(BIN) testnet --quiet $(PAPER) --nodes 200 --model none --time-scale 0.2 --duration 40s \
	  --barrier $(ALL_BARRIERS) --compare-sim --out results/fidelity-0.2
	$(BIN) testnet --quiet $(PAPER) --nodes 16 --model logreg --data mnist --exchange gossip --stragglers 0.2 --straggle-factor 4 \
	  --time-scale 0.1 --duration 60s --target 0.85 --eval-every 1s \
	  --barrier bsp,ssp:4,asp,pbsp:2,pbsp:10,pssp:2:4,pssp:10:4 --out results/accuracy
	$(BIN) testnet --quiet --nodes 16 --model logreg --data mnist --exchange gossip --stragglers 0.2 --straggle-factor 4 \
	  --time-scale 0.1 --duration 60s --target 0.85 --eval-every 1s \
	  --barrier pbsp:2,pbsp:10,pssp:2:4,pssp:10:4 --out results/accuracy-pace
	$(BIN) testnet --quiet $(PAPER) --nodes 200 --model none --time-scale 0.2 --duration 180s --barrier pssp:10:4 \
	  --churn 0.2 --churn-mode mixed --seed 11 --out results/churn
	$(BIN) testnet --quiet $(PAPER) --nodes 200 --model linreg --exchange epidemic:4 --time-scale 0.2 --duration 180s \
	  --barrier pssp:10:4 --churn 0.2 --churn-mode mixed --seed 11 --out results/churn-model
	$(BIN) testnet --quiet $(PAPER) --nodes 100 --model none --time-scale 0.2 --duration 24s --stragglers 0.2 \
	  --straggle-factor 4 --barrier asp,bsp,pbsp:10,pssp:10:4 --compare-sim --out results/hetero
	$(BIN) testnet --quiet --nodes 100 --model none --time-scale 0.2 --duration 24s --stragglers 0.2 \
	  --straggle-factor 4 --barrier asp,bsp,pbsp:10,pssp:10:4 --compare-sim --out results/hetero-pace
	for run in 7 7-again 8; do $(BIN) testnet --quiet $(PAPER) --nodes 50 --model none --time-scale 0.2 --duration 40s \
	  --barrier pbsp:10,pssp:10:4 --seed $${run%%-*} --out results/repro-$$run; done
	for enc in dense32 topk16; do $(BIN) testnet --quiet $(PAPER) --nodes 16 --model logreg --data mnist --exchange gossip \
	  --time-scale 0.05 --duration 45s --barrier pssp:10:4 --encoding $$enc --eval-every 2s --out results/encoding/$$enc; done
	mkdir -p docs/figures
	cp results/fidelity-0.05/step_distribution.png docs/figures/testnet_step_distribution.png
	cp results/accuracy/accuracy_time.png results/accuracy/accuracy_updates.png docs/figures/
	cp results/churn/step_distribution.png docs/figures/churn_step_distribution.png
	cp results/churn/estimate.png docs/figures/churn_estimate.png

## fuzz: run every fuzz target for FUZZTIME each (default 1m)
FUZZTIME ?= 1m
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

DIST_PLATFORMS := linux/amd64 linux/arm64 darwin/arm64 windows/amd64

## dist: static binaries (CGO off) for the platforms users run, and the
## Python client's wheels that carry them (pip install dist/pspnode-*.whl
## gives pspnode.Optimizer its binary; scripts/wheels.sh)
dist:
	@for p in $(DIST_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; ext=; [ $$os = windows ] && ext=.exe; \
	  echo "dist/pspnode-$$os-$$arch$$ext"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o dist/pspnode-$$os-$$arch$$ext ./cmd/pspnode || exit 1; \
	done
	LDFLAGS='$(LDFLAGS)' scripts/wheels.sh dist $(DIST_PLATFORMS)

## wheel: the Python client's wheel for this machine, with its binary, in
## dist/ (pip install dist/pspnode-*.whl)
wheel:
	LDFLAGS='$(LDFLAGS)' scripts/wheels.sh dist host

## lint: formatting and vet
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet $(PKGS)

## torch-example: three daemons and three PyTorch trainers on this machine
## (MNIST, pSSP), each printing its held-out accuracy; needs test-deps'
## Python packages (see examples/torch/run-three.sh)
torch-example: build
	examples/torch/run-three.sh

## bench-trainer: what a step costs a PyTorch trainer beyond its own
## compute, for a model of 1 M float32 parameters (examples/torch/bench_bridge.py)
bench-trainer: build
	/usr/bin/python3 examples/torch/bench_bridge.py --bin $(BIN)

## compare-ddp: the MNIST example under torch DDP (gloo) and pspnode (the
## daemon's defaults), 4 workers, each in its own network namespace behind
## an emulated link: tiers lan (0.2 ms round trip) and continent (70 ms),
## with no slow worker and one slowed ×4, 3 seeds; writes tables, runs and a
## figure per tier to results/ddp (about 25 minutes; root; ARGS=--resume
## goes on after an interruption, ARGS=--all runs every tier, model and slow
## mode, several hours). See docs/trainer.md, "Beside torch DDP"
compare-ddp: build
	$(GO) run ./examples/torch/compare --bin $(BIN) --out results/ddp $(ARGS)

## compare-diloco: pspnode.DiLoCo (pSSP, epidemic:3 and epidemic:1, int8
## models) beside DiLoCo over a blocking gloo all-reduce and torch DDP, on
## the character-level model of examples/diloco: 4 workers behind emulated
## links of the continent (70 ms, 400 Mbit/s) and consumer (30 ms,
## 100 Mbit/s) tiers, none slow (every system) and one slowed x4 (no DDP:
## no target needs it), seeds 1-3; writes runs.json, tables and figures to
## results/diloco and the targets' judgement to results/diloco/targets.md
## (root; 42 runs, about 2 hours on 2 cores: a DDP run trains its 400 s,
## the others 1-3 minutes each; add ARGS=--resume to go on after an
## interruption). See docs/trainer.md, "The targets over emulated links"
DILOCO_FLAGS = --bin $(BIN) --out results/diloco --tiers continent,consumer --seeds 1,2,3 \
	  --steps 1200 --H 100 --lr 1e-2 --ddp-lr 1e-2 --quota 0.5 --sleep 0.03 --target 2.0 --deadline 400s \
	  --extra "--context 32"
DILOCO_PSPNODE = diloco/pssp:2:4/epidemic:3:int8,diloco/pssp:2:4/epidemic:1:int8
compare-diloco: build
	$(GO) run ./examples/diloco $(DILOCO_FLAGS) --systems $(DILOCO_PSPNODE),allreduce,ddp --slow 0 $(ARGS)
	$(GO) run ./examples/diloco $(DILOCO_FLAGS) --systems $(DILOCO_PSPNODE),allreduce --slow 1 --resume $(ARGS)
	/usr/bin/python3 examples/diloco/targets.py results/diloco/runs.json | tee results/diloco/targets.md

## compare-diloco-mnist: the same systems, tiers, seeds and slow settings on
## the MNIST CNN of examples/diloco/tasks.py (5 994 parameters, 8 000
## training images split among the 4 workers, 2 000 held out): 800 inner
## steps of 32 images, H 100, AdamW 3e-3 (DDP too, at 4x the batch),
## target held-out loss 0.10; writes to results/diloco-mnist (root; 42
## runs, about 70 minutes on 2 cores). See docs/trainer.md, "The targets
## over emulated links"
DILOCO_MNIST_FLAGS = --bin $(BIN) --out results/diloco-mnist --tiers continent,consumer --seeds 1,2,3 \
	  --steps 800 --H 100 --batch 32 --lr 3e-3 --ddp-lr 3e-3 --quota 0.5 --sleep 0.03 --target 0.10 \
	  --deadline 400s --extra "--task cnn"
compare-diloco-mnist: build
	$(GO) run ./examples/diloco $(DILOCO_MNIST_FLAGS) --systems $(DILOCO_PSPNODE),allreduce,ddp --slow 0 $(ARGS)
	$(GO) run ./examples/diloco $(DILOCO_MNIST_FLAGS) --systems $(DILOCO_PSPNODE),allreduce --slow 1 --resume $(ARGS)
	/usr/bin/python3 examples/diloco/targets.py results/diloco-mnist/runs.json | tee results/diloco-mnist/targets.md

## diloco-matrix: pspnode.DiLoCo on every cell of tasks (MNIST CNN and MLP,
## the character model) x inner SGD/AdamW x H 20/100 x 3/6 workers x
## barriers (default, bsp, pssp:2:4) x exchanges (epidemic:1, the default,
## gossip), on loopback, each cell judged against DiLoCo over a gloo
## all-reduce; writes cells.json and table.md to results/diloco-matrix
## (no root; a cell of 3 workers at H 20 costs about 11 CPU-s, the whole
## matrix an estimated 9 000 CPU-s, some 2 hours on 2 cores;
## ARGS=--resume goes on after an interruption; ARGS="--tasks cnn --H 20
## --workers 3" for a part). See docs/trainer.md, "The matrix"
diloco-matrix: build
	nice -n 10 /usr/bin/python3 examples/diloco/matrix.py --bin $(BIN) --out results/diloco-matrix $(ARGS)

## proto: regenerate the trainer API's Go and Python code from
## proto/pspnode/trainer/v3/trainer.proto (the generated files are
## committed), with the Python client's type stubs (.pyi). Needs protoc
## (Debian protobuf-compiler), grpc_python_plugin (protobuf-compiler-grpc,
## the plugin of the grpcio the client runs with) and protoc-gen-mypy_grpc
## (mypy-protobuf, for the service stub's .pyi); the Go plugins are
## installed at pinned versions. (Debian's python3-grpc-tools carries
## libprotoc 3.5, which writes the pre-3.20 layout and no .pyi: not used.)
PROTO     := proto/pspnode/trainer/v3/trainer.proto
RPCPROTO  := proto/pspnode/rpc/status.proto
PYCLIENT  := clients/python
TOOLS     := $(CURDIR)/bin/tools
proto:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
	PATH=$(TOOLS):$$PATH protoc -I proto --go_out=. --go_opt=module=github.com/pspnode/pspnode \
	  --go-grpc_out=. --go-grpc_opt=module=github.com/pspnode/pspnode $(PROTO)
	scripts/proto-python.sh $(PYCLIENT)

clean:
	rm -rf bin dist results
