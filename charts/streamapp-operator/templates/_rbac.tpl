{{- /*
What the operator does with StreamApps and the objects it owns (operator/src/reconcile.rs).
Cluster-wide by default; a Role in watchNamespace when it watches one namespace.
*/}}
{{- define "streamapp-operator.rules" -}}
{{- $owned := list "get" "list" "watch" "create" "patch" -}}
# Its own resource: watched, and patched for its cleanup finalizer.
- apiGroups: ["streamapp.dev"]
  resources: ["streamapps"]
  verbs: ["get", "list", "watch", "patch"]
# The aggregate status, applied server-side; stale pod entries removed with a JSON patch.
- apiGroups: ["streamapp.dev"]
  resources: ["streamapps/status"]
  verbs: ["get", "patch"]
# Owner references with blockOwnerDeletion need update on the owner's finalizers.
- apiGroups: ["streamapp.dev"]
  resources: ["streamapps/finalizers"]
  verbs: ["update"]
# The owned objects, applied server-side (patch, and create for the first apply). The garbage
# collector deletes them with their StreamApp; the operator itself only deletes a StatefulSet it
# must replace (an immutable field changed) and configuration ConfigMaps no pod uses.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: {{ toJson $owned }}
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: {{ toJson $owned }}
# The pods' NetworkPolicy; deleted when a StreamApp turns spec.networkPolicy off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Replicas alone (scaling while the rest of a spec waits, stopping the pods for a reset or a
# cleanup) go through the scale subresource.
- apiGroups: ["apps"]
  resources: ["statefulsets/scale"]
  verbs: ["patch"]
# The agent's Role and RoleBinding. RBAC lets the operator grant only what it holds itself,
# and it does hold everything the agent Role grants (see operator/src/rbac.rs): get
# streamapps, get/patch streamapps/status, create/patch events. No bind or escalate.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: {{ toJson $owned }}
# Volumes grow by patching the claims (StatefulSets cannot change their templates); a reset
# deletes them (the pods start again on empty volumes).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Pods of a node that is gone are force-deleted (spec.nodeLoss), with their UID as a
# precondition.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# The Kafka credentials a StreamApp names (spec.kafka.sasl/tls): hashed into the pod template so
# a changed credential rolls the pods, and used to reach the app's Kafka. Read-only; the
# operator watches only their metadata.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
{{- /* StorageClasses are cluster-scoped: read whether a class allows volume expansion. */}}
{{- define "streamapp-operator.clusterRules" -}}
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["get"]
{{- /* spec.nodeLoss: which nodes are Ready, and which node a pod's local volume lives on. */}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["get"]
{{- end }}
