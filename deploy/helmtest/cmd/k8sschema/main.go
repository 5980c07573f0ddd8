// Command k8sschema writes strict per-kind JSON schemas for kubeconform from the Kubernetes
// swagger.json, so manifests can be validated offline:
//
//	k8sschema -in .../k8s.io/kubernetes@v1.36.3/api/openapi-spec/swagger.json -out .tools/schemas/v1.36.3-standalone-strict
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/xiaoclaw/xiaoclaw/deploy/helmtest/internal/k8sschema"
)

func main() {
	in := flag.String("in", "", "path of the Kubernetes swagger.json (OpenAPI v2)")
	out := flag.String("out", "", "directory to write the schemas into (created)")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "k8sschema:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	if in == "" || out == "" {
		return fmt.Errorf("both -in and -out are required")
	}
	swagger, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	schemas, err := k8sschema.Generate(swagger)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, s := range schemas {
		if err := os.WriteFile(filepath.Join(out, s.File), s.Body, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %d schemas to %s\n", len(schemas), out)
	return nil
}
