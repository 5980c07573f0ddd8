# xiaoclaw — `make help` lists the targets.
GO ?= go
TOOLS := $(CURDIR)/.tools/bin
STATICCHECK_VERSION := v0.8.2
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# Every module of the workspace; `./...` alone stops at module boundaries.
PKGS = $(shell $(GO) list -m -f '{{.Dir}}/...')
DATA_DIR ?= $(CURDIR)/.tmp/dev
CHROMIUM ?= /usr/bin/chromium

.PHONY: help build build-cli dev test test-ui test-go test-race fuzz lint bench bench-tracing tracing-share bench-openclaw interop jaeger jaeger-stop dev-observability test-jaeger images helm-tools helm-test tidy clean

help: ## show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: build-cli ## build bin/xiaoclaw and the three service binaries
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/gateway ./services/gateway/cmd/gateway
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/shim ./services/shim/cmd/shim
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/devicehub ./services/devicehub/cmd/devicehub

build-cli: ## build bin/xiaoclaw (CLI and `xiaoclaw dev`)
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/xiaoclaw ./cmd/xiaoclaw

dev: build-cli ## run the whole system in one process with embedded NATS and store
	bin/xiaoclaw dev --data-dir $(DATA_DIR)

test: test-go helm-test ## run every test: all Go modules, then the Helm chart checks

test-go: ## run the Go tests of every module (needs Postgres on 127.0.0.1:5432)
	$(GO) test -count=1 -timeout 10m $(PKGS)

test-race: ## run the tests with the race detector
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

FUZZTIME ?= 20s
fuzz: ## run every fuzz target for FUZZTIME each
	@for p in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$p 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$p $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$p || exit 1; \
	  done; done

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(TOOLS)/staticcheck ## go vet (with and without the interop tag) + staticcheck (pinned) + gofmt
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)
	$(GO) vet -tags interop $(PKGS)
	$(TOOLS)/staticcheck $(PKGS)

BENCHTIME ?= 2s
bench: ## run the Go benchmarks, then the real OpenClaw gateway against xiaoclaw (bench-openclaw)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -benchmem -timeout 20m $(PKGS)
	scripts/bench-openclaw.sh

bench-tracing: ## what tracing costs: throughput without a tracer provider vs tracing off vs 10 % and 100 % sampled
	scripts/bench-tracing.sh

tracing-share: ## what tracing costs against no tracer provider, read from CPU profiles: off, 10 % sampled, 100 % exported over OTLP/HTTP
	scripts/tracing-share.sh

bench-openclaw: ## node.invoke latency: the real OpenClaw gateway vs xiaoclaw, same stock node host
	scripts/bench-openclaw.sh

MCP_INTEROP_DIR := services/gateway/mcpserver/interop

interop: ## run real clients against xiaoclaw: the OpenClaw CLI and node host, the MCP TypeScript SDK and OpenAI Agents SDK (installs them from npm)
	bash ../shared/tools/openclaw/openclaw-ref.sh install
	cd "$${OCL:-$${TMPDIR:-/tmp}/openclaw-ref}" && { [ -x node_modules/.bin/mcp-server-everything ] || npm install --no-audit --no-fund @modelcontextprotocol/server-everything@2026.8.31; }
	cd $(MCP_INTEROP_DIR) && npm ci --no-audit --no-fund
	$(GO) test -count=1 -tags interop -run Interop -timeout 10m $(PKGS)

jaeger: ## build (once) and start a local Jaeger on 127.0.0.1: OTLP 4317/4318, query API 16686
	scripts/jaeger.sh start

jaeger-stop: ## stop the local Jaeger
	scripts/jaeger.sh stop

dev-observability: build-cli jaeger ## make dev with every call traced and exported to the local Jaeger
	OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 \
	OTEL_TRACES_SAMPLER=always_on \
	OTEL_BSP_SCHEDULE_DELAY=500 bin/xiaoclaw dev --data-dir $(DATA_DIR)

test-jaeger: ## export spans to a real Jaeger and query them back by trace id
	scripts/jaeger.sh build
	$(GO) test -count=1 -tags jaeger -run Jaeger ./pkg/telemetry/

images: ## build the container images (prints the commands when no Docker engine runs)
	deploy/scripts/images.sh

helm-tools: ## build helm, kubeconform and the offline Kubernetes schemas into .tools/ (cached)
	deploy/scripts/helm-tools.sh

helm-test: ## lint, render and validate the Helm chart (builds the tools on first use)
	deploy/scripts/helm-test.sh

tidy: ## go mod tidy -e in every module (plain tidy fails on a test-only dependency of sqlite)
	@for d in $$($(GO) list -m -f '{{.Dir}}'); do (cd $$d && $(GO) mod tidy -e) || exit 1; done

clean: ## remove build output and local state
	rm -rf bin .tmp

test-ui: build-cli ## browser tests of the console at /ui/: headless Chromium against xiaoclaw dev + sim (screenshots in .tmp/ui-screenshots)
	@command -v $(CHROMIUM) >/dev/null || { echo "$(CHROMIUM) not found: apt-get install chromium (.ci/run does)"; exit 1; }
	cd services/gateway/console/uitest && npm ci --no-audit --no-fund --loglevel=error
	cd services/gateway/console/uitest && XIAOCLAW_BIN=$(CURDIR)/bin/xiaoclaw CHROMIUM=$(CHROMIUM) SHOTS=$(CURDIR)/.tmp/ui-screenshots node console.test.mjs
