{{/*
The namespaces whose Services are never served (--excluded-namespaces, and the Service
webhook's namespaceSelector), comma-separated: the values', else the manager's default
with the release's namespace.
*/}}
{{- define "vitistack.excludedNamespaces" -}}
{{- if .Values.excludedNamespaces -}}
{{- join "," .Values.excludedNamespaces -}}
{{- else -}}
kube-system,kube-public,kube-node-lease,{{ .Release.Namespace }}
{{- end -}}
{{- end -}}
