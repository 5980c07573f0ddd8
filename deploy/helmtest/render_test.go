package helmtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	releaseName = "rel"
	namespace   = "xc"
)

// scenario is one way of installing the chart.
type scenario struct {
	name string
	args []string
	// Secrets the pods may reference without the chart rendering them (created by the
	// operator, or by a bundled dependency).
	externalSecrets map[string]bool
	// Whether the Job must run before anything else exists (external database).
	preInstall bool
}

func scenarios(t *testing.T) []scenario {
	chart := filepath.Join(repoRoot(t), "deploy", "helm", "xiaoclaw")
	return []scenario{
		{
			name:            "default",
			externalSecrets: map[string]bool{releaseName + "-postgresql": true},
		},
		{
			name:            "production",
			args:            []string{"-f", filepath.Join(chart, "values-production.yaml")},
			externalSecrets: map[string]bool{"xiaoclaw-credentials": true, "xiaoclaw-nats-auth": true},
			preInstall:      true,
		},
		{
			name: "external",
			args: []string{
				"--set", "nats.enabled=false,postgresql.enabled=false",
				"--set", "externalNats.url=nats://nats.nats.svc:4222",
				"--set", "externalDatabase.url=postgres://xiaoclaw:s3cret@pg.example:5432/xiaoclaw",
				"--set", "gateway.ingress.enabled=true,networkPolicy.egress.enabled=true",
			},
			externalSecrets: map[string]bool{},
			preInstall:      true,
		},
	}
}

// stagedChart copies the chart to a temporary directory and gives it stand-ins for the
// bundled nats and postgresql dependencies, whose archives `helm dependency update` would
// download. The stand-ins render nothing; the chart refers to their Services and Secrets by
// name only.
func stagedChart(t *testing.T) string {
	t.Helper()
	src := filepath.Join(repoRoot(t), "deploy", "helm", "xiaoclaw")
	dst := filepath.Join(t.TempDir(), "xiaoclaw")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	// Archives from `helm dependency update`, if any, are replaced: these checks cover this
	// chart's own objects.
	if err := os.RemoveAll(filepath.Join(dst, "charts")); err != nil {
		t.Fatal(err)
	}
	for name, version := range map[string]string{"nats": "1.2.0", "postgresql": "16.0.0"} {
		dir := filepath.Join(dst, "charts", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		chart := "apiVersion: v2\nname: " + name + "\nversion: " + version + "\n"
		if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), []byte(chart), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// manifest is one rendered object.
type manifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	raw []byte
}

func (m manifest) id() string { return m.Kind + "/" + m.Metadata.Name }

// hookEvents returns the helm hook events of an object (nil when it is a normal resource).
func (m manifest) hookEvents() []string {
	h := m.Metadata.Annotations["helm.sh/hook"]
	if h == "" {
		return nil
	}
	return strings.Split(h, ",")
}

func (m manifest) hookWeight(t *testing.T) int {
	w, err := strconv.Atoi(m.Metadata.Annotations["helm.sh/hook-weight"])
	if err != nil && m.Metadata.Annotations["helm.sh/hook-weight"] != "" {
		t.Fatalf("%s: bad hook weight: %v", m.id(), err)
	}
	return w
}

// into decodes the object strictly into a typed Kubernetes struct: an unknown field fails.
func into[T any](t *testing.T, m manifest) *T {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(m.raw, &v); err != nil {
		t.Fatalf("%s does not decode as %T: %v", m.id(), v, err)
	}
	return &v
}

// rendering is the output of `helm template` for one scenario.
type rendering struct {
	scenario
	yaml    []byte
	objects []manifest
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

func render(t *testing.T, chart string, args ...string) ([]byte, error) {
	t.Helper()
	helm := tool(t, "HELM", "helm")
	return run(t, helm, append([]string{"template", releaseName, chart, "--namespace", namespace}, args...)...)
}

func renderScenario(t *testing.T, chart string, sc scenario) rendering {
	t.Helper()
	out, err := render(t, chart, sc.args...)
	if err != nil {
		t.Fatalf("helm template (%s): %v", sc.name, err)
	}
	r := rendering{scenario: sc, yaml: out}
	for _, doc := range docSeparator.Split(string(out), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var m manifest
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: rendered document is not YAML: %v\n%s", sc.name, err, doc)
		}
		if m.Kind == "" || m.Metadata.Name == "" {
			t.Fatalf("%s: rendered document without kind or name:\n%s", sc.name, doc)
		}
		m.raw = []byte(doc)
		r.objects = append(r.objects, m)
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func (r rendering) all(kind string) []manifest {
	var out []manifest
	for _, m := range r.objects {
		if m.Kind == kind {
			out = append(out, m)
		}
	}
	return out
}

func (r rendering) find(kind, name string) (manifest, bool) {
	for _, m := range r.objects {
		if m.Kind == kind && m.Metadata.Name == name {
			return m, true
		}
	}
	return manifest{}, false
}

// deployments returns the Deployments by their component label.
func (r rendering) deployments(t *testing.T) map[string]*appsv1.Deployment {
	out := map[string]*appsv1.Deployment{}
	for _, m := range r.all("Deployment") {
		d := into[appsv1.Deployment](t, m)
		out[d.Spec.Template.Labels["app.kubernetes.io/component"]] = d
	}
	return out
}

// podSpec is the pod template of a workload, with where it came from.
type podSpec struct {
	owner  manifest
	labels map[string]string
	spec   corev1.PodSpec
}

func (r rendering) podSpecs(t *testing.T) []podSpec {
	var out []podSpec
	for _, m := range r.objects {
		switch m.Kind {
		case "Deployment":
			d := into[appsv1.Deployment](t, m)
			out = append(out, podSpec{m, d.Spec.Template.Labels, d.Spec.Template.Spec})
		case "Job":
			j := into[batchv1.Job](t, m)
			out = append(out, podSpec{m, j.Spec.Template.Labels, j.Spec.Template.Spec})
		case "Pod":
			p := into[corev1.Pod](t, m)
			out = append(out, podSpec{m, p.Labels, p.Spec})
		case "StatefulSet", "DaemonSet", "ReplicaSet", "CronJob":
			t.Errorf("%s: workload kind not covered by these checks", m.id())
		}
	}
	return out
}

func forEachScenario(t *testing.T, f func(t *testing.T, r rendering)) {
	chart := stagedChart(t)
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			f(t, renderScenario(t, chart, sc))
		})
	}
}

// selects reports whether a label selector (matchLabels only) matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func decodeAll[T any](t *testing.T, ms []manifest) []*T {
	out := make([]*T, 0, len(ms))
	for _, m := range ms {
		out = append(out, into[T](t, m))
	}
	return out
}
