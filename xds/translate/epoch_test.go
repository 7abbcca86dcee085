package translate

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/scopeplane/scopeplane/xds/model"
)

// grpcJSClusterFields are the Cluster fields grpc-js-xds 1.14 reads when it
// parses a cluster (its ClusterResourceType.validateResource): the parsed
// value it compares with its cached copy, to ignore an equal one, holds
// nothing else. The metadata is not among them.
var grpcJSClusterFields = map[protoreflect.Name]bool{
	"name": true, "type": true, "cluster_type": true, "eds_cluster_config": true,
	"load_assignment": true, "lb_policy": true, "load_balancing_policy": true,
	"ring_hash_lb_config": true, "lrs_server": true, "outlier_detection": true,
	"transport_socket": true, "circuit_breakers": true,
}

// asGRPCJSParses is c reduced to the fields grpc-js-xds parses.
func asGRPCJSParses(c *clusterv3.Cluster) *clusterv3.Cluster {
	out := proto.Clone(c).(*clusterv3.Cluster)
	m := out.ProtoReflect()
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !grpcJSClusterFields[fd.Name()] {
			m.Clear(fd)
		}
		return true
	})
	return out
}

// TestEpochReachesWhatGRPCJSParses checks that the clusters of a Stamped
// scope differ between two generations in a field grpc-js-xds parses, so
// that a running grpc-js-xds client takes a re-added Service's cluster
// instead of ignoring it as equal to the copy it cached before the
// removal; and that the clusters differ in nothing else.
func TestEpochReachesWhatGRPCJSParses(t *testing.T) {
	scope, services := loadCase(t, "proxyless")
	at := func(gen int64) []*clusterv3.Cluster {
		sc := *scope
		sc.Generation = gen
		return Translate(&sc, services).Clusters
	}
	before, after := at(4), at(6)
	if len(before) == 0 || len(before) != len(after) {
		t.Fatalf("%d clusters at generation 4, %d at 6", len(before), len(after))
	}
	for i := range before {
		b, a := before[i], after[i]
		if proto.Equal(asGRPCJSParses(b), asGRPCJSParses(a)) {
			t.Errorf("cluster %s: what grpc-js-xds parses of it is the same at generations 4 and 6", b.GetName())
		}
		b, a = proto.Clone(b).(*clusterv3.Cluster), proto.Clone(a).(*clusterv3.Cluster)
		b.Metadata, a.Metadata = nil, nil
		b.OutlierDetection, a.OutlierDetection = nil, nil
		if !proto.Equal(b, a) {
			t.Errorf("cluster %s: differs between generations beyond its epoch:\n%v\n%v", b.GetName(), b, a)
		}
	}
}

// TestEpochSeconds checks that every generation makes a valid, positive
// Duration (gRPC clients NACK an invalid one), equal to the generation
// for every generation a ProxyScope can reach.
func TestEpochSeconds(t *testing.T) {
	for _, c := range []struct{ gen, want int64 }{
		{1, 1},
		{42, 42},
		{maxDurationSeconds, maxDurationSeconds},
		{0, maxDurationSeconds},
		{maxDurationSeconds + 5, 5},
		{-1, maxDurationSeconds - 1},
	} {
		sc := &model.Scope{Generation: c.gen, Listener: model.Listener{Mode: model.ListenerProxylessGRPC}}
		od := epochOutlierDetection(sc)
		if got := od.GetMaxEjectionTime().GetSeconds(); got != c.want {
			t.Errorf("generation %d: max_ejection_time %ds, want %ds", c.gen, got, c.want)
		}
		if err := od.ValidateAll(); err != nil {
			t.Errorf("generation %d: %v", c.gen, err)
		}
		if err := od.GetMaxEjectionTime().CheckValid(); err != nil {
			t.Errorf("generation %d: %v", c.gen, err)
		}
	}
}
