package v1alpha1

// Condition types of a ProxyScope. Each is documented with what True means;
// the reasons below say why a condition has the status it has.
const (
	// ConditionAccepted is True when the spec is valid and every selection
	// resolved against the cluster's Services and namespaces.
	ConditionAccepted = "Accepted"
	// ConditionReady is True when the spec is accepted, the snapshot of the
	// current generation is built and served, and every connected proxy (if
	// any) ACKed its current version. Its message reads "N of M proxies at
	// version V". It is never True while Accepted is not.
	ConditionReady = "Ready"
	// ConditionDegraded is True while a proxy's last response to the current
	// configuration was a NACK, a resource of a selected Service cannot be
	// served, the bootstrap ConfigMap's name is taken, proxies keep
	// connecting with the wrong protocol, or a selection reaches Services of
	// a namespace that does not consent (no ReferenceGrant).
	ConditionDegraded = "Degraded"
	// ConditionStalled is True when the scope cannot make progress without a
	// change: its spec is invalid, or a proxy rejects the configuration it
	// is served. It is the abnormal-true condition kstatus (and so Flux, and
	// kubectl-style waiters built on it) reads as Failed; with Ready, it
	// makes every state map to one kstatus result: Ready=True is Current,
	// Stalled=True is Failed, anything else is InProgress.
	ConditionStalled = "Stalled"
)

// Reasons of the Accepted condition.
const (
	// ReasonResolved (Accepted=True): every selection resolved and at least
	// one Service was selected.
	ReasonResolved = "Resolved"
	// ReasonDeltaForGRPC (Accepted=True, with a Warning Event): the
	// selections resolved, but the scope is ProxylessGRPC and Delta, and no
	// gRPC xDS client speaks delta: its gRPC clients are refused until
	// spec.protocol is SotW (Envoys in delta still are served).
	ReasonDeltaForGRPC = "DeltaForGRPC"
	// ReasonNoMatchingServices (Accepted=False): the selections are valid but
	// match no Service yet; proxies receive an empty configuration.
	ReasonNoMatchingServices = "NoMatchingServices"
	// ReasonNamespaceNotFound (Accepted=False): a selection names a namespace
	// that does not exist, and that the scope may select from: its own, one
	// that granted it something before it went, or any with
	// --cross-namespace=allow. A namespace without consent is reported as
	// RefNotPermitted whether it exists or not, so that status tells no
	// scope author which namespaces exist.
	ReasonNamespaceNotFound = "NamespaceNotFound"
	// ReasonInvalidSelector (Accepted=False): a label selector cannot be
	// parsed (for example an unknown operator); the message names it.
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonRefNotPermitted (the name Gateway API gives a reference no
	// ReferenceGrant permits): selections name other namespaces that do not
	// consent, or do not exist (one reason for both, as the scope's author
	// may read neither), which the message lists; their Services are not
	// served. Namespaces that only a namespaceSelector reaches are never
	// listed, nor their Services counted, without consent: status must not
	// tell which namespaces hold Services matching a selector. Accepted stays True when other Services are
	// served (as a Gateway API route stays Accepted with ResolvedRefs=False),
	// and Degraded is True with the same reason, so that a scope that only
	// partly works is not reported healthy silently; Accepted is False when
	// nothing else is selected.
	ReasonRefNotPermitted = "RefNotPermitted"
)

// Reasons of the Ready condition.
const (
	// ReasonSynced (Ready=True): every connected proxy ACKed the current version.
	ReasonSynced = "Synced"
	// ReasonPending (Ready=False): some connected proxies have not ACKed the
	// current version yet.
	ReasonPending = "Pending"
	// ReasonNoProxies (Ready=True): the snapshot is built and served and no
	// proxy is connected yet; a scope is healthy before its proxies start.
	ReasonNoProxies = "NoProxiesConnected"
	// ReasonSnapshotNotBuilt (Ready=False; Accepted=Unknown): the control
	// plane has not built the snapshot of the current generation yet
	// (informers syncing, or the change still on its way).
	ReasonSnapshotNotBuilt = "SnapshotNotBuilt"
	// ReasonNotAccepted (Ready=False): Accepted is False; its reason says why.
	ReasonNotAccepted = "NotAccepted"
	// ReasonShardAbsent (Ready=False): with sharding, the scope's shard has
	// had no leader for a while (no replica of it renewed its Lease), so
	// no one serves the scope's proxies updates or keeps its status; shard
	// 0's leader writes it, and the message names the shard, its Lease and
	// since when. The rest of the status is what the shard last wrote. The
	// shard's leader, once back, writes the status anew.
	ReasonShardAbsent = "ShardAbsent"
)

// Reasons of the Degraded condition.
const (
	// ReasonAsExpected (Degraded=False): no proxy rejects the configuration
	// and no stream is being refused.
	ReasonAsExpected = "AsExpected"
	// ReasonProxyNACKed (Degraded=True): a proxy rejected the current
	// configuration; the message carries the node id, type, version and the
	// proxy's error_detail, and status.recentNACKs keeps the newest ones.
	ReasonProxyNACKed = "ProxyNACKed"
	// ReasonUnservableResource (Degraded=True): a resource translated from a
	// selected Service cannot be marshalled or fails Envoy's validation (data
	// that conversion could not repair). It alone is held back: proxies keep
	// its previous version, if there was one, and everything else, of the
	// same Service too, is served. The message names the Service, the
	// resource and why. Ready is unaffected (kstatus reads the scope as
	// Ready says), and so is Stalled: the next change of the Service's
	// objects may fix it.
	ReasonUnservableResource = "UnservableResource"
	// ReasonWrongProtocol (Degraded=True): clients naming this scope open
	// streams of the other protocol and are refused. The message's advice
	// follows the kind refused: a proxy's bootstrap ads_config.api_type
	// must match spec.protocol; a gRPC client speaks SotW only, so the
	// scope's spec.protocol must be SotW. It clears when a client of the
	// kind refused is admitted afterwards, or two minutes after the last
	// refusal.
	ReasonWrongProtocol = "WrongProtocol"
	// ReasonRefNotPermitted (Degraded=True) is also a reason of Degraded:
	// see the Accepted reason above.

	// ReasonBootstrapConfigMapConflict (Degraded=True): a ConfigMap that is
	// not scopeplane's (unlabelled, or controlled by another live object,
	// which the message names) already has the name of the scope's
	// bootstrap ConfigMap, so the bootstraps are not written
	// (status.bootstrapConfigMap is empty); the scope itself is served. A
	// labelled one whose controlling ProxyScope no longer exists is adopted.
	ReasonBootstrapConfigMapConflict = "BootstrapConfigMapConflict"
	// ReasonFeedbackNotReported (Degraded=True): a replica could not write
	// the part of its proxy-feedback report that holds this scope (the
	// message names the replica and the API server's answer), so the
	// leader counts that replica's proxies of the scope as it last
	// reported them, or not at all: the proxy counts and Ready may be
	// stale. It clears when the replica writes the part again.
	ReasonFeedbackNotReported = "FeedbackNotReported"
)

// The Stalled condition is True with ReasonInvalidSelector (the spec must
// be fixed) or ReasonProxyNACKed (a proxy rejects what it is served), and
// False with ReasonAsExpected.
