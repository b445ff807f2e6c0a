# Stockade build, setup, test and benchmark entry points. Every target that
# needs host software installs it itself (`stockade setup`), so each works on
# a bare Debian 12 machine with Go.

export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED := 0
export GOFLAGS := -buildvcs=false

# The version stockade --version prints: the checkout's, or devel.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
GUEST := internal/guestbin/payload/stockade-guest
PROBE := internal/guestbin/payload/stockade-probe

.PHONY: all build guest setup up test bench clean

all: build

# The guest agent is compiled first and embedded in the stockade binary;
# so is the probe that `stockade audit blast-radius` runs in a sandbox.
guest:
	go build -trimpath -ldflags='-s -w' -o $(GUEST) ./cmd/stockade-guest
	sha256sum $(GUEST) > $(GUEST).sha256
	go build -trimpath -ldflags='-s -w' -o $(PROBE) ./sandbox/conformance/probe

build: guest
	go build -trimpath -ldflags='-X main.version=$(VERSION)' -o bin/stockade ./cmd/stockade

# Installs runc and debootstrap, builds the static runsc and the images,
# and puts stockade on PATH.
setup: build
	install -m 0755 bin/stockade /usr/local/bin/stockade
	stockade setup

# README command 1: a bare machine to a running Stockade.
up: setup
	scripts/up.sh

# README command 2: the whole test suite, with every prerequisite installed.
test: setup
	scripts/test.sh

bench: setup
	go run ./bench/oneshot -n 30

clean:
	rm -rf bin $(GUEST) $(GUEST).sha256 $(PROBE)
