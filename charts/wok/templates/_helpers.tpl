{{- define "wok.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "wok.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "wok.labels" -}}
{{ include "wok.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "wok.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "wok.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* What the operator does in each namespace it watches: least privilege, verb by verb. */}}
{{- define "wok.workloadRules" -}}
- apiGroups: [wok.dev]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch, update]
- apiGroups: [wok.dev]
  resources: [inferenceservices/status]
  verbs: [get, patch, update]
- apiGroups: [wok.dev]
  resources: [inferenceservices/scale]
  verbs: [get]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, create, patch, update]
# The admin token: created once, read by the control loop; never listed or watched.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, create, patch]
{{- end -}}
