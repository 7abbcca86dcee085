// Package replicafeedback carries every replica's proxy feedback to the
// leader, which alone writes ProxyScope status: each replica publishes
// what its proxies said, counted per scope (feedback.Summary), in
// ConfigMaps of its own namespace (a manifest and the parts it names, see
// parts.go), and the leader merges those of the live replicas with its own.
//
// A few objects per replica, written at most once a second and only when
// they changed (or, the manifest alone, to say the replica is alive), keep
// the API writes bounded by the number of replicas, not of proxies or
// pushes: under endpoint churn a replica writes once a second, idle once a
// heartbeat. A replica that stops deletes its ConfigMaps; one that dies
// without a word drops out when its heartbeat is not seen for Expiry, and
// its ConfigMaps go with its Pod, which owns them.
package replicafeedback

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Label marks the feedback ConfigMaps; its value is the replica's name.
const Label = "xds.scopeplane.dev/replica-feedback"

// ShardLabel marks, with shards, the feedback ConfigMaps of a shard's
// replicas; its value is the shard's number (Replica.Shard).
const ShardLabel = "xds.scopeplane.dev/replica-feedback-shard"

// ShardsLabel marks, with shards, the feedback ConfigMaps with the shard
// count of their replica (Replica.Shards), so that a change of the count
// rolling out, whose replicas of both counts run at once, can be seen.
const ShardsLabel = "xds.scopeplane.dev/replica-feedback-shards"

// RenewedAnnotation is when the replica last said it is alive (RFC 3339):
// a heartbeat must change the object, or the API server drops the write as
// a no-op and nobody sees it.
const RenewedAnnotation = "xds.scopeplane.dev/renewed"

// ConfigMapName is the feedback ConfigMap of replica: its manifest.
func ConfigMapName(replica string) string { return "scopeplane-feedback-" + replica }

// report is the encoded form of a replica's Summaries: its own, stable
// field names, so replicas of neighbouring versions read each other's
// reports during a rolling update.
type report struct {
	Scopes map[string]*scope `json:"scopes"`
}

type scope struct {
	Proxies      []proxies        `json:"proxies,omitempty"`
	Nacking      []string         `json:"nacking,omitempty"`
	NackingCount int              `json:"nackingCount,omitempty"`
	Refused      map[string]int64 `json:"refused,omitempty"`
	LastRefused  map[string]int64 `json:"lastRefused,omitempty"` // Unix ms
	// LastAdmitted is when a stream of each client kind was last bound to
	// the scope (Unix ms), so a kind that came back on the right protocol
	// clears its wrong-protocol verdict on the leader too.
	LastAdmitted map[string]int64 `json:"lastAdmitted,omitempty"`
	NACKs        []nack           `json:"nacks,omitempty"`
	LastPush     int64            `json:"lastPush,omitempty"` // Unix ms
	Cost         cost             `json:"cost"`
	// UsageAll says some proxy asked for every Service, or that the
	// Services asked for were left out to keep the report small: either
	// way no Service can be called unused.
	UsageAll bool     `json:"usageAll,omitempty"`
	Services []string `json:"services,omitempty"`
}

type proxies struct {
	Version  string `json:"version"`
	Protocol string `json:"protocol"`
	Count    int    `json:"count"`
}

type nack struct {
	Node     string `json:"node"`
	Peer     string `json:"peer,omitempty"`
	Identity string `json:"identity,omitempty"`
	Zone     string `json:"zone,omitempty"`
	TypeURL  string `json:"typeURL"`
	Version  string `json:"version"`
	Detail   string `json:"detail"`
	Time     int64  `json:"time"` // Unix ms
}

type cost struct {
	Pushes            int64 `json:"pushes,omitempty"`
	Bytes             int64 `json:"bytes,omitempty"`
	OtherBytes        int64 `json:"otherBytes,omitempty"`
	Connects          int64 `json:"connects,omitempty"`
	ConnectBytes      int64 `json:"connectBytes,omitempty"`
	ConnectOtherBytes int64 `json:"connectOtherBytes,omitempty"`
	NACKs             int64 `json:"nacks,omitempty"`
	HeldBack          int64 `json:"heldBack,omitempty"`
	OtherHeldBack     int64 `json:"otherHeldBack,omitempty"`
	SpanMs            int64 `json:"spanMs,omitempty"`
	BucketMs          int64 `json:"bucketMs,omitempty"`
	Pending           bool  `json:"pending,omitempty"`
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func toWire(s *feedback.Summary, services bool, nacks int) *scope {
	w := &scope{Nacking: s.Nacking, NackingCount: s.NackingCount, Refused: s.Refused, LastPush: millis(s.LastPush), UsageAll: s.Usage.All}
	for _, c := range s.Proxies {
		w.Proxies = append(w.Proxies, proxies{Version: c.AtVersion, Protocol: string(c.Protocol), Count: c.Count})
	}
	if len(s.LastRefused) > 0 {
		w.LastRefused = make(map[string]int64, len(s.LastRefused))
		for k, v := range s.LastRefused {
			w.LastRefused[k] = millis(v)
		}
	}
	if len(s.LastAdmitted) > 0 {
		w.LastAdmitted = make(map[string]int64, len(s.LastAdmitted))
		for k, v := range s.LastAdmitted {
			w.LastAdmitted[k] = millis(v)
		}
	}
	for _, n := range s.NACKs[:min(len(s.NACKs), nacks)] {
		w.NACKs = append(w.NACKs, nack{Node: n.Node, Peer: n.Peer, Identity: n.Identity, Zone: n.Zone, TypeURL: n.TypeURL, Version: n.Version, Detail: n.Detail, Time: millis(n.Time)})
	}
	c := &s.Cost
	w.Cost = cost{
		Pushes: c.Pushes, Bytes: c.Bytes, OtherBytes: c.OtherBytes, Connects: c.Connects, ConnectBytes: c.ConnectBytes, ConnectOtherBytes: c.ConnectOtherBytes,
		NACKs: c.NACKs, HeldBack: c.HeldBack, OtherHeldBack: c.OtherHeldBack,
		SpanMs: c.Span.Milliseconds(), BucketMs: c.Bucket.Milliseconds(), Pending: c.Pending,
	}
	if !s.Usage.All {
		if services {
			for svc := range s.Usage.Services {
				w.Services = append(w.Services, svc.String())
			}
			slices.Sort(w.Services) // the same report, byte for byte, when nothing changed
		} else {
			w.UsageAll = true
		}
	}
	return w
}

func (w *scope) summary() feedback.Summary {
	s := feedback.Summary{Nacking: w.Nacking, NackingCount: w.NackingCount, Refused: w.Refused, LastRefused: map[string]time.Time{},
		LastPush: fromMillis(w.LastPush), Usage: feedback.Usage{All: w.UsageAll}}
	if s.Refused == nil {
		s.Refused = map[string]int64{}
	}
	for _, c := range w.Proxies {
		s.Proxies = append(s.Proxies, feedback.ProxyCount{AtVersion: c.Version, Protocol: model.Protocol(c.Protocol), Count: c.Count})
	}
	for k, v := range w.LastRefused {
		s.LastRefused[k] = fromMillis(v)
	}
	if len(w.LastAdmitted) > 0 {
		s.LastAdmitted = make(map[string]time.Time, len(w.LastAdmitted))
		for k, v := range w.LastAdmitted {
			s.LastAdmitted[k] = fromMillis(v)
		}
	}
	for _, n := range w.NACKs {
		s.NACKs = append(s.NACKs, feedback.NACK{Node: n.Node, Peer: n.Peer, Identity: n.Identity, Zone: n.Zone, TypeURL: n.TypeURL, Version: n.Version, Detail: n.Detail, Time: fromMillis(n.Time)})
	}
	c := &w.Cost
	s.Cost = feedback.CostWindow{
		Cost: feedback.Cost{Pushes: c.Pushes, Bytes: c.Bytes, OtherBytes: c.OtherBytes, Connects: c.Connects, ConnectBytes: c.ConnectBytes,
			ConnectOtherBytes: c.ConnectOtherBytes, NACKs: c.NACKs, HeldBack: c.HeldBack, OtherHeldBack: c.OtherHeldBack},
		Span: time.Duration(c.SpanMs) * time.Millisecond, Bucket: time.Duration(c.BucketMs) * time.Millisecond, Pending: c.Pending,
	}
	for _, name := range w.Services {
		if ns, n, ok := strings.Cut(name, "/"); ok {
			if s.Usage.Services == nil {
				s.Usage.Services = map[model.Key]bool{}
			}
			s.Usage.Services[model.Key{Namespace: ns, Name: n}] = true
		}
	}
	return s
}

// encode renders the Summaries of a replica's scopes. Past limit bytes
// (none when 0) it drops, in turn, the Services asked for (so no Service
// is called unused) and all but each scope's newest NACK: counts, versions
// and costs always stay whole.
func encode(scopes map[model.Key]feedback.Summary, limit int) ([]byte, error) {
	var out []byte
	for _, thin := range []struct {
		services bool
		nacks    int
	}{{true, feedback.MaxNACKs}, {false, feedback.MaxNACKs}, {false, 1}} {
		r := report{Scopes: make(map[string]*scope, len(scopes))}
		for key, s := range scopes {
			r.Scopes[key.String()] = toWire(&s, thin.services, thin.nacks)
		}
		var err error
		if out, err = json.Marshal(&r); err != nil {
			return nil, err
		}
		if limit == 0 || len(out) <= limit {
			return out, nil
		}
	}
	return nil, fmt.Errorf("the feedback of %d scopes takes %d bytes even without Services and older NACKs, more than a part holds (%d)", len(scopes), len(out), limit)
}

// decode reads a report; a scope name it cannot read is an error, as is
// any damage to the JSON.
func decode(data string) (map[model.Key]feedback.Summary, error) {
	var r report
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return nil, err
	}
	out := make(map[model.Key]feedback.Summary, len(r.Scopes))
	for name, w := range r.Scopes {
		ns, n, ok := strings.Cut(name, "/")
		if !ok || ns == "" || n == "" || w == nil {
			return nil, fmt.Errorf("scope %q is not namespace/name", name)
		}
		out[model.Key{Namespace: ns, Name: n}] = w.summary()
	}
	return out, nil
}
