package replicafeedback

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
)

func sample(services, nacks int) feedback.Summary {
	at := time.UnixMilli(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC).UnixMilli())
	s := feedback.Summary{
		Proxies:     []feedback.ProxyCount{{AtVersion: "v1", Protocol: model.Delta, Count: 3}, {AtVersion: "", Protocol: model.SotW, Count: 1}},
		Nacking:     []string{"envoy-1"},
		Refused:     map[string]int64{feedback.RefusedWrongProto: 2},
		LastRefused: map[string]time.Time{feedback.RefusedWrongProto: at, feedback.WrongProtocolKey(feedback.KindGRPC): at},
		// A gRPC client came back on the right protocol after its refusal.
		LastAdmitted: map[string]time.Time{feedback.KindGRPC: at.Add(time.Second)},
		LastPush:     at,
		Cost: feedback.CostWindow{Cost: feedback.Cost{Pushes: 4, Bytes: 400, OtherBytes: 300, Connects: 1, ConnectBytes: 100, ConnectOtherBytes: 90, NACKs: 1, HeldBack: 2, OtherHeldBack: 1},
			Span: time.Hour, Bucket: time.Minute, Pending: true},
		NackingCount: 1,
	}
	for i := range nacks {
		s.NACKs = append(s.NACKs, feedback.NACK{Node: "envoy-1", Peer: "10.0.0.1:1", Identity: "system:serviceaccount:shop:envoy", Zone: "zone-a", TypeURL: "t", Version: "v1",
			Detail: fmt.Sprint(i, strings.Repeat("x", 1000)), Time: at})
	}
	if services > 0 {
		s.Usage.Services = map[model.Key]bool{}
		for i := range services {
			s.Usage.Services[model.Key{Namespace: "shop", Name: fmt.Sprintf("svc-%05d", i)}] = true
		}
	}
	return s
}

// A report reads back as written, byte for byte the same when nothing
// changed.
func TestReportRoundTrip(t *testing.T) {
	in := map[model.Key]feedback.Summary{{Namespace: "shop", Name: "web"}: sample(3, 2)}
	data, err := encode(in)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := encode(in)
	if string(again) != string(data) {
		t.Error("the same Summaries encode differently")
	}
	out, err := decode(string(data))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Errorf("decoded %+v\nwant %+v", out, in)
	}
}

// A report too large for a ConfigMap drops the Services asked for (then no
// Service counts as unused), then older NACKs; counts and costs stay.
func TestLargeReportIsThinned(t *testing.T) {
	scopes := map[model.Key]feedback.Summary{}
	for i := range 60 {
		scopes[model.Key{Namespace: "shop", Name: fmt.Sprint("scope-", i)}] = sample(1000, feedback.MaxNACKs)
	}
	data, err := encode(scopes)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > maxReportBytes {
		t.Fatalf("%d bytes, over %d", len(data), maxReportBytes)
	}
	out, err := decode(string(data))
	if err != nil {
		t.Fatal(err)
	}
	for key, s := range out {
		if !s.Usage.All || len(s.Usage.Services) != 0 {
			t.Fatalf("%s: usage %+v, want All without Services", key, s.Usage)
		}
		if c, _ := s.Connected("v1"); c != 4 || s.Cost != scopes[key].Cost {
			t.Fatalf("%s: %d proxies, cost %+v: counts or costs lost", key, c, s.Cost)
		}
	}
}

func TestDamagedReport(t *testing.T) {
	for _, data := range []string{"", "{", `{"scopes":{"web":{}}}`, `{"scopes":{"/web":{}}}`, `{"scopes":{"shop/web":null}}`} {
		if _, err := decode(data); err == nil {
			t.Errorf("%q decoded", data)
		}
	}
}
