{{/*
scopeplane.name is the chart name, or nameOverride.
*/}}
{{- define "scopeplane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
scopeplane.fullname names the release's objects: fullnameOverride, or the release name
suffixed with the chart name unless it already contains it; at most 63 characters.
*/}}
{{- define "scopeplane.fullname" -}}
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
scopeplane.labels are the common labels of every object.
*/}}
{{- define "scopeplane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "scopeplane.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: scopeplane
{{- end }}

{{/*
scopeplane.selectorLabels select the release's pods; they never change after install.
*/}}
{{- define "scopeplane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scopeplane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
scopeplane.serviceAccountName is the ServiceAccount the pods run as.
*/}}
{{- define "scopeplane.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "scopeplane.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
scopeplane.xdsAddress is the host:port proxies dial, written into the bootstrap ConfigMaps:
xds.advertisedAddress, or the DNS name of the chart's Service.
*/}}
{{- define "scopeplane.xdsAddress" -}}
{{- if .Values.xds.advertisedAddress }}
{{- .Values.xds.advertisedAddress }}
{{- else }}
{{- printf "%s.%s.svc:%d" (include "scopeplane.fullname" .) .Release.Namespace (int .Values.service.xdsPort) }}
{{- end }}
{{- end }}

{{/*
scopeplane.leaderElect is "true" when the pods elect a leader: always with more than one
replica, and on request with one.
*/}}
{{- define "scopeplane.leaderElect" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}true{{ end }}
{{- end }}
