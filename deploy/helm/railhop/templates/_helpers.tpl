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

{{- /*
AppArmor for the agent container: the securityContext.appArmorProfile field exists from
Kubernetes 1.30 (older API servers drop or refuse it); below 1.30 the beta annotation
container.apparmor.security.beta.kubernetes.io/agent does the same. "true" when the cluster
(.Capabilities.KubeVersion: the server's version, or `helm template --kube-version`) takes the
field. "-0" lets pre-release / vendor versions such as v1.30.2-gke.1 or v1.30.0-eks-a count.
*/ -}}
{{- define "railhop.appArmorByField" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- end -}}

{{- /* The appArmorProfile value as the annotation's value (unconfined, runtime/default,
localhost/NAME). */ -}}
{{- define "railhop.appArmorAnnotation" -}}
{{- $p := .Values.appArmorProfile -}}
{{- if eq $p.type "Unconfined" }}unconfined
{{- else if eq $p.type "RuntimeDefault" }}runtime/default
{{- else if eq $p.type "Localhost" }}localhost/{{ required "appArmorProfile.localhostProfile is required with type Localhost" $p.localhostProfile }}
{{- else }}{{ fail (printf "appArmorProfile.type %v: not Unconfined, RuntimeDefault or Localhost" $p.type) }}
{{- end }}
{{- end -}}

{{- /* The agent pod's annotations (YAML): podAnnotations, plus the AppArmor annotation below
Kubernetes 1.30. */ -}}
{{- define "railhop.podAnnotations" -}}
{{- $a := deepCopy (.Values.podAnnotations | default dict) -}}
{{- if and .Values.appArmorProfile (not (include "railhop.appArmorByField" .)) -}}
{{- $_ := set $a "container.apparmor.security.beta.kubernetes.io/agent" (include "railhop.appArmorAnnotation" .) -}}
{{- end -}}
{{- toYaml $a -}}
{{- end -}}

{{- /* The ServiceMonitor's and the PodMonitor's relabeling: the pod's node name as the label
`node` (the dashboard's variable; the agents run on the host network, so `instance` is the
node's IP:port and says nothing a reader recognises). */ -}}
{{- define "railhop.nodeRelabeling" -}}
- { sourceLabels: [__meta_kubernetes_pod_node_name], targetLabel: node }
{{- end -}}
