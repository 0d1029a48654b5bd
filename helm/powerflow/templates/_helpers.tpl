{{- define "powerflow.labels" -}}
app.kubernetes.io/name: powerflow
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "powerflow.selector" -}}
app.kubernetes.io/name: powerflow
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "powerflow.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
kube-scheduler of the cluster's own release (a kube-scheduler supports control
planes one minor version around its own): the server's version without a
vendor's suffix (v1.29.3-eks-adc7111 -> v1.29.3), unless scheduler.image says.
*/}}
{{- define "powerflow.schedulerImage" -}}
{{- if .Values.scheduler.image -}}
{{ .Values.scheduler.image }}
{{- else -}}
{{ .Values.scheduler.repository }}:{{ regexReplaceAll "^(v[0-9]+\\.[0-9]+\\.[0-9]+).*$" .Capabilities.KubeVersion.Version "${1}" }}
{{- end -}}
{{- end -}}

{{/*
The ingest's TLS: on unless turned off (the agents' bearer tokens must not cross
the network in clear), from the Secret operator.ingestTLS.secretName names
(tls.crt, tls.key, ca.crt: a cert-manager Certificate's) or the one the chart
makes (templates/ingest-tls.yaml).
*/}}
{{- define "powerflow.ingestTLS" -}}
{{- if and .Values.operator.ingestPort .Values.operator.ingestTLS.enabled -}}
{{ .Values.operator.ingestTLS.secretName | default "powerflow-ingest-tls" }}
{{- end -}}
{{- end -}}

{{- define "powerflow.tolerateArgs" -}}
{{- range .Values.tolerateTaints }}
- --tolerate={{ . }}
{{- end }}
{{- end -}}

{{/*
numba only uses a cache folder it can write to, and the root file system is
read-only: an init container copies the kernels compiled at image build into
an emptyDir, so no pod pays the ~13 s of compilation at start. `cp -R`, not
`cp -a`: an emptyDir is root's (mode 0777) and only its owner may set its
times, so preserving them fails as the image's user
(tests/test_helm_chart.py runs the command so).
*/}}
{{- define "powerflow.numbaCacheInit" -}}
- name: numba-cache
  image: {{ include "powerflow.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["sh", "-c", "cp -R /opt/powerflow/numba-cache/. /numba-cache/"]
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: [ALL]}
  volumeMounts:
    - {name: numba-cache, mountPath: /numba-cache}
{{- end -}}

{{- define "powerflow.writableVolumes" -}}
- name: numba-cache
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "powerflow.writableMounts" -}}
- {name: numba-cache, mountPath: /numba-cache}
- {name: tmp, mountPath: /tmp}
{{- end -}}

{{- define "powerflow.commonEnv" -}}
- {name: NUMBA_CACHE_DIR, value: /numba-cache}
{{- end -}}

{{/*
Ports of one pod must differ: a collision would let only one server bind, and
the pod crash-loops with an "address in use" nobody reads. Called with a list of
(name, port) pairs; fails the install naming both values.
*/}}
{{- define "powerflow.distinctPorts" -}}
{{- $seen := dict -}}
{{- range $pair := . -}}
{{- $key := toString (index $pair 1) -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "%s (%s) and %s (%s) are the same port of one pod: give them different ports" (get $seen $key) $key (index $pair 0) $key) -}}
{{- end -}}
{{- $_ := set $seen $key (index $pair 0) -}}
{{- end -}}
{{- end -}}

{{- define "powerflow.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/*
The operator's rules on the DLJobs it runs and what it makes for them: in its
ClusterRole, or, with operator.watchNamespace, in a Role of that namespace.
*/}}
{{- define "powerflow.operatorJobRules" -}}
# kopf's watches and each pass's LIST; the operator writes only the status.
- apiGroups: [powerflow.io]
  resources: [dljobs]
  verbs: [list, watch]
- apiGroups: [powerflow.io]
  resources: [dljobs/status]
  verbs: [patch]
# Worker pods: created, annotated (clock), deleted (rescale, end); watched and
# listed (everyone's GPU pods hold GPUs the plan must leave alone).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete, patch]
# The rendezvous Service; get only after a create answered AlreadyExists
# (is that Service this DLJob's?).
- apiGroups: [""]
  resources: [services]
  verbs: [get, create]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}
