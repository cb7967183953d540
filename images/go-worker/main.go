// go-worker: TEST-ONLY. A worker whose image holds nothing of Coroner (a static Go binary in a
// `scratch` image: no shell, no Python), for the real-node tests of the registrar
// (tests/node/test_2d_image_free.py). Built by `coroner dev-cluster images` as
// localhost/coroner-dev/go-worker:dev (images/go-worker.Dockerfile); never shipped or deployed.
//
//	go-worker [SECONDS [CODE]]
//
// No argument: prints its pid, then sleeps until it is stopped (a line with its pid every minute).
// SECONDS: prints its pid, then exits with CODE (default 1) after SECONDS seconds: with CODE 0 a
// task that completes, otherwise a container that crash-loops.
// SIGTERM (the kubelet stopping the container) exits 0 at once: a clean exit.
// GO_WORKER_ALLOCATE_MIB=N: after GO_WORKER_ALLOCATE_AFTER_SECONDS (default 0), allocates N MiB in
// 1 MiB chunks and writes every page of each, so that a container memory limit below N MiB gets
// the process OOM-killed; if it survives, it keeps the memory and sleeps on.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

const usage = "usage: go-worker [SECONDS [CODE]]"

// held keeps what was allocated reachable, so the garbage collector never frees it.
var held [][]byte

func say(format string, args ...any) {
	fmt.Printf("go-worker pid=%d %s\n", os.Getpid(), fmt.Sprintf(format, args...))
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, message)
	os.Exit(2)
}

func seconds(text, what string) time.Duration {
	value, err := strconv.ParseFloat(text, 64)
	if err != nil || value < 0 {
		fail(fmt.Sprintf("%s: %q is not a number of seconds", what, text))
	}
	return time.Duration(value * float64(time.Second))
}

func allocate(mib int) {
	const page = 4096
	for i := 0; i < mib; i++ {
		chunk := make([]byte, 1<<20)
		for offset := 0; offset < len(chunk); offset += page {
			chunk[offset] = 1
		}
		held = append(held, chunk)
		if (i+1)%16 == 0 || i+1 == mib {
			say("allocated %d MiB", i+1)
		}
	}
}

func main() {
	args := os.Args[1:]
	if len(args) > 2 || (len(args) > 0 && (args[0] == "-h" || args[0] == "--help")) {
		fail(usage)
	}
	var deadline <-chan time.Time
	code := 1
	if len(args) > 0 {
		deadline = time.After(seconds(args[0], "SECONDS"))
	}
	if len(args) > 1 {
		parsed, err := strconv.Atoi(args[1])
		if err != nil || parsed < 0 || parsed > 255 {
			fail(fmt.Sprintf("CODE: %q is not an exit status (0-255)", args[1]))
		}
		code = parsed
	}
	var allocateAt <-chan time.Time
	mib := 0
	if text := os.Getenv("GO_WORKER_ALLOCATE_MIB"); text != "" {
		parsed, err := strconv.Atoi(text)
		if err != nil || parsed < 0 {
			fail(fmt.Sprintf("GO_WORKER_ALLOCATE_MIB: %q is not a number of MiB", text))
		}
		mib = parsed
		after := time.Duration(0)
		if text := os.Getenv("GO_WORKER_ALLOCATE_AFTER_SECONDS"); text != "" {
			after = seconds(text, "GO_WORKER_ALLOCATE_AFTER_SECONDS")
		}
		allocateAt = time.After(after)
	}
	terminate := make(chan os.Signal, 1)
	signal.Notify(terminate, syscall.SIGTERM)
	say("started")
	alive := time.NewTicker(time.Minute)
	defer alive.Stop()
	for {
		select {
		case received := <-terminate:
			say("got signal %d; exiting 0", received.(syscall.Signal))
			os.Exit(0)
		case <-deadline:
			say("exiting %d after %s s", code, args[0])
			os.Exit(code)
		case <-allocateAt:
			allocateAt = nil
			say("allocating %d MiB", mib)
			allocate(mib)
		case <-alive.C:
			say("alive")
		}
	}
}
