{{/* The chart name, or nameOverride. */}}
{{- define "streamapp-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: <release>-<chart>, or the release name alone when it already
contains the chart name. 63 characters at most (a DNS label, as Service names must be).
*/}}
{{- define "streamapp-operator.fullname" -}}
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

{{/*
Name of cluster-scoped objects (ClusterRoles, ClusterRoleBindings): the full name plus the
release namespace, so that releases of the same name in two namespaces do not collide.
*/}}
{{- define "streamapp-operator.clusterName" -}}
{{- printf "%s-%s" (include "streamapp-operator.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "streamapp-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "streamapp-operator.labels" -}}
helm.sh/chart: {{ include "streamapp-operator.chart" . }}
{{ include "streamapp-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: streamapp
{{- end }}

{{/* Labels that select the operator's pods (never change them: Deployment selectors are immutable). */}}
{{- define "streamapp-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamapp-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "streamapp-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "streamapp-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "streamapp-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
