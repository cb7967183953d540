{{/*
Hand-written helpers; every other template is generated from manifests/ by `python -m coroner_dev.chart`.
*/}}

{{/* An image reference from (list .Values.<x>.image .Chart): repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "coroner.image" -}}
{{- $image := index . 0 -}}
{{- $chart := index . 1 -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default $chart.AppVersion }}
{{- end -}}
{{- end -}}
