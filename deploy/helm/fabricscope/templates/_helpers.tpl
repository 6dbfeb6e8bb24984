{{/* The release's objects are named after it: "fabricscope" for a release of that name. */}}
{{- define "fabricscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fabricscope.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selects this release's agent pods (immutable in a DaemonSet: never add to it). */}}
{{- define "fabricscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fabricscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fabricscope.labels" -}}
{{ include "fabricscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: fabricscope
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "fabricscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fabricscope.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "fabricscope.image" -}}
{{- $repo := .Values.image.repository -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.probe.enabled -}}
{{- $repo = default $repo .Values.probe.image.repository -}}
{{- $tag = default (printf "%s-probe" $tag) .Values.probe.image.tag -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{/* HTTP or HTTPS: what the health probes and Prometheus speak to the metrics port. */}}
{{/* Where the kubelet's health probes GET /healthz: the metrics port, or with web.tls the
     plain-HTTP health port (--web.health-listen-address), on the node's loopback when the
     pod shares the node's network (the kubelet runs there too). */}}
{{- define "fabricscope.healthGet" -}}
path: /healthz
{{- if .Values.web.tls }}
{{- if .Values.hostNetwork }}
host: 127.0.0.1
{{- end }}
port: {{ .Values.web.healthPort }}
scheme: HTTP
{{- else }}
port: metrics
{{- end }}
{{- end -}}

{{- define "fabricscope.scheme" -}}
{{- if .Values.web.tls -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/* One scrape endpoint, shared by the ServiceMonitor and the PodMonitor. The job label is
     "fabricscope" whatever the release is called: the alert rules select up{job="fabricscope"}.
     honorLabels: pod attribution series carry the *workload's* namespace/pod/container; the
     agent exports no job or instance label. Host network: the target address is the node's
     IP, so the instance is named after the node. The agent pod's own target labels are
     dropped, so a rollout (new pod names) changes no series' identity. */}}
{{- define "fabricscope.endpoint" -}}
{{- $m := .monitor -}}
path: /metrics
scheme: {{ include "fabricscope.scheme" .root | lower }}
interval: {{ $m.interval }}
scrapeTimeout: {{ $m.scrapeTimeout }}
honorLabels: true
{{- with $m.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: instance
    action: replace
  - targetLabel: job
    replacement: fabricscope
    action: replace
  # The Operator gives every target the agent pod's namespace, service, pod and container
  # labels: the pod's name changes at every rollout, and with it every series' identity. A
  # series carries job, instance (the node) and endpoint, and its own labels (pod attribution's
  # namespace/pod/container are the workload's, kept by honorLabels).
  - action: labeldrop
    regex: (namespace|service|pod|container)
  {{- with $m.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $m.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The labels a Prometheus selects monitoring objects by (monitoringLabels, e.g.
     kube-prometheus-stack's release: <name>) and the object's own additionalLabels. */}}
{{- define "fabricscope.monitoringLabels" -}}
{{- $labels := merge (deepCopy (default dict .extra)) (default dict .root.Values.monitoringLabels) -}}
{{- with $labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Where the alerts' runbooks are: prometheusRule.runbookBaseUrl, else this release's docs
     in the project's repository (Chart.yaml home) at the release's tag. */}}
{{- define "fabricscope.runbookBase" -}}
{{- $base := .Values.prometheusRule.runbookBaseUrl -}}
{{- if not $base -}}
{{- $base = printf "%s/blob/v%s/" .Chart.Home .Chart.AppVersion -}}
{{- end -}}
{{- if not (hasSuffix "/" $base) -}}{{- $base = printf "%s/" $base -}}{{- end -}}
{{- $base -}}
{{- end -}}

{{/* The topology controller's labels: a name of its own, so neither the agents' DaemonSet
     nor their Service selects its pod. */}}
{{- define "fabricscope.topologySelectorLabels" -}}
app.kubernetes.io/name: {{ include "fabricscope.name" . }}-topology
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fabricscope.topologyLabels" -}}
{{ include "fabricscope.topologySelectorLabels" . }}
app.kubernetes.io/component: topology-controller
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: fabricscope
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The node's directory holding the kubelet's pod-resources socket: hostPaths.podResources,
     else <hostPaths.kubeletRoot>/pod-resources. */}}
{{- define "fabricscope.podResourcesPath" -}}
{{- $h := .Values.hostPaths -}}
{{- if $h.podResources -}}
{{- $h.podResources -}}
{{- else -}}
{{- printf "%s/pod-resources" (trimSuffix "/" $h.kubeletRoot) -}}
{{- end -}}
{{- end -}}

{{/* The GPU Operator's label for third-party GPU clients (gpuOperator.clientLabel): "true"
     while they may run on the node; the driver manager sets paused-for-driver-upgrade
     (mig-parted: paused-for-mig-change) and back. */}}
{{- define "fabricscope.gpuClientLabel" -}}nvidia.com/gpu.deploy.client{{- end -}}

{{/* nodeSelector: the value, plus the client label with gpuOperator.clientLabel=nodeSelector
     (the driver manager waits for DaemonSet pods whose nodeSelector has that key). */}}
{{- define "fabricscope.nodeSelector" -}}
{{- $sel := deepCopy (default dict .Values.nodeSelector) -}}
{{- if eq .Values.gpuOperator.clientLabel "nodeSelector" -}}
{{- $_ := set $sel (include "fabricscope.gpuClientLabel" .) "true" -}}
{{- end -}}
{{- with $sel }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* affinity: the value, with gpuOperator.clientLabel=affinity each required node selector
     term (or one empty term) ANDed with "the client label is true" or, as a second term,
     "the client label is absent" (a node no GPU Operator labelled). Terms are ORed. */}}
{{- define "fabricscope.affinity" -}}
{{- $aff := deepCopy (default dict .Values.affinity) -}}
{{- if eq .Values.gpuOperator.clientLabel "affinity" -}}
{{- $key := include "fabricscope.gpuClientLabel" . -}}
{{- $node := default dict $aff.nodeAffinity -}}
{{- $req := default dict $node.requiredDuringSchedulingIgnoredDuringExecution -}}
{{- $terms := list -}}
{{- range $term := (default (list dict) $req.nodeSelectorTerms) -}}
{{- range $rule := list (dict "key" $key "operator" "In" "values" (list "true")) (dict "key" $key "operator" "DoesNotExist") -}}
{{- $t := deepCopy $term -}}
{{- $_ := set $t "matchExpressions" (append (default list $t.matchExpressions) $rule) -}}
{{- $terms = append $terms $t -}}
{{- end -}}
{{- end -}}
{{- $_ := set $req "nodeSelectorTerms" $terms -}}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $req -}}
{{- $_ = set $aff "nodeAffinity" $node -}}
{{- end -}}
{{- with $aff }}{{ toYaml . }}{{ end -}}
{{- end -}}
