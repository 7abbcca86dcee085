package convert

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/randfill"
)

// filledObjects is a Service and its EndpointSlices with every field of
// every struct filled with random values, then made plausible where
// Service would otherwise ignore them (addresses that parse, the known
// address types, a service type that is sometimes ExternalName), so that a
// field Service reads and StripService drops changes the model.
func filledObjects(seed int64) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	f := randfill.NewWithSeed(seed).NilChance(0.1).NumElements(1, 3).Funcs(
		func(v *intstr.IntOrString, c randfill.Continue) {
			if c.Bool() {
				*v = intstr.FromInt32(c.Int31())
			} else {
				*v = intstr.FromString(c.String(8))
			}
		},
	)
	svc := &corev1.Service{}
	f.Fill(svc)
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	if seed%5 == 0 {
		svc.Spec.Type = corev1.ServiceTypeExternalName
	}
	addrs := []string{"10.0.0.1", "10.0.0.2", "fd00::1", "2001:db8::2"}
	var slices []*discoveryv1.EndpointSlice
	for i := range 1 + seed%3 {
		s := &discoveryv1.EndpointSlice{}
		f.Fill(s)
		s.AddressType = []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}[(seed+i)%2]
		for j := range s.Endpoints {
			s.Endpoints[j].Addresses = []string{addrs[(int(seed)+j)%len(addrs)], addrs[(int(seed)+j+1)%len(addrs)]}
		}
		slices = append(slices, s)
	}
	return svc, slices
}

// TestStripServiceKeepsWhatServiceReads converts Services whose every
// field is filled, with their EndpointSlices, before and after the cache's
// stripping: the models are equal, so nothing StripService or
// StripEndpointSlice drops is read. It also checks that the stripping
// drops what it says (an annotation, a selector, an endpoint's targetRef),
// so that it cannot pass by keeping everything.
func TestStripServiceKeepsWhatServiceReads(t *testing.T) {
	withEndpoints := 0
	for seed := range int64(200) {
		svc, slices := filledObjects(seed)
		want := Service(svc, slices)
		if len(want.Endpoints) > 0 {
			withEndpoints++
		}
		strippedSlices := make([]*discoveryv1.EndpointSlice, len(slices))
		for i, s := range slices {
			strippedSlices[i] = StripEndpointSlice(s)
		}
		stripped := StripService(svc)
		if got := Service(stripped, strippedSlices); !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: the stripped objects convert to\n%+v\nthe whole ones to\n%+v", seed, got, want)
		}
		if stripped.Annotations != nil || stripped.ManagedFields != nil || stripped.Spec.Selector != nil || stripped.Spec.ClusterIPs != nil {
			t.Fatalf("seed %d: the stripped Service keeps what it should drop: %+v", seed, stripped.ObjectMeta)
		}
		for _, s := range strippedSlices {
			if len(s.Labels) > 1 || s.Annotations != nil || s.ManagedFields != nil {
				t.Fatalf("seed %d: the stripped EndpointSlice keeps what it should drop: %+v", seed, s.ObjectMeta)
			}
			for _, e := range s.Endpoints {
				if e.TargetRef != nil || e.Hostname != nil || e.DeprecatedTopology != nil {
					t.Fatalf("seed %d: the stripped endpoint keeps what it should drop: %+v", seed, e)
				}
			}
		}
	}
	if withEndpoints < 100 {
		t.Fatalf("only %d of 200 filled Services have endpoints after conversion: the filled objects test too little", withEndpoints)
	}
}
