package helmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

var components = []string{"gateway", "shim", "devicehub"}

func TestHelmLint(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	chart := stagedChart(t)
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			out, err := run(t, helm, append([]string{"lint", "--strict", chart, "--namespace", namespace}, sc.args...)...)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
}

// TestManifestsMatchKubernetesSchemas validates every rendered object against the strict
// Kubernetes API schemas (unknown fields, wrong types and missing required fields fail).
// ServiceMonitor is a CRD without a schema there; TestServiceMonitor checks it.
func TestManifestsMatchKubernetesSchemas(t *testing.T) {
	kubeconform := tool(t, "KUBECONFORM", "kubeconform")
	schemas, version := schemaDir(t)
	location := filepath.Join(filepath.Dir(schemas), "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}", "{{ .ResourceKind }}{{ .KindSuffix }}.json")
	forEachScenario(t, func(t *testing.T, r rendering) {
		file := filepath.Join(t.TempDir(), r.name+".yaml")
		if err := os.WriteFile(file, r.yaml, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := run(t, kubeconform, "-strict", "-summary", "-kubernetes-version", version,
			"-schema-location", location, "-skip", "ServiceMonitor", file)
		if err != nil {
			t.Fatalf("kubeconform: %v\n%s", err, out)
		}
		t.Logf("kubeconform: %s", strings.TrimSpace(string(out)))
		// Every object of a kind the typed API knows must also decode strictly.
		for _, m := range r.objects {
			switch m.Kind {
			case "HorizontalPodAutoscaler":
				into[autoscalingv2.HorizontalPodAutoscaler](t, m)
			case "PodDisruptionBudget":
				into[policyv1.PodDisruptionBudget](t, m)
			case "NetworkPolicy":
				into[networkingv1.NetworkPolicy](t, m)
			case "Ingress":
				into[networkingv1.Ingress](t, m)
			case "Service":
				into[corev1.Service](t, m)
			case "ConfigMap":
				into[corev1.ConfigMap](t, m)
			case "Secret":
				into[corev1.Secret](t, m)
			}
		}
	})
}

func TestAllServicesAreDeployed(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		deps := r.deployments(t)
		for _, c := range components {
			d, ok := deps[c]
			if !ok {
				t.Errorf("no Deployment for %s", c)
				continue
			}
			image := d.Spec.Template.Spec.Containers[0].Image
			if !strings.Contains(image, "/"+c+":") {
				t.Errorf("%s runs image %q", c, image)
			}
			if !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				t.Errorf("%s: selector %v does not match its pods %v", c, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
			}
			env := envNames(d.Spec.Template.Spec.Containers[0])
			instance := findEnv(d.Spec.Template.Spec.Containers[0], "XIAOCLAW_INSTANCE")
			if instance == nil || instance.ValueFrom == nil || instance.ValueFrom.FieldRef == nil || instance.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%s: XIAOCLAW_INSTANCE is not the pod name (downward API)", c)
			}
			config := r.configFor(t, d.Spec.Template.Spec.Containers[0])
			if config["XIAOCLAW_NATS_URL"] == "" && !env["XIAOCLAW_NATS_URL"] {
				t.Errorf("%s: no NATS URL", c)
			}
		}
		gw := deps["gateway"].Spec.Template.Spec.Containers[0]
		for _, name := range []string{"XIAOCLAW_DATABASE_URL", "XIAOCLAW_ADMIN_TOKEN"} {
			if !envNames(gw)[name] {
				t.Errorf("gateway lacks %s", name)
			}
		}
		gwConfig := r.configFor(t, gw)
		for _, name := range []string{"XIAOCLAW_IDEMPOTENCY_REPLICAS", "XIAOCLAW_IDEMPOTENCY_TTL"} {
			if gwConfig[name] == "" {
				t.Errorf("gateway config lacks %s", name)
			}
		}
		if !envNames(deps["devicehub"].Spec.Template.Spec.Containers[0])["XIAOCLAW_DATABASE_URL"] {
			t.Error("devicehub lacks XIAOCLAW_DATABASE_URL (device keys)")
		}
		if envNames(deps["shim"].Spec.Template.Spec.Containers[0])["XIAOCLAW_DATABASE_URL"] {
			t.Error("the shim gets database credentials it does not need")
		}
	})
}

func TestProbesOnEveryServiceContainer(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		for c, d := range r.deployments(t) {
			for _, ctr := range d.Spec.Template.Spec.Containers {
				opsPort := namedPort(ctr, "ops")
				if opsPort != 9090 {
					t.Errorf("%s/%s: ops port is %d, want 9090", c, ctr.Name, opsPort)
				}
				checkProbe(t, c+"/"+ctr.Name+" readiness", ctr.ReadinessProbe, "/readyz")
				checkProbe(t, c+"/"+ctr.Name+" liveness", ctr.LivenessProbe, "/healthz")
			}
		}
	})
}

func checkProbe(t *testing.T, what string, p *corev1.Probe, path string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: no HTTP probe", what)
		return
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "ops" {
		t.Errorf("%s: probes %s on port %s, want %s on ops", what, p.HTTPGet.Path, p.HTTPGet.Port.String(), path)
	}
}

// TestPodsAreLockedDown covers every pod the chart creates, hooks and tests included.
func TestPodsAreLockedDown(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		for _, p := range r.podSpecs(t) {
			who := p.owner.id()
			psc := p.spec.SecurityContext
			if p.spec.AutomountServiceAccountToken == nil || *p.spec.AutomountServiceAccountToken {
				t.Errorf("%s: mounts a service account token it never uses", who)
			}
			for _, c := range append(slices.Clone(p.spec.InitContainers), p.spec.Containers...) {
				who := who + "/" + c.Name
				sc := c.SecurityContext
				if sc == nil {
					t.Errorf("%s: no securityContext", who)
					continue
				}
				nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
				if !nonRoot {
					t.Errorf("%s: runAsNonRoot is not set", who)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: root filesystem is writable", who)
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: privilege escalation allowed", who)
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s: capabilities are not dropped: %+v", who, sc.Capabilities)
				}
				seccomp := sc.SeccompProfile
				if seccomp == nil && psc != nil {
					seccomp = psc.SeccompProfile
				}
				if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("%s: seccomp profile is not RuntimeDefault", who)
				}
				for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					if _, ok := c.Resources.Requests[res]; !ok {
						t.Errorf("%s: no %s request", who, res)
					}
					if _, ok := c.Resources.Limits[res]; !ok {
						t.Errorf("%s: no %s limit", who, res)
					}
				}
			}
		}
	})
}

// secretLooking matches ConfigMap keys that name credentials.
var secretLooking = regexp.MustCompile(`(?i)(pass(word)?|secret|token|credential|private|api[_-]?key|database[_-]?url|dsn|\bkey$|_key$)`)

// urlWithPassword matches scheme://user:password@host.
var urlWithPassword = regexp.MustCompile(`^[a-z][a-z0-9+.-]*://[^/@:]+:[^/@]+@`)

func TestNoSecretsInConfigMaps(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		for _, m := range decodeAll[corev1.ConfigMap](t, r.all("ConfigMap")) {
			for k, v := range m.Data {
				if secretLooking.MatchString(k) {
					t.Errorf("ConfigMap %s has the secret-looking key %s", m.Name, k)
				}
				if urlWithPassword.MatchString(v) {
					t.Errorf("ConfigMap %s: %s holds a URL with a password", m.Name, k)
				}
			}
		}
		if r.name == "external" {
			// The database URL of this scenario carries a password: it must be in Secrets only.
			if !strings.Contains(secretPayloads(t, r), "s3cret") {
				t.Error("the external database URL is in no Secret")
			}
			for _, m := range r.all("ConfigMap") {
				if strings.Contains(string(m.raw), "s3cret") {
					t.Errorf("%s contains the database password", m.id())
				}
			}
		}
	})
}

func secretPayloads(t *testing.T, r rendering) string {
	var b strings.Builder
	for _, s := range decodeAll[corev1.Secret](t, r.all("Secret")) {
		for _, v := range s.Data {
			b.Write(v)
		}
		for _, v := range s.StringData {
			b.WriteString(v)
		}
	}
	return b.String()
}

// TestReferencesResolve: every Secret and ConfigMap a pod reads is rendered by the chart or
// is one the scenario says exists outside it.
func TestReferencesResolve(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		for _, p := range r.podSpecs(t) {
			for _, ref := range podRefs(p.spec) {
				if _, ok := r.find(ref.kind, ref.name); ok {
					continue
				}
				if ref.kind == "Secret" && r.externalSecrets[ref.name] {
					continue
				}
				t.Errorf("%s reads %s %q, which nothing provides", p.owner.id(), ref.kind, ref.name)
			}
		}
	})
}

func TestAutoscalingAndDisruptionBudgets(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		deps := r.deployments(t)
		hpas := decodeAll[autoscalingv2.HorizontalPodAutoscaler](t, r.all("HorizontalPodAutoscaler"))
		for _, c := range []string{"shim", "gateway"} {
			var hpa *autoscalingv2.HorizontalPodAutoscaler
			for _, h := range hpas {
				if h.Spec.ScaleTargetRef.Kind == "Deployment" && h.Spec.ScaleTargetRef.Name == deps[c].Name {
					hpa = h
				}
			}
			if hpa == nil {
				t.Errorf("no HorizontalPodAutoscaler for the %s", c)
				continue
			}
			cpu := false
			for _, metric := range hpa.Spec.Metrics {
				cpu = cpu || (metric.Resource != nil && metric.Resource.Name == corev1.ResourceCPU)
			}
			if !cpu {
				t.Errorf("%s autoscaler does not scale on CPU", c)
			}
			if deps[c].Spec.Replicas != nil {
				t.Errorf("%s sets replicas while its autoscaler owns them", c)
			}
		}
		pdbs := decodeAll[policyv1.PodDisruptionBudget](t, r.all("PodDisruptionBudget"))
		for _, c := range components {
			covered := false
			for _, p := range pdbs {
				covered = covered || (p.Spec.Selector != nil && selects(p.Spec.Selector.MatchLabels, deps[c].Spec.Template.Labels))
			}
			if !covered {
				t.Errorf("no PodDisruptionBudget covers the %s", c)
			}
		}
	})
}

func TestNetworkPolicies(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		deps := r.deployments(t)
		policies := decodeAll[networkingv1.NetworkPolicy](t, r.all("NetworkPolicy"))
		allowed := func(c string) map[string]bool {
			ports := map[string]bool{}
			for _, p := range policies {
				if !selects(p.Spec.PodSelector.MatchLabels, deps[c].Spec.Template.Labels) {
					continue
				}
				for _, rule := range p.Spec.Ingress {
					for _, port := range rule.Ports {
						ports[port.Port.String()] = true
					}
				}
			}
			return ports
		}
		want := map[string][]string{"gateway": {"http", "ops"}, "shim": {"ops"}, "devicehub": {"http", "mqtt", "ops"}}
		for c, ports := range want {
			got := allowed(c)
			if len(got) == 0 {
				t.Errorf("no NetworkPolicy restricts ingress to the %s", c)
				continue
			}
			for _, p := range ports {
				if !got[p] {
					t.Errorf("%s: NetworkPolicies do not admit port %s", c, p)
				}
			}
			if len(got) != len(ports) {
				t.Errorf("%s: NetworkPolicies admit ports %v, want only %v", c, got, ports)
			}
		}
	})
}

// TestDeviceHubDrains: devices reach the hub on 8000 (WebSocket, OTA) and 1883 (MQTT), and
// a rollout starts a new hub before an old one drains.
func TestDeviceHubDrains(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		hub := r.deployments(t)["devicehub"]
		ports := map[int32]bool{}
		for _, s := range decodeAll[corev1.Service](t, r.all("Service")) {
			if !selects(s.Spec.Selector, hub.Spec.Template.Labels) || s.Spec.ClusterIP == corev1.ClusterIPNone {
				continue
			}
			for _, p := range s.Spec.Ports {
				if p.Protocol != corev1.ProtocolTCP {
					t.Errorf("Service %s port %d is %s", s.Name, p.Port, p.Protocol)
				}
				ports[p.Port] = true
			}
		}
		if !ports[8000] || !ports[1883] {
			t.Errorf("devicehub Services expose %v, want 8000 and 1883", ports)
		}
		pod := hub.Spec.Template.Spec
		pre := pod.Containers[0].Lifecycle
		if pre == nil || pre.PreStop == nil || pre.PreStop.Sleep == nil || pre.PreStop.Sleep.Seconds <= 0 {
			t.Fatal("devicehub has no preStop pause before SIGTERM")
		}
		if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds <= pre.PreStop.Sleep.Seconds+10 {
			t.Errorf("devicehub grace period %v leaves under 10 s to close sessions after the %d s preStop",
				pod.TerminationGracePeriodSeconds, pre.PreStop.Sleep.Seconds)
		}
		ru := hub.Spec.Strategy.RollingUpdate
		if ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
			t.Error("devicehub rollout may take a hub down before its replacement is ready")
		}
	})
}

// TestMigrationsRunBeforeTheServices: the migrations Job is a hook, and everything it reads
// exists before it runs.
func TestMigrationsRunBeforeTheServices(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		jobs := r.all("Job")
		if len(jobs) != 1 {
			t.Fatalf("want one migrations Job, got %d", len(jobs))
		}
		jm := jobs[0]
		job := into[batchv1.Job](t, jm)
		events := jm.hookEvents()
		first := "post-install" // the bundled database exists only once the release does
		if r.preInstall {
			first = "pre-install"
		}
		if !slices.Contains(events, first) || !slices.Contains(events, "pre-upgrade") {
			t.Fatalf("Job hook is %v, want %s and pre-upgrade", events, first)
		}
		if !strings.Contains(jm.Metadata.Annotations["helm.sh/hook-delete-policy"], "before-hook-creation") {
			t.Error("Job is not replaced on the next upgrade (hook-delete-policy before-hook-creation)")
		}
		ctr := job.Spec.Template.Spec.Containers[0]
		if !strings.Contains(ctr.Image, "/xiaoclaw:") || !slices.Equal(ctr.Args, []string{"migrate"}) {
			t.Errorf("Job runs %s %v, want the xiaoclaw image with `migrate`", ctr.Image, ctr.Args)
		}
		if !envNames(ctr)["XIAOCLAW_DATABASE_URL"] {
			t.Error("Job has no XIAOCLAW_DATABASE_URL")
		}
		if job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever || job.Spec.BackoffLimit == nil || job.Spec.ActiveDeadlineSeconds == nil {
			t.Error("Job must not restart in place and needs a backoff limit and a deadline")
		}

		for _, ref := range podRefs(job.Spec.Template.Spec) {
			dep, rendered := r.find(ref.kind, ref.name)
			if !rendered {
				// Created by the operator before the install, or by the bundled database.
				if !r.externalSecrets[ref.name] {
					t.Errorf("Job reads %s %s, which nothing provides", ref.kind, ref.name)
				}
				continue
			}
			depEvents := dep.hookEvents()
			for _, e := range events {
				if !slices.Contains(depEvents, e) {
					t.Errorf("Job (%s) reads %s, which is not created before it (hooks %v)", e, dep.id(), depEvents)
				}
			}
			if dep.hookWeight(t) >= jm.hookWeight(t) {
				t.Errorf("%s (weight %d) is not created before the Job (weight %d)", dep.id(), dep.hookWeight(t), jm.hookWeight(t))
			}
		}
		if sa := job.Spec.Template.Spec.ServiceAccountName; sa != "" {
			if m, ok := r.find("ServiceAccount", sa); ok && m.hookEvents() == nil {
				t.Errorf("Job runs as ServiceAccount %s, which is created only after pre-install hooks", sa)
			}
		}
	})
}

func TestServiceMonitor(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		monitors := r.all("ServiceMonitor")
		if r.name != "production" {
			if len(monitors) != 0 {
				t.Fatal("ServiceMonitor rendered although serviceMonitor.enabled is false")
			}
			return
		}
		if len(monitors) != 1 || monitors[0].APIVersion != "monitoring.coreos.com/v1" {
			t.Fatalf("want one monitoring.coreos.com/v1 ServiceMonitor, got %v", monitors)
		}
		var sm struct {
			Spec struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				Endpoints []struct {
					Port string `json:"port"`
					Path string `json:"path"`
				} `json:"endpoints"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(monitors[0].raw, &sm); err != nil {
			t.Fatal(err)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "ops" || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor endpoints %+v, want port ops path /metrics", sm.Spec.Endpoints)
		}
		var metrics *corev1.Service
		for _, s := range decodeAll[corev1.Service](t, r.all("Service")) {
			if selects(sm.Spec.Selector.MatchLabels, s.Labels) {
				if metrics != nil {
					t.Fatalf("ServiceMonitor selects both %s and %s", metrics.Name, s.Name)
				}
				metrics = s
			}
		}
		if metrics == nil {
			t.Fatal("ServiceMonitor selects no Service")
		}
		for c, d := range r.deployments(t) {
			if !selects(metrics.Spec.Selector, d.Spec.Template.Labels) {
				t.Errorf("metrics Service %s does not reach the %s pods", metrics.Name, c)
			}
		}
		for _, j := range decodeAll[batchv1.Job](t, r.all("Job")) {
			if selects(metrics.Spec.Selector, j.Spec.Template.Labels) {
				t.Errorf("metrics Service selects Job %s pods", j.Name)
			}
		}
	})
}

// TestGeneratedAdminToken: with no token given, the chart generates a long random one.
func TestGeneratedAdminToken(t *testing.T) {
	chart := stagedChart(t)
	r := renderScenario(t, chart, scenarios(t)[0])
	m, ok := r.find("Secret", releaseName+"-xiaoclaw")
	if !ok {
		t.Fatal("no chart Secret")
	}
	s := into[corev1.Secret](t, m)
	if len(s.Data["adminToken"]) < 32 {
		t.Errorf("generated admin token is %d bytes, want at least 32", len(s.Data["adminToken"]))
	}
	r2 := renderScenario(t, chart, scenario{name: "token", args: []string{"--set", "secrets.adminToken=given-token"}})
	m2, _ := r2.find("Secret", releaseName+"-xiaoclaw")
	if got := string(into[corev1.Secret](t, m2).Data["adminToken"]); got != "given-token" {
		t.Errorf("admin token %q, want the given one", got)
	}
}

// TestInvalidValuesAreRejected: mistakes fail at render time with a message naming the fix.
func TestInvalidValuesAreRejected(t *testing.T) {
	chart := stagedChart(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"misspelled key", []string{"--set", "gateway.replica=3"}, "replica"},
		{"unknown log level", []string{"--set", "log.level=verbose"}, "level"},
		{"no memory limit", []string{"--set", "shim.resources.limits=null"}, "limits"},
		{"bad service type", []string{"--set", "devicehub.service.type=External"}, "type"},
		{"bad public URL", []string{"--set", "devicehub.publicURL=http://x/"}, "publicURL"},
		{"no NATS", []string{"--set", "nats.enabled=false"}, "externalNats.url"},
		{"no database", []string{"--set", "postgresql.enabled=false"}, "externalDatabase.url"},
		{"no idempotency replica", []string{"--set", "gateway.idempotency.replicas=0"}, "replicas"},
		{"bad idempotency TTL", []string{"--set", "gateway.idempotency.ttl=forever"}, "ttl"},
		{"sampling ratio above 1", []string{"--set-string", "otel.samplerArg=1.5"}, "samplerArg"},
		{"sampling ratio below 0", []string{"--set", "otel.samplerArg=-0.1"}, "samplerArg"},
		{"unknown sampler", []string{"--set", "otel.sampler=jaeger_remote"}, "sampler"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, chart, tc.args...)
			if err == nil {
				t.Fatalf("helm template %v succeeded", tc.args)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not mention %q: %v", tc.want, err)
			}
		})
	}
}

// TestNotesTellHowToConnect renders NOTES.txt as `helm install` prints it.
func TestNotesTellHowToConnect(t *testing.T) {
	helm := tool(t, "HELM", "helm")
	chart := stagedChart(t)
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			args := append([]string{"install", releaseName, chart, "--namespace", namespace, "--dry-run=client", "--kubeconfig", filepath.Join(t.TempDir(), "none")}, sc.args...)
			out, err := run(t, helm, args...)
			if err != nil {
				t.Fatalf("helm install --dry-run: %v", err)
			}
			_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
			if !ok {
				t.Fatal("no NOTES in the install output")
			}
			for _, want := range []string{"xiaoclaw nodes list --url ws", "openclaw nodes list --url ws", "--token", "/xiaozhi/ota/", "get secret"} {
				if !strings.Contains(notes, want) {
					t.Errorf("NOTES lack %q:\n%s", want, notes)
				}
			}
		})
	}
}

type objectRef struct{ kind, name string }

// podRefs lists the Secrets and ConfigMaps a pod reads through env, envFrom and volumes.
func podRefs(spec corev1.PodSpec) []objectRef {
	var refs []objectRef
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef != nil {
				refs = append(refs, objectRef{"ConfigMap", from.ConfigMapRef.Name})
			}
			if from.SecretRef != nil {
				refs = append(refs, objectRef{"Secret", from.SecretRef.Name})
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if e.ValueFrom.SecretKeyRef != nil {
				refs = append(refs, objectRef{"Secret", e.ValueFrom.SecretKeyRef.Name})
			}
			if e.ValueFrom.ConfigMapKeyRef != nil {
				refs = append(refs, objectRef{"ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name})
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			refs = append(refs, objectRef{"Secret", v.Secret.SecretName})
		}
		if v.ConfigMap != nil {
			refs = append(refs, objectRef{"ConfigMap", v.ConfigMap.Name})
		}
	}
	return refs
}

// configFor returns the ConfigMap data a container gets through envFrom.
func (r rendering) configFor(t *testing.T, c corev1.Container) map[string]string {
	data := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			continue
		}
		if m, ok := r.find("ConfigMap", from.ConfigMapRef.Name); ok {
			for k, v := range into[corev1.ConfigMap](t, m).Data {
				data[k] = v
			}
		}
	}
	return data
}

func envNames(c corev1.Container) map[string]bool {
	names := map[string]bool{}
	for _, e := range c.Env {
		names[e.Name] = true
	}
	return names
}

func findEnv(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func namedPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// TestTraceSamplingDefault: the services (and the migrations Job) sample a tenth of the new traces by default
// (parentbased_traceidratio 0.1, following a caller's sampled traceparent), and one value
// changes the ratio.
func TestTraceSamplingDefault(t *testing.T) {
	samplers := func(r rendering) map[string]string {
		got := map[string]string{}
		for _, m := range decodeAll[corev1.ConfigMap](t, r.all("ConfigMap")) {
			if _, ok := m.Data["XIAOCLAW_LOG_LEVEL"]; ok {
				got[m.Data["OTEL_TRACES_SAMPLER"]+" "+m.Data["OTEL_TRACES_SAMPLER_ARG"]] = m.Name
			}
		}
		return got
	}
	forEachScenario(t, func(t *testing.T, r rendering) {
		if got := samplers(r); len(got) != 1 || got["parentbased_traceidratio 0.1"] == "" {
			t.Errorf("service ConfigMaps sample %v, want parentbased_traceidratio 0.1", got)
		}
	})
	chart := stagedChart(t)
	r := renderScenario(t, chart, scenario{name: "sample-half", args: []string{"--set", "otel.samplerArg=0.5"}})
	if got := samplers(r); len(got) != 1 || got["parentbased_traceidratio 0.5"] == "" {
		t.Errorf("with otel.samplerArg=0.5: %v", got)
	}
}

// TestShimsReachTheGateway: the shims run the stored upstreams, whose calls go through the
// gateway: they get its Service URL, the gateway admits them even when allowFrom restricts
// it, and with egress restricted they may reach its port.
func TestShimsReachTheGateway(t *testing.T) {
	chart := stagedChart(t)
	for _, sc := range scenarios(t) {
		sc.args = append(sc.args, "--set", "networkPolicy.egress.enabled=true",
			"--set", "gateway.allowFrom[0].namespaceSelector.matchLabels.team=ops")
		t.Run(sc.name, func(t *testing.T) {
			r := renderScenario(t, chart, sc)
			deps := r.deployments(t)
			shim, gw := deps["shim"], deps["gateway"]
			var port int32
			var svcName string
			for _, s := range decodeAll[corev1.Service](t, r.all("Service")) {
				if selects(s.Spec.Selector, gw.Spec.Template.Labels) && len(s.Spec.Ports) > 0 && s.Spec.ClusterIP != "None" {
					svcName, port = s.Name, s.Spec.Ports[0].Port
				}
			}
			want := fmt.Sprintf("ws://%s:%d", svcName, port)
			if got := r.configFor(t, shim.Spec.Template.Spec.Containers[0])["XIAOCLAW_GATEWAY_URL"]; svcName == "" || got != want {
				t.Fatalf("shim XIAOCLAW_GATEWAY_URL %q, want %q", got, want)
			}
			admitted, egress := false, false
			for _, p := range decodeAll[networkingv1.NetworkPolicy](t, r.all("NetworkPolicy")) {
				switch {
				case selects(p.Spec.PodSelector.MatchLabels, gw.Spec.Template.Labels):
					for _, rule := range p.Spec.Ingress {
						for _, from := range rule.From {
							if from.PodSelector != nil && selects(from.PodSelector.MatchLabels, shim.Spec.Template.Labels) {
								admitted = true
							}
						}
					}
				case selects(p.Spec.PodSelector.MatchLabels, shim.Spec.Template.Labels):
					for _, rule := range p.Spec.Egress {
						for _, pp := range rule.Ports {
							if pp.Port != nil && pp.Port.IntValue() == int(port) {
								egress = true
							}
						}
					}
				}
			}
			if !admitted || !egress {
				t.Fatalf("gateway admits the shims: %v; shims may reach port %d: %v", admitted, port, egress)
			}
		})
	}
}
