package v1alpha1

// Condition types of a ProxyScope. Each is documented with what True means;
// the reasons below say why a condition has the status it has.
const (
	// ConditionAccepted is True when the spec is valid and every selection
	// resolved against the cluster's Services and namespaces.
	ConditionAccepted = "Accepted"
	// ConditionReady is True when the scope's snapshot is built and every
	// connected proxy ACKed its current version. Its message reads
	// "N of M proxies at version V". It is Unknown while no proxy is connected.
	ConditionReady = "Ready"
	// ConditionDegraded is True while a proxy's last response to the current
	// configuration was a NACK, or proxies keep connecting with the wrong
	// protocol or without a scope.
	ConditionDegraded = "Degraded"
)

// Reasons of the Accepted condition.
const (
	// ReasonResolved (Accepted=True): every selection resolved and at least
	// one Service was selected.
	ReasonResolved = "Resolved"
	// ReasonNoMatchingServices (Accepted=False): the selections are valid but
	// match no Service yet; proxies receive an empty configuration.
	ReasonNoMatchingServices = "NoMatchingServices"
	// ReasonNamespaceNotFound (Accepted=False): a selection names a namespace
	// that does not exist.
	ReasonNamespaceNotFound = "NamespaceNotFound"
	// ReasonInvalidSelector (Accepted=False): a label selector cannot be
	// parsed (for example an unknown operator); the message names it.
	ReasonInvalidSelector = "InvalidSelector"
)

// Reasons of the Ready condition.
const (
	// ReasonSynced (Ready=True): every connected proxy ACKed the current version.
	ReasonSynced = "Synced"
	// ReasonPending (Ready=False): some connected proxies have not ACKed the
	// current version yet.
	ReasonPending = "Pending"
	// ReasonNoProxies (Ready=Unknown): the snapshot is built but no proxy is
	// connected, so nothing can confirm it.
	ReasonNoProxies = "NoProxiesConnected"
	// ReasonSnapshotNotBuilt (Ready=False): the control plane has not built
	// the scope's snapshot yet (informers syncing, or the spec not accepted).
	ReasonSnapshotNotBuilt = "SnapshotNotBuilt"
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
	// ReasonWrongProtocol (Degraded=True): proxies naming this scope open
	// streams of the other protocol and are refused; their bootstrap's
	// ads_config.api_type must match spec.protocol.
	ReasonWrongProtocol = "WrongProtocol"
)
