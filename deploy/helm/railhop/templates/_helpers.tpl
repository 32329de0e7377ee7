{{- define "railhop.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "railhop.labels" -}}
app.kubernetes.io/name: railhop-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: railhop
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "railhop.selectorLabels" -}}
app.kubernetes.io/name: railhop-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "railhop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "railhop.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /*
The agent pod's affinity: the user's .Values.affinity wins when set; otherwise GPU nodes
(gpuNodeLabels, one ORed term per vendor), each term ANDed with the pool's label (a pool's
DaemonSet) or with "not in any pool" (the default DaemonSet). Called with dict root, pool.
*/ -}}
{{- define "railhop.affinity" -}}
{{- $pool := .pool -}}
{{- with .root -}}
{{- if .Values.affinity }}
affinity:
  {{- toYaml .Values.affinity | nindent 2 }}
{{- else }}
{{- $extra := list -}}
{{- if $pool }}
{{- $extra = list (dict "key" $pool.nodeLabel.key "operator" "In" "values" $pool.nodeLabel.values) -}}
{{- else }}
{{- range .Values.policyPools }}
{{- $extra = append $extra (dict "key" .nodeLabel.key "operator" "NotIn" "values" .nodeLabel.values) -}}
{{- end }}
{{- end }}
{{- if or .Values.gpuNodeLabels $extra }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      # one term per GPU vendor: terms are ORed; the pool's expressions are ANDed into each
      nodeSelectorTerms:
        {{- if .Values.gpuNodeLabels }}
        {{- range .Values.gpuNodeLabels }}
        - matchExpressions:
            - key: {{ .key }}
              operator: In
              values: {{ toJson .values }}
            {{- range $extra }}
            - {{ toJson . }}
            {{- end }}
        {{- end }}
        {{- else }}
        - matchExpressions:
            {{- range $extra }}
            - {{ toJson . }}
            {{- end }}
        {{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
