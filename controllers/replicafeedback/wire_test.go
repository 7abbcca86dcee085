package replicafeedback

import (
	"crypto/sha256"
	"encoding/hex"
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
	data, err := encode(in, 0)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := encode(in, 0)
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

// A report over its limit drops the Services asked for (then no Service
// counts as unused), then older NACKs; counts and costs stay.
func TestLargeReportIsThinned(t *testing.T) {
	scopes := map[model.Key]feedback.Summary{}
	for i := range 60 {
		scopes[model.Key{Namespace: "shop", Name: fmt.Sprint("scope-", i)}] = sample(1000, feedback.MaxNACKs)
	}
	const limit = 900 << 10
	data, err := encode(scopes, limit)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > limit {
		t.Fatalf("%d bytes, over %d", len(data), limit)
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

// contentVersion is scope i's version at step v, as random as the content
// hashes versions are.
func contentVersion(i, v int) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%d/%d", i, v))
	return hex.EncodeToString(h[:8])
}

// scopesOf is a replica's feedback of n scopes with a proxy each, as the
// tenants layout has it: every scope at a version of its own (content
// hashes do not compress), with a cost window.
func scopesOf(n, proxies int) map[model.Key]feedback.Summary {
	out := make(map[model.Key]feedback.Summary, n)
	for i := range n {
		out[model.Key{Namespace: fmt.Sprintf("tenant-%04d", i%1000), Name: fmt.Sprintf("scope-%05d", i)}] = feedback.Summary{
			Proxies: []feedback.ProxyCount{{AtVersion: contentVersion(i, 0), Protocol: model.Delta, Count: proxies}},
			Refused: map[string]int64{}, LastRefused: map[string]time.Time{},
			Cost: feedback.CostWindow{Cost: feedback.Cost{Pushes: int64(i % 97), Bytes: int64(i * 131), OtherBytes: int64(i * 71), Connects: 1, ConnectBytes: 900, ConnectOtherBytes: 950}, Span: time.Hour, Bucket: time.Minute},
		}
	}
	return out
}

// A replica's report of 10,000 and 50,000 scopes splits into parts that
// each fit a ConfigMap, and reads back whole; a change of one scope
// encodes its part alone again.
func TestReportSplitsToFit(t *testing.T) {
	for _, n := range []int{10_000, 50_000} {
		scopes := scopesOf(n, 1)
		report, err := splitReport(scopes, nil)
		if err != nil {
			t.Fatalf("%d scopes: %v", n, err)
		}
		parts := report.parts
		got := map[model.Key]feedback.Summary{}
		total := 0
		for i, p := range parts {
			if len(p.gz) > maxPartBytes {
				t.Errorf("%d scopes: part %d takes %d bytes, over %d", n, i, len(p.gz), maxPartBytes)
			}
			total += len(p.gz)
			s, d, err := decodePart(p.gz)
			if err != nil || d != p.digest {
				t.Fatalf("%d scopes: part %d: %v (digest %s, want %s)", n, i, err, d, p.digest)
			}
			for k, v := range s {
				if partOf(k, len(parts)) != i {
					t.Fatalf("%s in part %d, not %d", k, i, partOf(k, len(parts)))
				}
				got[k] = v
			}
		}
		if !reflect.DeepEqual(got, scopes) {
			t.Fatalf("%d scopes: %d read back, not the same", n, len(got))
		}
		t.Logf("%d scopes: %d parts, %d bytes compressed (%.0f per scope)", n, len(parts), total, float64(total)/float64(n))
		// A scope changes: its part alone is encoded again, to what
		// encoding it from scratch gives.
		changed := model.Key{Namespace: "tenant-0007", Name: "scope-00007"}
		s := scopes[changed]
		s.Proxies = []feedback.ProxyCount{{AtVersion: contentVersion(7, 1), Protocol: model.Delta, Count: 1}}
		scopes[changed] = s
		again, err := splitReport(scopes, report)
		if err != nil {
			t.Fatal(err)
		}
		fresh, _ := splitReport(scopes, nil)
		for i := range parts {
			if moved := again.parts[i].digest != parts[i].digest; moved != (i == partOf(changed, len(parts))) {
				t.Errorf("%d scopes: part %d encoded again: %v", n, i, moved)
			}
			if again.parts[i].digest != fresh.parts[i].digest {
				t.Errorf("%d scopes: part %d kept an encoding other than its scopes'", n, i)
			}
		}
	}
}
