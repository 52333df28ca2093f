{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "refinery.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; every object is "<fullname>-<component>". */}}
{{- define "refinery.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "refinery.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Standard labels. Call with (dict "ctx" $ "component" "ingest"). */}}
{{- define "refinery.labels" -}}
helm.sh/chart: {{ include "refinery.chart" .ctx }}
{{ include "refinery.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: refinery
{{- end -}}

{{- define "refinery.selectorLabels" -}}
app.kubernetes.io/name: {{ include "refinery.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image of one service: (dict "ctx" $ "component" "ingest"). */}}
{{- define "refinery.image" -}}
{{- $img := .ctx.Values.image -}}
{{- $repo := printf "%s-%s" $img.repository .component -}}
{{- if $img.registry -}}{{- $repo = printf "%s/%s" $img.registry $repo -}}{{- end -}}
{{- printf "%s:%s" $repo (default .ctx.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/* Pod-level security context shared by every Refinery pod. */}}
{{- define "refinery.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.uid }}
runAsGroup: {{ .Values.securityContext.gid }}
fsGroup: {{ .Values.securityContext.gid }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security context shared by every container. */}}
{{- define "refinery.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Name of the Secret holding the PostgreSQL DSN, and its key. */}}
{{- define "refinery.pgSecretName" -}}
{{- if .Values.postgresql.existingSecret -}}
{{- .Values.postgresql.existingSecret -}}
{{- else -}}
{{- printf "%s-pg" (include "refinery.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "refinery.kafkaBootstrap" -}}
{{- if .Values.kafka.enabled -}}
{{- printf "%s-kafka:9092" (include "refinery.fullname" .) -}}
{{- else -}}
{{- required "kafka.bootstrap is required when kafka.enabled is false" .Values.kafka.bootstrap -}}
{{- end -}}
{{- end -}}

{{/* Environment shared by every service: Kafka, PostgreSQL, logging. */}}
{{- define "refinery.commonEnv" -}}
- name: KAFKA_BOOTSTRAP
  value: {{ include "refinery.kafkaBootstrap" . | quote }}
{{- if .Values.kafka.propertiesSecret.name }}
- name: KAFKA_PROPERTIES
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.propertiesSecret.name }}
      key: {{ .Values.kafka.propertiesSecret.key }}
{{- else if .Values.kafka.properties }}
- name: KAFKA_PROPERTIES
  value: {{ .Values.kafka.properties | quote }}
{{- end }}
- name: REFINERY_PG
  valueFrom:
    secretKeyRef:
      name: {{ include "refinery.pgSecretName" . }}
      key: {{ .Values.postgresql.secretKey }}
{{- range $k, $v := .Values.extraEnv }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* gRPC server env: listen on every interface, and TLS when tls.enabled. */}}
{{- define "refinery.grpcEnv" -}}
- name: REFINERY_LISTEN
  value: {{ printf "0.0.0.0:%v" .port | quote }}
{{- if .ctx.Values.tls.enabled }}
- name: REFINERY_TLS_CERT
  value: /etc/refinery/tls/tls.crt
- name: REFINERY_TLS_KEY
  value: /etc/refinery/tls/tls.key
{{- if .ctx.Values.tls.mutual }}
- name: REFINERY_TLS_CA
  value: /etc/refinery/tls/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{/* Volume mounts every Refinery container has: /tmp, TLS and Kafka CA when on. */}}
{{- define "refinery.commonMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: grpc-tls
  mountPath: /etc/refinery/tls
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.secretName }}
- name: kafka-tls
  mountPath: /etc/refinery/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "refinery.commonVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSize }}
{{- if .Values.tls.enabled }}
- name: grpc-tls
  secret:
    secretName: {{ required "tls.secretName is required when tls.enabled" .Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.kafka.tls.secretName }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/*
Liveness/readiness probes. Kubelet's native gRPC probe (grpc.health.v1) has no TLS,
so with tls.enabled the probes fall back to a TCP connect on the same port.
Call with (dict "ctx" $ "port" 7101 "probes" .Values.ingest.probes).
*/}}
{{- define "refinery.probes" -}}
{{- $p := .probes -}}
{{- range $kind := list "liveness" "readiness" }}
{{ $kind }}Probe:
{{- if $.ctx.Values.tls.enabled }}
  tcpSocket:
    port: {{ $.port }}
{{- else }}
  grpc:
    port: {{ $.port }}
{{- end }}
{{- $c := index $p $kind }}
  initialDelaySeconds: {{ $c.initialDelaySeconds }}
  periodSeconds: {{ $c.periodSeconds }}
  timeoutSeconds: {{ $c.timeoutSeconds }}
  failureThreshold: {{ $c.failureThreshold }}
{{- end }}
{{- end -}}

{{/* Metrics (metrics.enabled): the env, the container port and the pod annotations. */}}
{{- define "refinery.metricsEnv" -}}
{{- if .Values.metrics.enabled }}
- name: REFINERY_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%v" .Values.metrics.port | quote }}
{{- else }}
- name: REFINERY_METRICS_LISTEN
  value: "0"
{{- end }}
{{- end -}}

{{- define "refinery.metricsPort" -}}
{{- if .Values.metrics.enabled }}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
  protocol: TCP
{{- end }}
{{- end -}}

{{- define "refinery.metricsAnnotations" -}}
{{- if and .Values.metrics.enabled .Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* NetworkPolicy rule for the metrics port: from metrics.scrapeFrom, or any source. */}}
{{- define "refinery.metricsIngress" -}}
{{- if .Values.metrics.enabled }}
- ports:
    - port: {{ .Values.metrics.port }}
      protocol: TCP
  {{- with .Values.metrics.scrapeFrom }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}
