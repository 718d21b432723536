{{/* The release's base name, at most 63 characters. */}}
{{- define "radixmesh.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "radixmesh.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "radixmesh.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "radixmesh.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Every worker pod's stable address (StatefulSet pods behind the headless Service). */}}
{{- define "radixmesh.workerAddresses" -}}
{{- $name := printf "%s-worker" (include "radixmesh.fullname" .) -}}
{{- $addresses := list -}}
{{- range $i := until (int .Values.worker.replicas) -}}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc:%d" $name $i $name $.Release.Namespace (int $.Values.worker.ports.grpc)) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}
