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

{{/*
--ipam-api-url: required, with no default. The IPAM-API registers what it is sent
without authentication, so an install must name the IPAM-API it registers in: a trial
install is never one in the production address authority by accident.
*/}}
{{- define "vitistack.ipamAPIURL" -}}
{{- required "set ipamAPI.url to your IPAM-API's URL, e.g. https://ipam-api.example.org" .Values.ipamAPI.url -}}
{{- end -}}
