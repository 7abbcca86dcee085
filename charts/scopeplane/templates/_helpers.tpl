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
scopeplane.xdsAddress is what the pods are told proxies dial (--xds-server-address), written
into the bootstrap ConfigMaps: xds.advertisedAddress, or the DNS name and xDS port of the
chart's Service; with shards, that of every slot's Service, slot 0 first, comma-separated.
*/}}
{{- define "scopeplane.xdsAddress" -}}
{{- $shards := int (include "scopeplane.shards" .) }}
{{- if and .Values.xds.advertisedAddress (gt $shards 1) }}
{{- fail (printf "xds.advertisedAddress cannot be set with sharding.shards=%d: one address cannot name %d shards, and each slot is reached at its own Service; leave it empty" $shards $shards) }}
{{- else if .Values.xds.advertisedAddress }}
{{- .Values.xds.advertisedAddress }}
{{- else if eq $shards 1 }}
{{- printf "%s.%s.svc:%d" (include "scopeplane.fullname" .) .Release.Namespace (int .Values.service.xdsPort) }}
{{- else }}
{{- $addresses := list }}
{{- range $slot := until (int (include "scopeplane.slots" .)) }}
{{- $addresses = append $addresses (include "scopeplane.slotXdsAddress" (list $ $slot)) }}
{{- end }}
{{- join "," $addresses }}
{{- end }}
{{- end }}

{{/*
scopeplane.leaderElect is "true" when the pods elect a leader: always with more than one
replica or more than one shard (each shard elects its own), and on request with one.
*/}}
{{- define "scopeplane.leaderElect" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) (gt (int (include "scopeplane.shards" .)) 1) }}true{{ end }}
{{- end }}

{{/*
scopeplane.shards is the number of shards the replicas are divided into: sharding.shards,
at least 1.
*/}}
{{- define "scopeplane.shards" -}}
{{- max 1 (int .Values.sharding.shards) }}
{{- end }}

{{/*
scopeplane.slots is the number of slots the scopes hash to with more than one shard:
sharding.slots, at least sharding.shards.
*/}}
{{- define "scopeplane.slots" -}}
{{- $shards := int (include "scopeplane.shards" .) }}
{{- $slots := int .Values.sharding.slots }}
{{- if lt $slots $shards }}
{{- fail (printf "sharding.slots=%d is fewer than sharding.shards=%d: each shard serves at least one slot; raise sharding.slots (a multiple of the shard count spreads the scopes evenly)" $slots $shards) }}
{{- end }}
{{- $slots }}
{{- end }}

{{/*
scopeplane.shardName names shard K's Deployment, Service and PodDisruptionBudget, given
(list $ K): the full name with one shard; <fullname>-shard-K with more, the full name
shortened so that the whole fits in 63 characters.
*/}}
{{- define "scopeplane.shardName" -}}
{{- $fullname := include "scopeplane.fullname" (index . 0) }}
{{- if eq (include "scopeplane.shards" (index . 0)) "1" }}
{{- $fullname }}
{{- else }}
{{- $suffix := printf "-shard-%d" (index . 1) }}
{{- printf "%s%s" ($fullname | trunc (sub 63 (len $suffix) | int) | trimSuffix "-") $suffix }}
{{- end }}
{{- end }}

{{/*
scopeplane.slotServiceName names slot I's Service, given (list $ I): slot 0's is the unsharded
Service's name, so that proxies started before sharding was turned on still reach a shard,
which tells them their scope's address; slot I's is <fullname>-slot-I, shortened to fit in 63
characters.
*/}}
{{- define "scopeplane.slotServiceName" -}}
{{- $fullname := include "scopeplane.fullname" (index . 0) }}
{{- if eq (index . 1) 0 }}
{{- $fullname }}
{{- else }}
{{- $suffix := printf "-slot-%d" (index . 1) }}
{{- printf "%s%s" ($fullname | trunc (sub 63 (len $suffix) | int) | trimSuffix "-") $suffix }}
{{- end }}
{{- end }}

{{/*
scopeplane.slotXdsAddress is the host:port of slot I's Service, given (list $ I).
*/}}
{{- define "scopeplane.slotXdsAddress" -}}
{{- $root := index . 0 }}
{{- printf "%s.%s.svc:%d" (include "scopeplane.slotServiceName" .) $root.Release.Namespace (int $root.Values.service.xdsPort) }}
{{- end }}

{{/*
scopeplane.slotSelectorLabels select the pods that serve slot I, given (list $ I): those of
shard I mod sharding.shards of this count, so that while the count changes the slot's Service
sends new connections to the replicas of the new count only.
*/}}
{{- define "scopeplane.slotSelectorLabels" -}}
{{- $root := index . 0 }}
{{- $shards := int (include "scopeplane.shards" $root) }}
{{ include "scopeplane.selectorLabels" $root }}
scopeplane.dev/shard: {{ mod (index . 1) $shards | toString | quote }}
scopeplane.dev/shards: {{ $shards | toString | quote }}
{{- end }}

{{/*
scopeplane.shardLabel is, with more than one shard, the label that keeps shard K's pods
(given (list $ K)) to its own Deployment and Service, on a line of its own; nothing with one.
*/}}
{{- define "scopeplane.shardLabel" -}}
{{- if ne (include "scopeplane.shards" (index . 0)) "1" }}
scopeplane.dev/shard: {{ index . 1 | toString | quote }}
{{- end }}
{{- end }}

{{/*
scopeplane.shardLabels are the common labels of shard K's objects and pods, given (list $ K):
with more than one shard, its shard and the shard count, which the slots' Services select.
*/}}
{{- define "scopeplane.shardLabels" -}}
{{ include "scopeplane.labels" (index . 0) }}{{ include "scopeplane.shardLabel" . }}
{{- if ne (include "scopeplane.shards" (index . 0)) "1" }}
scopeplane.dev/shards: {{ include "scopeplane.shards" (index . 0) | quote }}
{{- end }}
{{- end }}

{{/*
scopeplane.shardSelectorLabels select shard K's pods, given (list $ K): a Deployment's
selector cannot change, so they leave the count out.
*/}}
{{- define "scopeplane.shardSelectorLabels" -}}
{{ include "scopeplane.selectorLabels" (index . 0) }}{{ include "scopeplane.shardLabel" . }}
{{- end }}
