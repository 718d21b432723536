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

{{/* The headless worker Service's name, and its DNS name (one address per worker pod). */}}
{{- define "radixmesh.workerService" -}}
{{ include "radixmesh.fullname" . }}-worker
{{- end -}}

{{- define "radixmesh.workerDns" -}}
{{ include "radixmesh.workerService" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{- define "radixmesh.workerServerName" -}}
{{ .Values.tls.worker.serverName | default (include "radixmesh.workerDns" .) }}
{{- end -}}

{{/* The hub cache inside the pods: on the model volume, so a download is made once. */}}
{{- define "radixmesh.hubCache" -}}
{{ .Values.model.volume.mountPath }}/huggingface/hub
{{- end -}}

{{/* `radixmesh download` for the init containers; $tokenizerOnly for the router. */}}
{{- define "radixmesh.downloadContainer" -}}
{{- $ := index . 0 -}}
{{- $tokenizerOnly := index . 1 -}}
- name: download-model
  image: {{ include "radixmesh.image" $ }}
  imagePullPolicy: {{ $.Values.image.pullPolicy }}
  command: ["radixmesh"]
  args:
    - download
    - {{ $.Values.model.name | quote }}
    - --download-dir={{ include "radixmesh.hubCache" $ }}
    {{- with $.Values.model.revision }}
    - --revision={{ . }}
    {{- end }}
    {{- if $tokenizerOnly }}
    - --tokenizer-only
    {{- end }}
  {{- with $.Values.model.download.tokenSecret }}
  env:
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: token
  {{- end }}
  volumeMounts:
    - name: models
      mountPath: {{ $.Values.model.volume.mountPath }}
{{- end -}}

{{/* The model volume: the claim, or an emptyDir of the pod. */}}
{{- define "radixmesh.modelVolume" -}}
- name: models
  {{- if .Values.model.volume.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.volume.existingClaim }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.volume.sizeLimit }}
  {{- end }}
{{- end -}}

{{/* A gRPC health probe: Kubernetes' own (plaintext), or `radixmesh health` over TLS,
with the pod's certificate as the client's where the server requires one. Arguments:
port, TLS directory (empty: plaintext), the certificate's server name, mutual. */}}
{{- define "radixmesh.healthProbe" -}}
{{- $port := index . 0 -}}
{{- $tlsDir := index . 1 -}}
{{- if $tlsDir -}}
exec:
  command:
    - radixmesh
    - health
    - --address=127.0.0.1:{{ $port }}
    - --tls-ca={{ $tlsDir }}/ca.crt
    - --tls-server-name={{ index . 2 }}
    {{- if index . 3 }}
    - --tls-cert={{ $tlsDir }}/tls.crt
    - --tls-key={{ $tlsDir }}/tls.key
    {{- end }}
{{- else -}}
grpc:
  port: {{ $port }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the workers' key: the user's, or the one this chart generates. */}}
{{- define "radixmesh.workerKeySecret" -}}
{{ .Values.auth.workerApiKeySecret | default (printf "%s-worker-key" (include "radixmesh.fullname" .)) }}
{{- end -}}
