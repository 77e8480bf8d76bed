{{/* Names and labels shared by every template. */}}

{{- define "hotload.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hotload.fullname" -}}
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

{{- define "hotload.operatorName" -}}
{{- printf "%s-operator" (include "hotload.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hotload.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hotload.labels" -}}
helm.sh/chart: {{ include "hotload.chart" . }}
app.kubernetes.io/name: {{ include "hotload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hotload
{{- end }}

{{- define "hotload.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "hotload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "hotload.operatorLabels" -}}
{{ include "hotload.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "hotload.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hotload.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hotload.leaseName" -}}
{{- default (printf "%s-leader" (include "hotload.fullname" .) | trunc 63 | trimSuffix "-") .Values.leaderElection.leaseName }}
{{- end }}

{{- define "hotload.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The ClusterRole the operator binds every sidecar ServiceAccount to (hotload.operator.workload). */}}
{{- define "hotload.sidecarClusterRole" -}}
hotload-sidecar
{{- end }}

{{/*
"true" when the operator holds its namespaced rights cluster-wide: only when the user says
so (`clusterWide.enabled`). Least privilege otherwise: Roles in the namespaces it watches,
which are plain names; a kopf glob or exclusion (`*`, `?`, `!`, `[`, `,`) without
`clusterWide.enabled` fails the install, naming what cluster-wide would grant.
*/}}
{{- define "hotload.clusterScoped" -}}
{{- if not .Values.clusterWide.enabled }}
{{- range .Values.watchNamespaces }}
{{- if regexMatch "[*?!\\[,]" . }}
{{- fail (printf "watchNamespaces: %q is a pattern, which only the cluster-wide mode can watch. Name the namespaces, or set clusterWide.enabled=true: the operator may then create and patch StatefulSets, Services, ServiceAccounts, RoleBindings and NetworkPolicies in every namespace (docs/chart.md)" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- ternary "true" "false" (.Values.clusterWide.enabled | default false) }}
{{- end }}

{{/*
The namespaces the operator gets a Role in (Role mode): the names given, else the release's
own namespace.
*/}}
{{- define "hotload.watchedNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson .Values.watchNamespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
The operator's rights in the namespaces it watches, least privilege (docs/chart.md says why
each is there; the `kubectl auth can-i` matrix in tests/integration/chart checks every verb
both ways). It never writes pods: the sidecars report on their own pods, it reads them.
*/}}
{{- define "hotload.operatorNamespacedRules" -}}
# Deployments: kopf keeps one finalizer on each (the per-deployment daemon).
- apiGroups: [hotload.dev]
  resources: [rolloutdeployments]
  verbs: [get, list, watch, patch]
# Snapshots: read, delete old ones (retention; bucket data is the publisher's), and hold
# the deletion of a served one (patch: the hotload.dev/served finalizer).
- apiGroups: [hotload.dev]
  resources: [policysnapshots]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [hotload.dev]
  resources: [rolloutdeployments/status, policysnapshots/status]
  verbs: [patch]
# The replicas' reports (annotations, the SnapshotReady condition): read only.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# What each RolloutDeployment owns (server-side apply; deletion is left to ownerReferences).
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, list, watch, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [get, list, watch, create, patch]
# Each deployment's NetworkPolicy: ingress to its replicas on the front's port only.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch]
# Binding a sidecar's ServiceAccount to the sidecar ClusterRole without holding its rights.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [bind]
  resourceNames: [{{ include "hotload.sidecarClusterRole" . }}]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}
