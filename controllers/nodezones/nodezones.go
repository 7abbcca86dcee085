// Package nodezones tells the topology zone of each Kubernetes Node, so that
// the ADS server can place a proxy whose token names the Node its pod runs
// on (xds/server's Zones).
//
// It watches Nodes' metadata only: a Node object carries its status (images,
// conditions, addresses), tens of kilobytes each, of which the zone label is
// all that is needed here.
package nodezones

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Zones reads Nodes' zone labels from a cache of their metadata.
type Zones struct {
	reader client.Reader
	synced func() bool
}

// New registers a metadata-only informer of Nodes with c and returns what
// reads their zones from it.
func New(ctx context.Context, c cache.Cache) (*Zones, error) {
	inf, err := c.GetInformer(ctx, nodeMeta())
	if err != nil {
		return nil, fmt.Errorf("watching Nodes' metadata: %w", err)
	}
	return &Zones{reader: c, synced: inf.HasSynced}, nil
}

func nodeMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return m
}

// Zone is the Node's topology.kubernetes.io/zone label; ok is false when
// the Node is not in the cache or has no such label. It never waits: until
// the Nodes are listed, no zone is known (a proxy is placed when it
// connects, and a cache read would wait for the list).
func (z *Zones) Zone(node string) (string, bool) {
	if !z.synced() {
		return "", false
	}
	m := nodeMeta()
	if err := z.reader.Get(context.Background(), client.ObjectKey{Name: node}, m); err != nil {
		return "", false
	}
	zone, ok := m.Labels[corev1.LabelTopologyZone]
	return zone, ok && zone != ""
}
