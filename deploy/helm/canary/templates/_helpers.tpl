{{/* Names: <release>-canary unless the release already says canary. */}}
{{- define "canary.fullname" -}}
{{- if contains "canary" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-canary" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "canary.labels" -}}
app.kubernetes.io/name: canary
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* (dict "ctx" $ "component" "control-plane") */}}
{{- define "canary.selectorLabels" -}}
app.kubernetes.io/name: canary
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "canary.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "canary.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* (dict "ctx" $ "image" .Values.images.controlPlane) */}}
{{- define "canary.image" -}}
{{- printf "%s%s:%s" .ctx.Values.images.registry .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The Secrets both the control plane and the collectors mount, read-only, as files. */}}
{{- define "canary.secretVolumes" -}}
- name: tmp
  emptyDir: { medium: Memory, sizeLimit: 16Mi }
{{- with .Values.secrets.backendTls }}
- name: backend-tls
  secret: { secretName: {{ . }}, defaultMode: 0440 }
{{- end }}
{{- with .Values.secrets.etcdAuth }}
- name: etcd-auth
  secret: { secretName: {{ . }}, defaultMode: 0440 }
{{- end }}
{{- with .Values.secrets.redisAuth }}
- name: redis-auth
  secret: { secretName: {{ . }}, defaultMode: 0440 }
{{- end }}
{{- with .Values.secrets.sampleKeys }}
- name: sample-keys
  secret: { secretName: {{ . }}, defaultMode: 0440 }
{{- end }}
{{- with .Values.secrets.adminToken }}
- name: admin-token
  secret: { secretName: {{ . }}, defaultMode: 0440 }
{{- end }}
{{- end -}}

{{- define "canary.secretMounts" -}}
- { name: tmp, mountPath: /tmp }
{{- if .Values.secrets.backendTls }}
- { name: backend-tls, mountPath: /etc/canary/backend-tls, readOnly: true }
{{- end }}
{{- if .Values.secrets.etcdAuth }}
- { name: etcd-auth, mountPath: /etc/canary/etcd-auth, readOnly: true }
{{- end }}
{{- if .Values.secrets.redisAuth }}
- { name: redis-auth, mountPath: /etc/canary/redis-auth, readOnly: true }
{{- end }}
{{- if .Values.secrets.sampleKeys }}
- { name: sample-keys, mountPath: /etc/canary/sample-keys, readOnly: true }
{{- end }}
{{- if .Values.secrets.adminToken }}
- { name: admin-token, mountPath: /etc/canary/admin-token, readOnly: true }
{{- end }}
{{- end -}}

{{- define "canary.databaseEnv" -}}
- name: CANARY_DATABASE_URL
  valueFrom:
    secretKeyRef: { name: {{ .Values.secrets.database.name }}, key: {{ .Values.secrets.database.key }} }
{{- end -}}

{{/* Pod placement and identity shared by both workloads; takes the component's values. */}}
{{- define "canary.podCommon" -}}
{{- $ctx := .ctx -}}
serviceAccountName: {{ include "canary.serviceAccountName" $ctx }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml $ctx.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
{{- with $ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The backends' addresses: the trial's own in-cluster ones, else config's. */}}
{{- define "canary.etcdEndpoints" -}}
{{- if .Values.trial.enabled -}}
{{- printf "http://%s-etcd.%s.svc:2379" (include "canary.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.config.etcd -}}
{{- end -}}
{{- end -}}

{{- define "canary.redisUrl" -}}
{{- if .Values.trial.enabled -}}
{{- printf "redis://%s-redis.%s.svc:6379/0" (include "canary.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.config.redisUrl -}}
{{- end -}}
{{- end -}}

{{/* A trial Secret's value: what the cluster already holds (an upgrade keeps it), else
     the one generated now. (dict "ctx" $ "name" NAME "key" KEY "generated" VALUE) */}}
{{- define "canary.trialValue" -}}
{{- $secret := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- $data := ($secret | default dict).data | default dict -}}
{{- if hasKey $data .key -}}
{{- index $data .key | b64dec -}}
{{- else -}}
{{- .generated -}}
{{- end -}}
{{- end -}}
