{{/* The release's base name: the release name, with "-outbox" unless it already says so. */}}
{{- define "outbox.fullname" -}}
{{- if contains "outbox" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-outbox" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "outbox.selectorLabels" -}}
app.kubernetes.io/name: outbox
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox.labels" -}}
{{ include "outbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "outbox.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
What the restricted Pod Security Standard asks of a pod: non-root, seccomp RuntimeDefault; no
service-account token (the processes never call the Kubernetes API).
*/}}
{{- define "outbox.podSecurity" -}}
automountServiceAccountToken: false
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
securityContext:
  runAsNonRoot: true
  {{- if not (kindIs "invalid" .Values.runAsUser) }}
  runAsUser: {{ .Values.runAsUser }}
  runAsGroup: {{ .Values.runAsUser }}
  fsGroup: {{ .Values.runAsUser }}
  {{- end }}
  seccompProfile:
    type: RuntimeDefault
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* And of each container: no privilege escalation, no capability, a read-only root. */}}
{{- define "outbox.containerSecurity" -}}
securityContext:
  runAsNonRoot: true
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  privileged: false
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/*
The environment every process shares: the database from the Secret, Kafka, the schema, logs,
traces. Arguments: a dict with "ctx" (the root context) and "service" (OTEL_SERVICE_NAME).
*/}}
{{- define "outbox.env" -}}
{{- $v := .ctx.Values -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $v.existingSecret.name }}
      key: {{ $v.existingSecret.databaseUrlKey }}
- name: OUTBOX_SCHEMA
  value: {{ $v.schema | quote }}
{{- if $v.relay.tenants.enabled }}
{{- range $name, $key := $v.relay.tenants.databases }}
- name: OUTBOX_DATABASE_{{ upper $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $v.existingSecret.name }}
      key: {{ $key }}
{{- end }}
{{- end }}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ $v.kafka.bootstrapServers | quote }}
{{- if $v.existingSecret.kafkaPropertiesKey }}
- name: OUTBOX_KAFKA_PROPERTIES_FILE
  value: /etc/outbox/kafka/{{ $v.existingSecret.kafkaPropertiesKey }}
{{- end }}
{{- if $v.schemaRegistry.url }}
- name: SCHEMA_REGISTRY_URL
  value: {{ $v.schemaRegistry.url | quote }}
{{- end }}
- name: RUST_LOG
  value: {{ $v.logLevel | quote }}
{{- if $v.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $v.tracing.otlpEndpoint | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $v.tracing.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $v.tracing.samplerArg | quote }}
{{- $attrs := printf "k8s.namespace.name=%s" .ctx.Release.Namespace }}
{{- if $v.tracing.resourceAttributes }}
{{- $attrs = printf "%s,%s" $attrs $v.tracing.resourceAttributes }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ $attrs | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* `-X name=value` for each non-secret Kafka property. */}}
{{- define "outbox.kafkaArgs" -}}
{{- range $k, $val := .Values.kafka.properties }}
- -X
- {{ printf "%s=%v" $k $val | quote }}
{{- end }}
{{- end -}}

{{/* Volumes: /tmp (the root is read-only), the topics file, the Kafka properties file. */}}
{{- define "outbox.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .ctx.Values.topics }}
- name: topics
  configMap:
    name: {{ .topics }}
{{- end }}
{{- if .ctx.Values.existingSecret.kafkaPropertiesKey }}
- name: kafka
  secret:
    secretName: {{ .ctx.Values.existingSecret.name }}
    defaultMode: 0400
    items:
      - key: {{ .ctx.Values.existingSecret.kafkaPropertiesKey }}
        path: {{ .ctx.Values.existingSecret.kafkaPropertiesKey }}
{{- end }}
{{- end -}}

{{- define "outbox.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.topics }}
- name: topics
  mountPath: /etc/outbox/topics
  readOnly: true
{{- end }}
{{- if .Values.existingSecret.kafkaPropertiesKey }}
- name: kafka
  mountPath: /etc/outbox/kafka
  readOnly: true
{{- end }}
{{- end -}}

{{/*
Probes on a process's own port: liveness asks only whether its loops are alive (/healthz never
looks at Postgres or Kafka, so an outage is not a restart storm); readiness whether it can do
its job now (/readyz); the startup probe gives a first connection time before liveness counts.
*/}}
{{- define "outbox.probes" -}}
startupProbe:
  httpGet: { path: /healthz, port: {{ . }} }
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet: { path: /healthz, port: {{ . }} }
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: { path: /readyz, port: {{ . }} }
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* The values no schema can express, refused with the key to change. */}}
{{- define "outbox.check" -}}
{{- $v := .Values -}}
{{- $slots := ternary 4 64 $v.relay.exactlyOnce -}}
{{- $what := ternary "the 4 exactly-once slots" "the 64 ordering lanes" $v.relay.exactlyOnce -}}
{{- if gt (int $v.relay.replicas) $slots -}}
{{- fail (printf "relay.replicas: %d relays would share %s: at most %d do work, the rest idle" (int $v.relay.replicas) $what $slots) -}}
{{- end -}}
{{- if and $v.autoscaling.relay.enabled (gt (int $v.autoscaling.relay.maxReplicas) $slots) -}}
{{- fail (printf "autoscaling.relay.maxReplicas: %d is above %s (at most %d)" (int $v.autoscaling.relay.maxReplicas) $what $slots) -}}
{{- end -}}
{{- if and $v.autoscaling.relay.enabled (gt (int $v.autoscaling.relay.minReplicas) (int $v.autoscaling.relay.maxReplicas)) -}}
{{- fail "autoscaling.relay.minReplicas: above autoscaling.relay.maxReplicas" -}}
{{- end -}}
{{- if and $v.autoscaling.relay.enabled (not $v.autoscaling.relay.prometheusServer) -}}
{{- fail "autoscaling.relay.prometheusServer: the relay scales on a metric Prometheus holds; name that Prometheus" -}}
{{- end -}}
{{- range $i, $c := $v.autoscaling.consumers -}}
{{- if gt (int $c.maxReplicas) (int $c.partitions) -}}
{{- fail (printf "autoscaling.consumers[%d].maxReplicas: %d consumers of %s would share %d partitions: the rest idle" $i (int $c.maxReplicas) $c.topic (int $c.partitions)) -}}
{{- end -}}
{{- if gt (int ($c.minReplicas | default 1)) (int $c.maxReplicas) -}}
{{- fail (printf "autoscaling.consumers[%d].minReplicas: above its maxReplicas" $i) -}}
{{- end -}}
{{- end -}}
{{- if le (int $v.relay.terminationGracePeriodSeconds) (add (int $v.relay.shutdownTimeoutSeconds) 9) -}}
{{- fail (printf "relay.terminationGracePeriodSeconds: %d must exceed relay.shutdownTimeoutSeconds (%d) by 10 s, or the kubelet kills the relay mid-flush" (int $v.relay.terminationGracePeriodSeconds) (int $v.relay.shutdownTimeoutSeconds)) -}}
{{- end -}}
{{- if and $v.archiver.enabled (not $v.topics) -}}
{{- fail "topics: the archiver reads the dead-letter topics from the topics file; set topics or archiver.enabled=false" -}}
{{- end -}}
{{- if and $v.hooks.topicsApply.enabled (not $v.topics) -}}
{{- fail "topics: hooks.topicsApply needs the topics file; set topics or hooks.topicsApply.enabled=false" -}}
{{- end -}}
{{- end -}}
