{{/*
The objects' name: the release's when it has "kstall" in it (`helm install kstall` makes the
kustomize packages' names), else "<release>-kstall"; fullnameOverride wins.
*/}}
{{- define "kstall.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "kstall" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kstall" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The one label every object carries, as the kustomize packages do. The selector is this label:
kubectl kstall finds the agents by it, and the ServiceMonitor's job (jobLabel) is its value,
"kstall", which the KstallAgentDown rule expects.
*/}}
{{- define "kstall.labels" -}}
app.kubernetes.io/name: kstall
{{- end -}}

{{- define "kstall.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* http or https: how /metrics and /healthz are served (metrics.webConfig.tls). */}}
{{- define "kstall.scheme" -}}
{{- if and .Values.metrics.webConfig.secretName .Values.metrics.webConfig.tls -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/*
The agent's configuration file (config) as TOML: one `key = value` line per setting, sorted;
strings and list items as JSON strings (TOML's basic strings take JSON's escapes), whole numbers
without a fraction (YAML numbers arrive as floats), and booleans as "on" and "off": the agent's
switches are on|off, and YAML reads an unquoted on/off as a boolean.
*/}}
{{- define "kstall.toml.value" -}}
{{- if kindIs "string" . -}}
{{- toJson . -}}
{{- else if kindIs "bool" . -}}
{{- ternary "on" "off" . | toJson -}}
{{- else if and (kindIs "float64" .) (eq (float64 .) (floor .)) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{- define "kstall.config.toml" -}}
# kstall agent's settings (kstall agent --help): from the chart's `config` value.
{{- range $key := keys .Values.config | sortAlpha }}
{{- $value := get $.Values.config $key }}
{{- if kindIs "slice" $value }}
{{ $key }} = [{{ range $i, $item := $value }}{{ if $i }}, {{ end }}{{ include "kstall.toml.value" $item }}{{ end }}]
{{- else }}
{{ $key }} = {{ include "kstall.toml.value" $value }}
{{- end }}
{{- end }}
{{ end -}}

{{/* A secret's key mounted as a file for the agent: its volume. */}}
{{- define "kstall.secretVolume" -}}
- name: {{ .volume }}
  secret:
    secretName: {{ .secret.name }}
    items: [{key: {{ .secret.key | quote }}, path: {{ .secret.key | quote }}}]
{{- end -}}
