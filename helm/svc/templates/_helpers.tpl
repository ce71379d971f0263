{{/*
Helpers of the svc chart. A component's resources (Deployment, Service, ServiceAccount,
NetworkPolicy) are all named "<fullname>-<component>"; its callers' subjects are those
service accounts' "system:serviceaccount:<namespace>:<name>" (docs/auth.md, "In Kubernetes").
*/}}

{{/* The release's base name: the release name, with "-svc" unless it already holds "svc". */}}
{{- define "svc.fullname" -}}
{{- if contains "svc" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-svc" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* A component's resource name. Takes (list $ "pdp"). */}}
{{- define "svc.name" -}}
{{- printf "%s-%s" (include "svc.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{/* The caller subject of a component's service account. Takes (list $ "pdp"). */}}
{{- define "svc.subject" -}}
{{- printf "system:serviceaccount:%s:%s" (index . 0).Release.Namespace (include "svc.name" .) -}}
{{- end -}}

{{/* A component's in-cluster URL. Takes (list $ "policy"). */}}
{{- define "svc.url" -}}
{{- printf "http://%s:8080" (include "svc.name" .) -}}
{{- end -}}

{{/* Labels that select a component's pods. Takes (list $ "pdp"). */}}
{{- define "svc.selectorLabels" -}}
app.kubernetes.io/name: svc
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Every label of a component's resources. Takes (list $ "pdp"). */}}
{{- define "svc.labels" -}}
{{ include "svc.selectorLabels" . }}
app.kubernetes.io/version: {{ (index . 0).Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ (index . 0).Release.Service }}
app.kubernetes.io/part-of: svc
helm.sh/chart: {{ printf "%s-%s" (index . 0).Chart.Name (index . 0).Chart.Version }}
{{- end -}}

{{/* The image reference. */}}
{{- define "svc.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
The callers (subjects) of a list of clients: those that name a service account.
Takes (list $ clients) and prints a comma-separated list (possibly empty).
*/}}
{{- define "svc.clientSubjects" -}}
{{- $out := list -}}
{{- range (index . 1) -}}
{{- if .serviceAccount -}}
{{- $out = append $out (printf "system:serviceaccount:%s:%s" (required "a client with a serviceAccount needs its namespace" .namespace) .serviceAccount) -}}
{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/*
The roles (docs/auth.md#roles-and-methods) of a list of clients: each one that names a service
account goes into the dict, as its subject -> its `role` or the default. Prints nothing.
Takes (list $ clients "app" $roles).
*/}}
{{- define "svc.clientRoles" -}}
{{- $roles := index . 3 -}}
{{- range (index . 1) -}}
{{- if .serviceAccount -}}
{{- $_ := set $roles (printf "system:serviceaccount:%s:%s" (required "a client with a serviceAccount needs its namespace" .namespace) .serviceAccount) (.role | default (index $ 2)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Puts this release's component `name`'s subject in `roles` with the role `name`. Takes (list $ "pdp" $roles). */}}
{{- define "svc.componentRole" -}}
{{- $_ := set (index . 2) (include "svc.subject" (list (index . 0) (index . 1))) (index . 1) -}}
{{- end -}}

{{/* NetworkPolicy peers of a list of clients. Takes the list. */}}
{{- define "svc.clientPeers" -}}
{{- range . }}
{{- if .ipBlock }}
- ipBlock:
    cidr: {{ .ipBlock }}
{{- else }}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ required "a client needs a namespace or an ipBlock" .namespace }}
  {{- if .podLabels }}
  podSelector:
    matchLabels:
      {{- toYaml .podLabels | nindent 6 }}
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The metrics scrapers every component admits besides its callers: `metrics.from`, and the
reporter when it is on (it reads each component's /version, /readyz and /metrics; it calls no
API). Takes $.
*/}}
{{- define "svc.scrapers" -}}
{{- include "svc.clientPeers" .Values.metrics.from }}
{{- if .Values.reporter.enabled }}
{{ include "svc.componentPeer" (list . "reporter") }}
{{- end }}
{{- end -}}

{{/* The NetworkPolicy peer of one of this release's components. Takes (list $ "pdp"). */}}
{{- define "svc.componentPeer" -}}
- podSelector:
    matchLabels:
      {{- include "svc.selectorLabels" . | nindent 6 }}
{{- end -}}

{{/*
The bearer-token settings of a component's API (docs/auth.md): the cluster's issuer and JWKS,
the CA of its TLS certificate (the kube-root-ca.crt ConfigMap, mounted with the tokens), and
the callers with their roles. Takes (list $ "PDP" (dict "subject" "role" ...)).
*/}}
{{- define "svc.authEnv" -}}
{{- $root := index . 0 -}}
{{- $prefix := index . 1 -}}
- name: SVC_{{ $prefix }}_AUTH
  value: jwt
- name: SVC_{{ $prefix }}_AUTH_ISSUER
  value: {{ $root.Values.auth.issuer | quote }}
- name: SVC_{{ $prefix }}_AUTH_JWKS
  value: {{ $root.Values.auth.jwks | quote }}
- name: SVC_{{ $prefix }}_AUTH_JWKS_CA_FILE
  value: /var/run/svc/tokens/ca.crt
- name: SVC_{{ $prefix }}_AUTH_ROLES
  value: {{ index . 2 | toJson | quote }}
{{- end -}}

{{/*
Extra settings a component's values name (`<component>.env`), each SVC_<COMPONENT>_*.
Takes (list "PDP" .Values.pdp.env).
*/}}
{{- define "svc.extraEnv" -}}
{{- $prefix := index . 0 -}}
{{- range $name, $value := index . 1 }}
{{- if not (hasPrefix (printf "SVC_%s_" $prefix) $name) }}
{{- fail (printf "%s: extra settings of this component start with SVC_%s_" $name $prefix) }}
{{- end }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* The broker URL (SVC_KAFKA_URL), from the values or a Secret. */}}
{{- define "svc.kafkaEnv" -}}
- name: SVC_KAFKA_URL
{{- if .Values.kafka.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.existingSecret }}
      key: {{ .Values.kafka.existingSecretKey }}
{{- else }}
  value: {{ required "kafka.url (or kafka.existingSecret) is required" .Values.kafka.url | quote }}
{{- end }}
{{- end -}}

{{/* The Secret and key of the ClickHouse DSN. */}}
{{- define "svc.clickhouseRef" -}}
{{- if .Values.clickhouse.existingSecret -}}
name: {{ .Values.clickhouse.existingSecret }}
key: {{ .Values.clickhouse.existingSecretKey }}
{{- else -}}
name: {{ include "svc.name" (list . "clickhouse") }}
key: dsn
{{- end -}}
{{- end -}}

{{/* The Secret and key of a relational service's database URL. Takes (list $ "policy"). */}}
{{- define "svc.databaseRef" -}}
{{- $root := index . 0 -}}
{{- $svc := index . 1 -}}
{{- if $root.Values.postgresql.existingSecret -}}
name: {{ $root.Values.postgresql.existingSecret }}
key: {{ index $root.Values.postgresql.keys $svc }}
{{- else -}}
name: {{ include "svc.name" (list $root "postgresql") }}
key: {{ $svc }}
{{- end -}}
{{- end -}}

{{/* The projected volume of a component's outgoing tokens and the issuer's CA.
Takes (list $ "svc-policy" "svc-context" ...): one token per audience, at
/var/run/svc/tokens/<audience>.token. */}}
{{- define "svc.tokensVolume" -}}
{{- $root := index . 0 -}}
- name: tokens
  projected:
    sources:
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      {{- range $audience := rest . }}
      - serviceAccountToken:
          audience: {{ $audience }}
          expirationSeconds: {{ $root.Values.auth.tokenExpirationSeconds }}
          path: {{ $audience }}.token
      {{- end }}
{{- end -}}

{{/* The probes every component serves on its one port (docs/architecture.md). */}}
{{- define "svc.probes" -}}
ports:
  - name: http
    containerPort: 8080
    protocol: TCP
startupProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* Pod-level settings shared by every Deployment and Job. Takes (list $ component-values). */}}
{{- define "svc.podCommon" -}}
{{- $root := index . 0 -}}
{{- $v := index . 1 -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A Secret's value kept across upgrades: the one in the cluster, else a new random one.
Takes (list $ "secret-name" "key" length). */}}
{{- define "svc.keptRandom" -}}
{{- $root := index . 0 -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace (index . 1) -}}
{{- if and $existing (hasKey $existing.data (index . 2)) -}}
{{- index $existing.data (index . 2) -}}
{{- else -}}
{{- randAlphaNum (index . 3) | b64enc -}}
{{- end -}}
{{- end -}}

{{/* A component's ServiceAccount and its Service on port 8080. Takes (list $ "pdp"). */}}
{{- define "svc.accountAndService" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "svc.name" . }}
  labels:
    {{- include "svc.labels" . | nindent 4 }}
automountServiceAccountToken: false
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "svc.name" . }}
  labels:
    {{- include "svc.labels" . | nindent 4 }}
spec:
  selector:
    {{- include "svc.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: 8080
      targetPort: http
      protocol: TCP
{{- end -}}

{{/* The head of a component's Deployment up to its pod spec's containers.
Takes (list $ "pdp" component-values replicas). replicas "" leaves them to an autoscaler. */}}
{{- define "svc.deploymentHead" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "svc.name" (list $root $c) }}
  labels:
    {{- include "svc.labels" (list $root $c) | nindent 4 }}
spec:
  {{- if ne (toString (index . 3)) "" }}
  replicas: {{ index . 3 }}
  {{- end }}
  {{- if has $c (list "reasoner" "connectors") }}
  # One replica, never two at once: the reasoner's cycle (docs/reasoner.md#one-replica), the
  # connectors' state file (docs/connectors.md#state).
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "svc.selectorLabels" (list $root $c) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "svc.labels" (list $root $c) | nindent 8 }}
    spec:
      serviceAccountName: {{ include "svc.name" (list $root $c) }}
      {{- include "svc.podCommon" (list $root (index . 2)) | nindent 6 }}
{{- end -}}

{{/* The head of a component's NetworkPolicy, up to its ingress peers.
Takes (list $ "pdp"). */}}
{{- define "svc.networkPolicyHead" -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "svc.name" . }}
  labels:
    {{- include "svc.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "svc.selectorLabels" . | nindent 6 }}
  policyTypes: ["Ingress"]
{{- end -}}

{{/* A component's container head: name, image, args, security, port and probes.
Takes (list $ "pdp" args-list). */}}
{{- define "svc.containerHead" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  image: {{ include "svc.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args: {{ toJson (index . 2) }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  {{- include "svc.probes" $root | nindent 2 }}
{{- end -}}

{{/* A NetworkPolicy's ingress on port 8080 from the rendered peers; no peer: no ingress at all
(a rule without `from` would admit everyone). Takes the peers' YAML text. */}}
{{- define "svc.ingress" -}}
{{- if trim . }}
  ingress:
    - ports:
        - port: 8080
          protocol: TCP
      from:
        {{- . | nindent 8 }}
{{- else }}
  ingress: []
{{- end }}
{{- end -}}
