package helmtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
)

const buildHint = "build the chart tools with `make helm-tools` (deploy/scripts/helm-tools.sh, about 3 minutes the first time)"

// repoRoot is the repository root: this package lives in deploy/helmtest.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "deploy", "helm", "xiaoclaw", "Chart.yaml")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	return root
}

// tool returns the path of a tool: $ENV when set, else .tools/bin/NAME. A missing tool fails
// the test with how to build it.
func tool(t *testing.T, env, name string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		path = filepath.Join(repoRoot(t), ".tools", "bin", name)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s not found at %s (set %s to use another one): %s", name, path, env, buildHint)
	}
	return path
}

// schemaDir returns the directory holding the generated strict schemas
// ($K8S_SCHEMA_DIR, else the newest .tools/schemas/v*-standalone-strict) and its Kubernetes version.
func schemaDir(t *testing.T) (dir, version string) {
	t.Helper()
	dir = os.Getenv("K8S_SCHEMA_DIR")
	if dir == "" {
		matches, _ := filepath.Glob(filepath.Join(repoRoot(t), ".tools", "schemas", "v*-standalone-strict"))
		if len(matches) == 0 {
			t.Fatalf("no Kubernetes schemas under .tools/schemas: %s", buildHint)
		}
		sort.Strings(matches)
		dir = matches[len(matches)-1]
	}
	if _, err := os.Stat(filepath.Join(dir, "deployment-apps-v1.json")); err != nil {
		t.Fatalf("schema directory %s is incomplete: %s", dir, buildHint)
	}
	base := filepath.Base(dir)
	version = base[1 : len(base)-len("-standalone-strict")]
	return dir, version
}

// run executes a command and returns its stdout; on failure the test gets stderr too.
func run(t *testing.T, name string, args ...string) ([]byte, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), helmEnv(t)...)
	err := cmd.Run()
	if err != nil {
		return stdout.Bytes(), &commandError{args: append([]string{name}, args...), err: err, stderr: stderr.String()}
	}
	return stdout.Bytes(), nil
}

type commandError struct {
	args   []string
	err    error
	stderr string
}

func (e *commandError) Error() string {
	return e.err.Error() + ": " + e.stderr
}

// helmEnv keeps helm's config and cache out of the user's home.
func helmEnv(t *testing.T) []string {
	home := t.TempDir()
	return []string{
		"HOME=" + home,
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}
}
