# raftps. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -o pipefail -euc
.DEFAULT_GOAL := build
MAKEFLAGS += --no-print-directory

GO          ?= go
TOOLS       := $(CURDIR)/bin/tools
STATICCHECK := $(TOOLS)/staticcheck
# Pinned: a newer staticcheck may add checks that fail verify without a code change.
STATICCHECK_VERSION := v0.8.2
# Packages whose tests exercise concurrency; they also run under -race.
RACE_PKGS   := ./store/... ./replication/... ./shard/... ./collective/... ./trainer/...
# Go test output is kept here so failures can be read after the fact.
TEST_LOG    := bin/test.log

# Protobuf generators, pinned so that regenerating makes no diff. protoc
# comes from Debian (protobuf-compiler 3.21.12 on bookworm).
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.1
PROTOC_VERSION             := 3.21.12
PROTOS := shard/shardpb/client.proto shard/shardpb/peer.proto shard/shardpb/meta.proto replication/transportpb/transport.proto replication/chain/chainpb/chain.proto

.PHONY: protoc-installed help build build-faults test test-deps dashboard-screenshot test-unit test-race test-determinism verify fmt vet staticcheck tidy bench bench-stall bench-cluster bench-ab bench-idle bench-collective bench-hedge bench-tls bench-metrics bench-elastic bench-consistency bench-train fuzz demo proto proto-check clean python-deps proto-python proto-python-check test-python example-python bench-python image compose-up compose-down test-docker test-docker-if-engine soak crash

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 20

build: ## compile every package and put the raftps binary at bin/raftps
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/raftps ./cmd/raftps

# A test build: the same binary with /debug/netfault (--fault-injection),
# through which raftps chaos partitions and slows a local cluster's nodes.
# Production builds refuse --fault-injection.
build-faults: ## bin/raftps-faults: raftps with fault injection, for chaos of a local cluster (make soak)
	CGO_ENABLED=0 $(GO) build -trimpath -tags raftps_faultinject -o bin/raftps-faults ./cmd/raftps

test: verify test-unit test-race test-determinism test-python test-docker-if-engine ## what CI runs: verify, unit tests, race tests, FMA determinism, the Python client's tests, the Docker chaos round when an engine answers

# Programs the tests run, as program:Debian package: promtool checks each
# node's /metrics, headless Chromium renders the dashboard.
TEST_TOOLS := promtool:prometheus chromium:chromium

test-deps: ## install the Debian packages the tests need, where missing
	@missing=""; for tp in $(TEST_TOOLS); do command -v $${tp%%:*} >/dev/null || missing="$$missing $${tp#*:}"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing from Debian:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

dashboard-screenshot: test-deps ## the dashboard test, saving its screenshot as docs/dashboard.png
	RAFTPS_DASHBOARD_SCREENSHOT=$(CURDIR)/docs/dashboard.png $(GO) test -count=1 -run TestDashboardInBrowser -v ./test/

test-unit: test-deps ## go test ./... (no race detector)
	@mkdir -p bin
	@# -timeout: go test's default (10 minutes per package) is too close to
	@# what the ./test package took on a slow 2-core host (583-791 s before
	@# its training tests dropped fsync; about 250 s now on a faster one), and
	@# past it the package dies without running its cleanups.
	$(GO) test -count=1 -timeout 20m ./... 2>&1 | tee $(TEST_LOG)

test-race: ## tests of the concurrent packages under the race detector
	$(GO) test -race -count=1 $(RACE_PKGS)
	@# The cluster tests run apart: beside them, on two cores under the race
	@# detector, the replication package's timing-bound tests starve.
	$(GO) test -race -count=1 -timeout 20m ./test/...

# Replicas must agree to the bit on any CPU. GOAMD64=v3 lets the compiler
# fuse multiply-adds into FMA instructions; if an unrounded product slipped
# into store's arithmetic the golden checksums change. Skipped (with a note)
# where the CPU or architecture cannot run v3 code.
test-determinism: ## store's golden checksums with FMA fusion allowed (GOAMD64=v3)
	@if [ "$$($(GO) env GOARCH)" = amd64 ] && grep -qw fma /proc/cpuinfo && grep -qw avx2 /proc/cpuinfo; then \
		GOAMD64=v3 $(GO) test -count=1 -run 'Golden|Reference' ./store; \
	else echo "test-determinism: skipped, this CPU cannot run GOAMD64=v3 code"; fi

verify: fmt vet staticcheck tidy ## gofmt, go vet, staticcheck, go mod tidy leaves no diff

fmt:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

$(STATICCHECK):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

staticcheck: $(STATICCHECK)
	$(STATICCHECK) ./...

tidy:
	@$(GO) mod tidy -diff || { echo "go mod tidy would change go.mod/go.sum (above): run it and commit the result"; exit 1; }

bench: ## engine benchmarks against a plain map (1M and 10M rows; ~20 min, ~12 GiB)
	@mkdir -p bin
	$(GO) test ./store -run '^$$' -bench Engine -benchtime 2s -timeout 90m | tee bin/bench-engine.txt
	$(MAKE) bench-stall

bench-stall: ## the slowest Apply while a 10M-row snapshot is written
	@mkdir -p bin
	$(GO) test ./store -run '^$$' -bench SnapshotStall -benchtime 1x -timeout 30m | tee bin/bench-stall.txt

# Every Fuzz target in the tree (found by name in the _test.go files), one
# after another for FUZZTIME each: go test fuzzes one target of one package
# per run. Their seed corpora (f.Add and testdata/fuzz/<target>) run as
# ordinary tests in make test; the fuzzing itself does not.
FUZZTIME ?= 10s
fuzz: ## run every fuzz target (decoders, state machines, both listeners) for FUZZTIME (default 10s) each
	@for dir in $$(git grep -l '^func Fuzz' -- '*_test.go' | xargs -n1 dirname | sort -u); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$dir/*_test.go); do \
			echo "fuzz: ./$$dir $$t for $(FUZZTIME)"; \
			$(GO) test ./$$dir -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) || exit 1; \
		done; \
	done

demo: build ## a local 3-node cluster, a workload, a leader killed mid-run, and the proof nothing was lost
	bin/raftps demo

# A containerised cluster (deploy/docker-compose.yml; docs/OPERATIONS.md,
# "Docker"). The image is FROM scratch with the static binary built here, so
# nothing is pulled; the build context is bin/docker alone. COMPOSE is
# `docker compose` where that works, else docker-compose (v1.28+, for
# profiles); compose-up waits for every node's healthcheck itself, as v1 has
# no `up --wait`. COMPOSE_PROFILES=five adds n4 and n5.
IMAGE           ?= raftps:dev
COMPOSE         ?= $(shell docker compose version >/dev/null 2>&1 && echo docker compose || echo docker-compose)
COMPOSE_PROJECT ?= raftps
COMPOSE_FILE_   := deploy/docker-compose.yml
COMPOSE_WAIT    ?= 90
DC              := $(COMPOSE) -f $(COMPOSE_FILE_) -p $(COMPOSE_PROJECT)

image: ## the FROM scratch image IMAGE (default raftps:dev) with a static bin/docker/raftps
	@rm -rf bin/docker && mkdir -p bin/docker/data
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/docker/raftps ./cmd/raftps
	docker build -t $(IMAGE) -f Dockerfile bin/docker

compose-up: image ## start n1..n3 in containers (COMPOSE_PROFILES=five: n1..n5) and wait until all are healthy
	RAFTPS_IMAGE=$(IMAGE) $(DC) up -d
	@deadline=$$(( $$(date +%s) + $(COMPOSE_WAIT) )); \
	while :; do \
		cs=$$($(DC) ps -q); waiting=; [ -n "$$cs" ] || waiting=" (no containers)"; \
		for c in $$cs; do \
			s=$$(docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' $$c); \
			case "$$s" in *" healthy") ;; *certs*" exited") ;; *) waiting="$$waiting $${s#/}";; esac; \
		done; \
		[ -z "$$waiting" ] && break; \
		if [ $$(date +%s) -ge $$deadline ]; then echo "compose-up: not healthy after $(COMPOSE_WAIT)s:$$waiting"; exit 1; fi; \
		sleep 1; \
	done; \
	$(DC) ps; \
	n1=$$($(DC) ps -q n1); mkdir -p deploy/certs; \
	for f in ca.crt client.admin.crt client.admin.key; do docker cp -q $$n1:/certs/$$f deploy/certs/$$f || exit 1; done; \
	d=$$(cd deploy/certs && pwd); \
	printf 'export RAFTPS_CLUSTER=172.28.0.11:7001,172.28.0.12:7001,172.28.0.13:7001\nexport RAFTPS_CA=%s/ca.crt\nexport RAFTPS_CERT=%s/client.admin.crt\nexport RAFTPS_KEY=%s/client.admin.key\nunset RAFTPS_INSECURE RAFTPS_TOKEN\n' $$d $$d $$d > deploy/certs/env; \
	echo "cluster up: . deploy/certs/env; bin/raftps status"

compose-down: ## remove the containers (n4, n5 too), the network and the data volumes
	COMPOSE_PROFILES=five $(DC) down -v --remove-orphans

# Chaos (docs/RELIABILITY.md). make test runs a short local round
# (test/chaos_test.go) and, when a Docker engine answers, test-docker: a
# fresh compose cluster, a chaos round with kills, pauses and network
# partitions, then the cluster is removed whatever the verdict.
CHAOS_DOCKER_ARGS ?= --duration 30s --every 8s --down 2500ms --faults kill-leader,partition-leader,pause-leader --tables chaos_lin,chaos_bnd,chaos_idl
test-docker: build ## build the image, start the compose cluster, a chaos round with a kill, a docker network partition and a pause, tear down (~1.5 min)
	@$(MAKE) --no-print-directory compose-down >/dev/null 2>&1 || true
	@$(MAKE) --no-print-directory compose-up
	@status=0; bin/raftps chaos --target docker:$(COMPOSE_PROJECT) $(CHAOS_DOCKER_ARGS) --out bin/chaos-docker || status=$$?; \
	$(MAKE) --no-print-directory compose-down; \
	if [ $$status -ne 0 ]; then echo "test-docker: chaos FAILED (exit $$status); histories in bin/chaos-docker"; fi; exit $$status

test-docker-if-engine:
	@if timeout 10 docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory test-docker; \
	else echo "test-docker: SKIPPED: no Docker engine answers (docker info); the containerised chaos round did not run"; fi

# Long chaos for release checks: a fresh local 3-node cluster of the test
# build (bin/raftps-faults, run with --fault-injection, for partitions), SOAK (default 30m) of leader kills,
# pauses, partitions and slow nodes every SOAK_EVERY; the report and the histories go
# to bin/soak. SOAK_TARGET=docker runs it on the compose cluster instead.
SOAK        ?= 30m
SOAK_EVERY  ?= 10s
SOAK_TARGET ?= local
# A linearizable, a bounded and an eventual Raft table, and a chain table (chaos makes a
# table whose name contains "chn" a chain table, and gives one whose name
# contains "hot" hot keys). SOAK_NODES: the local cluster's size; hot-key
# read replicas need more nodes than replicas (5, with tables such as
# chaos_bnd_hot,chaos_chn_bnd_hot).
SOAK_TABLES ?= chaos_lin,chaos_bnd,chaos_evt,chaos_chn,chaos_idl
# Faults in turn, one every SOAK_EVERY; slow-node delays one node's every
# message by 200 ms (tc netem in a container's namespace under docker).
SOAK_FAULTS ?= kill-leader,pause-leader,partition-leader,partition-minority,slow-node
SOAK_NODES  ?= 3
# Crash: SIGKILL a node at random points during writes, CRASH_ROUNDS
# times, restart it each time; then every acknowledged push must be in the
# rows exactly once and the replicas must agree. go test ./test/ runs 4.
CRASH_ROUNDS ?= 40
CRASH_GRADS  ?= fp32
crash: ## kill -9 a node at random points during writes CRASH_ROUNDS times; nothing acknowledged lost or doubled, replicas agree (~5 min; CRASH_GRADS=bf16 for a bfloat16 table)
	RAFTPS_CRASH_ROUNDS=$(CRASH_ROUNDS) RAFTPS_CRASH_GRADS=$(CRASH_GRADS) $(GO) test ./test/ -run '^TestCrashKillDuringWrites$$' -count=1 -v -timeout 60m

soak: build build-faults ## long chaos (SOAK=30m) on a fresh cluster: report in bin/soak/report.json
	@rm -rf bin/soak && mkdir -p bin/soak
	@if [ "$(SOAK_TARGET)" = docker ]; then \
		$(MAKE) --no-print-directory compose-down >/dev/null 2>&1 || true; $(MAKE) --no-print-directory compose-up || exit 1; \
		target=docker:$(COMPOSE_PROJECT); \
	else \
		bin/raftps-faults cluster up --dir bin/soak/cluster --nodes $(SOAK_NODES) --base-port 17600 --server-args "--fault-injection" >/dev/null || exit 1; \
		target=local:bin/soak/cluster; \
	fi; \
	status=0; bin/raftps-faults chaos --target $$target --duration $(SOAK) --every $(SOAK_EVERY) --down 3s --faults $(SOAK_FAULTS) --tables $(SOAK_TABLES) --out bin/soak || status=$$?; \
	if [ "$(SOAK_TARGET)" = docker ]; then $(MAKE) --no-print-directory compose-down; else bin/raftps-faults cluster down --dir bin/soak/cluster >/dev/null; fi; \
	exit $$status

# The numbers of docs/BENCHMARKS.md's cluster section: a fresh local 3-node
# cluster, one 16-shard table, push/pull/mixed for BENCH_DURATION each.
BENCH_DURATION ?= 20s
bench-cluster: build ## raftps bench on a local 3-node cluster (push, pull, mixed; ~2 min)
	@mkdir -p bin
	@rm -rf bin/bench-cluster && bin/raftps cluster up --dir bin/bench-cluster --base-port 7601 >/dev/null
	@trap 'bin/raftps cluster down --dir bin/bench-cluster >/dev/null' EXIT; \
	. bin/bench-cluster/env; \
	bin/raftps table create bench --dim 64 --shards 16 --optimizer sgd >/dev/null; \
	{ bin/raftps bench --table bench --workload push --keys 1000000 --batch 4096 --zipf 1.1 --clients 4 --duration $(BENCH_DURATION); \
	  for w in pull mixed; do \
		bin/raftps bench --table bench --load=false --workload $$w --keys 1000000 --batch 4096 --zipf 1.1 --clients 4 --duration $(BENCH_DURATION); \
	  done; } 2>&1 | tee bin/bench-cluster.txt

# The bench-cluster push and pull of bin/raftps beside an older build,
# alternated run by run (test/bench-ab.sh): the A/B a performance claim
# needs. AB_OLD is a git revision, built from `git archive` into
# bin/raftps-AB_OLD; the default, b492129, is main before issue 23 and has
# no TLS, hence AB_FLAGS=-i (every cluster --insecure).
AB_OLD    ?= b492129
AB_ROUNDS ?= 4
AB_FLAGS  ?= -i
bench-ab: build ## push and pull of bin/raftps beside an older build (AB_OLD, a git revision), alternated in both orders (~12 min)
	@src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && \
	git archive $(AB_OLD) | tar -x -C "$$src" && \
	(cd "$$src" && CGO_ENABLED=0 $(GO) build -trimpath -o $(CURDIR)/bin/raftps-$(AB_OLD) ./cmd/raftps)
	test/bench-ab.sh -r $(AB_ROUNDS) $(AB_FLAGS) bin/raftps-$(AB_OLD) bin/raftps | tee bin/bench-ab.txt

# What idle Raft groups cost: cores busy in the three servers of a fresh
# local cluster holding TABLES×SHARDS idle tables (dim 16), for each layout,
# with table creation and a node's restart timed. IDLE_BINS lists binaries
# to alternate (an old build beside bin/raftps, say); only side-by-side
# runs compare on a shared host.
IDLE_LAYOUTS ?= 0x0 1x16 4x8 13x8 32x8
IDLE_BINS    ?= bin/raftps
IDLE_ROUNDS  ?= 1
bench-idle: build ## cores busy of an idle 3-node cluster per tables×shards layout, creation and restart timed (~1 min per layout and binary)
	test/bench-idle.sh -r $(IDLE_ROUNDS) -l "$(IDLE_LAYOUTS)" $(IDLE_BINS) | tee bin/bench-idle.txt

# What hedged reads cost on a healthy cluster: pulls of a bounded table
# with hedging and without, alternated run by run in one session (this
# host's speed drifts within minutes, so only side-by-side runs compare).
HEDGE_ROUNDS ?= 3
bench-hedge: build ## pull rows/s and p99 of a bounded table, hedging on and off alternated (~2 min)
	@mkdir -p bin
	@rm -rf bin/bench-hedge && bin/raftps cluster up --dir bin/bench-hedge --base-port 7651 >/dev/null
	@trap 'bin/raftps cluster down --dir bin/bench-hedge >/dev/null' EXIT; \
	. bin/bench-hedge/env; \
	bin/raftps table create bench --dim 64 --shards 16 --optimizer sgd --consistency bounded:100ms >/dev/null; \
	bin/raftps bench --table bench --workload push --keys 1000000 --batch 4096 --zipf 1.1 --clients 4 --duration 5s >/dev/null 2>&1; \
	{ for i in $$(seq $(HEDGE_ROUNDS)); do for h in true false; do \
		echo "round $$i, --hedge=$$h"; \
		bin/raftps bench --table bench --load=false --workload pull --keys 1000000 --batch 4096 --zipf 1.1 --clients 4 --duration $(BENCH_DURATION) --hedge=$$h; \
	  done; done; } 2>&1 | grep -v "rows/s  errors" | tee bin/bench-hedge.txt

# What TLS costs: push and pull rows/s of a secure cluster (TLS 1.3 on
# both listeners, encrypted gossip) and of an --insecure one, both up in
# one session and measured round by round alternately (this host's speed
# drifts within minutes, so only side-by-side runs compare).
TLS_ROUNDS ?= 3
bench-tls: build ## push and pull rows/s with TLS against --insecure, alternated round by round (~4 min)
	@mkdir -p bin
	@rm -rf bin/bench-tls && bin/raftps cluster up --dir bin/bench-tls/secure --base-port 7701 >/dev/null && \
	bin/raftps cluster up --dir bin/bench-tls/insecure --base-port 7751 --server-args --insecure >/dev/null
	@trap 'bin/raftps cluster down --dir bin/bench-tls/secure >/dev/null; bin/raftps cluster down --dir bin/bench-tls/insecure >/dev/null' EXIT; \
	for c in secure insecure; do \
		( . bin/bench-tls/$$c/env; bin/raftps table create bench --dim 64 --shards 16 --optimizer sgd >/dev/null; \
		  bin/raftps bench --table bench --workload push --keys 1000000 --batch 4096 --zipf 1.1 --clients 4 --duration 5s >/dev/null 2>&1 ) || exit 1; \
	done; \
	{ for i in $$(seq $(TLS_ROUNDS)); do for w in push pull; do for c in secure insecure; do \
		echo "round $$i, $$w, $$c"; \
		( . bin/bench-tls/$$c/env; bin/raftps bench --table bench --load=false --workload $$w --keys 1000000 --batch 4096 --zipf 1.1 --clients 4 --duration $(BENCH_DURATION) ); \
	  done; done; done; } 2>&1 | grep -v "rows/s  errors" | tee bin/bench-tls.txt
# Fresh clusters, metrics on and scraped every second (as a Prometheus at
# 1s would) against --no-metrics, alternated round by round: the host's
# speed drifts, so only ratios within a round mean anything.
METRICS_ROUNDS ?= 3
bench-metrics: build ## push and pull rows/s, metrics scraped every second against --no-metrics, alternated (~5 min)
	@mkdir -p bin
	@{ for i in $$(seq $(METRICS_ROUNDS)); do for m in on off; do \
		rm -rf bin/bench-metrics; args=""; [ $$m = off ] && args="--no-metrics"; \
		bin/raftps cluster up --dir bin/bench-metrics --base-port 7751 --server-args "$$args" >/dev/null; \
		. bin/bench-metrics/env; scraper=""; \
		if [ $$m = on ]; then \
			( while :; do for p in 7851 7852 7853; do \
				exec 3<>/dev/tcp/127.0.0.1/$$p && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3 >/dev/null; exec 3<&-; \
			done; sleep 1; done ) & scraper=$$!; \
		fi; \
		bin/raftps table create bench --dim 64 --shards 16 --optimizer sgd >/dev/null; \
		for w in push pull; do \
			echo "round $$i, metrics $$m, $$w"; \
			bin/raftps bench --table bench --load=false --workload $$w --keys 100000 --batch 4096 --zipf 1.1 --clients 4 --duration $(BENCH_DURATION); \
		done; \
		if [ -n "$$scraper" ]; then kill $$scraper; fi; \
		bin/raftps cluster down --dir bin/bench-metrics >/dev/null; \
	done; done; } 2>&1 | grep -v "rows/s  errors" | tee bin/bench-metrics.txt

# The first command gives time and bus bandwidth per size; the second the
# ring's share of loopback TCP, from the two interleaved round by round
# (this host's loopback rate drifts by 2x within minutes, so a ratio of
# numbers taken apart means nothing).
bench-collective: ## allreduce bus bandwidth per size (8 B to 256 MiB), and the ring's share of loopback TCP at 64 MiB, N = 2, 4, 8 (~2 min)
	@mkdir -p bin
	$(GO) test ./collective -run '^$$' -bench 'BenchmarkAllReduce$$|BenchmarkLoopbackTCP' -benchtime 3x -timeout 30m | tee bin/bench-collective.txt
	$(GO) test ./collective -run '^$$' -bench 'BenchmarkRingSchedule/N=./64MiB' -benchtime 20x -timeout 30m | tee -a bin/bench-collective.txt

bench-elastic: ## repair of a 1M-row table after a node death, push throughput while a joined node is filled (~2 min)
	@mkdir -p bin
	$(GO) test ./test -run '^$$' -bench 'BenchmarkElasticRepair' -benchtime 1x -timeout 30m | tee bin/bench-elastic.txt

bench-consistency: ## pull rows/s, p99 and busiest-node share per consistency level, hot-key replicas off/on, Zipf 1.1 and 1.3, 5 nodes (~2.5 min)
	@mkdir -p bin
	$(GO) test ./test -run '^$$' -bench 'BenchmarkConsistencyLevels' -benchtime 1x -timeout 30m | tee bin/bench-consistency.txt

bench-train: ## time to Bayes AUC - 0.01 of 4 trainers per mode, one slowed 3x, on a local cluster (~15 min)
	@mkdir -p bin
	$(GO) test ./test -run '^$$' -bench 'BenchmarkTimeToAccuracy' -benchtime 1x -timeout 30m | tee bin/bench-train.txt

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

protoc-installed:
	@if ! protoc --version 2>/dev/null | grep -q '$(PROTOC_VERSION)'; then \
		echo "installing protoc $(PROTOC_VERSION) from Debian (protobuf-compiler)"; \
		apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; \
	fi
	@protoc --version | grep -q '$(PROTOC_VERSION)' || { echo "protoc is $$(protoc --version), want $(PROTOC_VERSION)"; exit 1; }

proto: protoc-installed $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc ## regenerate the gRPC code from the .proto files
	@for p in $(PROTOS); do \
		d=$$(dirname $$p); \
		PATH=$(TOOLS):$$PATH protoc -I $$d --go_out=$$d --go_opt=paths=source_relative \
			--go-grpc_out=$$d --go-grpc_opt=paths=source_relative $$(basename $$p); \
	done

proto-check: proto ## fail if the committed generated code differs from a fresh generation
	@git diff --exit-code --stat -- '*.pb.go' || { echo "generated code is stale: run make proto and commit"; exit 1; }

# The Python client (trainer/python, docs/OPERATIONS.md "Python"). Debian's
# python3 and packages only: no other package index is reachable from our
# machines. The stubs come from Debian's protoc and gRPC plugin, pinned like
# the Go generators, and must match python3-protobuf's runtime (3.21.x).
PY               := /usr/bin/python3
PY_DEBS          := python3-grpcio python3-protobuf python3-numpy python3-torch python3-pytest protobuf-compiler protobuf-compiler-grpc
GRPC_PY_VERSION  := 1.51.1
PY_PB            := trainer/python/raftps/pb
# The pytest suite's cluster: its ports (client base..base+2, HTTP +100,
# gossip +1000, peer +2000) must be free.
PY_TEST_PORT     ?= 17401

python-deps: ## install the Debian packages of the Python client (apt-get; a no-op when installed)
	@missing=$$(for p in $(PY_DEBS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing from Debian:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

proto-python: python-deps protoc-installed ## regenerate the Python stubs of the client API into trainer/python/raftps/pb
	@dpkg-query -W -f='$${Version}' protobuf-compiler-grpc | grep -q '^$(GRPC_PY_VERSION)' || { echo "protobuf-compiler-grpc is $$(dpkg-query -W -f='$${Version}' protobuf-compiler-grpc), want $(GRPC_PY_VERSION)"; exit 1; }
	@# -I maps the proto to raftps/pb/, so the stubs import each other as
	@# raftps.pb.client_pb2 from inside the package.
	protoc --proto_path=raftps/pb=shard/shardpb --python_out=trainer/python --grpc_python_out=trainer/python \
		--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin raftps/pb/client.proto

proto-python-check: proto-python ## fail if the committed Python stubs differ from a fresh generation
	@git diff --exit-code --stat -- $(PY_PB) || { echo "Python stubs are stale: run make proto-python and commit"; exit 1; }

test-python: build python-deps proto-python-check ## the Python client's pytest suite against a fresh local 3-node cluster (~2 min)
	cd trainer/python && RAFTPS_BIN=$(CURDIR)/bin/raftps RAFTPS_TEST_PORT=$(PY_TEST_PORT) $(PY) -m pytest -q -p no:cacheprovider tests

# The training example (trainer/python/examples/train_dlrm.py) with 1 and
# with 2 trainer processes, each checked against the Bayes-optimal AUC.
example-python: build python-deps ## the PyTorch DLRM example, 1 and 2 trainers (gloo), must reach Bayes AUC - 0.01 (two passes; ~8 min)
	cd trainer/python && RAFTPS_BIN=$(CURDIR)/bin/raftps RAFTPS_TEST_PORT=$(PY_TEST_PORT) RAFTPS_EXAMPLE=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/test_example.py

# The Python client beside the Go client on one fresh cluster: pull and push
# rows/s with 4096-key batches of a dim-64 table, 1 and 4 clients each,
# alternated run by run (this host's speed drifts within minutes).
BENCH_KEYS ?= 1000000
BENCH_PY_PORT ?= 7701
bench-python: build python-deps ## Python vs Go client: pull/push rows/s, 4096-key batches, dim 64, 1 and 4 clients (~3.5 min)
	@mkdir -p bin
	@rm -rf bin/bench-python && bin/raftps cluster up --dir bin/bench-python --base-port $(BENCH_PY_PORT) --server-args --insecure >/dev/null
	@trap 'bin/raftps cluster down --dir bin/bench-python >/dev/null' EXIT; \
	. bin/bench-python/env; \
	bin/raftps table create bench --dim 64 --shards 16 --optimizer sgd >/dev/null; \
	bin/raftps bench --table bench --workload push --keys $(BENCH_KEYS) --batch 4096 --zipf 1.1 --clients 4 --duration 5s >/dev/null 2>&1; \
	{ for w in pull push; do for n in 1 4; do \
		bin/raftps bench --table bench --load=false --workload $$w --keys $(BENCH_KEYS) --batch 4096 --zipf 1.1 --clients $$n --duration $(BENCH_DURATION) 2>&1 | tail -1; \
		$(PY) trainer/python/examples/bench_client.py --table bench --workload $$w --keys $(BENCH_KEYS) --batch 4096 --zipf 1.1 --clients $$n --duration $(BENCH_DURATION); \
	  done; done; } 2>&1 | tee bin/bench-python.txt

clean: ## remove build output
	rm -rf bin
