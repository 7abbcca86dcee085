package convert

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// fuzzBytes reads fuzz input as a stream of small choices; when it runs
// out, every choice is the first option.
type fuzzBytes struct{ b []byte }

func (in *fuzzBytes) next() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

func (in *fuzzBytes) intn(n int) int { return int(in.next()) % n }

// raw is a string of up to 15 bytes taken as they come: any bytes at all,
// UTF-8 or not.
func (in *fuzzBytes) raw() string {
	n := in.intn(16)
	b := make([]byte, 0, n)
	for range n {
		b = append(b, in.next())
	}
	return string(b)
}

// text is one of a few usual values, or (one time in four) raw bytes.
func (in *fuzzBytes) text(usual ...string) string {
	if c := in.intn(len(usual) + len(usual)/3 + 1); c < len(usual) {
		return usual[c]
	}
	return in.raw()
}

// fuzzObjects builds a Service and its EndpointSlices as a client could
// store them. Names and namespaces are DNS labels, which the API server
// validates; the strings it does not (or not for every client) hold any
// bytes: an endpoint's zone and node name, port names, app protocols, a
// named target port, an ExternalName.
func fuzzObjects(data []byte) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	in := &fuzzBytes{b: data}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: []string{"web", "api", "x-1"}[in.intn(3)]}}
	if in.intn(6) == 5 {
		svc.Spec.Type = corev1.ServiceTypeExternalName
		svc.Spec.ExternalName = in.text("pay.example.com", "db.example.org.")
	}
	numbers := []int32{80, 8080, 9090, 443, 0, 65535}
	for range in.intn(4) {
		p := corev1.ServicePort{Name: in.text("http", "grpc", ""), Port: numbers[in.intn(len(numbers))]}
		if in.intn(2) == 0 {
			p.AppProtocol = ptr.To(in.text("grpc", "kubernetes.io/h2c", "http"))
		}
		switch in.intn(3) {
		case 1:
			p.TargetPort = intstr.FromInt32(numbers[in.intn(len(numbers))])
		case 2:
			p.TargetPort = intstr.FromString(in.text("web", "grpc"))
		}
		svc.Spec.Ports = append(svc.Spec.Ports, p)
	}
	var slices []*discoveryv1.EndpointSlice
	for range in.intn(3) {
		s := &discoveryv1.EndpointSlice{AddressType: []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}[in.intn(2)]}
		for range in.intn(3) {
			s.Ports = append(s.Ports, discoveryv1.EndpointPort{
				Name: ptr.To(in.text("http", "grpc", "", "web")), Port: ptr.To(numbers[in.intn(len(numbers))]),
			})
		}
		addrs := []string{"10.0.0.1", "10.0.0.2", "fd00::1", "2001:db8::2"}
		for range in.intn(5) {
			e := discoveryv1.Endpoint{Addresses: []string{addrs[in.intn(len(addrs))]}}
			if flags := in.next(); flags&1 != 0 {
				e.Conditions.Ready = ptr.To(flags&2 != 0)
			}
			if in.intn(2) == 0 {
				e.Zone = ptr.To(in.text("z1", "us-east-1a"))
			}
			if in.intn(2) == 0 {
				e.NodeName = ptr.To(in.text("node-1"))
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		slices = append(slices, s)
	}
	return svc, slices
}

// validator is what go-control-plane generates from Envoy's validation rules.
type validator interface{ ValidateAll() error }

// FuzzConvertTranslate takes Kubernetes objects through the whole path to
// the wire: conversion, translation in both listener modes, marshalling
// and Envoy's validation. Whatever bytes an object's strings hold, every
// resource must be servable, and every string of the model valid UTF-8.
func FuzzConvertTranslate(f *testing.F) {
	f.Add([]byte{})
	// One port, one IPv4 slice with one port and one ready endpoint whose
	// zone is the single byte 0xff.
	f.Add([]byte("\x00\x00\x01\x00\x00\x01\x00\x01\x00\x01\x00\x00\x01\x00\x03\x00\x02\x01\xff\x01"))
	// The same endpoint in zone z1 on a node whose name is not UTF-8.
	f.Add([]byte("\x00\x00\x01\x00\x00\x01\x00\x01\x00\x01\x00\x00\x01\x00\x03\x00\x00\x00\x01\x02\xc3\x28"))
	// An ExternalName that is not UTF-8.
	f.Add([]byte("\x00\x05\x02\x03\xffab\x01\x00\x00\x01\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		svc, slices := fuzzObjects(data)
		m := Service(svc, slices)
		if err := validUTF8(reflect.ValueOf(m), "Service"); err != nil {
			t.Fatal(err)
		}
		for _, mode := range []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC} {
			scope := &model.Scope{Key: model.Key{Namespace: "shop", Name: "s"}, Listener: model.Listener{Mode: mode, Port: 10080}}
			res := translate.Translate(scope, []*model.Service{m})
			res.Each(func(typ xdstype.Type, msg proto.Message) {
				if _, err := (proto.MarshalOptions{Deterministic: true}).Marshal(msg); err != nil {
					t.Fatalf("%s mode: an %s resource cannot be marshalled: %v", mode, typ, err)
				}
				if v, ok := msg.(validator); ok {
					if err := v.ValidateAll(); err != nil {
						t.Fatalf("%s mode: an %s resource fails validation: %v", mode, typ, err)
					}
				}
			})
		}
	})
}

// validUTF8 reports the first string under v that is not valid UTF-8.
func validUTF8(v reflect.Value, path string) error {
	switch v.Kind() {
	case reflect.String:
		if !utf8.ValidString(v.String()) {
			return fmt.Errorf("%s = %q is not valid UTF-8", path, v.String())
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return validUTF8(v.Elem(), path)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if err := validUTF8(v.Field(i), path+"."+v.Type().Field(i).Name); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if err := validUTF8(v.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if err := validUTF8(it.Key(), path+" key"); err != nil {
				return err
			}
			if err := validUTF8(it.Value(), fmt.Sprintf("%s[%v]", path, it.Key())); err != nil {
				return err
			}
		}
	}
	return nil
}

// fuzzRoute builds an HTTPRoute whose strings hold any bytes where the
// API server's schema is the only check (paths, header values, regular
// expressions, rule names) and whose weights and durations come as a
// client could write them.
func fuzzRoute(data []byte) *gatewayv1.HTTPRoute {
	in := &fuzzBytes{b: data}
	hr := httpRoute()
	for range in.intn(3) {
		rule := gatewayv1.HTTPRouteRule{}
		if in.intn(2) == 0 {
			rule.Name = ptr.To(gatewayv1.SectionName(in.text("canary", "main")))
		}
		for range in.intn(3) {
			m := gatewayv1.HTTPRouteMatch{}
			types := []gatewayv1.PathMatchType{gatewayv1.PathMatchPathPrefix, gatewayv1.PathMatchExact, gatewayv1.PathMatchRegularExpression}
			if in.intn(2) == 0 {
				m.Path = &gatewayv1.HTTPPathMatch{Type: ptr.To(types[in.intn(3)]), Value: ptr.To(in.text("/", "/v2", "/a/[0-9]+", "/(a"))}
			}
			for range in.intn(2) {
				m.Headers = append(m.Headers, gatewayv1.HTTPHeaderMatch{
					Type: ptr.To([]gatewayv1.HeaderMatchType{gatewayv1.HeaderMatchExact, gatewayv1.HeaderMatchRegularExpression}[in.intn(2)]),
					Name: gatewayv1.HTTPHeaderName(in.text("X-Canary", "user-agent")), Value: in.text("yes", "^curl/.*", "(?=x)"),
				})
			}
			rule.Matches = append(rule.Matches, m)
		}
		weights := []int32{0, 1, 90, 2147483647, -1}
		for range in.intn(3) {
			rule.BackendRefs = append(rule.BackendRefs, gatewayv1.HTTPBackendRef{BackendRef: backendRef(in.text("", "other"), in.text("v1", "v2"), 80, ptr.To(weights[in.intn(len(weights))]))})
		}
		if in.intn(2) == 0 {
			rule.Timeouts = &gatewayv1.HTTPRouteTimeouts{Request: ptr.To(gatewayv1.Duration(in.text("1s", "0s", "100ms", "1.5s")))}
		}
		if in.intn(3) == 0 {
			rule.Filters = append(rule.Filters, gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier,
				RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: []gatewayv1.HTTPHeader{{Name: gatewayv1.HTTPHeaderName(in.text("X-A")), Value: in.text("b")}}}})
		}
		hr.Spec.Rules = append(hr.Spec.Rules, rule)
	}
	return hr
}

// FuzzRoute converts HTTPRoutes with any bytes in their strings: the
// model holds valid UTF-8 only, and a route that is not refused holds
// only regular expressions RE2 compiles and weights a client can sum.
func FuzzRoute(f *testing.F) {
	f.Add([]byte{})
	// One rule with a regular-expression path "/(a".
	f.Add([]byte("\x01\x01\x01\x00\x02\x03\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := HTTPRoute(fuzzRoute(data))
		if err := validUTF8(reflect.ValueOf(r), "Route"); err != nil {
			t.Fatal(err)
		}
		if r.Refused != "" {
			return
		}
		for i, rule := range r.Rules {
			var sum int64
			for _, b := range rule.Backends {
				if b.Weight < 0 {
					t.Fatalf("rule %d: a negative weight %d is served", i, b.Weight)
				}
				sum += int64(b.Weight)
			}
			if sum > math.MaxUint32 {
				t.Fatalf("rule %d: weights summing to %d are served", i, sum)
			}
			for _, m := range rule.Matches {
				res := []string{}
				if m.PathType == model.PathRegex {
					res = append(res, m.Path)
				}
				for _, h := range m.Headers {
					if h.Regex {
						res = append(res, h.Value)
					}
				}
				for _, re := range res {
					if _, err := regexp.Compile(re); err != nil {
						t.Fatalf("rule %d: the regular expression %q is served: %v", i, re, err)
					}
				}
			}
		}
	})
}
