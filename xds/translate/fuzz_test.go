package translate

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
)

// fuzzInput reads fuzz bytes as a stream of small choices; when the bytes
// run out every choice is the first option, so any input is a valid model.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) next() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

func (in *fuzzInput) intn(n int) int { return int(in.next()) % n }

func pick[T any](in *fuzzInput, options ...T) T { return options[in.intn(len(options))] }

// fuzzModel builds a scope and distinct Services from fuzz bytes. The pools
// are small on purpose, so that collisions the translator must handle —
// shared short names, duplicate endpoints, one IPv6 address spelled two
// ways, ports Envoy cannot address, UDP ports, addresses that are not IPs —
// come up often. Names are Kubernetes-like (valid UTF-8, no dots), as the
// API server guarantees.
func fuzzModel(data []byte) (*model.Scope, []*model.Service, uint64) {
	in := &fuzzInput{b: data}
	scope := &model.Scope{
		Key:      model.Key{Namespace: pick(in, "a", "b"), Name: "s"},
		Protocol: pick(in, model.SotW, model.Delta),
		Listener: model.Listener{
			Mode: pick(in, model.ListenerEnvoy, model.ListenerProxylessGRPC),
			Port: pick[int32](in, 8080, 80, 10000, 0, 65535, 65536, -1),
		},
	}
	// Valid choices repeat, so most generated objects are usable and the
	// unusable ones still come up.
	portNames := []string{"http", "http", "grpc", "grpc", "", "metrics"}
	protocols := []model.PortProtocol{model.ProtocolTCP, model.ProtocolTCP, model.ProtocolTCP, "", model.ProtocolUDP, model.ProtocolSCTP}
	numbers := []int32{80, 80, 8080, 8080, 9090, 443, 53, 65535, 1, 0, 65536, -5}
	seen := map[model.Key]bool{}
	var services []*model.Service
	for range in.intn(9) {
		key := model.Key{Namespace: pick(in, "a", "b", "c"), Name: pick(in, "web", "api", "db", "x-1", "web")}
		svc := &model.Service{Key: key}
		if in.intn(6) == 0 {
			svc.ExternalName = pick(in, "example.com", "db.example.org.", "10.0.0.1")
		}
		for range in.intn(5) {
			svc.Ports = append(svc.Ports, model.ServicePort{
				Name:        pick(in, portNames...),
				Port:        pick(in, numbers...),
				Protocol:    pick(in, protocols...),
				AppProtocol: pick(in, "", "grpc", "h2c", "http", "kubernetes.io/h2c", "http2"),
				TargetPort:  pick[int32](in, 0, 8080),
			})
		}
		for range in.intn(12) {
			ep := model.Endpoint{
				Address: pick(in, "10.0.0.1", "10.0.0.2", "10.0.0.10", "10.0.0.3", "fd00::1", "2001:db8::1",
					"fd00::0001", "::ffff:10.0.0.1", "not-an-ip", "", "fe80::1%eth0", "192.168.1.300"),
				Zone: pick(in, "", "z1", "z2"),
				Node: pick(in, "", "n1"),
			}
			flags := in.next()
			// Mostly API-consistent conditions (ready implies serving), with
			// some that are not.
			ep.Ready, ep.Serving, ep.Terminating = flags&3 != 0, flags&3 != 0 || flags&4 != 0, flags&8 != 0
			ep.Family = model.IPv4
			if strings.Contains(ep.Address, ":") {
				ep.Family = model.IPv6
			}
			for range 1 + in.intn(3) {
				ep.Ports = append(ep.Ports, model.EndpointPort{
					Name:     pick(in, portNames...),
					Port:     pick(in, numbers...),
					Protocol: pick(in, protocols...),
				})
			}
			svc.Endpoints = append(svc.Endpoints, ep)
		}
		if !seen[key] {
			seen[key] = true
			services = append(services, svc)
		}
	}
	seed := uint64(in.next()) | uint64(in.next())<<8
	return scope, services, seed
}

// FuzzTranslate translates random models and requires that every resource
// passes Envoy's validation and the translator's invariants, that the
// output does not depend on input order, and that the input is untouched.
func FuzzTranslate(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x00\x03\x00\x00\x00\x02\x01\x00\x00\x00\x00\x04\x00\x00\x00\x03\x03\x01"))
	f.Add([]byte("\x01\x01\x01\x01\x05\x01\x01\x01\x03\x01\x02\x01\x01\x00\x08\x04\x02\x01\x03\x01\x02\x00\x05\x07\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		scope, services, seed := fuzzModel(data)
		before := cloneServices(services)
		res := Translate(scope, services)
		if !reflect.DeepEqual(before, services) {
			t.Fatal("Translate modified its input")
		}
		if err := validateAll(res); err != nil {
			t.Fatalf("ValidateAll:\n%v", err)
		}
		if err := checkInvariants(scope, res); err != nil {
			t.Fatalf("invariants:\n%v", err)
		}
		want, err := wire(res)
		if err != nil {
			t.Fatal(err)
		}
		got, err := wire(Translate(scope, shuffled(rand.New(rand.NewPCG(seed, 7)), services)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("output depends on input order")
		}
	})
}
