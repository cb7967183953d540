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

{{/* Extra entries of a map the chart writes itself, from (list extra ownKeys valuesKey): extra as YAML;
an entry whose key the chart already sets fails the render, naming the value (a Pod selector label
overridden would orphan the workload's Pods). */}}
{{- define "coroner.extend" -}}
{{- $extra := index . 0 -}}
{{- $value := index . 2 -}}
{{- range $key := index . 1 -}}
{{- if hasKey $extra $key -}}
{{- fail (printf "%s sets %q, which the chart sets itself on that object: remove it from %s" $value $key $value) -}}
{{- end -}}
{{- end -}}
{{- toYaml $extra -}}
{{- end -}}

{{/* The labels and hook annotations of every object of the helm test (templates/tests/doctor.yaml). */}}
{{- define "coroner.doctorTestMeta" -}}
labels:
  app.kubernetes.io/name: coroner-doctor-test
  app.kubernetes.io/part-of: coroner
  app.kubernetes.io/instance: {{ .Release.Name }}
  app.kubernetes.io/managed-by: Helm
  helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
annotations:
  helm.sh/hook: test
  helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}
