package helmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerui"
	digest "github.com/opencontainers/go-digest"
)

// images maps each Dockerfile to the binary it must build and the package it builds it from.
var images = []struct {
	dockerfile, binary, pkg string
}{
	{"services/gateway/Dockerfile", "gateway", "./services/gateway/cmd/gateway"},
	{"services/shim/Dockerfile", "shim", "./services/shim/cmd/shim"},
	{"services/devicehub/Dockerfile", "devicehub", "./services/devicehub/cmd/devicehub"},
	{"cmd/xiaoclaw/Dockerfile", "xiaoclaw", "./cmd/xiaoclaw"},
}

// offlineImages answers base-image lookups with an empty linux/amd64 image, so the linter
// runs without a registry.
type offlineImages struct{}

func (offlineImages) ResolveImageConfig(_ context.Context, ref string, _ sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	return ref, "", []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("0", 64) + `"]},"config":{}}`), nil
}

// TestDockerfilesPassBuildChecks runs the checks of `docker build --check` (BuildKit's
// Dockerfile linter, every rule) on each Dockerfile and fails on any warning.
func TestDockerfilesPassBuildChecks(t *testing.T) {
	root := repoRoot(t)
	for _, img := range images {
		t.Run(img.binary, func(t *testing.T) {
			dt, err := os.ReadFile(filepath.Join(root, img.dockerfile))
			if err != nil {
				t.Fatal(err)
			}
			source := llb.NewSourceMap(nil, img.dockerfile, "Dockerfile", dt)
			source.Definition = &llb.Definition{}
			res, err := dockerfile2llb.DockerfileLint(context.Background(), dt, dockerfile2llb.ConvertOpt{
				Config:       dockerui.Config{BuildArgs: map[string]string{"VERSION": "test"}},
				MetaResolver: offlineImages{},
				SourceMap:    source,
			})
			if err != nil {
				t.Fatalf("%s: %v", img.dockerfile, err)
			}
			if res.Error != nil {
				t.Fatalf("%s: build error: %s", img.dockerfile, res.Error.Message)
			}
			for _, w := range res.Warnings {
				line := 0
				if w.Location != nil && len(w.Location.Ranges) > 0 {
					line = int(w.Location.Ranges[0].Start.Line)
				}
				t.Errorf("%s:%d: %s: %s", img.dockerfile, line, w.RuleName, w.Detail)
			}
		})
	}
}

// TestDockerfilesBuildStaticNonRootImages checks what the images promise: a golang 1.26
// builder over the workspace, a static trimmed binary stamped with VERSION, and a distroless
// or scratch final stage that runs as user 65532.
func TestDockerfilesBuildStaticNonRootImages(t *testing.T) {
	root := repoRoot(t)
	for _, img := range images {
		t.Run(img.binary, func(t *testing.T) {
			stages, metaArgs := parseDockerfile(t, filepath.Join(root, img.dockerfile))
			defaults := map[string]string{}
			for _, a := range metaArgs {
				for _, kv := range a.Args {
					if kv.Value != nil {
						defaults[kv.Key] = *kv.Value
					}
				}
			}
			expand := func(s string) string {
				return os.Expand(s, func(k string) string { return defaults[k] })
			}
			if len(stages) < 2 {
				t.Fatalf("want a multi-stage build, got %d stage(s)", len(stages))
			}
			builder, final := stages[0], stages[len(stages)-1]

			if base := expand(builder.BaseName); !strings.HasPrefix(base, "golang:1.26") {
				t.Errorf("builder stage FROM %q, want golang:1.26", base)
			}
			build := findRun(builder, "go build")
			if build == "" {
				t.Fatal("builder stage has no `go build`")
			}
			for _, want := range []string{"-trimpath", "-s -w", "-X main.version=${VERSION}", "-o /out/" + img.binary, img.pkg} {
				if !strings.Contains(build, want) {
					t.Errorf("go build command %q lacks %q", build, want)
				}
			}
			if !stageEnv(builder)["CGO_ENABLED"].has("0") {
				t.Error("builder stage does not set CGO_ENABLED=0 (the final image has no libc)")
			}
			if !declaresArg(builder, "VERSION") {
				t.Error("builder stage does not declare ARG VERSION")
			}
			if !hasCopyAll(builder) {
				t.Error("builder stage does not copy the workspace (COPY . .)")
			}

			if base := expand(final.BaseName); base != "scratch" && !strings.HasPrefix(base, "gcr.io/distroless/static") {
				t.Errorf("final stage FROM %q, want distroless static or scratch", base)
			}
			user := lastUser(final)
			if user != "65532:65532" && user != "65532" {
				t.Errorf("final stage USER %q, want 65532 (non-root, numeric so runAsNonRoot can verify it)", user)
			}
			entry := entrypoint(final)
			if len(entry) != 1 || filepath.Base(entry[0]) != img.binary {
				t.Errorf("ENTRYPOINT %q, want the %s binary in exec form", entry, img.binary)
			}
		})
	}
}

func parseDockerfile(t *testing.T, path string) ([]instructions.Stage, []instructions.ArgCommand) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ast, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	stages, metaArgs, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return stages, metaArgs
}

func findRun(s instructions.Stage, contains string) string {
	for _, c := range s.Commands {
		if run, ok := c.(*instructions.RunCommand); ok {
			line := strings.Join(run.CmdLine, " ")
			if strings.Contains(line, contains) {
				return line
			}
		}
	}
	return ""
}

type envValues []string

func (v envValues) has(want string) bool {
	for _, x := range v {
		if x == want {
			return true
		}
	}
	return false
}

func stageEnv(s instructions.Stage) map[string]envValues {
	env := map[string]envValues{}
	for _, c := range s.Commands {
		if e, ok := c.(*instructions.EnvCommand); ok {
			for _, kv := range e.Env {
				env[kv.Key] = append(env[kv.Key], kv.Value)
			}
		}
	}
	return env
}

func declaresArg(s instructions.Stage, name string) bool {
	for _, c := range s.Commands {
		if a, ok := c.(*instructions.ArgCommand); ok {
			for _, kv := range a.Args {
				if kv.Key == name {
					return true
				}
			}
		}
	}
	return false
}

func hasCopyAll(s instructions.Stage) bool {
	for _, c := range s.Commands {
		if cp, ok := c.(*instructions.CopyCommand); ok && cp.From == "" {
			if fmt.Sprint(cp.SourcePaths) == "[.]" && cp.DestPath == "." {
				return true
			}
		}
	}
	return false
}

func lastUser(s instructions.Stage) string {
	user := ""
	for _, c := range s.Commands {
		if u, ok := c.(*instructions.UserCommand); ok {
			user = u.User
		}
	}
	return user
}

func entrypoint(s instructions.Stage) []string {
	var cmd []string
	for _, c := range s.Commands {
		if e, ok := c.(*instructions.EntrypointCommand); ok && !e.PrependShell {
			cmd = e.CmdLine
		}
	}
	return cmd
}
