package status

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// wrongProtocolMemory is how long a wrong-protocol refusal keeps a scope
// Degraded: proxies that keep knocking keep it there, one that was fixed
// lets it clear.
const wrongProtocolMemory = 2 * time.Minute

// Inputs is everything a scope's status is computed from: the pipeline's
// record of what it serves for the scope, joined with the proxies' feedback.
type Inputs struct {
	// Namespace, Name, Generation and Protocol are the ProxyScope's.
	Namespace  string
	Name       string
	Generation int64
	Protocol   model.Protocol
	Mode       model.ListenerMode
	// Built says the snapshot store holds a record for the scope; Resolution
	// is that record, and Version and RevTime its served version and when
	// the change that made it was observed.
	Built      bool
	Resolution snapshot.Resolution
	Version    string
	RevTime    time.Time
	// Feedback is the proxies' feedback, from every replica.
	Feedback feedback.Summary
	// Transition is the served spec's change of protocol, if any.
	Transition *model.Transition
	// Footprint is what each Service holds in the served snapshot, when
	// the usage can tell unused Services apart (nil otherwise).
	Footprint map[model.Key]Footprint
	// BootstrapConflict says why the scope's bootstrap ConfigMap cannot be
	// written ("" when it is).
	BootstrapConflict string
	// CostWritten is when this leader last wrote a change of the scope's
	// status.cost, or, when it has not, when it began writing statuses: a
	// predecessor's figures are refreshed at the scope's next slot after
	// that, not all at a new leader's start (see costDue).
	CostWritten time.Time
	// Leading is when this leader began writing statuses (zero: unknown).
	// For one refresh period from it, a predecessor's cost figures stand
	// while this process has none (see costHeld).
	Leading time.Time
	// Unreported says, per replica whose feedback of this scope could not
	// be written, why (none when every replica's was).
	Unreported []string
	// NoBootstrapConfigMap says no bootstrap ConfigMap is written for this
	// scope (--bootstrap-configmaps=false, or its namespace is not one of
	// --bootstrap-configmap-namespaces).
	NoBootstrapConfigMap bool
	Now                  time.Time
}

// Footprint is what one Service holds in a scope's snapshot.
type Footprint struct{ Resources, Bytes int }

// current reports whether the served state was built from this generation.
func (in *Inputs) current() bool {
	return in.Built && in.Resolution.Generation == in.Generation && in.Resolution.Invalid == ""
}

// rejected reports whether this generation's spec was refused.
func (in *Inputs) rejected() bool {
	return in.Built && in.Resolution.Generation == in.Generation && in.Resolution.Invalid != ""
}

// condition is a condition's computed status, reason and message.
type condition struct {
	status  metav1.ConditionStatus
	reason  string
	message string
}

// accepted says whether the spec was valid and its selections resolved.
func accepted(in *Inputs) condition {
	r := &in.Resolution
	switch {
	case in.rejected():
		return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonInvalidSelector, r.Invalid + "; the scope serves nothing until it is fixed"}
	case !in.current():
		return condition{metav1.ConditionUnknown, xdsv1alpha1.ReasonSnapshotNotBuilt, fmt.Sprintf("generation %d is not processed yet", in.Generation)}
	case len(r.MissingNamespaces) > 0:
		return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonNamespaceNotFound,
			"spec.services names namespaces that do not exist: " + strings.Join(r.MissingNamespaces, ", ")}
	case r.SelectedServices == 0 && len(r.RefusedNamespaces) > 0:
		return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonRefNotPermitted,
			refusedMessage(r) + "; no other Service is selected, so the scope's proxies receive an empty configuration"}
	case r.SelectedServices == 0:
		return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonNoMatchingServices,
			"the selections match no Service; the scope's proxies receive an empty configuration"}
	}
	resolved := fmt.Sprintf("%d Services selected: %d clusters, %d endpoints", r.SelectedServices, r.Clusters, r.Endpoints)
	if len(r.RefusedNamespaces) > 0 {
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted, resolved + "; " + refusedMessage(r)}
	}
	if in.Mode == model.ListenerProxylessGRPC && in.Protocol == model.Delta {
		// Still accepted: an Envoy speaking delta is served, and the
		// scope may be on its way to SotW. But it is almost surely a
		// mistake, so it is said here and, by its reason, in an Event.
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonDeltaForGRPC,
			resolved + "; but no gRPC xDS client speaks Delta: this ProxylessGRPC scope refuses every gRPC client until spec.protocol is SotW"}
	}
	return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonResolved, resolved}
}

// refusedMessage names the namespaces that refused the scope's selections.
func refusedMessage(r *snapshot.Resolution) string {
	msg := "not served, as no ReferenceGrant in their namespace permits this scope's namespace to select them (or the namespace does not exist): Services of " + strings.Join(r.RefusedNamespaces, ", ")
	if r.GrantsUnavailable {
		msg += " (the cluster does not serve ReferenceGrants: install Gateway API's ReferenceGrant CRD and restart scopeplane, or run it with --cross-namespace=allow)"
	}
	return msg
}

// proxyCounts are the connected proxies and those at the served version.
func proxyCounts(in *Inputs) (connected, synced int) { return in.Feedback.Connected(in.Version) }

// ready says whether the accepted spec of this generation is served and
// every connected proxy, if any, ACKed it. It is never True while Accepted
// is not: kstatus reads Ready=True as Current.
func ready(in *Inputs) condition {
	if a := accepted(in); a.status == metav1.ConditionFalse {
		return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonNotAccepted, fmt.Sprintf("Accepted is False (%s): %s", a.reason, a.message)}
	}
	if !in.current() {
		return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonSnapshotNotBuilt, fmt.Sprintf("the snapshot of generation %d is not built yet", in.Generation)}
	}
	connected, synced := proxyCounts(in)
	msg := fmt.Sprintf("%d of %d proxies at version %s", synced, connected, in.Version)
	switch {
	case connected == 0:
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonNoProxies, fmt.Sprintf("version %s is built and served; no proxy is connected yet", in.Version)}
	case synced == connected:
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonSynced, msg}
	}
	return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonPending, msg}
}

// degraded says whether a proxy rejects the configuration, a resource of
// a selected Service cannot be served, the bootstrap ConfigMap's name is
// taken, a replica's feedback of the scope cannot be written, or proxies
// keep knocking with the other protocol, in that order; the second value is how long until a
// WrongProtocol verdict expires (0 when none applies), for a re-check.
func degraded(in *Inputs) (condition, time.Duration) {
	if f := &in.Feedback; f.NackingCount > 0 {
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed, nackMessage(f.NACKs, f.Nacking, f.NackingCount)}, 0
	}
	if held := in.Resolution.Unservable; len(held) > 0 {
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonUnservableResource, unservableMessage(held)}, 0
	}
	if r := &in.Resolution; in.current() && len(r.RefusedNamespaces) > 0 {
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted, refusedMessage(r)}, 0
	}
	if in.BootstrapConflict != "" {
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonBootstrapConfigMapConflict, in.BootstrapConflict}, 0
	}
	if len(in.Unreported) > 0 {
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonFeedbackNotReported,
			"the proxies' feedback of some replicas cannot be written, so their proxies are counted as last reported: " + strings.Join(in.Unreported, "; ")}, 0
	}
	if advice, left := wrongProtocol(in); advice != "" {
		return condition{metav1.ConditionTrue, xdsv1alpha1.ReasonWrongProtocol,
			fmt.Sprintf("%d streams refused so far: %s", in.Feedback.Refused[feedback.RefusedWrongProto], advice)}, left
	}
	return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected, "no proxy rejects the configuration"}, 0
}

// wrongProtocol returns the advice for the kinds of clients (proxies, gRPC
// clients) refused for their protocol that have not come back on the right
// one, and how long until the first verdict expires; "" when none stands.
//
// A kind's verdict stands for wrongProtocolMemory after its last refusal,
// so clients that keep retrying keep it, unless a client of that kind was
// admitted since: the refused clients came back on the right protocol (the
// scope's protocol was changed, or their bootstrap fixed), and advice to
// change it further would be stale. The advice follows the kind: a proxy
// chooses its protocol in its bootstrap's api_type, a gRPC client speaks
// State of the World only and cannot, so it is told the scope's protocol.
func wrongProtocol(in *Inputs) (string, time.Duration) {
	f := &in.Feedback
	var advice []string
	var left time.Duration
	stands := func(key, kind string) bool {
		last := f.LastRefused[key]
		if last.IsZero() || f.LastAdmitted[kind].After(last) {
			return false
		}
		l := wrongProtocolMemory - in.Now.Sub(last)
		if l <= 0 {
			return false
		}
		if left == 0 || l < left {
			left = l
		}
		return true
	}
	grpcKind := stands(feedback.WrongProtocolKey(feedback.KindGRPC), feedback.KindGRPC)
	proxyKind := stands(feedback.WrongProtocolKey(feedback.KindProxy), feedback.KindProxy)
	if !grpcKind && !proxyKind && f.LastRefused[feedback.WrongProtocolKey(feedback.KindGRPC)].IsZero() &&
		f.LastRefused[feedback.WrongProtocolKey(feedback.KindProxy)].IsZero() {
		// Recorded without a kind (a replica of an older release): the
		// proxy advice, as then, on a scope of proxies; the gRPC one on a
		// ProxylessGRPC scope, whose clients are gRPC.
		if in.Mode == model.ListenerProxylessGRPC {
			grpcKind = stands(feedback.RefusedWrongProto, feedback.KindGRPC)
		} else {
			proxyKind = stands(feedback.RefusedWrongProto, feedback.KindProxy)
		}
	}
	if grpcKind {
		if in.Protocol == model.Delta {
			advice = append(advice, "gRPC clients naming this scope were refused: every gRPC xDS client speaks State of the World only and cannot change that, so set the scope's spec.protocol: SotW")
		} else {
			advice = append(advice, "gRPC clients naming this scope were refused while it served Delta; spec.protocol is SotW now, and they are served when they reconnect (gRPC backs off up to 2 minutes)")
		}
	}
	if proxyKind {
		advice = append(advice, fmt.Sprintf("proxies naming this scope use the other protocol; set api_type: %s in their ADS config (spec.protocol is %s)",
			in.Protocol.APIType(), in.Protocol))
	}
	return strings.Join(advice, "; "), left
}

// stalled says whether the scope cannot make progress without a change:
// kstatus reads Stalled=True as Failed. An invalid spec must be edited; a
// proxy that rejects what it is served keeps rejecting until the
// configuration (or the proxy) changes. Everything else that is not Ready
// is progress under way (InProgress): a generation being built, proxies
// catching up, a namespace or Services that do not exist yet.
func stalled(in *Inputs, nacked condition) condition {
	if a := accepted(in); a.reason == xdsv1alpha1.ReasonInvalidSelector {
		return condition{metav1.ConditionTrue, a.reason, a.message}
	}
	if nacked.reason == xdsv1alpha1.ReasonProxyNACKed {
		return condition{metav1.ConditionTrue, nacked.reason, nacked.message}
	}
	return condition{metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected, "the scope is served or on its way"}
}

// nackMessage names the newest rejection of a proxy that is still NACKing,
// of the count rejecting: nacking holds (some of) their cut node ids, as a
// NACK names its proxy (feedback.NodeID).
func nackMessage(nacks []feedback.NACK, nacking []string, count int) string {
	for _, n := range nacks { // newest first
		if slices.Contains(nacking, n.Node) {
			who := n.Node
			if n.Peer != "" {
				who += " at " + n.Peer // gRPC clients of a scope share the node id
			}
			msg := fmt.Sprintf("proxy %s rejected %s version %s: %s", who, n.TypeURL, n.Version, n.Detail)
			if count > 1 {
				msg += fmt.Sprintf(" (%d proxies are rejecting configuration)", count)
			}
			return msg
		}
	}
	return fmt.Sprintf("%d proxies are rejecting configuration", count)
}

// maxUnservableNamed is how many held-back resources the Degraded message
// names; the rest are counted.
const maxUnservableNamed = 5

// unservableMessage names the held-back resources, each with its Service
// and why it cannot be served.
func unservableMessage(held []snapshot.Unservable) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d resources cannot be served and are held back (proxies keep their previous version, if they had one; the rest is served): ", len(held))
	for i, u := range held[:min(len(held), maxUnservableNamed)] {
		if i > 0 {
			b.WriteString("; ")
		}
		owner := "the scope's"
		if u.Service != (model.Key{}) {
			owner = "Service " + u.Service.String() + ":"
		}
		fmt.Fprintf(&b, "%s %s %s: %s", owner, u.Type, u.Name, u.Reason)
	}
	if n := len(held) - maxUnservableNamed; n > 0 {
		fmt.Fprintf(&b, "; and %d more", n)
	}
	return b.String()
}

// compute returns the status a scope should have, starting from prev; the
// duration is when to compute it again even if nothing signals (0: never).
// It is a pure function of its arguments.
func compute(prev *xdsv1alpha1.ProxyScopeStatus, in *Inputs) (xdsv1alpha1.ProxyScopeStatus, time.Duration) {
	st := *prev.DeepCopy()
	st.BootstrapConfigMap = bootstrap.ConfigMapName(in.Name)
	if in.BootstrapConflict != "" || in.NoBootstrapConfigMap {
		st.BootstrapConfigMap = ""
	}
	set := func(typ string, c condition) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: c.status, Reason: c.reason, Message: c.message, ObservedGeneration: in.Generation})
	}
	set(xdsv1alpha1.ConditionAccepted, accepted(in))
	set(xdsv1alpha1.ConditionReady, ready(in))
	if in.rejected() || in.current() {
		st.ObservedGeneration = in.Generation
	}
	if !in.current() {
		set(xdsv1alpha1.ConditionStalled, stalled(in, condition{}))
		return st, 0
	}
	r := &in.Resolution
	st.SelectedServices, st.Clusters, st.Endpoints = int32(r.SelectedServices), int32(r.Clusters), int32(r.Endpoints)
	st.Routes = nil
	if r.Routes > 0 || r.RouteBackends > 0 || len(r.RoutesNotAccepted) > 0 {
		st.Routes = &xdsv1alpha1.RoutesStatus{Attached: int32(r.Routes), Backends: int32(r.RouteBackends), NotAccepted: r.RoutesNotAccepted[:min(len(r.RoutesNotAccepted), 8)]}
	}
	// The time of the change that made the version: a new leader, which
	// built the same version again, keeps the one its predecessor wrote.
	if !in.RevTime.IsZero() && (prev.Version != in.Version || prev.LastPushTime == nil) {
		t := metav1.NewTime(in.RevTime.Truncate(time.Second))
		st.LastPushTime = &t
	}
	st.Version = in.Version
	connected, synced := proxyCounts(in)
	st.ConnectedProxies, st.SyncedProxies = ptr.To(int32(connected)), int32(synced)
	st.RefusedStreams = 0
	for _, n := range in.Feedback.Refused {
		st.RefusedStreams += n
	}
	st.RecentNACKs = nil
	for _, n := range in.Feedback.NACKs {
		st.RecentNACKs = append(st.RecentNACKs, xdsv1alpha1.ProxyNACK{
			Node: n.Node, Peer: n.Peer, Identity: n.Identity, Zone: n.Zone, TypeURL: n.TypeURL, Version: n.Version, Detail: n.Detail, Time: metav1.NewTime(n.Time.Truncate(time.Second)),
		})
	}
	d, recheck := degraded(in)
	set(xdsv1alpha1.ConditionDegraded, d)
	set(xdsv1alpha1.ConditionStalled, stalled(in, d))
	var roll, ends time.Duration
	held := st.Cost
	st.Cost, roll = cost(prev.Cost, in)
	if st.Cost == nil && held != nil {
		if left := costHeld(in); left > 0 {
			st.Cost = held
			if roll == 0 || left < roll {
				roll = left
			}
		}
	}
	st.ProtocolTransition, ends = transition(in)
	if held != nil && st.Cost != nil {
		// The cost alone may change the status once per refresh; any
		// other change brings it up to date in the same write.
		if due, next := costDue(in); !due {
			fresh := st.Cost
			st.Cost = held
			if equality.Semantic.DeepEqual(&st, prev) {
				roll = next
			} else {
				st.Cost = fresh
			}
		}
	}
	for _, d := range []time.Duration{roll, ends} {
		if d > 0 && (recheck == 0 || d < recheck) {
			recheck = d
		}
	}
	return st, recheck
}

// transition reports a change of protocol in progress: the previous
// protocol, until when it is served, and how many of its proxies are still
// connected; and when to look again (when it ends).
func transition(in *Inputs) (*xdsv1alpha1.ProtocolTransition, time.Duration) {
	tr := in.Transition
	if tr == nil || !in.Now.Before(tr.Until) {
		return nil, 0
	}
	return &xdsv1alpha1.ProtocolTransition{
		From: xdsv1alpha1.Protocol(tr.From), Until: metav1.NewTime(tr.Until.Truncate(time.Second)), Proxies: int32(in.Feedback.Speaking(tr.From)),
	}, tr.Until.Sub(in.Now) + time.Second
}
