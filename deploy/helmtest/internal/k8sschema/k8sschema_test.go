package k8sschema

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

func generateSmall(t *testing.T) map[string]map[string]any {
	t.Helper()
	swagger, err := os.ReadFile("testdata/swagger-small.json")
	if err != nil {
		t.Fatal(err)
	}
	schemas, err := Generate(swagger)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, s := range schemas {
		var v map[string]any
		if err := json.Unmarshal(s.Body, &v); err != nil {
			t.Fatalf("%s is not JSON: %v", s.File, err)
		}
		out[s.File] = v
	}
	return out
}

// TestFileNamesFollowKubeconform: kubeconform looks schemas up as kind[-group]-version.json,
// with the group cut to its first DNS label.
func TestFileNamesFollowKubeconform(t *testing.T) {
	got := generateSmall(t)
	var names []string
	for name := range got {
		names = append(names, name)
	}
	want := []string{"deployment-apps-v1.json", "ingress-networking-v1.json", "service-v1.json"}
	if len(names) != len(want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	for _, w := range want {
		if _, ok := got[w]; !ok {
			t.Errorf("no %s among %v", w, names)
		}
	}
}

func TestSchemasAreStrictAndSelfContained(t *testing.T) {
	d := generateSmall(t)["deployment-apps-v1.json"]
	if d["$ref"] != "#/definitions/io.k8s.api.apps.v1.Deployment" {
		t.Fatalf("root $ref %v", d["$ref"])
	}
	defs := d["definitions"].(map[string]any)
	for _, name := range []string{
		"io.k8s.api.apps.v1.Deployment", "io.k8s.api.apps.v1.DeploymentSpec",
		"io.k8s.apimachinery.pkg.util.intstr.IntOrString", "io.k8s.apimachinery.pkg.api.resource.Quantity",
	} {
		if _, ok := defs[name]; !ok {
			t.Errorf("referenced definition %s is missing", name)
		}
	}
	if _, ok := defs["io.k8s.api.core.v1.Service"]; ok {
		t.Error("unreferenced definitions are copied in")
	}
	spec := defs["io.k8s.api.apps.v1.DeploymentSpec"].(map[string]any)
	if spec["additionalProperties"] != false {
		t.Errorf("objects with properties must reject unknown ones: %v", spec["additionalProperties"])
	}
	props := spec["properties"].(map[string]any)
	if ty := props["replicas"].(map[string]any)["type"]; !reflect.DeepEqual(ty, []any{"integer", "null"}) {
		t.Errorf("replicas type %v, want integer or null", ty)
	}
	// A map keeps its declared value schema instead of becoming strict.
	if ap := props["labels"].(map[string]any)["additionalProperties"]; !reflect.DeepEqual(ap, map[string]any{"type": []any{"string", "null"}}) {
		t.Errorf("labels additionalProperties %v", ap)
	}
	ios := defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"].(map[string]any)
	if _, hasType := ios["type"]; hasType || len(ios["oneOf"].([]any)) != 2 {
		t.Errorf("int-or-string %v, want oneOf string/integer", ios)
	}
	q := defs["io.k8s.apimachinery.pkg.api.resource.Quantity"].(map[string]any)
	if !strings.Contains(mustJSON(t, q), `"number"`) {
		t.Errorf("quantity %v does not accept numbers (cpu: 1)", q)
	}
}

func TestBadInputIsAnError(t *testing.T) {
	for name, in := range map[string]string{
		"not JSON":           `{`,
		"no definitions":     `{"swagger":"2.0"}`,
		"definition scalar":  `{"definitions":{"a":1}}`,
		"gvk not a list":     `{"definitions":{"a":{"x-kubernetes-group-version-kind":{}}}}`,
		"kind with a slash":  `{"definitions":{"a":{"x-kubernetes-group-version-kind":[{"group":"","version":"v1","kind":"../x"}]}}}`,
		"gvk without kind":   `{"definitions":{"a":{"x-kubernetes-group-version-kind":[{"group":"","version":"v1"}]}}}`,
		"dangling reference": `{"definitions":{"a":{"properties":{"b":{"$ref":"#/definitions/missing"}},"x-kubernetes-group-version-kind":[{"group":"","version":"v1","kind":"A"}]}}}`,
		"no served kinds":    `{"definitions":{"a":{"type":"object"}}}`,
	} {
		if _, err := Generate([]byte(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzGenerate: any input yields schemas or an error, never a panic, and every schema is JSON.
func FuzzGenerate(f *testing.F) {
	small, err := os.ReadFile("testdata/swagger-small.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(small)
	f.Add([]byte(`{"definitions":{"a":{"$ref":"#/definitions/a","x-kubernetes-group-version-kind":[{"group":"x.y","version":"v1","kind":"K"}]}}}`))
	f.Add([]byte(`{"definitions":{"a":{"properties":[1,2],"type":7,"format":"int-or-string"}}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, in []byte) {
		schemas, err := Generate(in)
		if err != nil {
			return
		}
		for _, s := range schemas {
			if !json.Valid(s.Body) || !strings.HasSuffix(s.File, ".json") || strings.ContainsAny(s.File, "/\\") {
				t.Fatalf("bad schema file %q", s.File)
			}
		}
	})
}
