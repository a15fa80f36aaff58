{{/*
What the schema cannot say: combinations. Each a one-line failure naming the values.
*/}}
{{- define "kstall.validate" -}}
{{- if and .Values.nonRoot .Values.kernelsBefore511 -}}
{{- fail "nonRoot and kernelsBefore511: a file capability set cannot carry SYS_RESOURCE to a node whose bounding set may lack it; run as root (nonRoot: false) on kernels before 5.11" -}}
{{- end -}}
{{- if and .Values.nonRoot .Values.podRules -}}
{{- fail "nonRoot and podRules: the binary's file capabilities carry neither SYS_ADMIN nor NET_ADMIN, and a non-root agent's iptables-save would lose them on exec; run as root (nonRoot: false) to read pods' NAT rules" -}}
{{- end -}}
{{- if and .Values.nonRoot .Values.capture.enabled -}}
{{- fail "nonRoot and capture.enabled: the binary's file capabilities carry none of SYS_ADMIN, NET_ADMIN and NET_RAW; run as root (nonRoot: false) to capture" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}
{{- fail "serviceMonitor.enabled and podMonitor.enabled: both would scrape every agent, twice; enable one" -}}
{{- end -}}
{{- if and (eq .Values.seccompProfile.type "Localhost") (not .Values.seccompProfile.localhostProfile) -}}
{{- fail "seccompProfile.type Localhost needs seccompProfile.localhostProfile (the profile's path under the kubelet's seccomp directory)" -}}
{{- end -}}
{{- if and (ne .Values.seccompProfile.type "Localhost") .Values.seccompProfile.localhostProfile -}}
{{- fail (printf "seccompProfile.localhostProfile is for type Localhost, not %s" .Values.seccompProfile.type) -}}
{{- end -}}
{{- if and .Values.metrics.webConfig.tls (not .Values.metrics.webConfig.secretName) -}}
{{- fail "metrics.webConfig.tls needs metrics.webConfig.secretName (the Secret with the web configuration and its certificate)" -}}
{{- end -}}
{{- $am := .Values.alertmanager -}}
{{- if and (not $am.urls) (or $am.caSecret.name $am.bearerTokenSecret.name $am.basicAuth.user $am.basicAuth.passwordSecret.name) -}}
{{- fail "alertmanager: credentials or a CA without alertmanager.urls" -}}
{{- end -}}
{{- if ne (not $am.basicAuth.user) (not $am.basicAuth.passwordSecret.name) -}}
{{- fail "alertmanager.basicAuth needs both user and passwordSecret.name" -}}
{{- end -}}
{{- if and $am.bearerTokenSecret.name $am.basicAuth.user -}}
{{- fail "alertmanager: a bearer token or basic auth, not both" -}}
{{- end -}}
{{- if and .Values.exportOtlp.headersSecret.name (not .Values.exportOtlp.enabled) -}}
{{- fail "exportOtlp.headersSecret without exportOtlp.enabled" -}}
{{- end -}}
{{- end -}}
