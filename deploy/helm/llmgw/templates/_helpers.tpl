{{/* The release's name for this chart's objects: <release>-llmgw, or the release name when it holds "llmgw". */}}
{{- define "llmgw.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "llmgw.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: control-plane
{{- end -}}

{{- define "llmgw.labels" -}}
{{ include "llmgw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "llmgw.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the deploy key, or "" without one. */}}
{{- define "llmgw.deployKeySecret" -}}
{{- if .Values.settings.deployKey.existingSecret -}}
{{- .Values.settings.deployKey.existingSecret -}}
{{- else if .Values.settings.deployKey.privateKey -}}
{{- printf "%s-deploy-key" (include "llmgw.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The names in the certificates of the agents' and admin listeners (`--tls-hostname`): the agents' and admin
Services in each form a pod dials, then tls.extraHostnames. */}}
{{- define "llmgw.tlsHostnames" -}}
{{- $names := list -}}
{{- range $listener := list "agents" "admin" -}}
{{- $svc := printf "%s-%s" (include "llmgw.fullname" $) $listener -}}
{{- $names = concat $names (list $svc (printf "%s.%s" $svc $.Release.Namespace) (printf "%s.%s.svc" $svc $.Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc $.Release.Namespace)) -}}
{{- end -}}
{{- concat $names .Values.tls.extraHostnames | uniq | toJson -}}
{{- end -}}

{{/* Refusals: settings that cannot work, said before anything is applied. */}}
{{- define "llmgw.check" -}}
{{- if not .Values.settings.repo -}}
{{- fail "settings.repo is required: the URL of the settings repository (ssh://git@host/path.git or https://...)" -}}
{{- end -}}
{{- if and (include "llmgw.deployKeySecret" .) (not .Values.settings.knownHosts) -}}
{{- fail "settings.knownHosts is required with a deploy key: the git server's lines of ~/.ssh/known_hosts (ssh-keyscan HOST, compared with its published keys)" -}}
{{- end -}}
{{- if and (include "llmgw.deployKeySecret" .) (not (or (hasPrefix "ssh://" .Values.settings.repo) (regexMatch "^[^/:]+@[^/:]+:" .Values.settings.repo))) -}}
{{- fail (printf "settings.deployKey is for an ssh settings.repo (ssh://user@host/path or user@host:path), not %s" .Values.settings.repo) -}}
{{- end -}}
{{- if not (or .Values.tls.enabled .Values.insecure) -}}
{{- fail "tls.enabled is false: llmgw server refuses agents (and an admin API without admin.tlsSecret) in plain text on the pod's address; keep tls.enabled, or set insecure: true if every machine that reaches the pod is trusted" -}}
{{- end -}}
{{- if not (has .Values.store.kind (list "sqlite" "postgresql")) -}}
{{- fail (printf "store.kind %q: give sqlite or postgresql" .Values.store.kind) -}}
{{- end -}}
{{- if and (eq .Values.store.kind "postgresql") (not .Values.store.postgresql.existingSecret) -}}
{{- fail "store.postgresql.existingSecret is required with store.kind postgresql: a Secret holding the URL postgresql://user:password@host:5432/database" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.serviceMonitor.tokenSecret.name) -}}
{{- fail "serviceMonitor.tokenSecret.name is required: /metrics needs a token (llmgw token create --scope metrics, stored in a Secret)" -}}
{{- end -}}
{{- end -}}
