{{/* Names, labels and the pieces every role shares. */}}

{{- define "shoal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* shoal.labels: dict "ctx" $ "component" "master" */}}
{{- define "shoal.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "shoal.selectorLabels" . }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shoal.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "shoal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "shoal.masterService" -}}
{{- printf "%s-master" (include "shoal.fullname" .) }}
{{- end }}

{{/* The master's URL; with a standby, both masters' (the active one and its standby,
each by its stable name on the headless Service): every shoal process moves to the
standby once the active one refuses connections. */}}
{{- define "shoal.masterURL" -}}
{{- $svc := include "shoal.masterService" . }}
{{- $port := int .Values.master.port }}
{{- if .Values.master.standby.enabled }}
{{- $ns := .Release.Namespace }}
{{- printf "http://%s-0.%s-headless.%s.svc:%d,http://%s-1.%s-headless.%s.svc:%d" $svc $svc $ns $port $svc $svc $ns $port }}
{{- else }}
{{- printf "http://%s.%s.svc:%d" $svc .Release.Namespace $port }}
{{- end }}
{{- end }}

{{- define "shoal.authSecret" -}}
{{- if .Values.auth.create }}{{ printf "%s-auth" (include "shoal.fullname" .) }}{{ else }}{{ .Values.auth.existingSecret }}{{ end }}
{{- end }}

{{- define "shoal.tlsSecret" -}}
{{- if .Values.tls.existingSecret }}{{ .Values.tls.existingSecret }}{{ else }}{{ printf "%s-tls" (include "shoal.fullname" .) }}{{ end }}
{{- end }}

{{- define "shoal.webhookSecret" -}}
{{- if eq .Values.operator.webhook.certificate "existing" }}{{ .Values.operator.webhook.existingSecret }}{{ else }}{{ printf "%s-webhook-tls" (include "shoal.fullname" .) }}{{ end }}
{{- end }}

{{/* Environment every shoal process gets: master URL, node identity, token, TLS files. */}}
{{- define "shoal.commonEnv" -}}
- name: SHOAL_MASTER
  value: {{ include "shoal.masterURL" . | quote }}
- name: SHOAL_NODE
  valueFrom:
    fieldRef: {fieldPath: spec.nodeName}
- name: SHOAL_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "shoal.authSecret" . }}
      key: {{ .Values.auth.secretKey }}
{{- if .Values.tls.enabled }}
- name: SHOAL_TLS_CERT_FILE
  value: /etc/shoal/tls/tls.crt
- name: SHOAL_TLS_KEY_FILE
  value: /etc/shoal/tls/tls.key
- name: SHOAL_TLS_CA_FILE
  value: /etc/shoal/tls/ca.crt
{{- end }}
{{- end }}

{{- define "shoal.ufsEnvFrom" -}}
{{- range .Values.ufsCredentials.existingSecrets }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end }}

{{- define "shoal.tlsVolumeMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/shoal/tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "shoal.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "shoal.tlsSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* The under-storage credential Secrets as files: /etc/shoal/secrets/<name>/<key>. */}}
{{- define "shoal.secretFileMounts" -}}
{{- range .Values.ufsCredentials.secretFiles }}
- name: ufs-{{ . }}
  mountPath: /etc/shoal/secrets/{{ . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "shoal.secretFileVolumes" -}}
{{- range .Values.ufsCredentials.secretFiles }}
- name: ufs-{{ . }}
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* Non-root pod and container security for the roles that allow it. */}}
{{- define "shoal.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "shoal.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end }}

{{/* A worker tier as shoal's --tier flag: NAME:PATH:SIZE[:HIGH:LOW]. */}}
{{- define "shoal.tierFlag" -}}
{{- $path := printf "/var/lib/shoal/tiers/%s" .name }}
{{- $flag := printf "%s:%s:%s" .name $path .quota }}
{{- $high := default 0.95 .highWatermark | float64 }}
{{- $low := default 0.8 .lowWatermark | float64 }}
{{- if or (ne $high 0.95) (ne $low 0.8) }}
{{- $flag = printf "%s:%v:%v" $flag $high $low }}
{{- end }}
{{- $flag }}
{{- end }}

{{/* Checks a JSON schema cannot express; each fails with one readable line. */}}
{{- define "shoal.validate" -}}
{{- if and (not .Values.auth.create) (not .Values.auth.existingSecret) }}
{{- fail "auth: set auth.existingSecret when auth.create is false" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) (not .Values.tls.certManager.enabled) }}
{{- fail "tls: tls.enabled needs tls.existingSecret or tls.certManager.enabled" }}
{{- end }}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) }}
{{- fail "tls.certManager: set tls.certManager.issuerRef.name" }}
{{- end }}
{{- if and .Values.operator.enabled .Values.operator.webhook.enabled }}
{{- $mode := .Values.operator.webhook.certificate }}
{{- if and (eq $mode "existing") (or (not .Values.operator.webhook.existingSecret) (not .Values.operator.webhook.caBundle)) }}
{{- fail "operator.webhook: certificate existing needs existingSecret and caBundle" }}
{{- end }}
{{- if and (eq $mode "cert-manager") (not .Values.tls.certManager.issuerRef.name) }}
{{- fail "operator.webhook: certificate cert-manager needs tls.certManager.issuerRef.name" }}
{{- end }}
{{- end }}
{{- if .Values.worker.enabled }}
{{- $seen := dict }}
{{- range $i, $t := .Values.worker.tiers }}
{{- if hasKey $seen $t.name }}
{{- fail (printf "worker.tiers[%d]: tier %s is given twice; each tier may be given once" $i $t.name) }}
{{- end }}
{{- $_ := set $seen $t.name true }}
{{- if and (eq $t.medium "hostPath") (not $t.path) }}
{{- fail (printf "worker.tiers[%d] (%s): medium hostPath needs a path" $i $t.name) }}
{{- end }}
{{- if and (ne $t.medium "hostPath") $t.path }}
{{- fail (printf "worker.tiers[%d] (%s): path is only for medium hostPath" $i $t.name) }}
{{- end }}
{{- $high := default 0.95 $t.highWatermark | float64 }}
{{- $low := default 0.8 $t.lowWatermark | float64 }}
{{- if not (lt $low $high) }}
{{- fail (printf "worker.tiers[%d] (%s): lowWatermark %v must be below highWatermark %v" $i $t.name $low $high) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
