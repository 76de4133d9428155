{{/* Names, labels and the operator's RBAC rules. Nothing here is random or time-dependent: the same values
render the same bytes (GitOps). */}}

{{- define "vllm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vllm-operator.fullname" -}}
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

{{- define "vllm-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vllm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vllm-operator.labels" -}}
helm.sh/chart: {{ include "vllm-operator.chart" . }}
{{ include "vllm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: vllm-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "vllm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vllm-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "vllm-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The GPU catalog overrides file, as the operator reads it (--gpu-catalog): a YAML list of rows. */}}
{{- define "vllm-operator.gpuCatalog" -}}
{{ toYaml .Values.gpuCatalog.overrides }}
{{- end }}

{{/*
Rules for namespaced resources: in a ClusterRole when the operator watches every namespace, in a Role per
watched namespace otherwise. Exactly what the operator and kopf call; tests/chart/test_rbac.py runs the real
operator against an emulated API server and fails when a call is not allowed here, or when a verb here is
never called.
*/}}
{{- define "vllm-operator.rules.namespaced" -}}
# VLLMServices: kopf watches them and patches its finalizer and last-handled-configuration annotation;
# the operator reads them and writes only status (never spec).
- apiGroups: [vllm-operator.dev]
  resources: [vllmservices]
  verbs: [get, list, watch, patch]
- apiGroups: [vllm-operator.dev]
  resources: [vllmservices/status]
  verbs: [patch]
# The children of a VLLMService (garbage-collected by their ownerReferences). A Deployment is deleted by the
# operator only when the service moved to a LeaderWorkerSet or StatefulSet (its plan spans nodes now, or each pod
# needs a cache claim of its own), and only its own.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# A claim per pod on ReadWriteOnce storage where the LeaderWorkerSet API is not served: one StatefulSet per such
# service (its volumeClaimTemplates); watched for its rollout; deleted by the operator only when the service moved
# to another workload kind, and only its own.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, delete]
# spec.modelCache.prewarm: a DaemonSet per service that pulls the image (and fills a shared cache) on the pool's
# nodes before its workload is created; deleted once done unless spec.modelCache.prewarm.keep.
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch]
# Model cache claims; a service's own claim is deleted by the operator when a switch to a claim per pod leaves it
# unused (only a claim with an ownerReference to that service).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create, delete]
# spec.gpu.maxNodes > 1: one LeaderWorkerSet (kubernetes-sigs/lws, installed separately) per multi-node service;
# deleted by the operator when the service is back on one node (a Deployment), and only its own. Watched (kopf,
# once the LWS CRD is installed) for its groups' readiness, which finishes a switch to it.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
# spec.autoscaling and spec.routing.inferencePool: an HPA or a KEDA ScaledObject, an InferencePool (deleted when
# the spec stops asking for them).
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, create, patch, delete]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, create, patch, delete]
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch, delete]
# vLLM pods: watched for failures; a bounded log tail is read when the termination message is empty.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
{{- if not .Values.rbac.modelSourceNamespaces }}
{{- include "vllm-operator.rules.modelSources" . }}
{{- end }}
# spec.gpu.share: the share group's record (vllm-share-<group>, written before any member's pods change).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
# spec.gpu.share with NVIDIA's DRA driver: one ResourceClaim per shared GPU (immutable: created once).
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: [get, create]
# Events on VLLMServices (the operator's and kopf's); get: whether a recorded step's Event that answered 409 exists;
# list: the kubelet's Pulled Events of a pod that just became Ready (status.coldStart.imagePullSeconds).
- apiGroups: [""]
  resources: [events]
  verbs: [create, get, list]
{{- end }}

{{/* What a service names for its model files, in its own namespace (rbac.modelSourceNamespaces narrows it). */}}
{{- define "vllm-operator.rules.modelSources" }}
# spec.model.configMapRef: a model's config.json kept in a ConfigMap; spec.hfTokenSecretRef: the service's own
# hub token, for its model's config.json (the operator's HF_TOKEN is used for it only with hfToken.forAllNamespaces).
- apiGroups: [""]
  resources: [configmaps, secrets]
  verbs: [get]
{{- end }}

{{/* kopf's peering object(s): list/watch to see the other replicas, patch to write its own keep-alive. */}}
{{- define "vllm-operator.rules.peering" -}}
{{- $plural := ternary "clusterkopfpeerings" "kopfpeerings" (empty .Values.watchNamespaces) -}}
- apiGroups: [kopf.dev]
  resources: [{{ $plural }}]
  verbs: [list, watch]
- apiGroups: [kopf.dev]
  resources: [{{ $plural }}]
  resourceNames: [{{ .Values.peering.name }}]
  verbs: [patch]
{{- end }}

{{/* Cluster-scoped reads, in a ClusterRole in both modes. */}}
{{- define "vllm-operator.rules.cluster" -}}
# Nodes: the planner reads GPU Feature Discovery labels (nvidia.com/gpu.product, gpu.memory, gpu.count) and
# allocatable memory.
- apiGroups: [""]
  resources: [nodes]
  verbs: [list]
# StorageClasses: whether the cluster has a default one (the default model cache is then a PVC).
- apiGroups: [storage.k8s.io]
  resources: [storageclasses]
  verbs: [list]
# spec.gpu.share: whether NVIDIA's DRA driver's device class (gpu.nvidia.com) exists.
- apiGroups: [resource.k8s.io]
  resources: [deviceclasses]
  verbs: [list]
# kopf's resource discovery: notices the VLLMService CRD being installed, upgraded or removed.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.watchNamespaces }}
# kopf's namespace observation: notices the watched namespaces being created or deleted.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end }}
