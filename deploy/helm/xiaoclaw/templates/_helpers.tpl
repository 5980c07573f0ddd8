{{/* Names, labels and the pod pieces every xiaoclaw workload shares. */}}

{{- define "xiaoclaw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects; components append -gateway, -shim, ... */}}
{{- define "xiaoclaw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "xiaoclaw.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. Call with (dict "ctx" $ "component" "gateway"). */}}
{{- define "xiaoclaw.labels" -}}
helm.sh/chart: {{ include "xiaoclaw.chart" .ctx }}
{{ include "xiaoclaw.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: xiaoclaw
{{- end -}}

{{- define "xiaoclaw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "xiaoclaw.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "xiaoclaw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "xiaoclaw.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Image of a component: (dict "ctx" $ "component" "gateway" "repository" .Values.gateway.image.repository). */}}
{{- define "xiaoclaw.image" -}}
{{- $repo := .repository | default (printf "%s/%s" .ctx.Values.image.registry .component) -}}
{{- printf "%s:%s" $repo (.ctx.Values.image.tag | default .ctx.Chart.AppVersion) -}}
{{- end -}}

{{/* Name of the Secret holding adminToken and databaseURL. */}}
{{- define "xiaoclaw.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "xiaoclaw.fullname" .) -}}
{{- end -}}

{{/* Whether the chart itself creates that Secret. */}}
{{- define "xiaoclaw.createSecret" -}}
{{- if not .Values.secrets.existingSecret }}true{{ end -}}
{{- end -}}

{{/* Service name of the bundled NATS, following the nats chart's own naming. */}}
{{- define "xiaoclaw.nats.fullname" -}}
{{- if .Values.nats.fullnameOverride -}}
{{- .Values.nats.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "nats" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-nats" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Service and Secret name of the bundled PostgreSQL, following the postgresql chart's naming. */}}
{{- define "xiaoclaw.postgresql.fullname" -}}
{{- if .Values.postgresql.fullnameOverride -}}
{{- .Values.postgresql.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "postgresql" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-postgresql" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* NATS URL when it is plain configuration (not in a Secret). */}}
{{- define "xiaoclaw.natsURL" -}}
{{- if .Values.nats.enabled -}}
{{- printf "nats://%s.%s.svc:4222" (include "xiaoclaw.nats.fullname" .) .Release.Namespace -}}
{{- else if .Values.externalNats.url -}}
{{- .Values.externalNats.url -}}
{{- else if not .Values.externalNats.existingSecret -}}
{{- fail "NATS: set externalNats.url (or externalNats.existingSecret), or nats.enabled=true for the bundled chart" -}}
{{- end -}}
{{- end -}}

{{/* Fails early when no database is configured. */}}
{{- define "xiaoclaw.checkDatabase" -}}
{{- if and (not .Values.postgresql.enabled) (not .Values.secrets.existingSecret) (not .Values.externalDatabase.url) -}}
{{- fail "PostgreSQL: set externalDatabase.url (or secrets.existingSecret with a databaseURL key), or postgresql.enabled=true for the bundled chart" -}}
{{- end -}}
{{- end -}}

{{/* Database URL of the bundled PostgreSQL; the password comes from PGPASSWORD. */}}
{{- define "xiaoclaw.bundledDatabaseURL" -}}
{{- printf "postgres://%s@%s.%s.svc:5432/%s?sslmode=disable" .Values.postgresql.auth.username (include "xiaoclaw.postgresql.fullname" .) .Release.Namespace .Values.postgresql.auth.database -}}
{{- end -}}

{{/*
Env entries giving a container the database: XIAOCLAW_DATABASE_URL, plus PGPASSWORD from the
bundled chart's Secret (pgx reads it when the URL has no password).
(dict "ctx" $ "secretName" NAME): NAME overrides the Secret holding databaseURL.
*/}}
{{- define "xiaoclaw.databaseEnv" -}}
{{- $ctx := .ctx -}}
{{- if $ctx.Values.postgresql.enabled }}
- name: XIAOCLAW_DATABASE_URL
  value: {{ include "xiaoclaw.bundledDatabaseURL" $ctx | quote }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $ctx.Values.postgresql.auth.existingSecret | default (include "xiaoclaw.postgresql.fullname" $ctx) }}
      key: {{ dig "secretKeys" "userPasswordKey" "password" ($ctx.Values.postgresql.auth | default dict) }}
{{- else }}
- name: XIAOCLAW_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .secretName | default (include "xiaoclaw.secretName" $ctx) }}
      key: {{ $ctx.Values.secrets.keys.databaseURL }}
{{- end }}
{{- end -}}

{{/* Env every service container gets: its instance name, NATS and tracing. (dict "ctx" $ "component" NAME) */}}
{{- define "xiaoclaw.commonEnv" -}}
{{- $ctx := .ctx -}}
- name: XIAOCLAW_INSTANCE
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: OTEL_SERVICE_NAME
  value: {{ printf "xiaoclaw-%s" .component | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.pod.name=$(XIAOCLAW_INSTANCE),k8s.namespace.name=$(POD_NAMESPACE),service.namespace=%s%s" $ctx.Release.Namespace (ternary (printf ",%s" $ctx.Values.otel.resourceAttributes) "" (ne $ctx.Values.otel.resourceAttributes "")) | quote }}
{{- if $ctx.Values.natsAuth.enabled }}
- name: XIAOCLAW_NATS_USER
  value: {{ .component | quote }}
- name: XIAOCLAW_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $ctx.Values.natsAuth.secretName }}
      key: {{ .component }}
{{- end }}
{{- if and (not $ctx.Values.nats.enabled) $ctx.Values.externalNats.existingSecret }}
- name: XIAOCLAW_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $ctx.Values.externalNats.existingSecret }}
      key: {{ $ctx.Values.externalNats.existingSecretKey }}
{{- end }}
{{- end -}}

{{/* ConfigMap data every service shares (non-secret only). */}}
{{- define "xiaoclaw.commonConfig" -}}
{{- $nats := include "xiaoclaw.natsURL" . -}}
{{- if $nats }}
XIAOCLAW_NATS_URL: {{ $nats | quote }}
{{- end }}
XIAOCLAW_OPS_ADDR: {{ printf ":%d" (int .Values.ops.port) | quote }}
XIAOCLAW_LOG_LEVEL: {{ .Values.log.level | quote }}
XIAOCLAW_LOG_FORMAT: {{ .Values.log.format | quote }}
{{- if .Values.otel.endpoint }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ .Values.otel.endpoint | quote }}
OTEL_EXPORTER_OTLP_PROTOCOL: {{ .Values.otel.protocol | quote }}
{{- end }}
OTEL_TRACES_SAMPLER: {{ .Values.otel.sampler | quote }}
OTEL_TRACES_SAMPLER_ARG: {{ .Values.otel.samplerArg | quote }}
{{- end -}}

{{- define "xiaoclaw.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "xiaoclaw.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Liveness on /healthz and readiness on /readyz of the ops port. */}}
{{- define "xiaoclaw.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: ops
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet:
    path: /healthz
    port: ops
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: ops
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* Pod-level scheduling and security shared by the Deployments. (dict "ctx" $ "component" NAME "values" .Values.<component>) */}}
{{- define "xiaoclaw.podSpecCommon" -}}
{{- $ctx := .ctx -}}
serviceAccountName: {{ include "xiaoclaw.serviceAccountName" $ctx }}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  {{- include "xiaoclaw.podSecurityContext" $ctx | nindent 2 }}
terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
{{- with $ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $ctx.Values.topologySpread.enabled }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: {{ $ctx.Values.topologySpread.topologyKey }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "xiaoclaw.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 8 }}
{{- end }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: 64Mi
{{- end -}}

{{/* preStop sleep that keeps a terminating pod serving until it has left the endpoints. */}}
{{- define "xiaoclaw.lifecycle" -}}
{{- if gt (int .preStopSleepSeconds) 0 }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ .preStopSleepSeconds }}
{{- end }}
{{- end -}}
