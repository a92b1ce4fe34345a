{{/* Names and labels, as prometheus-community's charts write them. */}}
{{- define "se-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "se-exporter.fullname" -}}
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

{{/* The fleet's objects: the name keeps "se-exporter-fleet", which the fleet's rules match scrape jobs by. */}}
{{- define "se-exporter.fleet.fullname" -}}
{{- printf "%s-fleet" (include "se-exporter.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "se-exporter.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "se-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component (node, windows, fleet): what a selector may match, never changed. */}}
{{- define "se-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "se-exporter.name" .root | quote }}
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component | quote }}
{{- end -}}

{{/* Every object's labels; call with (dict "root" $ "component" "node"). */}}
{{- define "se-exporter.labels" -}}
helm.sh/chart: {{ include "se-exporter.chart" .root | quote }}
{{ include "se-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service | quote }}
app.kubernetes.io/part-of: se-exporter
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{/* Labels of an object that belongs to no one component (rules, dashboards, the priority class). */}}
{{- define "se-exporter.commonLabels" -}}
helm.sh/chart: {{ include "se-exporter.chart" . | quote }}
app.kubernetes.io/name: {{ include "se-exporter.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: se-exporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{- define "se-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "se-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "se-exporter.fleet.serviceAccountName" -}}
{{- if .Values.fleet.serviceAccount.create -}}
{{- default (include "se-exporter.fleet.fullname" .) .Values.fleet.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.fleet.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "se-exporter.priorityClassName" -}}
{{- if .Values.priorityClassName -}}
{{- .Values.priorityClassName -}}
{{- else if .Values.priorityClass.create -}}
{{- /* PriorityClasses are cluster-scoped: the namespace in the name keeps two releases of one name apart. */ -}}
{{- printf "%s-%s-node" (include "se-exporter.fullname" .) (include "se-exporter.namespace" .) -}}
{{- end -}}
{{- end -}}

{{/* repository:tag or repository@digest; call with (dict "image" .Values.image "root" $). */}}
{{- define "se-exporter.image" -}}
{{- if not .image.repository -}}
{{- fail "image.repository is empty: build and push the image first (make image IMAGE=REGISTRY/se-exporter:TAG, docs/aks.md), then set image.repository" -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* A PowerShell single-quoted literal holding exactly the value: every character PowerShell ends such a literal
at (U+0027 and the typographic U+2018, U+2019, U+201A, U+201B) doubled, as PowerShell's own
CodeGeneration.EscapeSingleQuotedStringContent does. */}}
{{- define "se-exporter.psLiteral" -}}
'{{ . | toString | replace "'" "''" | replace "\u2018" "\u2018\u2018" | replace "\u2019" "\u2019\u2019" | replace "\u201a" "\u201a\u201a" | replace "\u201b" "\u201b\u201b" }}'
{{- end -}}

{{/* state.hostPath, cleaned, or a one-line refusal: the init container hands this node directory to the pod's user,
so it must be se-exporter's own (a folder named for it, or inside one), never a directory of the node's system or container runtime. */}}
{{- define "se-exporter.stateHostPath" -}}
{{- $given := .Values.state.hostPath | toString -}}
{{- $path := clean $given -}}
{{- $system := list "/proc" "/sys" "/dev" "/run" "/var/run" "/boot" "/etc/kubernetes" "/var/lib/kubelet" "/var/lib/containerd" "/var/lib/docker" "/var/lib/cni" "/opt/cni" "/var/log" -}}
{{- $inside := false -}}
{{- range $system -}}{{- if or (eq $path .) (hasPrefix (printf "%s/" .) $path) -}}{{- $inside = true -}}{{- end -}}{{- end -}}
{{- if or (not (isAbs $path)) $inside (not (contains "se-exporter" $path)) -}}
{{- fail (printf "state.hostPath=%s is not a directory of se-exporter's own (the init container hands it to uid %d): use /var/lib/se-exporter, or another directory named for se-exporter outside the node's system and runtime directories" $given (int (.Values.podSecurityContext.runAsUser | default 10001))) -}}
{{- end -}}
{{- $path -}}
{{- end -}}

{{/* true when the pods use Microsoft Entra Workload ID. */}}
{{- define "se-exporter.workloadIdentity" -}}
{{- if eq .Values.eventhubs.auth "workloadIdentity" -}}true{{- end -}}
{{- end -}}

{{/* true when the fleet's pods use Microsoft Entra Workload ID (for the hub, or for Blob Storage alone). */}}
{{- define "se-exporter.fleet.workloadIdentity" -}}
{{- if or (eq .Values.eventhubs.auth "workloadIdentity") .Values.fleet.serviceAccount.workloadIdentity.clientId -}}true{{- end -}}
{{- end -}}

{{/* The OTLP endpoint's port: the one in the URL; else, over gRPC, 443 whatever the scheme (the OTel exporter
hands gRPC the bare host, and gRPC's default port is 443), and over HTTP the scheme's (80, 443). */}}
{{- define "se-exporter.otlpPort" -}}
{{- $url := urlParse .Values.otlp.endpoint -}}
{{- $hostport := splitList ":" (get $url "host") -}}
{{- if gt (len $hostport) 1 -}}
{{- last $hostport -}}
{{- else if or (eq (get $url "scheme") "https") (eq .Values.otlp.protocol "grpc") -}}
443
{{- else -}}
80
{{- end -}}
{{- end -}}

{{/* The Event Hubs endpoint override's port (AMQP over TLS, 5671 unless given). */}}
{{- define "se-exporter.eventhubsEndpointPort" -}}
{{- $hostport := splitList ":" (get (urlParse .Values.eventhubs.endpoint) "host") -}}
{{- if gt (len $hostport) 1 -}}{{- last $hostport -}}{{- else -}}5671{{- end -}}
{{- end -}}

{{/* Settings both programs take: logging and Event Hubs; call with (dict "root" $ "secret" existingSecret). */}}
{{- define "se-exporter.commonEnv" -}}
{{- $secret := .secret -}}
{{- with .root -}}
- name: SE_EXPORTER_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: SE_EXPORTER_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- if eq .Values.eventhubs.auth "workloadIdentity" }}
- name: SE_EXPORTER_EVENTHUB_NAMESPACE
  value: {{ required "eventhubs.namespace is required with eventhubs.auth=workloadIdentity" .Values.eventhubs.namespace | quote }}
- name: SE_EXPORTER_EVENTHUB_NAME
  value: {{ required "eventhubs.name is required with eventhubs.auth=workloadIdentity" .Values.eventhubs.name | quote }}
{{- else if eq .Values.eventhubs.auth "existingSecret" }}
- name: SE_EXPORTER_EVENTHUB_CONNECTION_STRING
  valueFrom:
    secretKeyRef:
      name: {{ required "eventhubs.existingSecret.name is required with eventhubs.auth=existingSecret" $secret.name | quote }}
      key: {{ $secret.key | quote }}
{{- with .Values.eventhubs.name }}
- name: SE_EXPORTER_EVENTHUB_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if and (ne .Values.eventhubs.auth "none") .Values.eventhubs.endpoint }}
- name: SE_EXPORTER_EVENTHUB_ENDPOINT
  value: {{ .Values.eventhubs.endpoint | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* Seconds of a duration as the monitors' interval takes it (values.schema.json: e.g. 30s, 1m30s, 500ms). */}}
{{- define "se-exporter.durationSeconds" -}}
{{- $seconds := 0.0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- $unit := regexFind "[a-z]+$" . -}}
{{- $seconds = addf $seconds (mulf (trimSuffix $unit . | float64) (get (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) $unit)) -}}
{{- end -}}
{{- $seconds -}}
{{- end -}}

{{/*
The node pods' --max-scrape-interval, or "" for the default: a counter series appears at 0 and stays so for
--max-scrape-interval (default 2m) so that increase() of every scraper sees the first count, which needs it at least
the scrape interval. The longest interval of the enabled monitors is passed when it is longer than the default;
otherwise nothing is (the default also covers another Prometheus scraping at 1m). More than the sidecar's bound
(1h) is refused here, not in a crash-looping pod.
*/}}
{{- define "se-exporter.scrapeHold" -}}
{{- $longest := "" -}}
{{- $seconds := 120.0 -}}
{{- range $name := list "serviceMonitor" "podMonitor" -}}
{{- $m := index $.Values $name -}}
{{- if and $m.enabled $m.interval -}}
{{- $s := include "se-exporter.durationSeconds" $m.interval | float64 -}}
{{- if gt $s 3600.0 -}}
{{- fail (printf "%s.interval %s is longer than the sidecar's --max-scrape-interval takes (1h)" $name $m.interval) -}}
{{- end -}}
{{- if gt $s $seconds -}}
{{- $longest = $m.interval -}}
{{- $seconds = $s -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $longest -}}
{{- end -}}

{{/* se-exporter.scrapeHold as the Linux node pods' environment (the Windows ones pass it to install.ps1). */}}
{{- define "se-exporter.scrapeHoldEnv" -}}
{{- with include "se-exporter.scrapeHold" . }}
- name: SE_EXPORTER_MAX_SCRAPE_INTERVAL
  value: {{ . | quote }}
{{- end -}}
{{- end -}}

{{/* The sidecar's port of the monitors' endpoints and the node label they add (joins kube-state-metrics). */}}
{{- define "se-exporter.monitorEndpoint" -}}
{{- $m := .monitor -}}
- port: metrics
  path: /metrics
  {{- with $m.interval }}
  interval: {{ . | quote }}
  {{- end }}
  {{- with $m.scrapeTimeout }}
  scrapeTimeout: {{ . | quote }}
  {{- end }}
  {{- if $m.honorLabels }}
  honorLabels: true
  {{- end }}
  relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
    {{- with $m.relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $m.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Values that would render but fail (or quietly do nothing) at run time: refused at render with one line. */}}
{{- define "se-exporter.validate" -}}
{{- $eh := .Values.eventhubs -}}
{{- if and (eq $eh.auth "workloadIdentity") .Values.serviceAccount.create (not .Values.serviceAccount.workloadIdentity.clientId) -}}
{{- fail "eventhubs.auth=workloadIdentity needs serviceAccount.workloadIdentity.clientId (the identity with \"Azure Event Hubs Data Sender\" on the hub)" -}}
{{- end -}}
{{- $windowsForwards := and .Values.windows.enabled .Values.windows.managedIdentityClientId -}}
{{- if and (eq $eh.auth "none") (or $eh.namespace $eh.name $eh.endpoint) (not $windowsForwards) -}}
{{- fail "eventhubs.namespace, name or endpoint is set but eventhubs.auth is none: set eventhubs.auth (workloadIdentity or existingSecret) to forward, or clear them" -}}
{{- end -}}
{{- if and $windowsForwards (not (and $eh.namespace $eh.name)) -}}
{{- fail "windows.managedIdentityClientId needs eventhubs.namespace and eventhubs.name (the hub the Windows service forwards to)" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: every pod would be scraped twice; set one of them to false" -}}
{{- end -}}
{{- end -}}

{{/* The fleet's values that would render but fail at run time (after the fleet's own checks). */}}
{{- define "se-exporter.fleet.validate" -}}
{{- $f := .Values.fleet -}}
{{- if and (eq .Values.eventhubs.auth "existingSecret") (not $f.eventhubs.existingSecret.name) -}}
{{- fail "fleet.enabled with eventhubs.auth=existingSecret needs fleet.eventhubs.existingSecret.name: a Listen policy's connection string (the node pods' Send policy cannot read)" -}}
{{- end -}}
{{- $checkpointWi := and $f.checkpoint.accountUrl (not $f.checkpoint.existingSecret.name) -}}
{{- $platformWi := and $f.platform.namespace (not $f.platform.existingSecret.name) -}}
{{- $needsWi := or (eq .Values.eventhubs.auth "workloadIdentity") $checkpointWi $platformWi -}}
{{- if and $needsWi (not $f.serviceAccount.workloadIdentity.clientId) (or $f.serviceAccount.create (ne .Values.eventhubs.auth "workloadIdentity")) -}}
{{- fail "the fleet uses workload identity (eventhubs.auth=workloadIdentity, fleet.checkpoint.accountUrl or fleet.platform.namespace): set fleet.serviceAccount.workloadIdentity.clientId" -}}
{{- end -}}
{{- end -}}
