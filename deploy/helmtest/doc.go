// Package helmtest checks the xiaoclaw Helm chart and container images: it lints and renders
// the chart with helm, validates every rendered object against strict offline Kubernetes
// schemas with kubeconform, asserts what a production install needs, and lints the
// Dockerfiles. The tools come from deploy/scripts/helm-tools.sh (make helm-tools).
package helmtest
