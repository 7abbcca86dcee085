package replicafeedback

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Timings, when Replica leaves them zero: a replica writes at most once an
// Interval, says it is alive once a Heartbeat, and is dropped from the
// counts when no write of it was seen for Expiry (two and a half
// heartbeats: one lost write does not drop a live replica).
const (
	DefaultInterval  = time.Second
	DefaultHeartbeat = 10 * time.Second
	DefaultExpiry    = 25 * time.Second
)

// Replica names this replica among the others.
type Replica struct {
	// Name is unique among the replicas: the Pod's name.
	Name string
	// Namespace holds the feedback ConfigMaps: the Pod's.
	Namespace string
	// PodUID, when set, makes the Pod the owner of the replica's
	// ConfigMap, so that it goes when the Pod does.
	PodUID types.UID
	// Interval, Heartbeat and Expiry are the timings (the defaults when
	// zero).
	Interval, Heartbeat, Expiry time.Duration
	// Shard, with shards, is the replica's shard (its number): its
	// ConfigMaps carry it (ShardLabel), and its collector reads only its
	// own shard's, whose replicas alone serve the shard's scopes. Empty
	// unsharded.
	Shard string
	// Shards, with shards, is the shard count the replica runs with: its
	// ConfigMaps carry it (ShardsLabel). Empty unsharded.
	Shards string
}

func (r *Replica) interval() time.Duration  { return cmp.Or(r.Interval, DefaultInterval) }
func (r *Replica) heartbeat() time.Duration { return cmp.Or(r.Heartbeat, DefaultHeartbeat) }

// Publisher writes this replica's feedback to its ConfigMaps (a manifest
// and its parts, see parts.go). It runs on every replica, the leader too
// (so that the next leader has it at once).
type Publisher struct {
	Client   client.Client
	Feedback *feedback.Tracker
	Replica  Replica
	Log      logr.Logger
	// written is the digest each part last wrote ("" for none yet), and
	// failed why its current content could not be written; their length
	// is the number of parts.
	written, failed []string
	// manifest is the manifest last written, and renewed when.
	manifest []byte
	renewed  time.Time
	// report is the report last encoded.
	report *split
}

var _ manager.LeaderElectionRunnable = (*Publisher)(nil)

// NeedLeaderElection is false: every replica publishes.
func (*Publisher) NeedLeaderElection() bool { return false }

// Start publishes until ctx ends, then deletes the ConfigMaps: a replica
// that stops takes its proxies, whose streams end with it, out of the
// counts at once.
func (p *Publisher) Start(ctx context.Context) error {
	tick := time.NewTicker(p.Replica.interval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			p.remove()
			return nil
		case now := <-tick.C:
			if err := p.publish(ctx, now); err != nil && ctx.Err() == nil {
				metrics.FeedbackWrites.WithLabelValues("error").Inc()
				p.Log.Error(err, "publishing this replica's proxy feedback; retrying", "configmap", p.key())
			}
		}
	}
}

func (p *Publisher) key() types.NamespacedName {
	return types.NamespacedName{Namespace: p.Replica.Namespace, Name: ConfigMapName(p.Replica.Name)}
}

// maxFailure bounds the reason a part could not be written, as the
// manifest carries it to the leader's status.
const maxFailure = 256

// publish writes the parts that changed, then the manifest when it changed
// or a heartbeat is due.
func (p *Publisher) publish(ctx context.Context, now time.Time) error {
	scopes := map[model.Key]feedback.Summary{}
	for _, key := range p.Feedback.Scopes() {
		// A scope with nothing to say is left out: one that was deleted,
		// or whose proxies went and whose window emptied, costs nothing.
		if s := p.Feedback.Summary(key); len(s.Proxies) > 0 || len(s.Refused) > 0 || len(s.NACKs) > 0 || s.Cost.Cost != (feedback.Cost{}) || s.Cost.Pending {
			scopes[key] = s
		}
	}
	var errs []error
	var parts []encodedPart
	report, err := splitReport(scopes, p.report)
	if err == nil {
		p.report, parts = report, report.parts
	} else {
		// Nothing new can be written: every part keeps what it said,
		// and the manifest says why.
		errs = append(errs, err)
		if len(p.written) == 0 {
			p.written, p.failed = []string{""}, []string{""}
		}
		for i := range p.failed {
			p.failed[i] = feedback.Cut(err.Error(), maxFailure, maxFailure)
		}
	}
	if len(parts) > len(p.written) {
		// More parts: every scope may move to another one, so no part
		// holds what the new manifest will say until it is rewritten.
		p.written, p.failed = make([]string, len(parts)), make([]string, len(parts))
	}
	wrote := false
	for i, part := range parts {
		if part.digest == p.written[i] {
			continue
		}
		if err := p.write(ctx, p.partConfigMap(i, part.gz)); err != nil {
			errs = append(errs, err)
			p.failed[i] = feedback.Cut(err.Error(), maxFailure, maxFailure)
			continue
		}
		p.written[i], p.failed[i], wrote = part.digest, "", true
	}
	m := manifest{Parts: make([]manifestPart, len(p.written))}
	for i := range p.written {
		m.Parts[i] = manifestPart{Digest: p.written[i], Failed: p.failed[i]}
	}
	data, err := json.Marshal(&m)
	if err != nil {
		return err
	}
	if wrote || !bytes.Equal(data, p.manifest) || now.Sub(p.renewed) >= p.Replica.heartbeat() {
		if err := p.write(ctx, p.manifestConfigMap(data, now)); err != nil {
			p.manifest = nil // write it next time
			return errors.Join(append(errs, err)...)
		}
		p.manifest, p.renewed = data, now
		if len(errs) == 0 {
			metrics.FeedbackWrites.WithLabelValues("ok").Inc()
		}
	}
	metrics.FeedbackParts.Set(float64(len(p.written)))
	return errors.Join(errs...)
}

// write updates cm, or creates it. It is written without a
// resourceVersion: only this replica writes it, so the last write wins.
func (p *Publisher) write(ctx context.Context, cm *corev1.ConfigMap) error {
	err := p.Client.Update(ctx, cm)
	if apierrors.IsNotFound(err) {
		err = p.Client.Create(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("writing ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

// manifestConfigMap is the replica's ConfigMap holding the manifest.
func (p *Publisher) manifestConfigMap(data []byte, now time.Time) *corev1.ConfigMap {
	cm := p.configMap(ConfigMapName(p.Replica.Name))
	cm.Annotations = map[string]string{RenewedAnnotation: now.UTC().Format(time.RFC3339Nano)}
	cm.Data = map[string]string{ManifestKey: string(data)}
	return cm
}

// partConfigMap is the ConfigMap of part i, holding gz.
func (p *Publisher) partConfigMap(i int, gz []byte) *corev1.ConfigMap {
	cm := p.configMap(PartName(p.Replica.Name, i))
	cm.Labels[PartLabel] = strconv.Itoa(i)
	cm.BinaryData = map[string][]byte{PartKey: gz}
	return cm
}

func (p *Publisher) configMap(name string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p.Replica.Namespace, Name: name, Labels: map[string]string{Label: p.Replica.Name}}}
	if p.Replica.Shard != "" {
		cm.Labels[ShardLabel] = p.Replica.Shard
	}
	if p.Replica.Shards != "" {
		cm.Labels[ShardsLabel] = p.Replica.Shards
	}
	if p.Replica.PodUID != "" {
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Replica.Name, UID: p.Replica.PodUID, Controller: ptr.To(true)}}
	}
	return cm
}

// remove deletes the manifest, which takes the replica out of the counts,
// then the parts, within a few seconds of the stop. Parts a replica of the
// same name left behind when it died go with its Pod, which owns them;
// no manifest names them meanwhile, so they are never read.
func (p *Publisher) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	names := []string{ConfigMapName(p.Replica.Name)}
	for i := range p.written {
		names = append(names, PartName(p.Replica.Name, i))
	}
	for _, name := range names {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p.Replica.Namespace, Name: name}}
		if err := client.IgnoreNotFound(p.Client.Delete(ctx, cm)); err != nil {
			p.Log.Error(err, "deleting this replica's feedback ConfigMap on stop; the leader drops it when its heartbeat expires", "configmap", name)
		}
	}
}
