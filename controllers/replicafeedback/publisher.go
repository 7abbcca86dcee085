package replicafeedback

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
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
}

func (r *Replica) interval() time.Duration  { return cmp.Or(r.Interval, DefaultInterval) }
func (r *Replica) heartbeat() time.Duration { return cmp.Or(r.Heartbeat, DefaultHeartbeat) }

// Publisher writes this replica's feedback to its ConfigMap. It runs on
// every replica, the leader too (so that the next leader has it at once).
type Publisher struct {
	Client   client.Client
	Feedback *feedback.Tracker
	Replica  Replica
	Log      logr.Logger
	// last is the report last written, and written when.
	last    []byte
	written time.Time
}

var _ manager.LeaderElectionRunnable = (*Publisher)(nil)

// NeedLeaderElection is false: every replica publishes.
func (*Publisher) NeedLeaderElection() bool { return false }

// Start publishes until ctx ends, then deletes the ConfigMap: a replica
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
				p.last = nil // write it whole next time
			}
		}
	}
}

func (p *Publisher) key() types.NamespacedName {
	return types.NamespacedName{Namespace: p.Replica.Namespace, Name: ConfigMapName(p.Replica.Name)}
}

// publish writes the report when it changed or a heartbeat is due.
func (p *Publisher) publish(ctx context.Context, now time.Time) error {
	scopes := map[model.Key]feedback.Summary{}
	for _, key := range p.Feedback.Scopes() {
		// A scope with nothing to say is left out: one that was deleted,
		// or whose proxies went and whose window emptied, costs nothing.
		if s := p.Feedback.Summary(key); len(s.Proxies) > 0 || len(s.Refused) > 0 || len(s.NACKs) > 0 || s.Cost.Cost != (feedback.Cost{}) || s.Cost.Pending {
			scopes[key] = s
		}
	}
	data, err := encode(scopes)
	if err != nil {
		return err
	}
	if bytes.Equal(data, p.last) && now.Sub(p.written) < p.Replica.heartbeat() {
		return nil
	}
	cm := p.configMap(data, now)
	err = p.Client.Update(ctx, cm)
	if apierrors.IsNotFound(err) {
		err = p.Client.Create(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("writing ConfigMap %s: %w", p.key(), err)
	}
	metrics.FeedbackWrites.WithLabelValues("ok").Inc()
	p.last, p.written = data, now
	return nil
}

// configMap is the replica's ConfigMap holding data. It is written without
// a resourceVersion: only this replica writes it, so the last write wins.
func (p *Publisher) configMap(data []byte, now time.Time) *corev1.ConfigMap {
	key := p.key()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: key.Namespace, Name: key.Name,
			Labels:      map[string]string{Label: p.Replica.Name},
			Annotations: map[string]string{RenewedAnnotation: now.UTC().Format(time.RFC3339Nano)},
		},
		Data: map[string]string{DataKey: string(data)},
	}
	if p.Replica.PodUID != "" {
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Replica.Name, UID: p.Replica.PodUID, Controller: ptr.To(true)}}
	}
	return cm
}

// remove deletes the ConfigMap, within a few seconds of the stop.
func (p *Publisher) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p.Replica.Namespace, Name: ConfigMapName(p.Replica.Name)}}
	if err := client.IgnoreNotFound(p.Client.Delete(ctx, cm)); err != nil {
		p.Log.Error(err, "deleting this replica's feedback ConfigMap on stop; the leader drops it when its heartbeat expires", "configmap", p.key())
	}
}
