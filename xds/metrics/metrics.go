// Package metrics defines scopeplane's Prometheus metrics. They are
// registered with controller-runtime's registry, so the manager's metrics
// endpoint serves them next to the controller metrics. docs/metrics.md
// documents each one.
package metrics

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// ConnectedProxies counts open ADS streams per scope and protocol.
	ConnectedProxies = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "scopeplane_xds_connected_proxies",
		Help: "Open ADS streams, by scope and protocol.",
	}, []string{"scope", "protocol"})

	// Pushes counts responses sent.
	Pushes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_pushes_total",
		Help: "xDS responses sent, by scope, type and protocol.",
	}, []string{"scope", "type", "protocol"})

	// ResourcesSent counts resources carried by responses.
	ResourcesSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_resources_sent_total",
		Help: "Resources carried by xDS responses, by scope, type and protocol.",
	}, []string{"scope", "type", "protocol"})

	// BytesSent counts the serialized size of responses.
	BytesSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_sent_bytes_total",
		Help: "Serialized bytes of xDS responses, by scope, type and protocol.",
	}, []string{"scope", "type", "protocol"})

	// OtherProtocolBytes counts what the other protocol would have sent for
	// the same changes to the same proxies (package cost prices it).
	OtherProtocolBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_other_protocol_bytes_total",
		Help: "Serialized bytes the other xDS protocol would have sent for the same changes to the same proxies, by scope, type and the protocol actually used.",
	}, []string{"scope", "type", "protocol"})

	// ConnectBytes counts the part of the bytes sent that were streams'
	// first responses (initial syncs and reconnects).
	ConnectBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_connect_sent_bytes_total",
		Help: "Serialized bytes of streams' first responses per type (initial syncs and reconnects), by scope and protocol.",
	}, []string{"scope", "protocol"})
	// ConnectOtherProtocolBytes counts what the other protocol would have
	// sent as those first responses.
	ConnectOtherProtocolBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_connect_other_protocol_bytes_total",
		Help: "What the other xDS protocol would have sent as those first responses, by scope and the protocol actually used.",
	}, []string{"scope", "protocol"})

	// HeldBack counts the resources rejected responses kept from proxies:
	// a NACK's blast radius.
	HeldBack = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_nack_held_back_resources_total",
		Help: "Resources carried by responses proxies rejected, by scope and protocol.",
	}, []string{"scope", "protocol"})
	// OtherProtocolHeldBack counts what the other protocol's responses for
	// the same changes would have held back.
	OtherProtocolHeldBack = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_nack_other_protocol_held_back_resources_total",
		Help: "Resources the other xDS protocol's responses for the same changes would have carried, by scope and the protocol actually used.",
	}, []string{"scope", "protocol"})

	// NACKs counts rejected responses.
	NACKs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_nacks_total",
		Help: "xDS responses proxies rejected, by scope and type.",
	}, []string{"scope", "type"})
	// NACKsPaced counts rejections answered but not reported, beyond a
	// stream's NACK pace: what they say never reaches status or Events.
	NACKsPaced = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_nacks_paced_total",
		Help: "xDS rejections beyond a stream's NACK pace: answered, not reported, by scope.",
	}, []string{"scope"})

	// Refusals counts streams refused.
	Refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_xds_refusals_total",
		Help: "ADS streams refused (or ended by a limit), by reason; scope is empty when the proxy named no existing scope.",
	}, []string{"scope", "reason"})

	// Convergence observes how long a change took to be ACKed by a proxy.
	Convergence = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "scopeplane_xds_convergence_seconds",
		Help:    "Time from a change being observed to a proxy having ACKed everything it changed, by protocol.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	}, []string{"protocol"})

	// Translation observes the time to record one object change in the
	// catalog, translation of the touched Service included.
	Translation = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "scopeplane_translation_duration_seconds",
		Help:    "Time to convert and translate one changed object, by kind.",
		Buckets: prometheus.ExponentialBuckets(0.00001, 4, 12),
	}, []string{"kind"})

	// SnapshotBuild observes the time to version and marshal one batch.
	SnapshotBuild = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "scopeplane_snapshot_build_duration_seconds",
		Help:    "Time to version and marshal one batch of changes into the scopes' snapshots.",
		Buckets: prometheus.ExponentialBuckets(0.00001, 4, 12),
	})

	// UnservableResources counts resources the snapshot builder held back
	// because they cannot be marshalled or fail Envoy's validation.
	UnservableResources = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_snapshot_unservable_resources_total",
		Help: "Resources held back from a scope's snapshot because they cannot be marshalled or fail Envoy's validation, by type; once per scope and change.",
	}, []string{"type"})

	// ScopeCondition mirrors each ProxyScope's conditions as the leader
	// writes them, so that alerts can say how long a scope has not been Ready.
	ScopeCondition = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "scopeplane_scope_condition",
		Help: "1 while the ProxyScope's condition is True, else 0, by scope and condition (Accepted, Ready, Degraded, Stalled); exported by the leader.",
	}, []string{"scope", "condition"})

	// StatusWriteFailures counts status patches the API server refused or
	// did not answer; each is retried with backoff.
	StatusWriteFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_status_write_failures_total",
		Help: "ProxyScope status patches that failed (each is retried with backoff), by scope.",
	}, []string{"scope"})

	// FeedbackWrites counts this replica's rounds of writes of its feedback
	// ConfigMaps (package replicafeedback: the parts that changed, then
	// the manifest): at most one a second, so the rate shows what
	// replicas cost the API server; an error means some scopes' feedback
	// did not reach the leader.
	FeedbackWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scopeplane_feedback_report_writes_total",
		Help: "Rounds of writes of this replica's proxy-feedback ConfigMaps (the parts that changed, then the manifest), which the leader merges into status (at most one a second), by result (ok, error: some part or the manifest could not be written).",
	}, []string{"result"})
	// FeedbackParts is how many ConfigMaps this replica's feedback report
	// is split into (besides its manifest).
	FeedbackParts = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "scopeplane_feedback_report_parts",
		Help: "How many parts (ConfigMaps of at most 900 KiB compressed, besides the manifest) this replica's proxy-feedback report is split into.",
	})

	// WatchAge says, per watched kind, how long ago this replica last heard
	// from the API server about it (package apiwatch).
	WatchAge = NewAges(prometheus.NewDesc("scopeplane_watch_age_seconds",
		"Seconds since this replica last heard from the API server about a watched kind (a list, a watch event, or a watch bookmark, which the API server sends about every minute on a quiet watch), by kind: how old the newest data of that kind may be.",
		[]string{"kind"}, nil))

	// GRPC counts the ADS server's streams by method and by the status code
	// they ended with (refusals included), and the messages each way:
	// go-grpc-middleware's standard grpc_server_* metrics.
	GRPC = grpcprom.NewServerMetrics()

	// CertificateExpiry is when the xDS serving certificate, and the CA that
	// proxies verify it with, stop being valid (Unix seconds; 0 while none is
	// loaded, as with plaintext xDS), so that an alert can fire days before
	// a renewal that does not happen would break every new connection.
	CertificateExpiry = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "scopeplane_xds_certificate_expiry_timestamp_seconds",
		Help: "When the xDS certificate in use expires, in Unix seconds, by certificate: serving (the server's own) or ca (the CA bundle's certificate that verifies it); 0 while none is loaded.",
	}, []string{"certificate"})

	// BuildInfo is 1, labelled with the binary's version and Go version, so
	// that dashboards can show which version each replica runs.
	BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "scopeplane_build_info",
		Help: "Always 1; the labels say which scopeplane version and Go version this replica runs.",
	}, []string{"version", "goversion"})
	// Shards is the number of shards, labelled with this replica's own
	// (docs/sharding.md): a shard none of whose replicas is scraped
	// shows as fewer shards seen than their number, while the others are
	// (ScopeplaneShardAbsent).
	Shards = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "scopeplane_shards",
		Help: "The number of shards the scopes are divided among (1 unsharded); the label is this replica's shard.",
	}, []string{"shard"})
)

// SetShard records this replica's shard, of count.
func SetShard(index, count int) {
	Shards.Reset()
	Shards.WithLabelValues(strconv.Itoa(index)).Set(float64(count))
}

// SetBuildInfo records the binary's version in BuildInfo.
func SetBuildInfo(version string) {
	BuildInfo.Reset()
	BuildInfo.WithLabelValues(version, runtime.Version()).Set(1)
}

func init() {
	ctrlmetrics.Registry.MustRegister(ConnectedProxies, Pushes, ResourcesSent, BytesSent, OtherProtocolBytes,
		ConnectBytes, ConnectOtherProtocolBytes, HeldBack, OtherProtocolHeldBack, NACKs, NACKsPaced, Refusals, Convergence, Translation, SnapshotBuild, UnservableResources, ScopeCondition, StatusWriteFailures, FeedbackWrites, FeedbackParts, WatchAge, CertificateExpiry, BuildInfo, Shards, GRPC)
	// Both series exist from the start, so that their absence says the
	// replica is not scraped rather than that it has no certificate yet.
	for _, c := range []string{CertificateServing, CertificateCA} {
		CertificateExpiry.WithLabelValues(c).Set(0)
	}
	// A replica that has written no report yet (a single replica, or one
	// still starting) exports both results at 0, so that the alert on
	// errors reads a series rather than nothing.
	for _, r := range []string{"ok", "error"} {
		FeedbackWrites.WithLabelValues(r)
	}
	// The version main reports unless built with -X main.version, so that
	// scopeplane_build_info exists from the first scrape and an alert can
	// read its absence as the operator being down.
	SetBuildInfo("dev")
}

// ScopeLabels says what the scope label of the per-scope series holds.
type ScopeLabels string

// The values of --metrics-scope-labels.
const (
	// ScopeLabelsAll labels every per-scope series with its scope: about
	// 35 series per scope served (proxies, pushes, resources and bytes per
	// type and protocol, conditions), what a few hundred scopes afford.
	ScopeLabelsAll ScopeLabels = "all"
	// ScopeLabelsNone folds every scope's series into one whose scope
	// label is FoldedScope (sums, which the alerts' and dashboard's
	// queries read alike), and keeps scopeplane_scope_condition only for
	// the conditions a scope is unhealthy by: the series no longer grow
	// with the scopes, and ScopeplaneScopeNotReady still names the scope.
	ScopeLabelsNone ScopeLabels = "none"
)

// FoldedScope is the scope label of every series under ScopeLabelsNone.
const FoldedScope = "*"

var scopeLabels atomic.Value // ScopeLabels; ScopeLabelsAll until set

// SetScopeLabels chooses what the scope label holds, before anything is
// counted. It refuses a value it does not know.
func SetScopeLabels(l ScopeLabels) error {
	switch l {
	case ScopeLabelsAll, ScopeLabelsNone:
		scopeLabels.Store(l)
		return nil
	}
	return fmt.Errorf("metrics scope labels %q: want %s or %s", l, ScopeLabelsAll, ScopeLabelsNone)
}

// folded reports whether every scope's series are folded into one.
func folded() bool { return scopeLabels.Load() == ScopeLabelsNone }

// Scope is the scope label value of a series of scope: the scope itself,
// or FoldedScope when the series are folded. The empty scope (a refusal
// that names none) stays empty.
func Scope(scope string) string {
	if scope != "" && folded() {
		return FoldedScope
	}
	return scope
}

// SetCondition records that scope's condition is true (1) or not (0);
// healthy says whether that is the condition's healthy state. Folded, only
// an unhealthy condition is exported, so that alerts can name the scope.
func SetCondition(scope, condition string, value float64, healthy bool) {
	if folded() && healthy {
		ScopeCondition.DeleteLabelValues(scope, condition)
		return
	}
	ScopeCondition.WithLabelValues(scope, condition).Set(value)
}

// ForgetScope drops a deleted scope's own series. Folded series are sums
// over every scope and stay.
func ForgetScope(scope string) {
	ScopeCondition.DeletePartialMatch(prometheus.Labels{"scope": scope})
	if !folded() {
		StatusWriteFailures.DeletePartialMatch(prometheus.Labels{"scope": scope})
	}
}

// Values of CertificateExpiry's certificate label.
const (
	CertificateServing = "serving"
	CertificateCA      = "ca"
)

// Ages is a gauge per label value of the seconds since Touch was last
// called with it, computed when scraped: the age keeps growing while
// nothing touches it, which a gauge set on each event could not show.
type Ages struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	last map[string]time.Time
}

// NewAges returns Ages whose desc has a single variable label.
func NewAges(desc *prometheus.Desc) *Ages { return &Ages{desc: desc, last: map[string]time.Time{}} }

// Touch records that label's value is current now.
func (a *Ages) Touch(label string) {
	a.mu.Lock()
	a.last[label] = time.Now()
	a.mu.Unlock()
}

// Age returns how long ago label was touched, and whether it ever was.
func (a *Ages) Age(label string) (time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.last[label]
	return time.Since(t), ok
}

// Describe implements prometheus.Collector.
func (a *Ages) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

// Collect implements prometheus.Collector.
func (a *Ages) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for l, t := range a.last {
		ch <- prometheus.MustNewConstMetric(a.desc, prometheus.GaugeValue, time.Since(t).Seconds(), l)
	}
}
